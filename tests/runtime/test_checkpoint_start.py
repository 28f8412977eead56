"""The checkpoint clock starts once every task is built: a slow start-up is not a slow
checkpoint."""

import time

import rayflow as rf


class _SlowStartSink(rf.CollectSink):
    """A sink whose client takes seconds to connect (as a Kafka producer's
    ``init_transactions`` can)."""

    def build(self, ctx, resume_state=None):
        time.sleep(3.0)
        return super().build(ctx, resume_state)


def _slow(x):
    time.sleep(0.002)
    return x


def test_the_first_checkpoint_does_not_wait_for_the_tasks_start_up(ray_session):
    flow = rf.Dataflow("slow-start")
    (flow.source("nums", rf.MemorySource(list(range(1500))), batch_size=10)
         .map("slow", _slow)
         .sink("out", _SlowStartSink()))
    job = rf.run(flow, checkpoint={"processing_guarantee": "exactly_once",
                                   "interval_s": 0.2})
    assert sorted(job.collect("out")) == list(range(1500))
    done = [c for c in job.checkpoints() if c["status"] == "completed"]
    assert done and done[0]["id"] == 1, job.checkpoints()
    # triggered before the sink was built, it took the 3 s start-up
    assert done[0]["duration_s"] < 2.0, done[0]
