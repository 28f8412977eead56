"""Checkpoints that outlive the driver: written under ``state_dir``, resumed by path from a
new driver, with the checkpoint's own settings; cleaned up after a job that finished."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

import rayflow as rf
from rayflow.checkpoint_store import load_checkpoint
from rayflow.connectors.kafka import create_topic, produce, read_values
from rayflow.errors import ConfigError
from rayflow.operators.windows import Count, CountWindow
from rayflow.testing import wait_for

N = 1500
WORDS = [f"k{i}" for i in range(30)]


def _records(n):
    return [json.dumps({"id": i, "w": WORDS[(i * 7) % len(WORDS)]}).encode() for i in range(n)]


def _expected(n):
    counts = Counter(json.loads(r)["w"] for r in _records(n))
    out = Counter()
    for w, c in counts.items():
        for i in range(c // 10):
            out[(w, i, 10)] += 1
        if c % 10:
            out[(w, c // 10, c % 10)] += 1
    return out


FLOW = """
import json, time
import rayflow as rf
from rayflow.operators.windows import Count, CountWindow

def make_flow(bs, topic_in, topic_out, name="durable", delay=0.003):
    flow = rf.Dataflow(name)
    (flow.source("src", rf.KafkaSource(topic_in, bootstrap=bs, bounded=True), parallelism=2)
         .map("parse", lambda r: (time.sleep(delay), json.loads(r)["w"])[1])
         .key_by(lambda w: w)
         .window("count", CountWindow(10), Count())
         .map("fmt", lambda r: json.dumps([r.key, r.start, r.value]).encode())
         .sink("out", rf.KafkaSink(topic_out, bootstrap=bs)))
    return flow
"""


def _make_flow(*args, **kw):
    scope: dict = {}
    exec(compile(FLOW, "durable_flow", "exec"), scope)
    return scope["make_flow"](*args, **kw)


@pytest.fixture(scope="module")
def topic_in(kafka_broker):
    topic = f"durable-in-{time.time_ns()}"
    create_topic(kafka_broker.bootstrap, topic, 2)
    produce(kafka_broker.bootstrap, topic, _records(N), partitions=2)
    return topic


def _headers_of(bs, topic, which):
    """Offsets and epoch headers of the records ``which`` names (for a failure message)."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bs, isolation_level="read_committed",
                      auto_offset_reset="earliest", enable_auto_commit=False)
    tp = TopicPartition(topic, 0)
    c.assign([tp])
    out = []
    for _ in range(10):
        for recs in c.poll(500).values():
            out += [(r.offset, r.headers) for r in recs if tuple(json.loads(r.value)) in which]
    c.close()
    return out


def _got(bs, topic):
    return Counter(tuple(json.loads(v)) for v in read_values(bs, topic, "read_committed"))


