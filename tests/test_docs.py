"""Every fenced code block of README.md and docs/*.md runs as written, so the docs cannot rot.

Python blocks run in this process, on the test session's Ray, each in a fresh namespace
(their asserts check what the text says). Bash blocks run with ``bash -e`` in a scratch
directory that links the checkout's files (so what they write stays out of the checkout),
with this Python's ``bin`` first on ``PATH``.

A block that must not run says so in an HTML comment on the line above its fence, which the
page's readers do not see:

- ``<!-- docs-test: skip REASON -->``: not run (it needs a cluster, a cloud, or it installs
  packages); the reason is required.
- ``<!-- docs-test: output -->``: a sample of what the block above prints; when that block
  ran, each line of the sample must be in its output.
- ``<!-- docs-test: expect-error -->``: runs and must fail (an error sample follows).
- ``<!-- docs-test: slow -->``: runs, in the slow tests only.

A block with no marker that the harness cannot run (another language, no language) fails
the harness: nothing is skipped silently.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = {"python", "bash"}
MARKS = {"skip", "output", "expect-error", "slow"}
_FENCE = re.compile(r"^```([\w-]*)[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
_MARK = re.compile(r"<!--\s*docs-test:\s*([\w-]+)\s*(.*?)\s*-->")
_OUTPUTS: dict[tuple[str, int], str] = {}  # (page, line) of a block that ran -> its output


@dataclass(frozen=True)
class Block:
    page: str  # relative to the checkout
    line: int  # of the opening fence
    lang: str
    code: str
    mark: str | None
    reason: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    page = str(path.relative_to(ROOT))
    out = []
    for m in _FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = _MARK.search(before)
        out.append(Block(page, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2),
                         mark.group(1) if mark else None, mark.group(2) if mark else ""))
    return out


ALL = [b for p in PAGES for b in blocks(p)]
RUN = [b for b in ALL if b.lang in RUNNABLE
       and b.mark in (None, "slow", "expect-error")]


def _param(b: Block):
    return pytest.param(b, id=b.id, marks=[pytest.mark.slow] if b.mark == "slow" else [])


def test_every_block_is_runnable_or_marked():
    problems = []
    for b in ALL:
        if b.mark is not None and b.mark not in MARKS:
            problems.append(f"{b.id}: unknown marker {b.mark!r} (known: {sorted(MARKS)})")
        elif b.mark == "skip" and not b.reason:
            problems.append(f"{b.id}: 'skip' needs a reason")
        elif b.mark is None and b.lang not in RUNNABLE:
            problems.append(f"{b.id}: a {b.lang or 'plain'} block the harness cannot run: "
                            f"mark it (skip REASON, or output)")
        elif b.mark == "output":
            prev = [a for a in ALL if a.page == b.page and a.line < b.line]
            if not prev or prev[-1].lang not in RUNNABLE:
                problems.append(f"{b.id}: an output sample must follow a code block")
    assert not problems, "\n".join(problems)


def test_the_markers_are_where_the_harness_reads_them():
    # a marker that is not on the line just above a fence would be ignored: none may stray
    for page in PAGES:
        text = page.read_text()
        marked = {b.line for b in blocks(page) if b.mark}
        for m in _MARK.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            assert line + 1 in marked, f"{page.relative_to(ROOT)}:{line}: a marker not " \
                                       f"directly above a fence"


@pytest.mark.parametrize("block", [_param(b) for b in RUN if b.lang == "python"])
def test_python_block_runs(ray_session, block: Block, capsys, monkeypatch):
    # run as a script is: in a __main__ module of its own (dataclasses look their module up;
    # Ray pickles what __main__ defines by value, for its workers)
    module = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(block.code, block.id, "exec"), module.__dict__)
    _OUTPUTS[(block.page, block.line)] = capsys.readouterr().out


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    """A scratch directory that links the checkout's top-level files and folders."""
    for entry in ROOT.iterdir():
        if entry.name not in {".git", ".venv", ".pytest_cache", ".ruff_cache", ".mypy_cache",
                              "build", "dist"} and not entry.name.endswith(".egg-info"):
            (tmp_path / entry.name).symlink_to(entry)
    return tmp_path


@pytest.mark.parametrize("block", [_param(b) for b in RUN if b.lang == "bash"])
def test_bash_block_runs(block: Block, sandbox: Path):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    r = subprocess.run(["bash", "-e", "-c", block.code], cwd=sandbox, env=env,
                       capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    if block.mark == "expect-error":
        assert r.returncode != 0, f"{block.id} should fail:\n{out}"
    else:
        assert r.returncode == 0, f"{block.id} exited {r.returncode}:\n{out}"
    _OUTPUTS[(block.page, block.line)] = out
    _check_sample(block, out)


def _check_sample(block: Block, out: str) -> None:
    after = [b for b in ALL if b.page == block.page and b.line > block.line]
    if after and after[0].mark == "output":
        for line in after[0].code.splitlines():
            if line.strip():
                assert line.strip() in out, f"{after[0].id}: {line.strip()!r} is not in " \
                                            f"what {block.id} printed:\n{out}"
