"""Running a dataflow: actors up, wired, sources started; the job handle watches and reports.

    job = rayflow.run(flow)                    # run to completion
    job = rayflow.run(flow, background=True)   # returns at once
    job.status(); job.metrics(); job.stop(); job.wait()
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from rayflow._raycontext import ensure_ray
from rayflow.batches import concat
from rayflow.config import RayflowConfig, load_config
from rayflow.dataflow import Dataflow
from rayflow.errors import StepError
from rayflow.metrics import StepCounters, latency_windows, summarize_latency
from rayflow.operators.base import StepContext
from rayflow.runtime.channel import unwrap
from rayflow.runtime.plan import make_plan

POLL_S = 0.5


class Job:
    """Handle of a running (or finished) dataflow job."""

    def __init__(self, flow: Dataflow, config: RayflowConfig):
        self.flow, self.config = flow, config
        self.plan = make_plan(flow)
        self.state = "CREATED"
        self.error: BaseException | None = None
        self.hosts: dict[tuple[str, int], Any] = {}
        self._runs: dict[Any, tuple[str, int]] = {}
        self._finals: dict[tuple[str, int], dict] = {}
        self.started_at = self.ready_at = self.finished_at = None

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> Job:
        ray = ensure_ray(self.config.ray.address, self.config.ray.num_cpus,
                         include_dashboard=self.config.ray.include_dashboard)
        from rayflow.runtime.host import StepHost

        self.started_at = time.time()
        opts = self.config.stream
        steps = {s.step_id: s for s in self.flow.steps}
        for step_id, i in self.plan.instances():
            step = steps[step_id]
            ctx = StepContext(step_id, i, step.parallelism, self.flow.name)
            self.hosts[(step_id, i)] = StepHost.options(
                num_cpus=opts.actor_num_cpus,
                scheduling_strategy="SPREAD",
                name=None,
            ).remote(step, ctx, opts, self.flow.dead_letter_sink)
        handles: dict[str, list[Any]] = defaultdict(list)
        for (step_id, _i), h in self.hosts.items():
            handles[step_id].append(h)
        try:
            ray.get([
                h.connect.remote(self.plan.outputs[key], dict(handles),
                                 self.plan.expected_eos[key])
                for key, h in self.hosts.items()
            ])
        except Exception as exc:  # noqa: BLE001 - a step failed to build (bad config, no topic)
            self._teardown()
            self.state = "FAILED"
            self.error = unwrap(exc)
            raise self.error from None
        self.ready_at = time.time()
        for key, h in self.hosts.items():
            if steps[key[0]].kind == "source":
                self._runs[h.run.remote()] = key
        self.state = "RUNNING"
        return self

    @property
    def startup_s(self) -> float | None:
        """Seconds from ``start`` until every instance was built and wired."""
        return None if self.ready_at is None else self.ready_at - self.started_at

    def wait(self, timeout_s: float | None = None) -> Job:
        """Block until the job finishes; raise :class:`StepError` if a step failed."""
        import ray

        if self.state not in ("RUNNING", "STOPPING"):
            if self.error is not None:
                raise self.error
            return self
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        sinks = [h for (s, _), h in self.hosts.items() if self.flow.step(s).kind == "sink"]
        done_refs = [h.wait_done.remote() for h in sinks]
        pending = list(self._runs) + done_refs
        while pending:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.flow.name!r} still running after {timeout_s}s")
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
            for ref in ready:
                try:
                    ray.get(ref)
                except Exception as exc:  # noqa: BLE001
                    self._finish_failed(unwrap(exc))
            if pending:
                self._check_failures()
        self._collect()
        self.state = "STOPPED" if self.state == "STOPPING" else "FINISHED"
        self.finished_at = time.time()
        self._teardown()
        return self

    def stop(self, timeout_s: float | None = 60.0) -> Job:
        """Graceful stop: sources end their streams, everything in flight is processed."""
        import ray

        if self.state == "RUNNING":
            self.state = "STOPPING"
            ray.get([self.hosts[k].stop.remote() for k in self._runs.values()])
        return self.wait(timeout_s)

    def cancel(self) -> None:
        """Kill every actor now; in-flight records are lost."""
        self.state = "CANCELLED"
        self._teardown()

    def status(self) -> str:
        return self.state

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc) -> None:
        if self.state in ("RUNNING", "STOPPING"):
            self.cancel()

    def _check_failures(self) -> None:
        import ray

        statuses = ray.get([h.status.remote() for h in self.hosts.values()])
        for st in statuses:
            if st["error"] is not None:
                self._finish_failed(st["error"])

    def _finish_failed(self, exc: BaseException) -> None:
        if not isinstance(exc, StepError):
            exc = StepError("?", -1, "-", f"{type(exc).__name__}: {exc}")
        self.error = exc
        self.state = "FAILED"
        try:
            self._collect()
        except Exception:  # noqa: BLE001 - keep the first error
            pass
        self.finished_at = time.time()
        self._teardown()
        raise exc

    def _collect(self) -> None:
        import ray

        keys = list(self.hosts)
        finals = ray.get([self.hosts[k].final.remote() for k in keys], timeout=60)
        self._finals = dict(zip(keys, finals))

    def _teardown(self) -> None:
        import ray

        for h in self.hosts.values():
            try:
                ray.kill(h, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.hosts.clear()

    # -- results -------------------------------------------------------------------------
    def collect(self, step_id: str) -> Any:
        """Records a :class:`CollectSink` step received, instance 0 first."""
        parts = [f["result"] for (s, i), f in sorted(self._finals.items()) if s == step_id]
        parts = [p for p in parts if p is not None]
        return concat(parts) if parts else []

    def dead_letters(self) -> list:
        """Dead letters kept by every step (all are counted; at most 10,000 per instance kept)."""
        return [d for f in self._finals.values() for d in f["dead_letters"]]

    def metrics(self) -> dict[str, dict]:
        """Per-step counters summed over instances (live while running, final after)."""
        if self.hosts and self.state in ("RUNNING", "STOPPING"):
            import ray

            keys = list(self.hosts)
            live = ray.get([self.hosts[k].status.remote() for k in keys])
            per = {k: st["counters"] for k, st in zip(keys, live)}
        else:
            per = {k: f["counters"] for k, f in self._finals.items()}
        out: dict[str, StepCounters] = {}
        for (step_id, _), d in per.items():
            c = StepCounters(**{**d, "first_in_time": d["first_in_time"] or float("inf")})
            out[step_id] = out[step_id].merge(c) if step_id in out else c
        return {s: c.as_dict() for s, c in out.items()}

    def latency(self, skip_s: float = 0.0) -> dict:
        """outTime - eventTime over all sinks: p50/p90/p99/max in ms."""
        return summarize_latency([f["latency"] for f in self._finals.values()], skip_s)

    def latency_windows(self, window_s: float = 1.0) -> list[dict]:
        return latency_windows([f["latency"] for f in self._finals.values()], window_s)

    def throughput(self, step_id: str | None = None) -> float:
        """Records / (last outTime - first inTime), over the sinks (or one sink step)."""
        m = self.metrics()
        sinks = [s.step_id for s in self.flow.steps if s.kind == "sink"]
        chosen = [step_id] if step_id else sinks
        n = sum(m[s]["records_in"] for s in chosen)
        first = min((m[s]["first_in_time"] or float("inf")) for s in chosen)
        last = max(m[s]["last_out_time"] for s in chosen)
        return n / (last - first) if last > first else 0.0


def run(flow: Dataflow, *, config: RayflowConfig | None = None, background: bool = False,
        timeout_s: float | None = None, **overrides: Any) -> Job:
    """Run ``flow`` and return its :class:`Job`.

    Args:
        flow: the dataflow.
        config: the configuration; ``load_config(**overrides)`` when None.
        background: return as soon as the job runs (then ``job.wait()`` or ``job.stop()``).
        timeout_s: how long ``wait`` may take when not in the background.
        **overrides: configuration sections, e.g. ``stream={"batch_size": 1000}``.
    """
    config = config or load_config(**overrides)
    job = Job(flow, config).start()
    if not background:
        job.wait(timeout_s)
    return job
