"""The runnable examples of docs/streams.md's operator sections run (so they cannot rot);
their asserts check the output against what the text says."""

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "streams.md"
SECTIONS = ["Event time and watermarks", "Windows", "Merge and branch", "Joins",
            "Keyed state: stateful_map", "Process functions and timers", "State time to live",
            "Lookup joins and cached enrichment"]


def _example(section: str) -> str:
    text = DOC.read_text()
    body = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert body, f"docs/streams.md has no section {section!r}"
    code = re.findall(r"```python\n(.*?)```", body.group(1), re.S)
    assert len(code) == 1, f"section {section!r} should have one python example"
    return code[0]


@pytest.mark.parametrize("section", SECTIONS)
def test_streams_doc_example_runs(ray_session, section):
    exec(compile(_example(section), f"docs/streams.md ({section})", "exec"), {})
