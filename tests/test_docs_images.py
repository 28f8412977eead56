"""Every code block of docs/images.md runs as written (so it cannot rot)."""

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "images.md"


def test_every_python_block_of_the_images_doc_runs(ray_session):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 2  # the W1 job and the exact tiling of a fractional kernel
    for i, code in enumerate(blocks):
        exec(compile(code, f"docs/images.md (block {i + 1})", "exec"), {})  # asserts inside


def test_the_images_doc_has_no_other_code_blocks():
    # a block in another language would not be run here: keep them all runnable
    fences = re.findall(r"^```(\w*)$", DOC.read_text(), re.M)
    assert fences[::2] == ["python"] * (len(fences) // 2)
