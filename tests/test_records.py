"""Every collective traced to its source line, op, phase, reason, tactic and parameter (issue 20).

The model, tests/data/diag_model.py, marks the lines collectives must name with `# DIAG:<name>`
comments; line numbers are read from the file, never written here.
"""

from __future__ import annotations

import collections
import html
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import pytest

import partir_plugin as partir
from partir_plugin.core.mesh import Mesh
from partir_plugin.frontend.trace import key_path_str, trace
from partir_plugin.ir.locations import NO_LOCATIONS_HINT, Phase
from partir_plugin.options import PartitionOptions
from partir_plugin.plugin.resolve import simulate
from partir_plugin.report.records import SCHEMA, Reason
from partir_plugin.spmd.collectives import Collective
from partir_plugin.stages import partition, report_for_function, report_for_stablehlo

MODEL = Path(__file__).parent / "data" / "diag_model.py"
HARDWARE = "host-cpu"  # its spec combines all_reduces: combined slices are traced too
OPTIONS = PartitionOptions(hardware=HARDWARE)


def load_model(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def markers(path: Path) -> dict[str, int]:
    """`# DIAG:<name>` marker -> its line number."""
    found = {}
    for n, text in enumerate(path.read_text().splitlines(), start=1):
        m = re.search(r"# DIAG:(\w+)", text)
        if m:
            found[m.group(1)] = n
    return found


dm = load_model(MODEL, "diag_model")
LINES = markers(MODEL)
BP = partir.ManualPartition({"batch": 0}, axis="batch", name="BP")
MP = partir.ManualPartition({"params": dm.megatron_rule}, axis="model", name="MP")


def param_paths(params) -> set[str]:
    return {"params/" + key_path_str(path)
            for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]}


def in_model(record) -> bool:
    return record.source is not None and Path(record.source.file) == MODEL


@pytest.fixture(scope="module")
def megatron():
    return report_for_function(dm.train_step, dm.example(), {"model": 4}, [MP], OPTIONS)


@pytest.fixture(scope="module")
def bp_mp():
    return report_for_function(dm.train_step, dm.example(), {"batch": 2, "model": 4},
                               [BP, MP], OPTIONS)


def test_megatron_forward_all_reduce_names_each_layers_down_projection(megatron):
    records = megatron.tactics[-1].records
    forward = [r for r in records
               if r.kind == Collective.ALL_REDUCE and r.phase is Phase.FORWARD and
               r.axes == ("model",)]
    assert len(forward) == len(dm.LAYERS)
    for r in forward:
        assert in_model(r) and r.source.line == LINES["down"] and r.source.function == "layer"
        assert r.reason is Reason.PARTIAL_SUM and r.tactic == "MP"
        assert r.op == "stablehlo.dot_general"
    # one per layer: the frame below names the line calling that layer
    assert sorted(r.stack[1].line for r in forward) == [LINES["layer0"], LINES["layer1"]]


def test_megatron_backward_all_reduces_name_their_layers_lines(megatron):
    layer_lines = {LINES["up"], LINES["act"], LINES["down"]}
    backward = [r for r in megatron.tactics[-1].records
                if r.kind == Collective.ALL_REDUCE and r.phase is Phase.BACKWARD]
    assert backward  # the input gradient of the second layer, summed over its hidden units
    for r in backward:
        assert in_model(r) and r.source.line in layer_lines, r
        assert r.stack[1].line in (LINES["layer0"], LINES["layer1"])
        assert r.name_stack.count("transpose(") >= 1


def test_bp_names_the_parameter_of_every_gradient_reduction():
    params, batch = dm.example()
    meta = report_for_function(dm.train_step, (params, batch), {"batch": 8}, [BP], OPTIONS)
    records = meta.tactics[-1].records
    gradients = [r for r in records if r.phase is Phase.BACKWARD]
    assert all(r.kind == Collective.ALL_REDUCE and r.param is not None for r in gradients)
    assert {r.param for r in gradients} == param_paths(params)
    assert len(gradients) == len(param_paths(params))  # one all_reduce per parameter
    (loss,) = [r for r in records if r.phase is Phase.FORWARD]  # ... plus one for the loss
    assert loss.param is None and loss.source.line == LINES["loss"]


