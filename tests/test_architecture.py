"""The package's architecture, held by import-linter (`make lint`, pyproject.toml): the real tree
keeps every contract, and a copy of the package with a cycle between two siblings breaks them,
also where the layers contract alone would allow it (siblings inside one folder)."""

from __future__ import annotations

import json
import os
import pkgutil
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import partir_plugin

ROOT = Path(__file__).resolve().parents[1]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
LAYERS, ACYCLIC = (next(c for c in CONFIG["contracts"] if c["type"] == kind)
                   for kind in ("layers", "acyclic_siblings"))


def _lint_imports(config: Path, cwd: Path, env: dict[str, str] | None = None
                  ) -> subprocess.CompletedProcess:
    script = "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())"
    return subprocess.run([sys.executable, "-c", script, str(config), "--no-cache", "--no-logo"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _toml(contracts: list[dict]) -> str:
    """A config holding `contracts` over partir_plugin alone (JSON strings, lists and booleans
    are TOML values)."""
    lines = ["[tool.importlinter]", 'root_packages = ["partir_plugin"]']
    for contract in contracts:
        lines += ["", "[[tool.importlinter.contracts]]"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in contract.items()]
    return "\n".join(lines) + "\n"


def test_the_tree_keeps_every_contract():
    out = _lint_imports(ROOT / "pyproject.toml", ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


def test_plugins_boundary_names_every_module_but_extend():
    """The plugins' forbidden list stays complete as modules are added."""
    boundary = next(c for c in CONFIG["contracts"]
                    if c["type"] == "forbidden" and "partir_tactics" in c["source_modules"])
    top = {f"partir_plugin.{m.name}" for m in pkgutil.iter_modules(partir_plugin.__path__)}
    assert set(boundary["forbidden_modules"]) == top - {"partir_plugin.extend"}


@pytest.mark.parametrize("module, cycle, layers_kept", [
    # report.text reads records; records reading text closes a circle inside one folder,
    # which no layer orders: only the acyclic contract sees it.
    ("report/records.py", "from . import text", True),
    # plugin.resolve reads the cost types; cost reading the registry is a circle between
    # top-level siblings (the old hookspecs - kernel - simulation one) and an upward import.
    ("cost.py", "from .plugin import resolve", False),
])
def test_a_cycle_between_siblings_breaks_the_contracts(tmp_path, module, cycle, layers_kept):
    copy = tmp_path / "src"
    shutil.copytree(ROOT / "partir_plugin", copy / "partir_plugin",
                    ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / "partir_plugin" / module
    target.write_text(target.read_text() + f"\n{cycle}  # noqa\n")
    acyclic = {**ACYCLIC, "ancestors": ["partir_plugin"]}
    config = tmp_path / "importlinter.toml"
    config.write_text(_toml([LAYERS, acyclic]))
    out = _lint_imports(config, tmp_path, env={**os.environ, "PYTHONPATH": str(copy)})
    assert out.returncode != 0, out.stdout
    said = " ".join(out.stdout.split())  # the report wraps long contract names
    assert f"{ACYCLIC['name']} BROKEN" in said
    package = "partir_plugin." + module.rsplit("/", 1)[0] if "/" in module else "partir_plugin"
    assert f"No cycles are allowed in {package}." in said
    assert (f"{LAYERS['name']} KEPT" in said) == layers_kept, out.stdout
