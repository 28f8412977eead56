"""The checkpoint coordinator, as a state machine, without Ray."""

from rayflow.checkpoint import Abort, Complete, Coordinator, Trigger

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
    assert c.tick(5.0) == [] and c.tick(5.5) == [Trigger(2)]


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


def test_failure_aborts_in_flight_and_finished_sources_stop_triggers():
    c = Coordinator(TASKS, interval_s=1.0)
    c.tick(0)
    assert c.tick(1) == [Trigger(1)]
    assert c.failure(1.5) == [Abort(1, "failure")]
    assert c.tick(2.5) == [Trigger(2)]
    assert c.task_finished(("src", 0), 2.6) == [Abort(2, "src[0] finished")]
    assert c.tick(10) == []
    assert [h["status"] for h in c.history] == ["aborted: failure", "aborted: src[0] finished"]


def test_restored_coordinator_continues_ids():
    c = Coordinator(TASKS, interval_s=1.0, first_id=8)
    c.tick(0)
    assert c.tick(1) == [Trigger(8)]
