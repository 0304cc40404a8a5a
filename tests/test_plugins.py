"""The plugin manager: built-ins and a third-party plugin installed through an entry point."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PLUGIN_DIR = Path(__file__).parent / "third_party_plugin"


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory):
    """A directory with the example plugin installed (a real wheel install, entry points and
    all), put on sys.path of a fresh interpreter."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--target", str(target), str(PLUGIN_DIR)],
                   check=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(target), env.get("PYTHONPATH", "")])
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    return env


SCRIPT = textwrap.dedent("""
    import jax, numpy as np
    import partir_plugin as partir
    from partir_plugin.plugin import manager
    print("tactics", sorted(manager.tactic_factories()))
    print("hardware", manager.find_hardware("EXAMPLE").name)
    f = lambda x, w: x @ w
    x, w = np.ones((16, 4), np.float32), np.ones((4, 2), np.float32)
    step, meta = partir.jit(f, {"batch": 8}, [partir.tactic("ShardX", axis="batch")])
    out = step(x, w)
    print("spec", meta.in_shardings[0].spec, "ok", bool(np.allclose(out, x @ w)))
""")


@pytest.mark.slow  # a subprocess
def test_third_party_tactic_through_entry_point(plugin_env):
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=plugin_env, capture_output=True,
                         text=True, check=True).stdout
    assert "ShardX" in out and "BP" in out
    assert "hardware example-accelerator" in out
    assert "spec P('batch',) ok True" in out


@pytest.mark.slow  # a subprocess
def test_autoload_can_be_disabled(plugin_env):
    env = dict(plugin_env, PARTIR_DISABLE_PLUGIN_AUTOLOAD="1")
    script = ("from partir_plugin.plugin import manager; t = manager.tactic_factories(); "
              "print(sorted(t)); assert 'ShardX' not in t and 'BP' in t")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert "Z3" in out.stdout


def test_builtin_presets_build_manual_partitions():
    import partir_plugin as partir

    bp = partir.tactic("BP", axis="data", inputs=("batch", "labels"))
    assert isinstance(bp, partir.ManualPartition)
    assert bp.inputs == {"batch": 0, "labels": 0} and bp.axis == "data"
    z2 = partir.tactic("Z2")
    assert z2.inputs["params"] is partir.REPLICATED
    with pytest.raises(partir.PartitionError, match="no tactic preset 'Nope'"):
        partir.tactic("Nope")


@pytest.mark.slow  # a subprocess
def test_cli_lists_plugins():
    out = subprocess.run([sys.executable, "-m", "partir_plugin.cli", "plugins"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "builtin_tactics" in out.stdout
