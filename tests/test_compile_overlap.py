"""Issue 23: the per-tactic report's rows are made on another thread while XLA compiles the
step, so a caller who reads the report after compiling does not wait for it; what they read
is what a lazy read on the caller's thread makes."""

from __future__ import annotations

import gc
import json
import threading
import warnings

import jax
import jax.numpy as jnp
import pytest

import partir_plugin as partir
import partir_plugin.report.rows as rows
from partir_plugin.runtime import compile_overlap
from partir_plugin.spmd.rules.halo import HaloWarning

MESH = {"batch": 4, "model": 2}


def _mlp_step():
    def step(w1, w2, x):
        def loss(w1, w2):
            return (jnp.tanh(x @ w1) @ w2).sum()
        g1, g2 = jax.grad(loss, argnums=(0, 1))(w1, w2)
        return w1 - 0.1 * g1, w2 - 0.1 * g2
    args = (jnp.ones((16, 32)) * 0.01, jnp.ones((32, 16)) * 0.02, jnp.ones((8, 16)))
    schedule = [partir.ManualPartition({"x": 0}, axis="batch", name="BP"),
                partir.ManualPartition({"w1": 1, "w2": 0}, axis="model", name="MP")]
    return step, args, schedule


def _made_lazily() -> tuple[str, dict]:
    """The report of a fresh partitioning, made by a read on this thread (nothing queued)."""
    step, args, schedule = _mlp_step()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compile_overlap, "usable_cores", lambda: 1)
        fn, meta = partir.jit(step, MESH, schedule)
        fn.lower(*args)
    assert not meta.tactics.made
    return meta.report(detail=True), meta.to_json()


def _same_json(a: dict, b: dict) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True,
                                                                    default=str)


def test_rows_are_made_while_the_step_compiles_and_read_the_same():
    step, args, schedule = _mlp_step()
    fn, meta = partir.jit(step, MESH, schedule)
    fn.lower(*args).compile()
    compile_overlap.wait(timeout=60)
    assert meta.tactics.made  # before any read: made on the compile's side thread
    text, data = _made_lazily()
    assert meta.report(detail=True) == text
    assert _same_json(meta.to_json(), data)


def test_first_call_compiles_with_the_rows_made_meanwhile():
    step, args, schedule = _mlp_step()
    fn, meta = partir.jit(step, MESH, schedule)
    jax.block_until_ready(fn(*args))
    compile_overlap.wait(timeout=60)
    assert meta.tactics.made
    assert [t.name for t in meta.tactics] == ["BP", "MP"]


def test_a_failure_on_the_side_thread_is_raised_by_the_first_read(monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("simulated failure in a report row")

    monkeypatch.setattr(rows, "tactic_report", broken)
    step, args, schedule = _mlp_step()
    fn, meta = partir.jit(step, MESH, schedule)
    fn.lower(*args).compile()
    compile_overlap.wait(timeout=60)
    assert not meta.tactics.made
    with pytest.raises(RuntimeError, match="simulated failure"):
        meta.report()


def test_one_core_queues_nothing(monkeypatch):
    monkeypatch.setattr(compile_overlap, "usable_cores", lambda: 1)
    step, args, schedule = _mlp_step()
    fn, meta = partir.jit(step, MESH, schedule)
    fn.lower(*args).compile()
    compile_overlap.wait(timeout=60)
    assert not meta.tactics.made
    assert len(meta.tactics) == 2 and meta.tactics[1].name == "MP"  # made on read


def test_a_task_is_dropped_with_its_object():
    ran = threading.Event()

    class Owner:
        def task(self):
            ran.set()

    owner = Owner()
    assert compile_overlap.while_xla_compiles(owner.task)
    del owner
    gc.collect()
    jax.jit(lambda x: x * 3.0).lower(jnp.ones(3)).compile()  # a compile starts the queue
    compile_overlap.wait(timeout=60)
    assert not ran.is_set()


def test_a_read_during_the_side_thread_waits_for_the_same_rows():
    """Two threads reading at once make the rows once."""
    step, args, schedule = _mlp_step()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compile_overlap, "usable_cores", lambda: 1)
        fn, meta = partir.jit(step, MESH, schedule)
        fn.lower(*args)
    made = []
    original = meta.tactics._make

    def counted():
        made.append(threading.current_thread().name)
        return original()

    meta.tactics._make = counted
    side = threading.Thread(target=meta.tactics.make_quietly)
    side.start()
    rows = list(meta.tactics)
    side.join()
    assert len(made) == 1 and rows == list(meta.tactics)


def test_report_rows_lower_without_halo_warnings():
    """A HaloWarning is about the program that runs (its lowering warns once, when
    partitioning); the rows' lowerings of earlier tactics' programs are quiet."""
    def loss(img, ker):
        y = jax.lax.conv_general_dilated(img, ker, (1, 1), ((5, 5), (5, 5)),
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return (y ** 2).sum()

    img, ker = jnp.ones((2, 16, 8, 3)), jnp.ones((11, 11, 3, 4)) * 0.1
    schedule = [partir.ManualPartition({"img": 1}, axis="m", name="H"),
                partir.ManualPartition({"img": 0}, axis="b", name="B")]
    fn, meta = partir.jit(jax.grad(loss, argnums=1), {"m": 4, "b": 2}, schedule)
    with pytest.warns(HaloWarning):
        fn.lower(img, ker)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HaloWarning)
        assert len(meta.report()) > 0
