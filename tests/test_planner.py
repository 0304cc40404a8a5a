"""`partir.plan`: sorted plans that fit, the best one runs under partir.jit with jax.jit's
numbers; the search space respects the cluster; nothing fitting is a clear error; the
`partir plan` command prints a table."""

from __future__ import annotations

import dataclasses

import jax
import pytest
from oracle import assert_matches_jax_jit

import partir_plugin as partir
from partir_plugin.cli.main import main as partir_main
from partir_plugin.models import megatron, transformer
from partir_plugin.planner import PlanError
from partir_plugin.planner.space import SpaceLimits, layouts


@pytest.fixture(scope="module")
def model():
    cfg = dataclasses.replace(transformer.Config.small(layers=2, scan=True), batch=16,
                              learning_rate=1e-3)
    return transformer.make_train_step(cfg), transformer.init(cfg, jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def plans(model):
    step, args = model
    return partir.plan(step, *args, devices=8, hardware="a100-40gb", seconds=600, max_estimates=8,
                       model_rule=megatron.transformer_rule)


@pytest.mark.slow  # a search of eight estimates
def test_plans_are_sorted_fit_and_say_why(plans):
    assert len(plans) >= 2
    times = [p.estimate.step_time_s for p in plans]
    assert times == sorted(times)
    for p in plans:
        assert p.estimate.peak_memory_bytes <= 40 * 2**30
        assert p.estimate.mesh == p.mesh and p.why and "est." in p.why
        n = 1
        for size in p.mesh.values():
            n *= size
        assert n == 8
    assert plans.stats.estimated >= len(plans)
    # Candidates without PP share the step's one plain trace.
    assert plans.stats.traces < plans.stats.estimated
    assert {"data", "model"} & set(plans[0].mesh)


@pytest.mark.slow  # compiles and runs the best plan's step beside jax.jit's
def test_the_best_plan_runs_with_jax_jits_numbers(model, plans):
    step, args = model
    best = plans[0]
    assert_matches_jax_jit(step, args, best.mesh, best.schedule)


def test_a_memory_limit_below_everything_says_what_is_closest(model):
    step, args = model
    with pytest.raises(PlanError, match=r"no configuration of 8 devices fits 1\.0 KiB.*"
                                        r"the smallest, .*, needs"):
        partir.plan(step, *args, devices=8, hardware="a100-40gb", memory_limit=1024,
                    seconds=5, model_rule=megatron.transformer_rule)


def test_a_device_count_nothing_divides_says_what_must_divide(model):
    """7 devices split neither the batch nor the rule's dimensions: no mesh at all (it used
    to read "no configuration fits 40 GiB ...: all 0 need more", a memory message)."""
    step, args = model
    batch = next(x for x in jax.tree.leaves(args[2]) if x.ndim).shape[0]
    with pytest.raises(PlanError, match=rf"no mesh of 7 devices splits this step: .*batch of "
                                        rf"{batch}.*model_rule splits .*\(1\)"):
        partir.plan(step, *args, devices=7, hardware="a100-40gb", seconds=5,
                    model_rule=megatron.transformer_rule)


def test_the_batch_argument_must_be_found(model):
    step, args = model
    with pytest.raises(PlanError, match="none is named 'tokens'"):
        partir.plan(step, *args, devices=8, batch="tokens", seconds=5)


def test_the_model_axis_stays_within_a_node():
    limits = SpaceLimits(batch=512, layers=32, model_sizes=None, expert_sizes=None,
                         zero=True, devices_per_node=8, remat_policies=())
    found = list(layouts(256, limits))
    assert {lay.model for lay in found} == {1, 2, 4, 8}
    assert all(lay.devices == 256 and 32 % lay.stage == 0 for lay in found)
    assert {lay.stage for lay in found} == {1, 2, 4, 8, 16, 32}
    unbounded = dataclasses.replace(limits, devices_per_node=None)
    assert max(lay.model for lay in layouts(256, unbounded)) == 256


def test_cli_prints_the_top_plans_as_a_table(tmp_path, capsys):
    mod = tmp_path / "mlpstep.py"
    mod.write_text(
        "import jax, jax.numpy as jnp\n"
        "def step(params, batch):\n"
        "    def loss(p):\n"
        "        return jnp.mean((jnp.tanh(batch @ p['w1']) @ p['w2']) ** 2)\n"
        "    return jax.value_and_grad(loss)(params)\n"
        "def example():\n"
        "    s = lambda *d: jax.ShapeDtypeStruct(d, jnp.float32)\n"
        "    return {'w1': s(64, 256), 'w2': s(256, 64)}, s(512, 64)\n"
        "def rule(path, shape):\n"
        "    return {'w1': 1, 'w2': 0}[path]\n")
    rc = partir_main(["plan", "--function", f"{mod}:step", "--args", f"{mod}:example",
                      "--devices", "8", "--hardware", "a100-40gb", "--seconds", "10",
                      "--model-rule", f"{mod}:rule", "--top", "3"])
    out = capsys.readouterr().out
    assert rc == 0, out
    lines = out.splitlines()
    assert "plans for 8 devices of a100-40gb" in lines[0]
    assert lines[1].split()[:4] == ["#", "mesh", "schedule", "est."]
    assert [line.split()[0] for line in lines[3:6]] == ["1", "2", "3"]
    assert lines[6] == ("note: no pipelines: the step has no layer loop (a lax.scan over "
                        "stacked layers)")
    assert "4 configurations, 0 pruned" in lines[0] and "BP(data " in out and "est. " in out


def test_cli_errors(capsys):
    rc = partir_main(["plan", "--function", "nowhere:step", "--args", "nowhere:args",
                      "--devices", "8"])
    assert rc == 2 and "cannot import module 'nowhere'" in capsys.readouterr().err


def _mlp_step(params, batch):
    import jax.numpy as jnp

    def loss(p):
        return jnp.mean((jnp.tanh(batch @ p["w1"]) @ p["w2"]) ** 2)

    return jax.value_and_grad(loss)(params)


def test_without_a_model_rule_automatic_partition_decides_the_model_axis_once_per_size():
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    args = ({"w1": jax.random.normal(k[0], (256, 1024)),
             "w2": jax.random.normal(k[1], (1024, 256))}, jax.random.normal(k[2], (64, 256)))
    plans = partir.plan(_mlp_step, *args, devices=8, hardware="a100-40gb", seconds=20)
    modelled = [p for p in plans if "model" in p.mesh]
    assert {p.mesh["model"] for p in modelled} == {2, 4, 8}
    for p in modelled:
        assert isinstance(p.schedule[-1], partir.FrozenPartition)
        assert f"Auto(model {p.mesh['model']})" in p.label and "AutomaticPartition" in p.why
    best = min(modelled, key=lambda p: p.estimate.step_time_s)
    assert_matches_jax_jit(_mlp_step, args, best.mesh, best.schedule)
