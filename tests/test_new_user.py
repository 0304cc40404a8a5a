"""What a new user hit first (issue 10), each tried as a new user would."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partir_plugin as partir
from partir_plugin.cli.main import main as partir_main
from partir_plugin.cli.report import ReportInputError, schedule_from_json
from partir_plugin.errors import UnknownNameError


def matmul(x, w):
    return x @ w


X, W = np.ones((16, 4), np.float32), np.ones((4, 8), np.float32)


@pytest.mark.parametrize("name, canonical", [
    ("a100", "a100-40gb"), ("A100", "a100-40gb"), ("TPUv3", "tpu-v3"), ("tpu-v3", "tpu-v3"),
    ("H100", "h100-sxm"), ("h200", "h200-sxm"), ("CPU", "host-cpu")])
def test_hardware_names_people_type(name, canonical):
    step, meta = partir.jit(matmul, {"b": 8}, [partir.ManualPartition({"x": 0}, axis="b")],
                            hardware=name)
    step.lower(X, W)
    assert meta.hardware == canonical
    assert meta.tactics[0].estimated_runtime_s is not None


def test_unknown_hardware_fails_at_jit_not_after_tracing():
    def never_traced(x):
        raise AssertionError("traced before the hardware was checked")

    with pytest.raises(UnknownNameError, match=r"'tpu-v9'.*'a100'.*'a100-40gb'"):
        partir.jit(never_traced, {"b": 8}, [], hardware="tpu-v9")


def test_report_without_hardware_estimates_on_the_default_and_says_so():
    step, meta = partir.jit(matmul, {"b": 8}, [partir.ManualPartition({"x": 0}, axis="b")])
    step.lower(X, W)
    assert meta.hardware == "host-cpu"
    assert meta.tactics[0].estimated_runtime_s is not None
    assert meta.tactics[0].estimated_peak_memory_bytes is not None
    assert "hardware host-cpu (the default spec" in meta.report()


def flax_like(params, x):
    return x @ params["params"]["Dense_0"]["kernel"]


PARAMS = {"params": {"Dense_0": {"kernel": np.ones((4, 8), np.float32)}}}


def test_a_rule_matching_no_leaf_warns_naming_tactic_and_argument():
    wrong = lambda path, shape: 1 if path == "Dense_0/kernel" else None  # noqa: E731
    step, _ = partir.jit(flax_like, {"m": 8},
                         [partir.ManualPartition({"params": wrong}, axis="m", name="MP")])
    with pytest.warns(partir.PartitionWarning,
                      match=r"MP: the selector for argument 'params' decided none.*"
                            r"'params/Dense_0/kernel'"):
        step.lower(PARAMS, X)
    right = lambda path, shape: 1 if path == "params/Dense_0/kernel" else None  # noqa: E731
    step, meta = partir.jit(flax_like, {"m": 8},
                            [partir.ManualPartition({"params": right}, axis="m")])
    with warnings.catch_warnings():
        warnings.simplefilter("error", partir.PartitionWarning)
        step.lower(PARAMS, X)
    assert meta.tactics[0].name == "params@m"  # derived from inputs and axis


def test_strict_makes_an_unmatched_rule_an_error():
    never = lambda path, shape: None  # noqa: E731
    step, _ = partir.jit(flax_like, {"m": 8},
                         [partir.ManualPartition({"params": never}, axis="m", strict=True)])
    with pytest.raises(partir.PartitionError, match="params@m.*'params'.*decided none"):
        step.lower(PARAMS, X)


def test_manual_partition_rows_get_distinct_derived_names():
    names = [partir.ManualPartition({"x": 0}, axis="b").name,
             partir.ManualPartition({"w": 1}, axis="m").name,
             partir.ManualPartition({"x": 0, "w": 0}, axis="b").name]
    assert names == ["x@b", "w@m", "x,w@b"]


def test_tactic_presets_take_positional_arguments_and_explain_bad_ones():
    rule = lambda path, shape: None  # noqa: E731
    mp = partir.tactic("MP", rule, axis="model")
    assert mp.inputs == {"params": rule} and mp.axis == "model"
    with pytest.raises(TypeError, match=r"tactic\('BP', \.\.\.\).*axis.*inputs"):
        partir.tactic("BP", "batch", nonsense=1)


def test_schedule_json_runs_presets_by_name_or_rejects_them():
    bp, z3, mp = schedule_from_json(["BP", {"name": "Z3", "axis": "data"},
                                     {"preset": "BP", "axis": "b", "inputs": ["x"]}])
    assert isinstance(bp, partir.ManualPartition) and bp.name == "BP"
    assert z3.axis == "data" and mp.inputs == {"x": 0}
    with pytest.raises(ReportInputError, match=r"no preset 'Nope'.*presets: .*'BP'"):
        schedule_from_json([{"name": "Nope", "axis": "b"}])
    with pytest.raises(ReportInputError, match=r"preset 'BP'.*unexpected"):
        schedule_from_json([{"preset": "BP", "colour": "red"}])


def test_cli_report_with_a_preset_schedule(tmp_path, capsys):
    mod = tmp_path / "mm.py"
    mod.write_text("import jax, jax.numpy as jnp\n"
                   "def f(batch, w):\n    return batch @ w\n"
                   "def example():\n"
                   "    return (jax.ShapeDtypeStruct((16, 4), jnp.float32),\n"
                   "            jax.ShapeDtypeStruct((4, 8), jnp.float32))\n")
    rc = partir_main(["report", "--function", f"{mod}:f", "--args", f"{mod}:example",
                      "--mesh", "batch=8", "--schedule-json", json.dumps(["BP"])])
    assert rc == 0
    out = capsys.readouterr().out
    assert "\nBP " in out and "host-cpu (the default spec" in out


@pytest.mark.slow  # a subprocess
def test_piping_the_cli_into_head_prints_no_traceback():
    proc = subprocess.Popen([sys.executable, "-m", "partir_plugin.cli", "plugins"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader leaves at once, as `| head -0` would
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_jit_accepts_jnp_arrays_after_a_preset():
    step, _ = partir.jit(matmul, {"batch": 8}, [partir.tactic("BP", inputs=("x",))])
    np.testing.assert_allclose(np.asarray(step(jnp.asarray(X), jnp.asarray(W))), X @ W)
    jax.block_until_ready(step(X, W))
