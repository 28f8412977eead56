"""The checkpoint coordinator, as a state machine, without Ray."""

from rayflow.checkpoint import Abort, Complete, CompletedCheckpoint, Coordinator, Trigger

TASKS = {("src", 0), ("src", 1), ("sink", 0)}


def _complete(c, cid, now):
    acts = []
    for t in sorted(TASKS):
        acts += c.ack(cid, t, f"h-{t[0]}{t[1]}-{cid}", now)
    return acts


def test_periodic_trigger_complete_and_ids_increase():
    c = Coordinator(TASKS, interval_s=2.0)
    assert c.tick(0.0) == [] and c.tick(1.9) == []
    assert c.tick(2.0) == [Trigger(1)]
    assert c.tick(3.0) == []  # one checkpoint in flight at a time
    assert c.ack(1, ("src", 0), "a", 3.1) == []
    assert _complete(c, 1, 3.5)[-1] == Complete(1)
    assert c.latest.checkpoint_id == 1 and c.latest.duration_s == 1.5
    # the interval runs from start to start (Flink's): the next starts 2 s after the first
    assert c.tick(3.9) == [] and c.tick(4.0) == [Trigger(2)]
    # one that takes longer than the interval is followed as soon as it ends
    assert c.tick(6.5) == []
    assert _complete(c, 2, 6.6)[-1] == Complete(2)
    assert c.tick(6.6) == [Trigger(3)]


def test_min_pause_keeps_room_between_checkpoints():
    c = Coordinator(TASKS, interval_s=2.0, min_pause_s=1.0)
    c.tick(0.0)
    assert c.tick(2.0) == [Trigger(1)]
    _complete(c, 1, 3.5)
    assert c.tick(4.0) == [] and c.tick(4.4) == []  # interval passed, the pause has not
    assert c.tick(4.5) == [Trigger(2)]


def test_the_history_says_when_each_task_acknowledged():
    c = Coordinator(TASKS, interval_s=1.0)
    c.tick(0.0)
    c.tick(1.0)
    c.ack(1, ("src", 1), "a", 1.25)
    c.ack(1, ("src", 0), "b", 1.5)
    c.ack(1, ("sink", 0), "c", 3.0)
    assert c.history[0]["acked_s"] == {"sink[0]": 2.0, "src[0]": 0.5, "src[1]": 0.25}


def test_acks_for_other_checkpoints_or_tasks_are_ignored():
    c = Coordinator(TASKS, interval_s=1.0)
    c.tick(0)
    c.tick(1)
    assert c.ack(7, ("src", 0), "x") == []
    assert c.ack(1, ("nope", 0), "x") == []
    assert c.pending.acks == {}


def test_timeout_aborts_and_keeps_the_previous_checkpoint():
    c = Coordinator(TASKS, interval_s=1.0, timeout_s=5.0)
    c.tick(0)
    c.tick(1)
    _complete(c, 1, 1.2)
    assert c.tick(2.2) == [Trigger(2)]
    c.ack(2, ("src", 0), "partial", 2.3)
    assert c.tick(7.3) == [Abort(2, "timeout")]
    assert c.latest.checkpoint_id == 1
    assert c.ack(2, ("src", 1), "late") == []  # late ack of an aborted checkpoint
    assert c.tick(8.3) == [Trigger(3)]


def test_failure_aborts_in_flight():
    c = Coordinator(TASKS, interval_s=1.0)
    c.tick(0)
    assert c.tick(1) == [Trigger(1)]
    assert c.failure(1.5) == [Abort(1, "failure")]
    assert c.tick(2.5) == [Trigger(2)]
    assert [h["status"] for h in c.history] == ["aborted: failure"]


def test_a_finished_task_acknowledges_with_its_final_state():
    c = Coordinator(TASKS, interval_s=1.0, sources={("src", 0), ("src", 1)})
    c.tick(0)
    assert c.tick(1) == [Trigger(1)]
    # src 0 ends before it sees barrier 1: its final state stands in for its ack
    assert c.task_finished(("src", 0), 1.1, "end-0") == []
    c.ack(1, ("src", 1), "s1", 1.2)
    assert c.ack(1, ("sink", 0), "k", 1.3) == [Complete(1, frozenset({("src", 0)}))]
    assert c.latest.handles[("src", 0)] == "end-0" and not c.latest.final
    # checkpoints go on with the remaining source; the finished one is prefilled
    assert c.tick(2.5) == [Trigger(2)]
    assert c.pending.acks == {("src", 0): "end-0"}
    assert c.ack(2, ("src", 0), "ignored", 2.4) == []
    c.ack(2, ("src", 1), "s1b", 2.5)
    assert c.ack(2, ("sink", 0), "k2", 2.6)[0].checkpoint_id == 2


def test_the_final_checkpoint_completes_when_every_task_has_finished():
    c = Coordinator(TASKS, interval_s=0, sources={("src", 0), ("src", 1)})
    assert c.task_finished(("src", 0), 1.0, "a") == []
    assert c.task_finished(("src", 1), 1.1, "b") == []
    assert c.trigger(1.2) == []  # no source can inject a barrier; the sink is still running
    assert c.task_finished(("sink", 0), 1.5, "last-epoch") == [Complete(1, frozenset(TASKS))]
    assert c.latest.final and c.done
    assert c.latest.handles == {("src", 0): "a", ("src", 1): "b", ("sink", 0): "last-epoch"}
    assert c.tick(10) == [] and c.trigger(11) == []  # nothing after the final checkpoint