@pytest.mark.slow
def test_a_killed_driver_is_resumed_exactly_once_from_the_directory(
        ray_session, kafka_broker, topic_in, tmp_path):
    bs = kafka_broker.bootstrap
    out = f"durable-out-{time.time_ns()}"
    create_topic(bs, out, 1)
    script = tmp_path / "driver.py"
    script.write_text(FLOW + textwrap.dedent(f"""
        import sys
        job = rf.run(make_flow({bs!r}, {topic_in!r}, {out!r}, delay=0.02), background=True,
                     checkpoint={{"interval_s": 0.3, "processing_guarantee": "exactly_once",
                                 "state_dir": {str(tmp_path / "state")!r}}},
                     stream={{"batch_size": 20}})
        print("RUN", job.store_root, flush=True)
        job.wait()
        print("FINISHED", flush=True)
    """))
    env = {**os.environ, "RAYFLOW_RAY__INCLUDE_DASHBOARD": "0"}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("RUN "), line
        run_dir = line.split(maxsplit=1)[1].strip()
        # a few checkpoints, and some output committed: then the driver dies
        wait_for(lambda: len(list(Path(run_dir).glob("chk-*/manifest.json"))) >= 1, 120)
        wait_for(lambda: len(read_values(bs, out, "read_committed")) > 10, 120, every_s=0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and the Ray it started
        proc.wait(30)
    assert len(read_values(bs, out, "read_committed")) < sum(_expected(N).values())
    chk = load_checkpoint(run_dir)
    assert chk.meta["job"] == "durable" and chk.meta["processing_guarantee"] == "exactly_once"
    job = rf.run(_make_flow(bs, topic_in, out), resume_from=run_dir, timeout_s=240,
                 checkpoint={"interval_s": 0.3, "processing_guarantee": "exactly_once",
                             "state_dir": str(tmp_path / "state")},
                 stream={"batch_size": 20})
    assert job.status() == "FINISHED"
    got = _got(bs, out)
    assert got == _expected(N), ("extra", got - _expected(N), "missing", _expected(N) - got,
                                 _headers_of(bs, out, got - _expected(N)), chk.checkpoint_id)


@pytest.mark.slow
def test_resume_uses_the_checkpoints_backend_and_refuses_another_guarantee(
        ray_session, kafka_broker, topic_in, tmp_path):
    bs = kafka_broker.bootstrap
    out = f"durable-rdb-{time.time_ns()}"
    create_topic(bs, out, 1)
    chk = {"interval_s": 0.3, "processing_guarantee": "exactly_once",
           "state_backend": "rocksdb", "state_dir": str(tmp_path / "rdb")}
    job = rf.run(_make_flow(bs, topic_in, out), background=True, checkpoint=chk,
                 stream={"batch_size": 20})
    wait_for(lambda: job.metrics()["out"]["records_in"] > 30, 120)
    job.stop(savepoint=True, timeout_s=120)
    assert job.status() == "STOPPED"
    savepoint = job.last_checkpoint()
    assert savepoint.path and Path(savepoint.path, "manifest.json").exists()
    assert load_checkpoint(savepoint.path).meta["state_backend"] == "rocksdb"
    with pytest.raises(ConfigError, match="processing_guarantee"):
        rf.run(_make_flow(bs, topic_in, out), resume_from=savepoint.path,
               checkpoint={"processing_guarantee": "at_least_once"})
    # no state_backend given: the checkpoint's (rocksdb) is used
    job2 = rf.run(_make_flow(bs, topic_in, out), resume_from=savepoint.path, timeout_s=240,
                  checkpoint={"interval_s": 0.3, "processing_guarantee": "exactly_once"},
                  stream={"batch_size": 20})
    assert job2.config.checkpoint.state_backend == "rocksdb"
    assert _got(bs, out) == _expected(N)


def test_a_finished_job_leaves_no_state_files(ray_session, tmp_path):
    flow = rf.Dataflow("clean")
    (flow.source("in", rf.MemorySource([f"k{i % 17}" for i in range(3000)]))
         .map("slow", lambda w: (time.sleep(0.0005), w)[1])
         .key_by(lambda w: w)
         .window("count", CountWindow(7), Count())
         .sink("out", rf.CollectSink()))
    job = rf.run(flow, checkpoint={"interval_s": 0.2, "state_backend": "rocksdb",
                                   "state_dir": str(tmp_path)}, stream={"batch_size": 50},
                 timeout_s=240)
    assert sum(c["status"] == "completed" for c in job.checkpoints()) >= 2
    assert sum(r.value for r in job.collect("out")) == 3000
    left = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert left == []


def test_savepoint_after_a_bounded_source_finished(ray_session):
    """A finished task acknowledges with its final state: checkpoints and savepoints go on."""
    flow = rf.Dataflow("sp-finished")
    short = flow.source("short", rf.MemorySource(list(range(10))))
    long = flow.source("long", rf.GeneratorSource(lambda i: i, count=10**9, rate=2000))
    short.merge("both", long).map("id", lambda x: x).sink("out", rf.DiscardSink())
    job = rf.run(flow, background=True, checkpoint={"interval_s": 0.2})
    wait_for(lambda: job.metrics()["short"]["records_out"] == 10, 60)
    time.sleep(0.5)
    before = sum(c["status"] == "completed" for c in job.checkpoints())
    wait_for(lambda: sum(c["status"] == "completed" for c in job.checkpoints()) > before, 30)
    job.stop(savepoint=True, timeout_s=60)
    assert job.status() == "STOPPED" and job.last_checkpoint() is not None


def test_resume_from_a_path_with_nothing_there_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="no completed checkpoint"):
        load_checkpoint(str(tmp_path))


def test_a_state_dir_that_cannot_hold_checkpoints_is_a_clear_error(ray_session, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    flow = rf.Dataflow("bad-dir")
    flow.source("in", rf.MemorySource([1, 2])).sink("out", rf.CollectSink())
    with pytest.raises(ConfigError, match="checkpoint.state_dir"):
        rf.run(flow, checkpoint={"state_dir": str(blocker)})
