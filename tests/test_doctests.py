"""The examples in rayflow's docstrings run as written, and every module imports without
starting Ray (so that documentation tools and the examples themselves can import them)."""

from __future__ import annotations

import doctest
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "rayflow"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = sorted(_module_name(p) for p in PKG.rglob("*.py"))
WITH_EXAMPLES = sorted(_module_name(p) for p in PKG.rglob("*.py") if ">>> " in p.read_text())


def test_every_module_imports_without_starting_ray():
    code = ("import importlib, sys\n"
            f"for name in {MODULES!r}:\n"
            "    importlib.import_module(name)\n"
            "import ray\n"
            "print(ray.is_initialized())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False", "importing rayflow started Ray"


@pytest.mark.parametrize("name", WITH_EXAMPLES)
def test_docstring_examples_run(name, capsys):
    module = importlib.import_module(name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in doctest.DocTestFinder().find(module, name):
        runner.run(test)
    result = runner.summarize(verbose=False)
    report = capsys.readouterr().out
    assert result.attempted > 0, f"{name} has '>>> ' in its text but no example doctest finds"
    assert result.failed == 0, report
