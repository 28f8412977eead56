"""The docs' runnable examples run (so they cannot rot)."""

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_writing_an_operator_example_runs(ray_session):
    code = re.search(r"```python\n(.*?)```", (DOCS / "operators.md").read_text(), re.S).group(1)
    exec(compile(code, "docs/operators.md", "exec"), {})  # its asserts check the output


def test_readme_stream_example_runs(ray_session):
    readme = (DOCS.parent / "README.md").read_text()
    code = re.search(r"## A stream in ten lines\n\n```python\n(.*?)```", readme, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})


def test_readme_mpi_stage_example_runs(ray_session):
    readme = (DOCS.parent / "README.md").read_text()
    code = re.search(r"## An MPI stage in ten lines\n\n```python\n(.*?)```", readme, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})


def test_readme_exactly_once_example_runs(ray_session):
    readme = (DOCS.parent / "README.md").read_text()
    code = re.search(r"## Windows, state and exactly-once\n\n```python\n(.*?)```", readme,
                     re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})  # its assert checks the committed output


@pytest.mark.slow  # four gangs started one after the other: 30-80 s on 2 cores
def test_hpc_guide_example_runs(ray_session):
    code = re.search(r"```python\n(.*?)```", (DOCS / "hpc.md").read_text(), re.S).group(1)
    exec(compile(code, "docs/hpc.md", "exec"), {})  # its assert checks the solve
