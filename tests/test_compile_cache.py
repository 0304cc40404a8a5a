"""A partitioned step is the same program in every process, so jax's persistent compilation
cache serves a restarted run (a long training job after a preemption): nothing in the
embedded module may depend on hash seeds, object ids or the order of sets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # fresh processes across hash seeds

CHILD = r"""
import hashlib, json, sys
import jax
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
events = []
jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))
import partir_plugin as partir
from partir_plugin.models import megatron, transformer

config = transformer.Config(layers=2, batch=8)
params, opt_state, batch = transformer.init(config, jax.random.PRNGKey(0))
schedule = [partir.tactic("BP", axis="batch"),
            partir.tactic("MP", megatron.transformer_rule, axis="model"),
            partir.tactic("Z3", axis="batch")]
step, meta = partir.jit(transformer.make_train_step(config), {"batch": 4, "model": 2}, schedule)
lowered = step.lower(params, opt_state, batch)
lowered.compile()
print(json.dumps({"local": hashlib.sha256(lowered.as_text().encode()).hexdigest(),
                  "hits": events.count("/jax/compilation_cache/cache_hits"),
                  "misses": events.count("/jax/compilation_cache/cache_misses")}))
"""


def _run(cache: Path, seed: str, tmp_path: Path) -> dict:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONHASHSEED": seed,
           "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    proc = subprocess.run([sys.executable, str(script), str(cache)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_second_process_compiles_the_step_from_the_persistent_cache(tmp_path):
    cache = tmp_path / "jax-cache"
    first = _run(cache, "1", tmp_path)
    second = _run(cache, "2", tmp_path)  # another hash seed: set and dict orders differ
    assert first["misses"] >= 1 and first["hits"] == 0
    assert second["local"] == first["local"]
    assert second["hits"] >= 1 and second["misses"] == 0
