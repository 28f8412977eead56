"""Files handed out by the source's split enumerator on a real local Ray: readers share the
work, and a failure or a rescale neither loses nor repeats a file (each file is counted
exactly once in restored keyed state)."""

from __future__ import annotations

import time
from collections import Counter

import pytest

import rayflow as rf
from rayflow.connectors.images import DirectorySource
from rayflow.core.operators import StepContext
from rayflow.errors import StepError
from rayflow.operators.stateless import Map
from rayflow.operators.windows import Count, CountWindow
from rayflow.testing import CrashDuringCheckpoint

N = 400
WORDS = [f"w{i % 7}" for i in range(N)]


def _write(d, start, stop):
    d.mkdir(exist_ok=True)
    for i in range(start, stop):
        (d / f"f{i:05d}.txt").write_text(WORDS[i % N])


def _slow_word(record):
    time.sleep(0.003)  # stretch the run over several checkpoints
    return record[1].decode()


def _flow(name, d, read_spec=lambda s: s, **src):
    flow = rf.Dataflow(name)
    (flow.source("read", DirectorySource(str(d), "*.txt", max_batch_bytes=16, **src),
                 parallelism=2)
         .apply("word", read_spec(Map(_slow_word)), parallelism=2)
         .key_by(lambda w: w)
         .window("count", CountWindow(10**9), Count(), parallelism=2)  # emitted at the end
         .map("fmt", lambda r: (r.key, r.value))
         .sink("out", rf.CollectSink()))
    return flow


def test_every_file_counted_once_after_a_reader_crashes(ray_session, tmp_path):
    d = tmp_path / "in"
    _write(d, 0, N)
    flow = _flow("files-crash", d, lambda m: CrashDuringCheckpoint(m, 2, str(tmp_path / "m")))
    job = flow.run(checkpoint={"interval_s": 0.2, "processing_guarantee": "exactly_once"},
                   stream={"batch_size": 4}, timeout_s=120)
    assert len(job.recoveries) == 1 and job.recoveries[0]["restored_checkpoint"] is not None
    assert dict(job.collect("out")) == dict(Counter(WORDS))


@pytest.mark.slow
def test_rescaled_readers_continue_without_loss_or_duplicates(ray_session, tmp_path):
    d = tmp_path / "in"
    _write(d, 0, N // 2)
    first = rf.run(_flow("files-rescale", d, watch=True, poll_interval_s=0.05, settle_s=0.05),
                   background=True, checkpoint={"interval_s": 0.3},
                   stream={"batch_size": 4})
    time.sleep(1.0)
    second = first.rescale({"read": 3, "word": 3})
    _write(d, N // 2, N)  # new files, found by the rescaled readers' enumerator
    deadline = time.time() + 60
    while second.metrics()["word"]["records_out"] < N - first.metrics()["word"]["records_out"] \
            and time.time() < deadline:
        time.sleep(0.2)
    second.stop()
    total = Counter()
    for k, v in first.collect("out") + second.collect("out"):
        total[k] += v
    assert dict(total) == dict(Counter(WORDS))


def test_a_missing_directory_fails_the_job_naming_the_step(ray_session, tmp_path):
    flow = _flow("files-missing", tmp_path / "nope")
    with pytest.raises(StepError, match=r"step 'read'.*is not a directory"):
        flow.run(timeout_s=60)


@pytest.mark.parametrize("readers", [1, 2])  # one reader scans itself; two share an enumerator
def test_a_pattern_that_matches_nothing_fails_the_job_naming_it(ray_session, tmp_path, readers):
    _write(tmp_path, 0, 3)  # .txt files only
    flow = rf.Dataflow(f"files-nomatch-{readers}")
    (flow.source("read", DirectorySource(str(tmp_path), ("*.png", "*.jpg")), parallelism=readers)
         .sink("out", rf.CollectSink()))
    with pytest.raises(StepError, match=r"step 'read'.*no file in .* matches '\*\.png' or "
                                        r"'\*\.jpg'"):
        flow.run(timeout_s=60)
    # watching, an empty directory is fine: files may come
    reader = DirectorySource(str(tmp_path), "*.png", watch=True).build(StepContext("r", 0, 1))
    assert reader.poll(10, 0.0) is None and not reader.exhausted
    with pytest.raises(ValueError, match="pattern must be a glob or a list of globs"):
        DirectorySource(str(tmp_path), ())


def test_a_replaced_reader_gets_no_files_and_its_calls_are_dropped(ray_session, tmp_path):
    """A killed reader's calls may reach the coordinator after the recovery started its
    replacement: they must not take files from the new enumerator (nobody would read them)
    nor overwrite what the new instances report."""
    from rayflow.runtime.coordinator import CoordinatorActor, SplitClient

    d = tmp_path / "in"
    _write(d, 0, 20)
    spec = DirectorySource(str(d), "*.txt")
    coord = CoordinatorActor.remote(1.0, 10.0)
    tasks = [("read", 0), ("read", 1)]
    ray_session.get(coord.start_attempt.remote(0, tasks, {"read": spec.enumerator(2, [])}))
    ray_session.get(coord.start_attempt.remote(1, tasks, {"read": spec.enumerator(2, [])}))
    assert SplitClient(coord, "read", 0, attempt=0).request().result(10) == []
    got = SplitClient(coord, "read", 0, attempt=1).request().result(10)
    assert got and got[0].endswith("f00000.txt")  # the first chunk was not taken before
    coord.position.remote(("read", 1), ["new"], 1)
    ray_session.get(coord.position.remote(("read", 1), ["old"], 0))
    assert ray_session.get(coord.detach.remote())["positions"] == {("read", 1): ["new"]}
    ray_session.kill(coord)
