"""The README's and docs' Python examples run as written (issue 10: a new user copies them).

Each file's ```python blocks run in order as one script, in a fresh interpreter whose working
directory is an empty folder (so nothing resolves from the repository by accident). A block
fenced ```python fragment is an illustration (it names the user's own objects) and is skipped;
one fenced ```python worker is a program for several processes, which its own test runs
(tests/test_multihost.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # every doc's examples, each in a fresh interpreter

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```python[ \t]*(\S*)[ \t]*\n(.*?)^```", re.M | re.S)
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks(path: Path) -> list[str]:
    return [body for tag, body in BLOCK.findall(path.read_text())
            if tag not in ("fragment", "worker")]


def run_script(source: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the README sets it
    env.pop("PYTHONPATH", None)
    script = cwd / "example.py"
    script.write_text(source)
    return subprocess.run([sys.executable, str(script)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)


def test_the_readme_has_examples_and_fences_are_balanced():
    text = (ROOT / "README.md").read_text()
    assert len(python_blocks(ROOT / "README.md")) >= 3
    assert text.count("```") % 2 == 0


@pytest.mark.parametrize("doc", [d for d in DOCS if python_blocks(d)], ids=lambda d: d.name)
def test_python_blocks_run_as_one_script(doc, tmp_path):
    source = "\n\n".join(python_blocks(doc))
    if "XLA_FLAGS" not in source:  # docs other than the README assume the README's setup
        source = ("import os\nos.environ.setdefault('XLA_FLAGS', "
                  "'--xla_force_host_platform_device_count=8')\n\n" + source)
    proc = run_script(source, tmp_path)
    assert proc.returncode == 0, f"{doc.name}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert "Traceback" not in proc.stderr
