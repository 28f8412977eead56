"""Log lines of rayflow's actors reach Ray's worker logs (what `ray job logs` and the
dashboard show), at INFO for what an operator tails."""

from __future__ import annotations

import logging
import re
import time
import uuid
from pathlib import Path

import rayflow as rf
from rayflow import _log


def _no_sevens(x: int) -> int:
    if x % 7 == 0:
        raise ValueError(f"seven divides {x}")
    return x


def _worker_lines(ray, needle: str, timeout_s: float = 60.0) -> list[str]:
    logs = Path(ray._private.worker._global_node.get_logs_dir_path())
    deadline = time.monotonic() + timeout_s
    while True:
        lines = [ln for f in logs.glob("worker-*.err")
                 for ln in f.read_text(errors="replace").splitlines() if needle in ln]
        if lines or time.monotonic() > deadline:
            return lines
        time.sleep(0.5)


def test_dead_letters_are_logged_at_info_in_the_worker_log(ray_session):
    step = f"check-{uuid.uuid4().hex[:8]}"  # names this test's lines among the session's
    flow = rf.Dataflow("logged")
    (flow.source("in", rf.MemorySource(list(range(1, 50))))
         .map(step, _no_sevens, on_error="dead_letter")
         .sink("out", rf.CollectSink()))
    job = rf.run(flow)
    assert len(job.dead_letters()) == 7
    lines = _worker_lines(ray_session, repr(step))
    assert lines, "no log line of the step in the worker logs"
    assert all(ln.startswith("INFO rayflow.runtime.tasks.base: ") for ln in lines), lines
    dead = sum(int(n) for ln in lines for n in re.findall(r": (\d+) dead letters? ", ln))
    assert dead == 7  # every dead letter counted in the lines, per batch
    assert "(first: ValueError: seven divides 7)" in lines[0]


def test_worker_logging_sets_up_the_rayflow_logger_once(monkeypatch):
    logger = logging.getLogger("rayflow")
    before = (list(logger.handlers), logger.level, logger.propagate)
    monkeypatch.setattr(_log, "_installed", False)
    monkeypatch.setenv("RAYFLOW_LOG_LEVEL", "debug")
    try:
        _log.worker_logging()
        _log.worker_logging()
        added = [h for h in logger.handlers if h not in before[0]]
        assert len(added) == 1 and logger.level == logging.DEBUG and not logger.propagate
        assert added[0].formatter._fmt == _log.LOG_FORMAT
        monkeypatch.setattr(_log, "_installed", False)
        monkeypatch.setenv("RAYFLOW_LOG_LEVEL", "loud")  # unknown: INFO
        logger.handlers = list(before[0])
        _log.worker_logging()
        assert logger.level == logging.INFO
    finally:
        logger.handlers, logger.level, logger.propagate = before
