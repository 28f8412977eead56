"""Stateful streams on the runtime: state backends give identical results; a job stopped
with a savepoint resumes exactly where it stopped; late records get their own output."""

import time
from pathlib import Path

import pytest

import rayflow as rf
from rayflow.operators.windows import Count, CountWindow, EventTime, TumblingWindow

WORDS = [f"w{(i * 7) % 23}" for i in range(4000)]


def _count_flow(name, source):
    flow = rf.Dataflow(name)
    (flow.source("src", source)
         .key_by(lambda w: w)
         .window("count", CountWindow(10), Count(), parallelism=2)
         .map("fmt", lambda r: (r.key, int(r.start), r.value), parallelism=2)
         .sink("out", rf.CollectSink()))
    return flow


@pytest.mark.parametrize("backend", ["memory", "filesystem", "rocksdb"])
def test_state_backends_give_identical_window_results(ray_session, backend, tmp_path):
    if backend == "rocksdb":
        pytest.importorskip("rocksdict")
    job = _count_flow(f"sb-{backend}", rf.MemorySource(WORDS)).run(
        checkpoint={"state_backend": backend, "state_dir": str(tmp_path), "interval_s": 0.2},
        stream={"batch_size": 200}, timeout_s=120)
    out = sorted(job.collect("out"))
    expected = sorted((f"w{k}", s, 10 if s < n // 10 else n % 10)
                      for k in range(23) for n in [WORDS.count(f"w{k}")]
                      for s in range(n // 10 + (1 if n % 10 else 0)))
    assert out == expected


def test_savepoint_stop_and_resume_continues_without_loss_or_duplicates(ray_session):
    src = rf.GeneratorSource(lambda i: f"w{i % 13}", rate=20_000)  # unbounded
    first = rf.run(_count_flow("sp", src), background=True, checkpoint={"interval_s": 0.5})
    time.sleep(1.5)
    first.stop(savepoint=True)
    chk = first.last_checkpoint()
    assert chk is not None
    part1 = first.collect("out")
    assert all(v == 10 for _, _, v in part1)  # no partial windows flushed at a savepoint
    second = rf.run(_count_flow("sp", src), background=True, resume_from=chk,
                    checkpoint={"interval_s": 0.5})
    time.sleep(1.5)
    second.stop()  # a plain stop drains: partial windows are emitted
    part2 = second.collect("out")
    generated = first.metrics()["src"]["records_out"] + second.metrics()["src"]["records_out"]
    counted = sum(v for _, _, v in part1) + sum(v for _, _, v in part2)
    assert counted == generated  # every record counted exactly once across the two runs
    windows = [(k, s) for k, s, _ in part1 + part2]
    assert len(windows) == len(set(windows))  # no window emitted twice
    for k in {k for k, _ in windows}:  # window sequences continue across the restart
        seqs = sorted(s for kk, s in windows if kk == k)
        assert seqs == list(range(len(seqs)))
    assert all(chk.handles[("count", i)] is not None for i in range(2))  # the windows' state


def test_late_records_go_to_the_late_output_counted(ray_session):
    t0 = 1_000.0
    events = [("a", t0 + 1), ("a", t0 + 12), ("a", t0 + 2), ("a", t0 + 25), ("a", t0 + 3)]
    flow = rf.Dataflow("late")
    counts = (flow.source("src", rf.MemorySource(events),
                          watermarks=EventTime(timestamp=lambda r: r[1], max_delay_s=0.0))
                  .key_by(lambda r: r[0])
                  .window("win", TumblingWindow(10.0), Count(), clock=EventTime(),
                          batch_size=1))
    counts.sink("out", rf.CollectSink())
    counts.side("late").sink("late_out", rf.CollectSink())
    job = flow.run(stream={"batch_size": 1}, timeout_s=60)
    assert sorted((r.start - t0, r.value) for r in job.collect("out")) == [
        (0.0, 1), (10.0, 1), (20.0, 1)]
    assert job.collect("late_out") == [("a", t0 + 2), ("a", t0 + 3)]
    assert job.metrics()["win"]["side_records"] == 2


def _kafka_words(bs, prefix, partitions):
    """A new topic holding 3,000 words of 17 kinds over ``partitions``: (topic, words)."""
    from rayflow.connectors.kafka import create_topic, produce

    topic = f"{prefix}-in-{time.time_ns()}"
    create_topic(bs, topic, partitions)
    words = [f"k{(i * 5) % 17}" for i in range(3000)]
    produce(bs, topic, [w.encode() for w in words], partitions=partitions)
    return topic, words


def _slow_decode(w):
    time.sleep(0.001)  # a slow step: the job backpressures
    return w.decode()


def test_rescale_running_job_moves_keyed_state_and_partitions(ray_session, kafka_broker):
    """Parallelism changes on a running job; exactly-once output still matches Python."""
    import json

    from rayflow.connectors.kafka import create_topic, read_values

    bs = kafka_broker.bootstrap
    t_in, words = _kafka_words(bs, "rs", 4)
    t_out = f"rs-out-{time.time_ns()}"
    create_topic(bs, t_out, 1)

    flow = rf.Dataflow("rescale")
    (flow.source("src", rf.KafkaSource(t_in, bootstrap=bs, bounded=True))
         .map("decode", _slow_decode)
         .key_by(lambda w: w)
         .window("count", CountWindow(10), Count())
         .map("fmt", lambda r: json.dumps([r.key, int(r.start), r.value]).encode())
         .sink("out", rf.KafkaSink(t_out, bootstrap=bs)))
    chk = {"processing_guarantee": "exactly_once", "interval_s": 0.3}
    job = rf.run(flow, background=True, checkpoint=chk, stream={"batch_size": 20})
    from rayflow.testing import wait_for

    wait_for(lambda: job.metrics()["count"]["records_in"] > 300)
    job2 = job.rescale({"src": 2, "decode": 2, "count": 3})
    assert job.status() == "STOPPED" and len(job2.hosts) == 2 + 2 + 3 + 1 + 1
    job2.wait(120)
    got = [tuple(json.loads(v)) for v in read_values(bs, t_out)]
    n = {w: words.count(w) for w in set(words)}
    expected = sorted((w, s, 10 if s < n[w] // 10 else n[w] % 10)
                      for w in n for s in range(-(-n[w] // 10)))
    assert sorted(got) == expected


def test_resume_from_an_unaligned_checkpoint_at_other_parallelism(ray_session, kafka_broker):
    """A backpressured job's unaligned checkpoint holds batches in flight to two steps; the job
    is cancelled and resumed from it with both steps at another parallelism: the batches are
    dealt (rebalance) and split by key (hash) to the new instances, and the exactly-once output
    still matches Python."""
    import json

    from rayflow.connectors.kafka import create_topic, read_values
    from rayflow.testing import wait_for

    bs = kafka_broker.bootstrap
    t_in, words = _kafka_words(bs, "ua", 2)
    t_out = f"ua-out-{time.time_ns()}"

    def flow(decode, count):
        f = rf.Dataflow("unaligned-rescale")
        (f.source("src", rf.KafkaSource(t_in, bootstrap=bs, bounded=True))
          .map("decode", _slow_decode, parallelism=decode)
          .key_by(lambda w: w)
          .window("count", CountWindow(10), Count(), parallelism=count)
          .map("fmt", lambda r: json.dumps([r.key, int(r.start), r.value]).encode(),
               parallelism=1)
          .sink("out", rf.KafkaSink(t_out, bootstrap=bs)))
        return f

    def held(chk):
        return {s for h in chk.handles.values() for s, _ in getattr(h, "inflight", {})}

    chk = {"processing_guarantee": "exactly_once", "interval_s": 0.3, "unaligned": True}
    for _ in range(4):  # until the checkpoint it is cancelled at holds batches for both
        create_topic(bs, t_out, 1)
        # channels deep enough that the checkpoint holds batches in flight
        job = rf.run(flow(2, 2), background=True, checkpoint=chk,
                     stream={"batch_size": 20, "channel_calls": 16})
        wait_for(lambda j=job: j.metrics()["count"]["records_in"] > 300)
        wait_for(lambda j=job: j.last_checkpoint() is not None and
                 {"decode", "count"} <= held(j.last_checkpoint()) or j.state != "RUNNING")
        job.cancel()
        latest = job.last_checkpoint()
        if {"decode", "count"} <= held(latest):
            break
        t_out = f"ua-out-{time.time_ns()}"  # (that run's output is not what is checked)
    assert {"decode", "count"} <= held(latest), held(latest)
    job2 = rf.run(flow(3, 1), resume_from=latest, checkpoint=chk, stream={"batch_size": 20})
    assert job2.status() == "FINISHED"
    got = [tuple(json.loads(v)) for v in read_values(bs, t_out, "read_committed")]
    n = {w: words.count(w) for w in set(words)}
    expected = sorted((w, s, 10 if s < n[w] // 10 else n[w] % 10)
                      for w in n for s in range(-(-n[w] // 10)))
    assert sorted(got) == expected


@pytest.mark.parametrize("backend", [pytest.param("filesystem", marks=pytest.mark.slow), "rocksdb"])
def test_subsumed_snapshots_are_deleted(ray_session, backend, tmp_path):
    """Each completed checkpoint deletes the operators' older snapshots: however many
    checkpoints a job takes, an instance keeps the latest (plus at most one in flight)."""
    if backend == "rocksdb":
        pytest.importorskip("rocksdict")
    src = rf.GeneratorSource(lambda i: f"w{i % 13}", rate=20_000)
    job = rf.run(_count_flow(f"gc-{backend}", src), background=True,
                 checkpoint={"state_backend": backend, "state_dir": str(tmp_path),
                             "interval_s": 0.2})
    deadline = time.time() + 60
    while len([c for c in job.checkpoints() if c["status"] == "completed"]) < 6:
        assert time.time() < deadline, job.checkpoints()
        time.sleep(0.2)
    job.stop(savepoint=True)
    latest = job.last_checkpoint()
    for i in range(2):
        kept = sorted(p.name for p in (tmp_path / f"gc-{backend}" / "count" / str(i)).iterdir()
                      if p.name.startswith("chk-"))
        assert 1 <= len(kept) <= 2, kept
        assert Path(latest.handles[("count", i)]).name in kept


def test_a_drained_instance_ends_with_no_state_a_savepoint_keeps_it():
    """An instance that drained at its end of stream has emitted everything and takes no
    more input (a restore marks it finished): its final state is none, so the end of a
    bounded job copies no state. At a savepoint stop (not drained) it keeps its state for
    the resume."""
    from rayflow.config import StreamOptions
    from rayflow.core.operators import StepContext
    from rayflow.core.records import Batch
    from rayflow.runtime.tasks import make_task

    f = rf.Dataflow("t")
    (f.source("s", rf.MemorySource([1])).key_by(str)
      .stateful_map("m", lambda n, r: ((n or 0) + 1, r)).sink("k", rf.CollectSink()))
    for drain in (True, False):
        task = make_task(f.step("m"), StepContext("m", 0, 1), StreamOptions(),
                         coordinator=object())  # (a checkpointed job's task)
        task.connect([], {}, [("s", 0)], {})
        task.push(Batch(["a", "b", "a"], None, 0.0), ("s", 0), 0)
        task._drain = drain
        handle, holds = task._end_of_stream()
        assert not holds
        if drain:
            assert handle is None
        else:
            restored = f.step("m").spec.build(StepContext("m", 0, 1), handle)
            assert dict(restored.state.items()) == {"a": 2, "b": 1}