def test_a_conflict_is_reported_at_the_matmul_line():
    """Two tactics tile incompatible dimensions of one matmul on the same axis: the first
    loops the matmul over its output columns, the second's tiling of x's contracting
    dimension serves nothing there, so x is gathered back."""
    w = jax.ShapeDtypeStruct((16, 32), "float32")
    x = jax.ShapeDtypeStruct((8, 16), "float32")
    cols = partir.ManualPartition({"w": 1}, axis="a", name="cols")
    rows = partir.ManualPartition({"x": 1}, axis="a", name="contract")
    meta = report_for_function(dm.conflict_step, (w, x), {"a": 4}, [cols, rows], OPTIONS)
    (record,) = meta.tactics[-1].records
    assert record.reason is Reason.CONFLICT and record.tactic == "contract"
    assert in_model(record) and record.source.line == LINES["conflict"]
    assert record.source.function == "conflict_step" and record.param == "x"
    assert f"diag_model.py:{LINES['conflict']} conflict_step" in meta.report(detail=True)


def test_detail_groups_by_line_or_by_layer(megatron):
    by_line = megatron.report(detail=True).splitlines()
    by_layer = megatron.report(detail=True, group_by="layer").splitlines()
    down = f"diag_model.py:{LINES['down']} layer"
    # by line: the down-projection's line heads one group, both layers' all_reduces in it
    assert sum(line.lstrip().startswith(down) for line in by_line) == 1
    # by layer: each call site of the layer function heads its own group
    for call in ("layer0", "layer1"):
        assert sum(line.lstrip().startswith(f"diag_model.py:{LINES[call]} loss_fn")
                   for line in by_layer) == 1


def test_counts_equal_records_for_every_row(bp_mp, megatron):
    for meta in (bp_mp, megatron):
        for row in meta.tactics:
            counted = collections.Counter(str(r.kind) for r in row.records)
            assert {k: v for k, v in row.collectives.items() if v} == dict(counted)
            assert len({r.id for r in row.records}) == len(row.records)


def test_a_tactic_is_credited_with_the_collectives_it_added(bp_mp):
    base, after_bp, after_mp = bp_mp.tactics
    assert not base.records
    assert {r.tactic for r in after_bp.records} == {"BP"}
    assert {r.axes for r in after_mp.records if r.tactic == "MP"} == {("model",)}
    kept = {r.id for r in after_bp.records} & {r.id for r in after_mp.records}
    assert kept and all(r.tactic == "BP" for r in after_mp.records if r.id in kept)


def test_scan_records_count_the_trip_count():
    meta = report_for_function(dm.scan_train_step, dm.scan_example(), {"model": 4}, [MP],
                               OPTIONS)
    forward = [r for r in meta.tactics[-1].records
               if r.kind == Collective.ALL_REDUCE and r.phase is Phase.FORWARD]
    assert len(forward) == 1  # one op in the loop body ...
    assert forward[0].count == len(dm.LAYERS)  # ... run once per layer
    assert forward[0].source.line == LINES["scan_down"]


def test_a_long_loop_is_listed_once_and_expanded_only_in_the_trace(tmp_path):
    """A loop's body is on the timeline once, with its trip count (a 1536-step decode loop
    listed step by step made a report take 30 s); records count every execution and the trace
    file has every iteration."""
    import jax
    import jax.numpy as jnp

    import partir_plugin as partir

    def loop(x, w):  # Megatron inside a loop: one all_reduce per iteration
        return jax.lax.fori_loop(0, 300, lambda i, h: jnp.tanh(h @ w) @ w.T, x)

    x, w = jnp.ones((8, 16)), jnp.ones((16, 32)) / 16
    step, meta = partir.jit(loop, {"m": 4}, [partir.ManualPartition({"w": 1}, axis="m")],
                            hardware=HARDWARE)
    step.lower(x, w)
    row = meta.tactics[-1]
    [reduce] = [r for r in row.records if r.kind == Collective.ALL_REDUCE]
    assert reduce.count == 300
    assert len(row.timeline) < 50
    trace = json.loads(meta.write_trace(tmp_path / "t.json").read_text())
    in_trace = [e for e in trace["traceEvents"]
                if e.get("ph") == "X" and e["cat"] == "collective"]
    assert len(in_trace) == 300


