"""runtime/partitioner.py: partir.jit compiles its embedding with GSPMD and the user's step
is still traced with Shardy. The compiled program must be the one Shardy gave (the switch
only saves XLA partitioning work), and the user's own setting must survive every call."""

from __future__ import annotations

import collections
import contextlib
import re

import jax
import optax
import pytest
from jax._src import config

import partir_plugin as partir
from partir_plugin.examples import mlp
from partir_plugin.runtime import partitioner

MESH = {"batch": 4, "model": 2}
_INSTR = re.compile(r"= (\S+) ([\w-]+)\(")
_COLLECTIVE = re.compile(r"(all-reduce|all-gather|reduce-scatter|all-to-all|"
                         r"collective-permute)(?:-start)?\(.*?(replica_groups=\S+|"
                         r"source_target_pairs=\S+)")


def _step():
    model, optimizer = mlp.MLP(hidden=32, layers=3, classes=8), optax.adam(1e-3)
    args = mlp.init(model, optimizer, batch_size=64, features=16)
    schedule = [partir.tactic("BP", axis="batch"),
                partir.tactic("MP", rule=mlp.megatron_rule, axis="model"),
                partir.tactic("Z3", axis="batch")]
    return mlp.make_train_step(model, optimizer), args, schedule


def _shape(text: str) -> tuple:
    """(opcode, result type) of every instruction, and the collectives with their groups:
    the compiled program up to instruction names and metadata."""
    return (collections.Counter((m[2], m[1]) for m in _INSTR.finditer(text)),
            sorted(_COLLECTIVE.findall(text)))


@pytest.mark.skipif(partitioner.STATE is None, reason="jax has no jax_use_shardy_partitioner")
def test_the_compiled_program_is_the_one_shardy_compiles(monkeypatch):
    step, args, schedule = _step()
    ours = partir.jit(step, MESH, schedule)[0].lower(*args).compile().as_text()
    monkeypatch.setattr(partitioner, "embedding", contextlib.nullcontext)
    jax.clear_caches()
    step, args, schedule = _step()
    shardy = partir.jit(step, MESH, schedule)[0].lower(*args).compile().as_text()
    assert _shape(ours) == _shape(shardy)
    assert _shape(ours)[1], "no collective: the schedule did not partition"


@pytest.mark.skipif(partitioner.STATE is None, reason="jax has no jax_use_shardy_partitioner")
def test_the_users_setting_survives_calls_and_the_step_is_traced_with_shardy(monkeypatch):
    import partir_plugin.api as api

    seen = []
    real_trace = api.trace

    def trace(*a, **k):
        seen.append(config.use_shardy_partitioner.value)
        return real_trace(*a, **k)

    monkeypatch.setattr(api, "trace", trace)
    step, args, schedule = _step()
    fn, _ = partir.jit(step, MESH, schedule)
    before = config.use_shardy_partitioner.value
    jax.block_until_ready(fn(*args))
    jax.block_until_ready(fn(*args))
    fn.lower(*args).compile()
    assert config.use_shardy_partitioner.value == before
    assert seen and all(seen), seen
