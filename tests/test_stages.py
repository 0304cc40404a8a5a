"""One driver path (`partir_plugin.stages`, issue 35): `partir report --function ... --schedule
...` partitions exactly what `partir.jit` does, for every kind of schedule the suite uses (the
schedule's trace hooks, the same options), and PP's per-trace state stays with its trace."""

from __future__ import annotations

import dataclasses
import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from test_pp_recipes import _init_stack, _tokens_batch
from test_pp_recipes import cli_step as stack_step

import partir_plugin as partir
from partir_plugin.cli import report as report_cli
from partir_plugin.cli.main import build_parser
from partir_plugin.frontend.trace import Traced, trace
from partir_plugin.models import megatron, moe, transformer
from partir_plugin.options import PartitionOptions
from partir_plugin.stages import partition

LM = dataclasses.replace(transformer.Config.small(layers=2), batch=8)
MOE = moe.Config.small(layers=1)


# -- the programs, as `--function` / `--args` name them -----------------------------------------

def lm_step(params, opt_state, batch):
    return transformer.make_train_step(LM)(params, opt_state, batch)


def lm_args():
    return jax.eval_shape(lambda: transformer.init(LM, jax.random.PRNGKey(0)))


def moe_step(params, opt_state, batch):
    return moe.make_train_step(MOE)(params, opt_state, batch)


def moe_args():
    return jax.eval_shape(lambda: moe.init(MOE, jax.random.key(0)))


