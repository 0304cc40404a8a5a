"""The plugin boundary (issue 10): built-ins load like third-party plugins, through
`partir_plugin.extend`; names are unique across plugins unless overridden on purpose; a
misspelled hook is an error; plugins add CLI subcommands; defaults come from hooks."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from partir_hardware import A100_40GB

import partir_plugin as partir
from partir_plugin import extend
from partir_plugin.errors import PluginError, UnknownNameError
from partir_plugin.plugin import manager

ROOT = Path(__file__).resolve().parents[1]
BUILTIN_PACKAGES = {"partir_tactics", "partir_autopart", "partir_simulators", "partir_hardware",
                    "partir_tmr_rules"}


def test_builtins_are_top_level_packages_loaded_by_entry_point():
    names = dict(manager.loaded_plugins())
    assert set(names.values()) >= BUILTIN_PACKAGES
    for module in BUILTIN_PACKAGES:
        path = Path(__import__(module).__file__).resolve()
        assert ROOT / "plugins" in path.parents or "site-packages" in str(path)
    assert not (ROOT / "partir_plugin" / "plugins").exists()


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


@pytest.mark.parametrize("folder", [*sorted((ROOT / "plugins").glob("*/partir_*")),
                                    ROOT / "tests" / "third_party_plugin"], ids=lambda p: p.name)
def test_plugins_import_only_the_public_modules(folder):
    for path in folder.rglob("*.py"):
        kernel_modules = {m for m in _imports(path) if m.startswith("partir_plugin")}
        assert kernel_modules <= {"partir_plugin", "partir_plugin.extend"}, (path, kernel_modules)


def test_kernel_names_no_builtin_plugin():
    """Defaults and lookups go through hooks: no kernel code (docstrings aside) spells a
    built-in plugin's name or imports one."""
    for path in (ROOT / "partir_plugin").rglob("*.py"):
        if "models" in path.parts or "examples" in path.parts:
            continue
        tree = ast.parse(path.read_text())
        strings = {n.value for n in ast.walk(tree)
                   if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        assert not strings & {"analytical", "host-cpu", "mcts"}, path
        assert not {m.split(".")[0] for m in _imports(path)} & BUILTIN_PACKAGES, path


def test_defaults_come_from_hooks():
    assert manager.default_hardware_name() == "host-cpu"
    assert manager.default_simulator_name() == "analytical"
    assert extend.resolve_hardware(None).name == "host-cpu"
    assert extend.resolve_simulator(None) is manager.simulators()["analytical"]


class _Duplicate:
    @extend.hookimpl
    def partir_add_tactics(self):
        return {"BP": lambda **kw: None}


class _Override:
    @extend.hookimpl
    def partir_add_tactics(self):
        return {"BP": extend.override(lambda **kw: "mine")}

    @extend.hookimpl
    def partir_add_hardware(self):
        return [extend.override(dataclasses.replace(A100_40GB, notes="measured"))]


class _Misspelled:
    @extend.hookimpl
    def partir_add_tactic(self):  # no such hook: must not be ignored silently
        return {}


class _AliasClash:
    @extend.hookimpl
    def partir_add_hardware(self):
        return [dataclasses.replace(A100_40GB, name="my-gpu", aliases=("A100",))]


def _with(monkeypatch, name, plugin):
    pm = manager.build_plugin_manager([(name, plugin)])
    monkeypatch.setattr(manager, "plugin_manager", lambda: pm)


def test_duplicate_names_are_an_error_naming_both_plugins(monkeypatch):
    _with(monkeypatch, "dup", _Duplicate())
    with pytest.raises(PluginError, match=r"'BP'.*'builtin_tactics'.*'dup'.*override"):
        manager.tactic_factories()


def test_override_replaces_on_purpose(monkeypatch):
    _with(monkeypatch, "mine", _Override())
    assert manager.tactic_factories()["BP"]() == "mine"
    assert manager.find_hardware("A100-40GB").notes == "measured"


def test_alias_clash_is_an_error(monkeypatch):
    _with(monkeypatch, "clash", _AliasClash())
    with pytest.raises(PluginError, match=r"'A100'.*'a100-40gb'.*'my-gpu'.*'clash'"):
        manager.find_hardware("a100")


def test_misspelled_hook_is_an_error():
    with pytest.raises(PluginError, match=r"'typo'.*partir_add_tactic"):
        manager.build_plugin_manager([("typo", _Misspelled())])


@pytest.mark.slow  # a subprocess
def test_plugins_add_cli_commands():
    out = subprocess.run([sys.executable, "-m", "partir_plugin.cli", "calibrate", "--help"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "--budget" in out.stdout
    out = subprocess.run([sys.executable, "-m", "partir_plugin.cli", "--help"],
                         capture_output=True, text=True)
    for command in ("report", "reshard-plan", "plugins", "demo", "calibrate"):
        assert command in out.stdout


def test_unknown_names_are_both_key_and_partition_errors():
    with pytest.raises(KeyError):
        manager.find_hardware("tpu-v9")
    with pytest.raises(partir.PartitionError, match="tpu-v9.*a100"):
        manager.find_hardware("tpu-v9")
    assert issubclass(UnknownNameError, KeyError)


def test_collective_kinds_are_one_str_enum():
    kinds = [str(k) for k in extend.Collective if k.counted]
    assert kinds == ["all_gather", "all_reduce", "reduce_scatter", "all_to_all", "all_permute"]
    assert extend.Collective("all_gather") == "all_gather"
