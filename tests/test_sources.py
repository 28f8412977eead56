"""Every Python file of the project compiles without a warning.

An invalid escape sequence in a string (``"\\ "``, ``"\\d"``) is a DeprecationWarning on
Python 3.11 and a SyntaxWarning on 3.12, printed by every process that imports the module
(each Ray worker too) and an error in a later Python. Compiling with warnings as errors
catches it on any supported Python.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted(p for d in ("rayflow", "benchmarks", "jobs", "tests") for p in (ROOT / d).rglob("*.py"))


def test_the_tree_has_python_files():
    assert len(FILES) > 100


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_compiles_without_warnings(path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compile(path.read_text(encoding="utf-8"), str(path), "exec")


def test_an_invalid_escape_is_caught():
    with warnings.catch_warnings(), pytest.raises((SyntaxError, DeprecationWarning,
                                                    SyntaxWarning)):
        warnings.simplefilter("error")
        compile('x = "a\\ b"\n', "<escape>", "exec")
