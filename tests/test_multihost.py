"""Two processes x 4 CPU devices through jax.distributed (gloo collectives): a BP+MP partitioned
train step on the global 8-device mesh gives jax.jit's numbers. The transport is jax's."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import optax
import pytest

from partir_plugin.examples import mlp

pytestmark = pytest.mark.slow  # two processes joined by jax.distributed

DOC = Path(__file__).resolve().parents[1] / "docs" / "multihost.md"

# Appended to the docs' worker: process 0 writes what it computed, in full.
REPORT = textwrap.dedent("""
    from jax.experimental import multihost_utils

    assert jax.process_count() == 2 and len(jax.devices()) == 8
    full = multihost_utils.process_allgather(params, tiled=True)
    if jax.process_index() == 0:
        np.savez(os.environ["PARTIR_TEST_OUT"], loss=np.asarray(loss),
                 **{f"{k}/{n}": v for k, d in full.items() for n, v in d.items()})
    print("done", jax.process_index())
""")


def docs_worker() -> str:
    """The Python block of docs/multihost.md: the test runs the documented program."""
    blocks = re.findall(r"```python worker\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 1
    return blocks[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_bp_mp_match_jax_jit(tmp_path):
    """docs/multihost.md's worker on 2 processes x 4 CPU devices gives jax.jit's numbers."""
    (tmp_path / "worker.py").write_text(docs_worker() + REPORT)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu", PARTIR_TEST_OUT=str(tmp_path / "out.npz"))
    address = f"127.0.0.1:{_free_port()}"
    procs = [subprocess.Popen([sys.executable, str(tmp_path / "worker.py"), address, str(i)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(2)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=300))
    finally:
        for p in procs:
            p.kill()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        assert "done" in out, out[-2000:]

    model, optimizer = mlp.MLP(hidden=32, layers=3, classes=8), optax.sgd(0.1)
    params, opt_state, batch = mlp.init(model, optimizer, batch_size=64, features=16)
    step = jax.jit(mlp.make_train_step(model, optimizer))
    p_ref, o_ref = params, opt_state
    for _ in range(3):
        p_ref, o_ref, loss_ref = step(p_ref, o_ref, batch)
    got = np.load(tmp_path / "out.npz")
    np.testing.assert_allclose(got["loss"], np.asarray(loss_ref), rtol=1e-5)
    for layer, d in p_ref.items():
        for name, v in d.items():
            np.testing.assert_allclose(got[f"{layer}/{name}"], np.asarray(v), rtol=1e-4,
                                       atol=2e-5)
