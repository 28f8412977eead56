"""rayflow type-checks clean under the strictness that ``[tool.mypy]`` in pyproject.toml states
(the package ships ``py.typed``, so its users' checkers read these annotations)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("mypy", reason="mypy is in the dev extra")


def _mypy(*args: str) -> subprocess.CompletedProcess:
    # in the checkout, so that pyproject.toml's settings and the incremental cache apply
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=280)


def test_rayflow_type_checks_clean():
    out = _mypy()
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Success: no issues found" in out.stdout


def test_the_check_reports_errors_and_bare_ignores(tmp_path):
    # the gate can fail: a wrong type is an error, and so is an ignore that names no code
    bad = tmp_path / "bad.py"
    bad.write_text('x: int = "a"\ny: int = "b"  # type: ignore\n')
    out = _mypy("--cache-dir", str(tmp_path / "cache"), str(bad))
    assert out.returncode == 1, out.stdout + out.stderr
    assert 'bad.py:1: error: Incompatible types in assignment' in out.stdout
    assert "bad.py:2: error" in out.stdout and "ignore-without-code" in out.stdout