def test_moving_the_model_down_moves_every_line(tmp_path, bp_mp):
    moved_path = tmp_path / "diag_model_moved.py"
    moved_path.write_text("\n" + MODEL.read_text())
    moved = load_model(moved_path, "diag_model_moved")
    meta = report_for_function(moved.train_step, moved.example(), {"batch": 2, "model": 4},
                               [BP, MP], OPTIONS)
    before = {r.id: r for r in bp_mp.tactics[-1].records}
    after = {r.id: r for r in meta.tactics[-1].records}
    assert before.keys() == after.keys()  # same program, same ids
    for rid, r in before.items():
        assert in_model(r) and Path(after[rid].source.file) == moved_path
        assert after[rid].source.line == r.source.line + 1


def test_to_json_has_versioned_records(bp_mp):
    data = json.loads(json.dumps(bp_mp.to_json()))
    assert data["records_schema"] == SCHEMA
    last = data["tactics"][-1]
    assert len(last["records"]) == sum(last["collectives"].values())
    assert {"id", "kind", "axes", "bytes", "count", "est_time_s", "phase", "tactic", "reason",
            "op", "source", "param"} <= set(last["records"][0])


def _final_program_comm_s():
    t = trace(dm.train_step, dm.example())
    part = partition(t, Mesh.of({"batch": 2, "model": 4}), [BP, MP],
                     PartitionOptions(hardware=HARDWARE, scatter_sums=True))
    return simulate(part.program.func, part.program.mesh, HARDWARE).communication_s


def assert_nested(thread: list[dict]) -> None:
    """Complete events on one thread either contain one another or do not overlap (in whole
    nanoseconds, as the viewers keep them)."""
    spans = sorted((round(e["ts"] * 1e3), round((e["ts"] + e["dur"]) * 1e3)) for e in thread)
    open_ends: list[int] = []
    for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
        while open_ends and start >= open_ends[-1]:
            open_ends.pop()
        if open_ends:
            assert end <= open_ends[-1], (start, end, open_ends[-1])
        open_ends.append(end)


def test_trace_of_a_loop_nests_its_body(tmp_path):
    meta = report_for_function(dm.scan_train_step, dm.scan_example(), {"model": 4}, [MP],
                               OPTIONS)
    events = json.loads(meta.write_trace(tmp_path / "t.json").read_text())["traceEvents"]
    compute = [e for e in events if e["ph"] == "X" and e["tid"] == 1 and e["pid"] == 1]
    loops = [e for e in compute if e["name"].startswith("while")]
    assert loops and all(e["name"].endswith(f"x{len(dm.LAYERS)}") for e in loops)
    assert_nested(compute)
    inside = [e for e in compute if e is not loops[0] and
              loops[0]["ts"] <= e["ts"] < loops[0]["ts"] + loops[0]["dur"]]
    assert inside  # the body's kernels, once per layer, within the loop's slice


def test_trace_is_valid_and_its_collectives_add_up(tmp_path, bp_mp):
    path = bp_mp.write_trace(tmp_path / "trace.json")
    data = json.loads(path.read_text())
    assert "metadata" not in data and data["otherData"]["schema"] == "partir.trace/v1"
    events = data["traceEvents"]
    named = {(e["pid"], e.get("tid")) for e in events if e["ph"] == "M"}
    slices = collections.defaultdict(list)
    for e in events:
        assert {"ph", "pid", "ts" if e["ph"] != "M" else "name", "name"} <= set(e)
        if e["ph"] == "X":
            assert (e["pid"], None) in named and (e["pid"], e["tid"]) in named
            slices[e["pid"], e["tid"]].append(e)
    for thread in slices.values():
        assert_nested(thread)
    last_pid = len(bp_mp.tactics)
    comm = [e for e in slices[last_pid, 2]]
    # each slice is written in whole nanoseconds: within a nanosecond per slice
    assert sum(e["dur"] for e in comm) * 1e-6 == pytest.approx(_final_program_comm_s(),
                                                               abs=len(comm) * 1e-9)
    ids = [e["args"]["id"] for e in comm if "id" in e["args"]]
    ids += [m["id"] for e in comm for m in e["args"].get("members", [])]
    assert collections.Counter(ids) == collections.Counter(
        {r.id: r.count for r in bp_mp.tactics[-1].records})
    assert any(e["ph"] == "C" and e["name"] == "live bytes" for e in events)


