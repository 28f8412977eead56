"""Collectives and point-to-point latency: rayflow's direct channels against mpi4py (MPICH).

    python benchmarks/bench_collectives.py [--quick] [--rounds 3]

2 and 4 ranks on this machine: allreduce of 1 float, 1 KiB, 1 MiB and 64 MiB (not with
``--quick``), bcast of 1 KiB, allgather of 1 float, barrier, and a ping-pong of 8 B and
1 MiB between ranks 0 and 1. Each rank times every repetition itself; the figure is rank
0's median in microseconds, then the median over ``--rounds`` rounds in which rayflow and
``mpiexec`` alternate (with the min-max of each). rayflow all-reduces arrays into a buffer it keeps
(``comm.allreduce(x, out=buf)``), as MPI's buffer ``Allreduce`` does. mpi4py runs the
same loop under ``mpiexec`` with its pickle API (``allreduce``) and its buffer API
(``Allreduce``) when it is installed (the ``peers`` extra), and rayflow's gloo backend
runs it too when torch is (the ``gloo`` extra). Three more tables: which path a
large message should take on one node (ring, shared-memory segment, Ray's object store),
where a small message's time goes, and where a 1 MiB allreduce's goes.
Writes ``benchmarks/results/collectives.json``.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import click  # noqa: E402
import numpy as np  # noqa: E402
from _common import machine_info, print_table, ratio, write_result  # noqa: E402

HERE = Path(__file__).resolve()
KIB, MIB = 1024, 1024 * 1024


def _cases(quick: bool) -> list[tuple[str, int, int]]:
    """(op, payload bytes, repetitions)."""
    small = 1000 if quick else 3000
    cases = [("allreduce", 8, small), ("allreduce", KIB, small), ("allreduce", MIB, 30),
             ("bcast", KIB, small), ("allgather", 8, small), ("barrier", 0, small),
             ("pingpong", 8, small), ("pingpong", MIB, 30)]
    if not quick:
        cases.insert(3, ("allreduce", 64 * MIB, 3))
    return cases


def _payload(nbytes: int):
    return 1.0 if nbytes == 8 else np.ones(nbytes // 8)


def _time_ops(api: dict, rank: int, cases: list) -> dict:
    """Median microseconds of every case on this rank (``api`` adapts one library)."""
    out = {}
    for op, nbytes, reps in cases:
        x = _payload(nbytes)
        fn = api[op]
        api["barrier"](None)
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn(x)
            ts.append(time.perf_counter() - t0)
        out[f"{op} {nbytes}"] = median(ts[len(ts) // 10:]) * 1e6
    return out


def _rayflow_api(comm) -> dict:
    def pingpong(x):
        if comm.rank == 0:
            comm.send(x, 1)
            comm.recv(1)
        elif comm.rank == 1:
            comm.send(comm.recv(0), 0)

    outs: dict = {}

    def allreduce(x):
        # arrays into a buffer of the caller's, as MPI's buffer Allreduce (the MPICH column)
        if not isinstance(x, np.ndarray):
            return comm.allreduce(x)
        out = outs.setdefault(x.nbytes, np.empty_like(x))
        return comm.allreduce(x, out=out)

    return {"allreduce": allreduce, "bcast": lambda x: comm.bcast(x, 0),
            "allgather": comm.allgather, "barrier": lambda x: comm.barrier(),
            "pingpong": pingpong}


def _rayflow_rank(comm, block, cases, paths=True):
    import ray

    out = _time_ops(_rayflow_api(comm), comm.rank, cases)
    if comm.size == 2 and paths:
        out["paths"] = _paths(comm, ray)
    return out


def _paths(comm, ray) -> dict:
    """Ping-pong of large arrays through the ring, a segment, and Ray's object store."""
    from rayflow.hpc.backends import links

    res, keep = {}, links.SEGMENT_BYTES
    try:
        for nbytes in (64 * KIB, 256 * KIB, 512 * KIB, MIB, 4 * MIB, 16 * MIB):
            x = np.ones(nbytes // 8)
            for path in ("ring", "segment", "object store"):
                if path == "ring" and nbytes > 512 * KIB:  # a record must fit the 1 MiB ring
                    continue
                links.SEGMENT_BYTES = 1 << 40 if path == "ring" else 0
                ts = []
                try:
                    _pingpong_path(comm, ray, x, path, ts)
                except Exception as err:  # noqa: BLE001 - a path that cannot run is reported
                    res[f"{path} {nbytes}"] = f"failed: {type(err).__name__}: {err}"[:200]
                    continue
                res[f"{path} {nbytes}"] = median(ts[2:]) * 1e6
    finally:
        links.SEGMENT_BYTES = keep
    return res


def _pingpong_path(comm, ray, x, path, ts) -> None:
        for _ in range(20):
            comm.barrier()
            t0 = time.perf_counter()
            if path == "object store":
                # a ref pickled by Ray's cloudpickle (plain pickle drops its owner); each is
                # held until the peer has read it (the next barrier)
                dumps, loads = ray.cloudpickle.dumps, ray.cloudpickle.loads
                if comm.rank == 0:
                    ref = ray.put(x)
                    comm.send(dumps(ref), 1)
                    ray.get(loads(comm.recv(1)))
                else:
                    ref = ray.put(ray.get(loads(comm.recv(0))))
                    comm.send(dumps(ref), 0)
            elif comm.rank == 0:
                comm.send(x, 1)
                comm.recv(1)
            else:
                comm.send(comm.recv(0), 0)
            ts.append(time.perf_counter() - t0)


def gloo_available() -> bool:
    from rayflow.hpc.backends.gloo_backend import gloo_available as available

    return available()


def run_rayflow(ranks: int, cases: list, backend: str = "ray") -> dict:
    """The cases on a gang of ``ranks`` of ``backend`` (the ring/segment/object-store paths
    only on the Ray-native backend, whose transport has them)."""
    from rayflow.hpc import BlockDataset, Gang, mpimap

    with Gang(ranks, backend=backend, rank_num_cpus=0.25, gang_timeout_s=120) as g:
        t0 = time.perf_counter()
        mpimap(lambda comm, b: comm.allreduce(1.0), BlockDataset.from_numpy(np.zeros(ranks), ranks),
               gang=g)
        first_stage_ms = (time.perf_counter() - t0) * 1e3
        outs = mpimap(_rayflow_rank, BlockDataset.from_numpy(np.zeros(ranks), ranks),
                      fn_args=(cases, backend == "ray"), gang=g).blocks()
    res = outs[0]
    res["stage_on_started_gang_ms"] = first_stage_ms
    return res


def gang_start_s() -> dict:
    """A stage without ``gang=``: cold (new gang) and warm (the pool's gang)."""
    from rayflow.hpc import BlockDataset, mpimap
    from rayflow.hpc.pool import warm_gangs

    ds = BlockDataset.from_numpy(np.zeros(2), 2)
    warm_gangs.clear()
    out = {}
    for name in ("cold", "warm"):
        t0 = time.perf_counter()
        mpimap(lambda comm, b: comm.allreduce(1.0), ds, rank_num_cpus=0.25)
        out[name] = time.perf_counter() - t0
    warm_gangs.clear()
    return out


def message_cost() -> dict:
    """Where a small message's time goes: one process, no waiting (microseconds each)."""
    from rayflow.hpc.backends import shm
    from rayflow.hpc.backends.channels import Endpoint, Mailbox, node_info
    from rayflow.hpc.comm import Communicator

    n = 20000
    infos = [node_info("n"), node_info("n")]
    eps = [Endpoint(r, infos) for r in range(2)]
    ts = [e.connect([e.address for e in eps], Mailbox(), "s") for e in eps]
    key = ("c", ("world",), 1, "allgather")

    def per(fn) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n * 1e6

    ring = ts[1]._ch.rings[0]
    out = {
        "send + recv (transport)": per(lambda: (ts[0].send(1, key, 1.0), ts[1].recv(0, key))),
        "pickle dumps + loads": per(lambda: pickle.loads(pickle.dumps(("s", key, 1.0), 5))),
        "ring write + read": per(lambda: (ts[0]._ch.links[1].ring.try_write1(b"x" * 60),
                                          ring.peek(), ring.commit())),
        "doorbell write": per(lambda: shm.ring_fd(ts[0]._ch.links[1].bell_fd)),
    }
    ts[1]._ch.bell.drain()
    c0, c1 = Communicator(ts[0]), Communicator(ts[1])

    def exchange():  # both halves of a 2-rank allreduce, one after the other
        c0.send(1.0, 1)
        c1.send(2.0, 0)
        c0.recv(1)
        c1.recv(0)

    out["comm.send + comm.recv"] = per(exchange) / 2
    for t in ts:
        t.close()
    return out


def allreduce_cost(nbytes: int = MIB) -> dict:
    """Where a large 2-rank allreduce's time goes, one process, no waiting (microseconds):
    the whole of one rank's half as the communicator runs it, then its parts, and what the
    parts cost before segments were reused and results written into a given buffer."""
    from rayflow.hpc.backends import shm
    from rayflow.hpc.backends.channels import Endpoint, Mailbox, node_info
    from rayflow.hpc.backends.wire import _encode
    from rayflow.hpc.reduce import _Fold

    n = 200
    infos = [node_info("n"), node_info("n")]
    eps = [Endpoint(r, infos) for r in range(2)]
    ts = [e.connect([e.address for e in eps], Mailbox(), "s") for e in eps]
    for t in ts:
        t.release_fds()
    x = [np.full(nbytes // 8, r + 1.0) for r in range(2)]
    outs = [np.empty_like(v) for v in x]
    key = ("c", ("world",), 0, "allreduce")

    def per(fn) -> float:
        fn()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n * 1e6

    def halves(into: bool) -> None:
        ts[0].send_many([1], key, x[0])
        ts[1].send_many([0], key, x[1])
        for r in range(2):
            fold = _Fold("sum", x[r], r, outs[r] if into else None, "allreduce")
            ts[r].recv_apply(1 - r, key, fold.with_peer)

    raw = [memoryview(b"h" * 128), memoryview(x[0]).cast("B")]
    seg = shm.Segment.create(shm.Segment.need(raw))
    address = seg.fill(raw)
    maps = shm.SegmentMaps()
    view = maps.views(address)[1]
    held: list = []

    def fresh_result() -> None:  # a new array each call, kept a while as a caller would
        held.append(np.add(x[0], x[1]))
        del held[:-2]

    def fresh_segment() -> None:
        s, _ = shm.Segment.write(raw)
        s.close()

    def fresh_map() -> None:
        m = shm.SegmentMaps()
        m.views(address)
        m.close()

    out = {
        "one rank's half, into the given buffer": per(lambda: halves(True)) / 2,
        "one rank's half, into a new array": per(lambda: halves(False)) / 2,
        "pickle the array (out of band)": per(lambda: _encode("s", key, x[0])),
        "refill a reused segment": per(lambda: seg.fill(raw)),
        "add from the segment into the buffer": per(
            lambda: np.add(x[0], np.frombuffer(view), out=outs[0])),
        "copy out of the segment (a message kept)": per(lambda: bytearray(view)),
        "before: a new segment, created and filled": per(fresh_segment),
        "before: map a new segment": per(fresh_map),
        "before: add into a new array": per(fresh_result),
    }
    maps.close()
    seg.close()
    for t in ts:
        t.close()
    return out


# ------------------------------------------------------------------------ mpi4py side
def _mpi_worker(cases: list) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()

    def pingpong(x):
        if rank == 0:
            comm.send(x, 1)
            comm.recv(source=1)
        elif rank == 1:
            comm.send(comm.recv(source=0), 0)

    pickled = {"allreduce": comm.allreduce, "bcast": lambda x: comm.bcast(x, 0),
               "allgather": comm.allgather, "barrier": lambda x: comm.barrier(),
               "pingpong": pingpong}
    bufs: dict = {}

    def buf(x):
        x = np.atleast_1d(np.asarray(x, dtype=np.float64))
        k = x.nbytes
        if k not in bufs:
            bufs[k] = (np.empty_like(x), np.empty(comm.Get_size() * x.size))
        return x, *bufs[k]

    def bpingpong(x):
        x, out, _ = buf(x)
        if rank == 0:
            comm.Send(x, 1)
            comm.Recv(out, 1)
        elif rank == 1:
            comm.Recv(out, 0)
            comm.Send(out, 0)

    buffer = {"allreduce": lambda x: comm.Allreduce(buf(x)[0], buf(x)[1]),
              "bcast": lambda x: comm.Bcast(buf(x)[1 if rank else 0], 0),
              "allgather": lambda x: comm.Allgather(buf(x)[0], buf(x)[2]),
              "barrier": lambda x: comm.Barrier(), "pingpong": bpingpong}
    res = {"pickle": _time_ops(pickled, rank, cases), "buffer": _time_ops(buffer, rank, cases)}
    if rank == 0:
        print("MPI-RESULT " + json.dumps(res), flush=True)


def run_mpi(ranks: int, cases: list) -> dict | None:
    import peers

    exe = peers.mpiexec()
    if exe is None:
        return None
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.run([exe, "-n", str(ranks), sys.executable, str(HERE), "--mpi-worker",
                           json.dumps(cases)], capture_output=True, text=True, env=env, timeout=300)
    for line in proc.stdout.splitlines():
        if line.startswith("MPI-RESULT "):
            return json.loads(line[len("MPI-RESULT "):])
    raise RuntimeError(f"mpiexec failed ({proc.returncode}): {proc.stderr[-2000:]}")


def _mid(values: list) -> float | None:
    """The median of the values measured (None where a peer did not run)."""
    got = [v for v in values if v is not None]
    return median(got) if got else None


@click.command()
@click.option("--quick", is_flag=True, help="fewer repetitions, no 64 MiB allreduce")
@click.option("--rounds", default=3, show_default=True,
              help="alternating rounds (rayflow, then mpiexec, per rank count); medians")
@click.option("--mpi-worker", "worker", default=None, hidden=True)
def main(quick: bool, rounds: int, worker: str | None) -> None:
    if worker is not None:
        _mpi_worker([tuple(c) for c in json.loads(worker)])
        return
    from rayflow._raycontext import ensure_ray

    print("machine:", machine_info())
    cases = _cases(quick)
    ensure_ray(None, num_cpus=4, include_dashboard=False)
    gloo = gloo_available()  # the gloo backend's column: with torch (the gloo extra)
    rows, paths, extra = [], {}, {}
    for ranks in (2, 4):
        # rayflow and mpiexec alternate, so that both see the machine's load alike
        runs: list[tuple[dict, dict]] = []
        gloo_runs: list[dict] = []
        for _ in range(rounds):
            ours = run_rayflow(ranks, cases)
            if gloo:
                gloo_runs.append(run_rayflow(ranks, cases, "gloo"))
            mpi = run_mpi(ranks, cases) or {"pickle": {}, "buffer": {}}
            paths = ours.pop("paths", paths)
            runs.append((ours, mpi))
        extra[f"stage_on_started_gang_ms_{ranks}"] = median(
            o.pop("stage_on_started_gang_ms") for o, _ in runs)

        for op, nbytes, _ in cases:
            k = f"{op} {nbytes}"
            ours_k = [o[k] for o, _ in runs]
            buf = [m["buffer"].get(k) for _, m in runs]
            o, p, b = median(ours_k), _mid([m["pickle"].get(k) for _, m in runs]), _mid(buf)
            g = _mid([r.get(k) for r in gloo_runs])
            rows.append({"ranks": ranks, "op": op, "bytes": nbytes, "rayflow_us": o,
                         "rayflow_gloo_us": g, "gloo_vs_buffer": ratio(g, b),
                         "mpi4py_pickle_us": p, "mpi4py_buffer_us": b,
                         "vs_pickle": ratio(o, p), "vs_buffer": ratio(o, b),
                         "rayflow_us_range": [min(ours_k), max(ours_k)],
                         "mpi4py_buffer_us_range": [min(v for v in buf if v is not None),
                                                    max(v for v in buf if v is not None)]
                         if any(v is not None for v in buf) else None})
    starts = gang_start_s()
    cost = message_cost()
    big_cost = allreduce_cost()
    print_table(f"median microseconds per operation (rank 0), median of {rounds} rounds",
                ["ranks", "op", "bytes", "rayflow", "rayflow gloo", "mpi4py pickle",
                 "mpi4py buffer", "x pickle", "x buffer", "rayflow min-max", "buffer min-max"],
                [[r["ranks"], r["op"], r["bytes"], r["rayflow_us"], r["rayflow_gloo_us"],
                  r["mpi4py_pickle_us"], r["mpi4py_buffer_us"], r["vs_pickle"], r["vs_buffer"],
                  "-".join(f"{v:.0f}" for v in r["rayflow_us_range"]),
                  "-".join(f"{v:.0f}" for v in r["mpi4py_buffer_us_range"] or [])]
                 for r in rows])
    print_table("large messages on one node, 2 ranks: ping-pong round trip (us)",
                ["path and bytes", "us"], [[k, v] for k, v in paths.items()])
    print_table("a small message's cost, one process (us)", ["part", "us"],
                [[k, v] for k, v in cost.items()])
    print_table("a 1 MiB allreduce's cost, 2 ranks, one process (us)", ["part", "us"],
                [[k, v] for k, v in big_cost.items()])
    print(f"\nstage on a started gang: {extra}; stage without gang=: cold "
          f"{starts['cold']:.2f} s, warm {starts['warm'] * 1e3:.1f} ms")
    path = write_result("collectives", {"quick": quick, "rounds": rounds, "rows": rows, "large_message_paths_us": paths,
                                        "small_message_cost_us": cost,
                                        "allreduce_1MiB_cost_us": big_cost,
                                        "stage_start_s": starts,
                                        **extra})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
