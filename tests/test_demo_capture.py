"""The demo as a terminal shows it: captures of ``rayflow demo --quick`` in tmux at 80 and 120
columns (``tmux capture-pane -p -J``: wrapped lines joined, so a line wider than the pane
shows as one long line), committed under docs/. Each line fits the width, the run ended
well, and nothing but the demo's own output is there (no warnings from dependencies).

To retake them (about 2 minutes each on 2 cores), for W in 80 120:

    tmux new-session -d -s demo -x $W -y 60
    tmux send-keys -t demo 'rayflow demo --quick; echo demo-exit=$?' Enter
    # ... once demo-exit= shows:
    tmux capture-pane -p -J -t demo -S - > docs/demo-$W.txt; tmux kill-session -t demo
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rich.cells import cell_len

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _lines(width: int) -> list[str]:
    return (DOCS / f"demo-{width}.txt").read_text().rstrip("\n").splitlines()


@pytest.mark.parametrize("width", [80, 120])
def test_the_captured_demo_fits_its_terminal(width):
    lines = _lines(width)
    too_wide = [ln for ln in lines if cell_len(ln.rstrip()) > width]
    assert not too_wide, too_wide


@pytest.mark.parametrize("width", [80, 120])
def test_the_captured_demo_is_clean_and_complete(width):
    lines = [ln.rstrip() for ln in _lines(width)]
    assert "demo-exit=0" in lines
    assert any(ln.startswith("Ray dashboard: http://") for ln in lines)
    body = "\n".join(lines)
    for noise in ("Warning", "WARNING", "INFO", "Traceback", "(raylet)", "pid="):
        assert noise not in body, noise
    checks = [ln for ln in lines if ln.startswith("│ ") and "│" in ln[2:]
              and not ln.startswith("│   ")]
    assert len(checks) == 5 and all(ln.split("│")[2].strip() == "ok" for ln in checks), checks
    for step in ("starting Ray and the embedded Kafka broker", "W4 word count, exactly-once",
                 "W1 image blur", "W5 Cannon and W6 CG", "stream -> MPI stage"):
        assert any(ln.startswith(f"✓ {step} (") for ln in lines), step
    # the progress bars are gone once it ends (a spinner left behind is a broken redraw)
    assert not [ln for ln in lines if re.match("[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏]", ln)]