def test_a_task_that_acked_then_finished_gets_a_final_checkpoint_after():
    c = Coordinator(TASKS, interval_s=1.0, sources={("src", 0), ("src", 1)})
    c.tick(0)
    c.tick(1)
    c.ack(1, ("src", 0), "s0", 1.1)
    c.ack(1, ("src", 1), "s1", 1.1)
    for t, h in [(("src", 0), "e0"), (("src", 1), "e1")]:
        assert c.task_finished(t, 1.2, h) == []
    acts = c.task_finished(("sink", 0), 1.3, "kfinal")  # fills checkpoint 1, then final 2
    assert acts == [Complete(1, frozenset({("sink", 0)})), Complete(2, frozenset(TASKS))]
    assert c.latest.checkpoint_id == 2 and c.latest.final


def test_savepoint_trigger_waits_for_the_checkpoint_in_flight():
    c = Coordinator(TASKS, interval_s=1.0, sources={("src", 0), ("src", 1)})
    c.tick(0)
    assert c.tick(1) == [Trigger(1)]
    assert c.trigger(1.1, savepoint=True) == []
    _complete(c, 1, 1.2)
    assert c.trigger(1.3, savepoint=True) == [Trigger(2, True)]
    _complete(c, 2, 1.4)
    assert c.latest.savepoint and c.latest.checkpoint_id == 2


def test_restored_coordinator_continues_ids():
    c = Coordinator(TASKS, interval_s=1.0, first_id=8)
    c.tick(0)
    assert c.tick(1) == [Trigger(8)]


def test_tasks_stopped_at_a_savepoint_are_finished_but_not_drained():
    """A resume must flush what a savepoint stop kept open, and never what a task that ran
    to its end already flushed."""
    c = Coordinator(TASKS, interval_s=0, sources={("src", 0), ("src", 1)})
    c.task_finished(("src", 0), 1.0, "a", drained=False)
    c.task_finished(("src", 1), 1.0, "b", drained=True)
    c.task_finished(("sink", 0), 1.1, "k", drained=False)
    assert c.latest.final and c.latest.drained == frozenset({("src", 1)})


def test_a_region_restart_aborts_in_flight_and_its_tasks_run_again():
    """A failover region restarts: what is in flight aborts, the region's finished tasks
    count as running again (they report their end anew), the others stay finished."""
    c = Coordinator(TASKS, interval_s=1.0, sources={("src", 0), ("src", 1)})
    c.tick(0)
    c.tick(1)
    _complete(c, 1, 1.1)
    c.task_finished(("src", 0), 1.2, "end-0")
    c.task_finished(("src", 1), 1.3, "end-1")
    assert c.tick(2.3) == []  # no live source: nothing to inject
    assert c.restart({("src", 1)}, 2.4) == []
    assert set(c.finished) == {("src", 0)} and ("src", 1) not in c.drained
    assert c.tick(3.4) == [Trigger(2)]  # the restarted source injects barriers again
    assert c.restart({("src", 1), ("sink", 0)}, 3.5) == [Abort(2, "failure")]
    assert c.latest.checkpoint_id == 1


def test_regions_of_a_plan():
    import rayflow as rf
    from rayflow.runtime.plan import make_plan, regions

    f = rf.Dataflow("r")
    a = f.source("a", rf.MemorySource([1]), parallelism=3).map("m", str)
    a.sink("out", rf.CollectSink(), parallelism=3)
    parts = sorted(sorted(r) for r in regions(make_plan(f)))
    assert parts == [[("a", i), ("m", i), ("out", i)] for i in range(3)]
    assert len(regions(make_plan(f), coupled=["a"])) == 1  # readers sharing splits
    g = rf.Dataflow("b")
    g.source("a", rf.MemorySource([1]), parallelism=2).map("m", str, parallelism=3) \
        .sink("out", rf.CollectSink(), parallelism=3)  # rebalanced: one region
    assert len(regions(make_plan(g))) == 1


def test_the_store_reads_its_newest_checkpoint_only_when_it_is_newer(tmp_path):
    """A recovery asks the store for a checkpoint newer than the one it knows: the store
    answers None without loading a checkpoint that is not newer."""
    from rayflow.checkpoint_store import CheckpointStore

    store = CheckpointStore(str(tmp_path))
    assert store.latest() is None and store.latest(newer_than=0) is None
    for cid in (3, 4):
        store.write(CompletedCheckpoint(cid, {("src", 0): {0: cid}}, 1.0, 2.0),
                    {"job": "demo", "state_backend": "memory"})
    assert store.latest().checkpoint_id == 4
    assert store.latest(newer_than=3).handles == {("src", 0): {0: 4}}
    assert store.latest(newer_than=4) is None and store.latest(newer_than=9) is None


def test_a_lease_read_while_it_is_renewed_is_always_whole(tmp_path):
    """A resume reads the lease a live run renews every second: it sees the old lease or the
    new one, never a file cut short (an empty read failed a resume with a JSON error)."""
    import json
    import threading

    from rayflow.checkpoint_store import CheckpointStore, _read_lease

    store = CheckpointStore(str(tmp_path / "run"))
    store.renew_lease()
    stop = threading.Event()

    def renew():
        while not stop.is_set():
            store.renew_lease()

    t = threading.Thread(target=renew)
    t.start()
    try:
        reads = [_read_lease(store.fs, store.path) for _ in range(3000)]
    finally:
        stop.set()
        t.join()
    assert all(isinstance(json.loads(r)["t"], float) for r in reads)