def conv_loss(img, ker):
    y = lax.conv_general_dilated(img, ker, (1, 1), "SAME",
                                 dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return (y ** 2).sum()


def conv_args():
    return (jax.ShapeDtypeStruct((2, 32, 8, 3), jnp.float32),
            jax.ShapeDtypeStruct((3, 3, 3, 4), jnp.float32))


def mlp_step(x, w1, w2):
    return jnp.tanh(x @ w1) @ w2


def mlp_args():
    return (jax.ShapeDtypeStruct((32, 16), jnp.float32),
            jax.ShapeDtypeStruct((16, 64), jnp.float32),
            jax.ShapeDtypeStruct((64, 16), jnp.float32))


def stack_args(batch: int = 16):
    """`cli_step`'s arguments (a scanned stack of layers, what PP pipelines) for `batch`."""
    return jax.eval_shape(lambda: (_init_stack(names=("wq", "wo")), _tokens_batch(b=batch)))


def _lm(*names):
    made = {"BP": lambda: partir.tactic("BP", axis="batch"),
            "MP": lambda: partir.tactic("MP", megatron.transformer_rule, axis="model"),
            "Z2": lambda: partir.tactic("Z2", axis="batch"),
            "Z3": lambda: partir.tactic("Z3", axis="batch"),
            "EMB": lambda: partir.tactic("EMB", axis="model")}
    return [made[n]() for n in names]


# name -> (function, args, mesh, schedule factory): each schedule kind the suite uses.
CASES = {
    "BP+MP+Z2": ("lm_step", "lm_args", {"batch": 4, "model": 2},
                 lambda: _lm("BP", "MP", "Z2")),
    "BP+MP+Z3+EMB": ("lm_step", "lm_args", {"batch": 4, "model": 2},
                     lambda: _lm("BP", "MP", "Z3", "EMB")),
    "BP+EP": ("moe_step", "moe_args", {"batch": 2, "expert": 4},
              lambda: [partir.tactic("BP", axis="batch"),
                       partir.tactic("EP", megatron.expert_rule, axis="expert")]),
    "SP-halo": ("conv_loss", "conv_args", {"m": 8},
                lambda: [partir.ManualPartition({"img": 1}, axis="m", name="SP")]),
    "Auto": ("mlp_step", "mlp_args", {"batch": 2, "model": 4},
             lambda: [partir.ManualPartition({"x": 0}, axis="batch", name="BP"),
                      partir.AutomaticPartition(["model"], budget=20)]),
    "PP-gpipe+BP": ("stack_step", "stack_args", {"stage": 2, "batch": 4},
                    lambda: [partir.tactic("PP", axis="stage", microbatches=4),
                             partir.tactic("BP", axis="batch")]),
    "PP-circular+BP": ("stack_step", "stack_args", {"stage": 2, "batch": 2},
                       lambda: [partir.tactic("PP", axis="stage", microbatches=4,
                                              schedule="circular", repeats=2),
                                partir.tactic("BP", axis="batch")]),
}


def without_locations(text: str) -> str:
    """A program's text without its source locations: they hold the caller's frames above
    the traced function (jax records up to ten), which are `partir.jit`'s in one program and
    the CLI's in the other; the ops, types and attributes must be the same."""
    text = re.sub(r"^#loc.*\n", "", text, flags=re.M)
    return re.sub(r" loc\([^()]*(\([^()]*\))?[^()]*\)", "", text)


def schedule_of(name: str) -> list:
    """What a `--schedule` file runs for case `name`."""
    return CASES[name][3]()


@pytest.mark.parametrize("name", list(CASES))
def test_partir_report_gives_partir_jits_device_local_program(name, tmp_path):
    fn_name, args_name, mesh, make_schedule = CASES[name]
    schedule_file = tmp_path / "schedule.py"
    schedule_file.write_text(f"import runpy\nschedule = runpy.run_path({__file__!r})"
                             f"['schedule_of']({name!r})\n")
    mesh_arg = ",".join(f"{a}={n}" for a, n in mesh.items())
    cli_args = build_parser().parse_args(
        ["report", "--function", f"{__file__}:{fn_name}", "--args", f"{__file__}:{args_name}",
         "--schedule", str(schedule_file), "--mesh", mesh_arg, "--no-baseline"])
    reported = report_cli._metadata_from_args(cli_args)

    fn, args = globals()[fn_name], globals()[args_name]()
    step, meta = partir.jit(fn, mesh, make_schedule())
    text = step.lower(*args).as_text()
    assert without_locations(reported.device_local_stablehlo) == without_locations(text)
    assert [t.name for t in reported.tactics] == [t.name for t in meta.tactics]
    assert ([t.collectives for t in reported.tactics]
            == [t.collectives for t in meta.tactics])


def test_one_pp_tactic_traced_by_two_threads_at_once_keeps_each_traces_shapes():
    """Two steps (batches of 16 and 32) traced at the same time with one PP instance: each
    trace pipelines its own loop and partitions with its own batch (the hook dispatches per
    context; what a trace found stays with its run, not on the tactic)."""
    pp = partir.tactic("PP", axis="stage", microbatches=4)
    mesh = {"stage": 2, "batch": 4}
    both_in_trace = threading.Barrier(2, timeout=60)

    def waiting_step(params, batch):
        both_in_trace.wait()  # both traces are open before either scans
        return stack_step(params, batch)

    notes, errors = {}, []

    def run(batch):
        try:
            traced = trace(waiting_step, stack_args(batch), [pp], mesh)
            part = partition(traced, mesh, [pp, partir.tactic("BP", axis="batch")])
            notes[batch] = part.state.notes
        except Exception as e:  # noqa: BLE001 -- reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(b,)) for b in (16, 32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert any("4 microbatches of 4" in n for n in notes[16]), notes[16]
    assert any("4 microbatches of 8" in n for n in notes[32]), notes[32]


def test_a_pp_trace_nested_in_another_keeps_each_traces_shapes():
    """A step traced while another step's trace is open (interleaved traces, one PP): the
    inner trace pipelines its loop, and the outer one still finds its own afterwards."""
    pp = partir.tactic("PP", axis="stage", microbatches=4)
    mesh = {"stage": 2, "batch": 4}
    inner = {}

    def outer_step(params, batch):
        traced = trace(stack_step, stack_args(32), [pp], mesh)
        inner["part"] = partition(traced, mesh, [pp])
        return stack_step(params, batch)

    traced = trace(outer_step, stack_args(16), [pp], mesh)
    outer = partition(traced, mesh, [pp])
    assert any("microbatches of 8" in n for n in inner["part"].state.notes)
    assert any("microbatches of 4" in n for n in outer.state.notes)
    assert jax.lax.scan is lax.scan  # the hook left jax as it found it


def test_a_stablehlo_file_enters_as_a_traced_stage():
    lowered = jax.jit(mlp_step).lower(*mlp_args())
    traced = Traced.from_stablehlo(lowered.as_text(), arg_names=["x", "w1", "w2"])
    part = partition(traced, {"batch": 4}, [partir.ManualPartition({"x": 0}, axis="batch")],
                     PartitionOptions(scatter_sums=False))
    assert part.program.in_layouts[0].spec() == jax.sharding.PartitionSpec("batch")
    np.testing.assert_equal(len(part.reports), 1)


def test_partition_options_check_their_values_where_written():
    with pytest.raises(ValueError, match="conflicts='nope'"):
        PartitionOptions(conflicts="nope")
    assert PartitionOptions().for_platform("cpu").scatter_sums is False
    assert PartitionOptions().for_platform("gpu").scatter_sums is True
    assert PartitionOptions(scatter_sums=True).for_platform("cpu").scatter_sums is True