def test_html_is_self_contained(tmp_path, bp_mp):
    text = bp_mp.write_html(tmp_path / "report.html").read_text()
    assert "<table>" in text and "http://" not in text and "https://" not in text
    assert not re.search(r"<(link|img|iframe)\b|<script[^>]*\bsrc=", text)
    down = MODEL.read_text().splitlines()[LINES["down"] - 1].strip()
    assert html.escape(down) in text  # the costliest collectives show their source


def chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser",
                                                "google-chrome")) if p), None)


@pytest.mark.skipif(chromium() is None, reason="no chromium binary installed (Debian: apt-get "
                    "install chromium)")
@pytest.mark.slow  # a subprocess
def test_html_renders_in_headless_chromium(tmp_path, bp_mp):
    page = bp_mp.write_html(tmp_path / "report.html")
    proc = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=2000",
         "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = re.search(r'data-rendered-rows="(\d+)"', proc.stdout)
    assert m, proc.stdout[:2000]
    assert int(m.group(1)) > len(bp_mp.tactics)  # the tables were laid out with height


def test_stablehlo_file_keeps_locations_only_when_printed_with_them():
    lowered = jax.jit(dm.train_step).lower(*dm.example())
    names = [f"arg{i}" for i in range(len(jax.tree_util.tree_leaves(dm.example())))]
    # leaves in key order per layer: b_up, w_down, w_up (Megatron: 0, 0, 1)
    mp = partir.ManualPartition({f"arg{3 * i + k}": d for i in range(len(dm.LAYERS))
                                 for k, d in enumerate((0, 0, 1))}, axis="model", name="MP")
    with_debug = report_for_stablehlo(lowered.as_text(debug_info=True), {"model": 4}, [mp],
                                      OPTIONS, arg_names=names, baseline=False)
    records = with_debug.tactics[-1].records
    assert records and all(in_model(r) for r in records)
    plain = report_for_stablehlo(lowered.as_text(), {"model": 4}, [mp], OPTIONS,
                                 arg_names=names, baseline=False)
    assert [r.id for r in plain.tactics[-1].records] == [r.id for r in records]
    assert all(r.source is None for r in plain.tactics[-1].records)
    assert NO_LOCATIONS_HINT in plain.report(detail=True)


@pytest.mark.slow  # a subprocess
def test_cli_writes_detail_trace_and_html(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "partir_plugin.cli", "report", "--function",
         "diag_model:train_step", "--args", "diag_model:example", "--mesh", "model=4",
         "--schedule-json", json.dumps([{"name": "MP", "axis": "model",
                                         "inputs": {"params": {n: {"w_down": 0, "w_up": 1}
                                                               for n in dm.LAYERS}}}]),
         "--detail", "--trace", str(tmp_path / "t.json"), "--html", str(tmp_path / "r.html")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(MODEL.parent)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"diag_model.py:{LINES['down']} layer" in out.stdout
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert "<table>" in (tmp_path / "r.html").read_text()


def test_locations_are_parsed_only_when_records_are_read(monkeypatch):
    """Partitioning and the report's rows keep location objects; parsing them (the costly
    part) waits for the first read of `records`, so partitioning time does not move."""
    import partir_plugin.report.records as records

    parsed = []
    parse = records.parse_location
    monkeypatch.setattr(records, "parse_location", lambda loc: parsed.append(loc) or parse(loc))
    meta = report_for_function(dm.train_step, dm.example(), {"batch": 2, "model": 4},
                               [BP, MP], OPTIONS)
    assert meta.report() and not parsed  # rows made, counts and estimates read
    assert meta.tactics[-1].records and parsed


def test_records_are_exported():
    import partir_plugin.extend as extend

    assert partir.CollectiveRecord is extend.CollectiveRecord
    assert partir.SourceLocation is extend.SourceLocation
