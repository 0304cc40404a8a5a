"""Per-tactic reports: the table, to_json, the plot and `partir report`."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import optax
import pytest

import partir_plugin as partir
from partir_plugin.cli.main import main as partir_main
from partir_plugin.cli.report import schedule_from_json
from partir_plugin.core.mesh import Mesh
from partir_plugin.examples import mlp
from partir_plugin.frontend.trace import trace
from partir_plugin.options import PartitionOptions
from partir_plugin.report.metadata import Metadata
from partir_plugin.report.rows import estimate
from partir_plugin.report.tactic_report import BASELINE, TacticReport
from partir_plugin.stages import partition, report_for_function

CHAIN_SCHEDULE = [{"name": "BP", "axis": "B", "inputs": {"x": 0}},
                  {"name": "MP", "axis": "M", "inputs": {"w1": 1}},
                  {"name": "Z3", "axis": "B", "inputs": {"w1": 0, "w2": 1}}]


def matmul_chain(x, w1, w2):
    return (x @ w1) @ w2


def chain_args():
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((256, 8), f32), jax.ShapeDtypeStruct((8, 16), f32),
            jax.ShapeDtypeStruct((16, 8), f32))


def _rows(report: str) -> dict[str, list[str]]:
    """Table rows by tactic name; columns split on whitespace (AG AR RS A2A AP first)."""
    lines = report.splitlines()
    dash = next(i for i, line in enumerate(lines) if line.startswith("--"))
    rows = {}
    for line in lines[dash + 1:]:
        if line.startswith(("ops without", "conflict", "...")):
            break
        cells = line.split()
        rows[cells[0]] = cells[1:]
    return rows


@pytest.fixture(scope="module")
def chain_meta():
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    args = (jax.random.normal(k[0], (256, 8)), jax.random.normal(k[1], (8, 16)),
            jax.random.normal(k[2], (16, 8)))
    step, meta = partir.jit(matmul_chain, {"B": 4, "M": 2}, schedule_from_json(CHAIN_SCHEDULE),
                            hardware="host-cpu")
    step.lower(*args)
    return meta


def test_report_has_per_tactic_rows_with_deltas(chain_meta):
    text = chain_meta.report()
    header = next(line for line in text.splitlines() if line.startswith("tactic"))
    for col in ("AG", "AR", "RS", "A2A", "AP", "est. runtime", "Δ runtime", "est. peak mem",
                "Δ mem", "conflicts", "est. GFLOP"):
        assert col in header
    assert header.index("Δ runtime") < header.index("est. GFLOP")
    rows = _rows(text)
    assert list(rows) == ["BP", "MP", "Z3"]
    assert [r[:2] for r in rows.values()] == [["0", "0"], ["0", "1"], ["2", "1"]]
    # the first tactic has no previous one; the others show a ratio
    assert "x" not in " ".join(rows["BP"][5:9])
    assert rows["MP"][7].endswith("x") and rows["Z3"][7].endswith("x")


def test_to_json_round_trips(chain_meta):
    data = chain_meta.to_json()
    again = json.loads(json.dumps(data))
    assert again == data
    assert [t["name"] for t in again["tactics"]] == ["BP", "MP", "Z3"]
    assert again["tactics"][2]["collectives"]["all_gather"] == 2
    assert again["tactics"][2]["estimated_runtime_s"] > 0
    assert again["mesh"] == {"B": 4, "M": 2}
    assert again["in_shardings"] == ["P('B')", "P('B', 'M')", "P('M', 'B')"]
    assert again["out_shardings"] == "P('B')"


def test_to_json_of_an_unpartitioned_function_is_plain():
    assert json.loads(json.dumps(Metadata().to_json()))["tactics"] == []


def test_plot_writes_a_png(chain_meta, tmp_path):
    out = chain_meta.plot(tmp_path / "report.png")
    data = out.read_bytes()
    assert out.stat().st_size > 0
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"matplotlib" in data.lower()  # the Software text chunk matplotlib writes


def test_plot_needs_tactics(tmp_path):
    with pytest.raises(ValueError, match="not partitioned yet"):
        Metadata().plot(tmp_path / "x.png")


def test_plot_includes_all_permute_when_present(tmp_path):
    meta = Metadata(tactics=[TacticReport("A", {"all_permute": 2}, 1e-3, 2**20, 1e9)],
                    mesh={"d": 2})
    assert (meta.plot(tmp_path / "p.png")).stat().st_size > 0


@pytest.fixture(scope="module")
def chain_mlir(tmp_path_factory):
    path = tmp_path_factory.mktemp("hlo") / "chain.mlir"
    path.write_text(jax.jit(matmul_chain).lower(*chain_args()).as_text())
    return path


def test_cli_report_on_a_stablehlo_file(chain_mlir, tmp_path, capsys):
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    rc = partir_main(["report", "--stablehlo", str(chain_mlir), "--arg-names", "x,w1,w2",
                      "--mesh", "B=4,M=2", "--schedule-json", json.dumps(CHAIN_SCHEDULE),
                      "--hardware", "a100-40gb", "--json", str(out_json),
                      "--plot", str(out_png)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "hardware a100-40gb" in text
    rows = _rows(text)
    assert list(rows) == [BASELINE, "BP", "MP", "Z3"]
    assert {name: r[:2] for name, r in rows.items()} == {
        BASELINE: ["0", "0"], "BP": ["0", "0"], "MP": ["0", "1"], "Z3": ["2", "1"]}
    data = json.loads(out_json.read_text())
    assert data["in_shardings"] == {"x": "P('B')", "w1": "P('B', 'M')", "w2": "P('M', 'B')"}
    assert out_png.stat().st_size > 0


def test_cli_report_with_a_schedule_file_and_default_names(chain_mlir, tmp_path, capsys):
    sched = tmp_path / "schedule.py"
    sched.write_text("import partir_plugin as partir\n"
                     "schedule = [partir.ManualPartition({'arg0': 0}, axis='B', name='BP'),\n"
                     "            partir.ManualPartition({'arg1': 1}, axis='M', name='MP')]\n")
    rc = partir_main(["report", "--stablehlo", str(chain_mlir), "--mesh", "B=4,M=2",
                      "--schedule", str(sched), "--no-baseline"])
    assert rc == 0
    rows = _rows(capsys.readouterr().out)
    assert list(rows) == ["BP", "MP"] and rows["MP"][:2] == ["0", "1"]


def test_cli_report_on_a_function(tmp_path, capsys):
    mod = tmp_path / "chainmod.py"
    mod.write_text("import jax, jax.numpy as jnp\n"
                   "def f(x, w1, w2):\n    return (x @ w1) @ w2\n"
                   "def example():\n"
                   "    s = lambda *d: jax.ShapeDtypeStruct(d, jnp.float32)\n"
                   "    return s(256, 8), s(8, 16), s(16, 8)\n")
    rc = partir_main(["report", "--function", f"{mod}:f", "--args", f"{mod}:example",
                      "--mesh", "B=4,M=2", "--schedule-json", json.dumps(CHAIN_SCHEDULE)])
    assert rc == 0
    rows = _rows(capsys.readouterr().out)
    assert rows["Z3"][:2] == ["2", "1"]


@pytest.mark.parametrize("argv, message", [
    (["--mesh", "B=4"], "either --function"),
    (["--stablehlo", "CHAIN", "--mesh", "B4"], "AXIS=SIZE"),
    (["--stablehlo", "CHAIN", "--mesh", "B=x"], "must be an integer"),
    (["--stablehlo", "missing.mlir", "--mesh", "B=4"], "no such file"),
    (["--stablehlo", "CHAIN", "--mesh", "B=4", "--arg-names", "x,y"], "has 3 arguments"),
    (["--stablehlo", "CHAIN", "--mesh", "B=4", "--hardware", "nope"], "unknown hardware"),
    (["--stablehlo", "CHAIN", "--mesh", "B=4", "--schedule-json", "[{"], "not valid JSON"),
    (["--stablehlo", "CHAIN", "--mesh", "B=4", "--schedule-json", '[{"inputs": {}}]'],
     "needs an \"axis\""),
    (["--stablehlo", "CHAIN", "--mesh", "B=4", "--schedule-json",
      '[{"axis": "B", "inputs": {"arg0": "sideways"}}]'], "selector for 'arg0'"),
    (["--function", "no_such_module_xyz:f", "--args", "m:a", "--mesh", "B=4"],
     "cannot import module"),
    (["--function", "json:dumps", "--mesh", "B=4"], "needs --args"),
])
def test_cli_report_rejects_bad_input(chain_mlir, argv, message, capsys):
    argv = [str(chain_mlir) if a == "CHAIN" else a for a in argv]
    assert partir_main(["report", *argv]) == 2
    assert message in capsys.readouterr().err


def test_cli_report_partition_error_is_reported(chain_mlir, capsys):
    rc = partir_main(["report", "--stablehlo", str(chain_mlir), "--mesh", "B=4",
                      "--schedule-json", '[{"axis": "B", "inputs": {"nope": 0}}]'])
    assert rc == 1
    assert "unknown argument name 'nope'" in capsys.readouterr().err


def test_bp_divides_per_device_flops_by_k_and_the_report_shows_it():
    # batch-dominated: 65536 examples through a 32-256-256-8 MLP; shapes only, nothing runs
    model, optimizer = mlp.MLP(hidden=256, layers=3, classes=8), optax.adam(1e-3)
    args = jax.eval_shape(lambda: mlp.init(model, optimizer, batch_size=65536, features=32))
    step = mlp.make_train_step(model, optimizer)
    bp = partir.ManualPartition({"batch": 0}, axis="batch", name="BP")
    traced = trace(step, args)
    empty = partition(traced, Mesh.of({"batch": 8}), [], PartitionOptions(scatter_sums=True))
    empty_flops = estimate(empty.program, "a100-40gb").flops
    meta = report_for_function(step, args, {"batch": 8}, [bp],
                               PartitionOptions(hardware="a100-40gb"))
    base, after = meta.tactics
    assert base.name == BASELINE and after.name == "BP"
    assert base.estimated_flops == empty_flops  # the baseline row is the empty schedule
    assert 6 <= empty_flops / after.estimated_flops <= 8.5
    assert after.estimated_runtime_s < base.estimated_runtime_s
    row = _rows(meta.report())["BP"]
    delta_runtime = next(c for c in row[5:] if c.endswith("x"))
    assert float(delta_runtime[:-1]) < 1.0
    gflop = {name: float(r[-1]) for name, r in _rows(meta.report()).items()}
    assert 6 <= gflop[BASELINE] / gflop["BP"] <= 8.5
