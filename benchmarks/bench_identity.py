"""W2 Identity (seed 003: Flink vs Storm), every system measured the same way.

    python benchmarks/bench_identity.py [--quick] [--rounds 3]

Measures, on the embedded Tansu broker and a private local Ray:
  1. in-memory throughput, parallelism 1: a per-record Python function stamping inTime at
     entry and outTime at exit, beside a bare single-process loop doing the same two stamps
     (a columnar identity that passes one numpy array by reference through a chain measures
     nothing, so there is none);
  2. Kafka throughput from a pre-filled topic (1 and 8 partitions), kafka-python and
     confluent-kafka, beside a plain consume -> stamp -> produce loop with the same client and
     settings, and Bytewax and Pathway where installed. Every system writes
     ``msgId,eventTime,inTime,outTime``; the figures come from those stamps read back
     (``_streams``), in interleaved rounds, with start-up apart;
  3. latency p50/p99 at 25/50/75/90 % of the measured capacity, in memory and through Kafka.

W3 (a 1 ms sleep per record) is ``bench_sleep.py``.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _streams as S  # noqa: E402
import click  # noqa: E402
from _common import print_table, ratio, write_result  # noqa: E402
from report.published import W2_IDENTITY as PUBLISHED  # noqa: E402

import rayflow as rf  # noqa: E402
from rayflow._raycontext import ensure_ray  # noqa: E402
from rayflow.connectors.kafka import create_topic, produce  # noqa: E402


def stamp_in(record: bytes) -> bytes:
    """W2's entry: ``msgId,eventTime`` -> ``msgId,eventTime,inTime`` (ms)."""
    return b"%s,%d" % (record, time.time() * 1000)


def stamp_out(record: bytes) -> bytes:
    """W2's exit: append outTime (ms), taken when the record leaves."""
    return b"%s,%d" % (record, time.time() * 1000)


def kafka_stamp(record: bytes, in_time: float, out_time: float) -> bytes:
    """The Kafka sink's stamp: inTime when the record's batch left the source (entry),
    outTime when the sink writes it (exit)."""
    return b"%s,%d,%d" % (record, in_time * 1000, out_time * 1000)


def _messages(n: int) -> list[bytes]:
    now = int(time.time() * 1000)
    return [b"%d,%d" % (i, now) for i in range(n)]


# -- 1. in memory ----------------------------------------------------------------------------

def bare_loop(records: list[bytes]) -> float:
    t0 = time.perf_counter()
    out = []
    append = out.append
    for r in records:
        append(stamp_out(stamp_in(r)))
    return len(records) / (time.perf_counter() - t0)


def in_memory(n: int, rounds: int) -> dict:
    """The per-record function path in one chain, beside a bare loop doing the same two stamps
    per record, in interleaved rounds (the job's own span: first source batch to last write)."""
    records = _messages(n)
    ours, loops, startups = [], [], []
    for k in range(rounds):
        per = rf.Dataflow(f"w2-per-record-{k}")
        (per.source("source", rf.MemorySource(records))
            .map("in", stamp_in)
            .map("out", stamp_out)
            .sink("sink", rf.DiscardSink()))
        job = rf.run(per)
        ours.append(job.throughput())
        startups.append(job.startup_s)
        loops.append(bare_loop(records))
    return {"per_record_rec_s": S.summary(ours), "bare_loop_rec_s": S.summary(loops),
            "per_record_vs_loop": ratio(S.summary(ours)["median"], S.summary(loops)["median"]),
            "startup_s": S.summary(startups)}


# -- 2. Kafka throughput ---------------------------------------------------------------------

def _check(fig: dict, records: list[bytes], n: int) -> dict:
    ids = {r.split(b",", 1)[0] for r in records}
    if len(records) != n or len(ids) != n:
        raise AssertionError(f"{len(records)} records written ({len(ids)} distinct ids) "
                             f"for {n} read")
    return fig


def plain(bs: str, topic: str, n: int, client: str):
    def run(_round: int) -> dict:
        out = S.new_topic(bs, "w2-plain")
        t0 = time.time()
        t_done = S.run_plain("identity", client, bs, topic, out, n)
        recs = S.read_back(bs, out)
        return _check(S.figures(n, recs, S.identity_stamps, t0, t_done), recs, n)
    return run


def rayflow(bs: str, topic: str, n: int, partitions: int, client: str):
    def run(_round: int) -> dict:
        out = S.new_topic(bs, "w2-rf")
        flow = rf.Dataflow(f"w2-kafka-{time.time_ns()}")
        (flow.source("source", rf.KafkaSource(topic, bootstrap=bs, bounded=True, client=client))
             .sink("sink", rf.KafkaSink(out, bootstrap=bs, client=client, stamp=kafka_stamp)))
        t0 = time.time()
        job = rf.run(flow)
        recs = S.read_back(bs, out)
        fig = S.figures(n, recs, S.identity_stamps, t0, job.metrics()["sink"]["delivered_time"])
        fig["job_rec_s"] = round(job.throughput())
        return _check(fig, recs, n)
    return run


def peer(name: str, bs: str, topic: str, n: int):
    from peers_stream import run_peer

    def run(_round: int) -> dict:
        out = S.new_topic(bs, f"w2-{name}")
        r = run_peer(name, "identity", bs, topic, out, n)
        recs = S.read_back(bs, out)
        fig = S.figures(n, recs, S.identity_stamps, r["t_launch"], r["t_done"])
        fig.update(version=r.get("version"), workers=r.get("workers"), notes=r.get("notes"))
        return _check(fig, recs, n)
    return run


def kafka_throughput(bs: str, n: int, partitions: int, client: str, rounds: int,
                     peers: list[str]) -> dict:
    """rayflow and the plain loop with the same client (and the peers), interleaved."""
    topic = S.new_topic(bs, f"w2-in-{client}", partitions)
    produce(bs, topic, _messages(n), partitions, client="confluent")
    systems = {"plain loop": plain(bs, topic, n, client),
               "rayflow": rayflow(bs, topic, n, partitions, client)}
    for p in peers:
        systems[f"{p} (1 worker)"] = peer(p, bs, topic, n)
    print(f"\n{client}, {partitions} partition(s), {n:,} records:")
    res = S.interleaved(systems, rounds)
    base = res["plain loop"]
    rows = [{"system": name, **{k: v for k, v in r.items() if k != "rounds"},
             "vs_loop": S.median_ratio(r, base),
             "delivered_vs_loop": S.median_ratio(r, base, "delivered_rec_s"),
             "rounds": r["rounds"]} for name, r in res.items()]
    ours = res["rayflow"]["rec_s"]["median"]
    return {"client": client, "partitions": partitions, "records": n, "systems": rows,
            "vs_flink": ratio(ours, PUBLISHED["flink_rec_s"]),
            "vs_storm": ratio(ours, PUBLISHED["storm_rec_s"])}


# -- 3. latency ------------------------------------------------------------------------------

def latency_in_memory(rate: float, seconds: float) -> dict:
    flow = rf.Dataflow("w2-latency-memory")
    now = int(time.time() * 1000)
    (flow.source("source", rf.GeneratorSource(lambda i: b"%d,%d" % (i, now), rate=rate))
         .map("in", stamp_in)
         .map("out", stamp_out)
         .sink("sink", rf.DiscardSink()))
    job = rf.run(flow, background=True, stream={"latency_sample_every": 4})
    time.sleep(seconds)
    job.stop()
    return {**job.latency(skip_s=1.0), "achieved_rec_s": round(job.throughput())}


def latency_kafka(bootstrap: str, rate: float, seconds: float, client: str) -> dict:
    tag = f"lat-{client}-{time.time_ns()}"
    create_topic(bootstrap, f"in-{tag}", 1)
    create_topic(bootstrap, f"out-{tag}", 1)
    flow = rf.Dataflow("w2-latency-kafka")
    (flow.source("source", rf.KafkaSource(f"in-{tag}", bootstrap=bootstrap, start="latest",
                                          client=client))
         .map("in", stamp_in)
         .map("out", stamp_out)
         .sink("sink", rf.KafkaSink(f"out-{tag}", bootstrap=bootstrap, client=client)))
    job = rf.run(flow, background=True, stream={"latency_sample_every": 4})
    time.sleep(1.0)
    stop = threading.Event()

    def load():  # the load generator: confluent-kafka, cheap per record, paced in 5 ms steps
        from confluent_kafka import Producer

        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
        t0, sent = time.time(), 0
        while not stop.is_set():
            due = int((time.time() - t0) * rate)
            now = int(time.time() * 1000)
            for i in range(sent, due):
                while True:
                    try:
                        p.produce(f"in-{tag}", b"%d,%d" % (i, now))
                        break
                    except BufferError:
                        p.poll(0.005)
            sent = due
            p.poll(0)
            time.sleep(0.005)
        p.flush()

    th = threading.Thread(target=load, daemon=True)
    th.start()
    time.sleep(seconds)
    stop.set()
    th.join()
    time.sleep(0.5)
    job.stop()
    return {**job.latency(skip_s=1.0), "achieved_rec_s": round(job.throughput())}


@click.command()
@click.option("--quick", is_flag=True, help="Small sizes and one round, for a check.")
@click.option("--rounds", default=3, show_default=True, help="interleaved rounds")
def main(quick: bool, rounds: int) -> None:
    n_mem = 200_000 if quick else 1_000_000
    n_kafka = 50_000 if quick else 300_000
    secs = 3.0 if quick else 6.0
    rounds = 1 if quick else rounds
    ensure_ray(None)
    broker = rf.EmbeddedBroker().start()
    bs = broker.bootstrap
    result: dict = {"published": PUBLISHED, "quick": quick, "rounds": rounds}
    try:
        mem = in_memory(n_mem, rounds)
        result["in_memory"] = mem
        print_table("W2 in memory, parallelism 1 (rec/s, medians)",
                    ["per-record", "bare loop", "per-record / loop", "startup s"],
                    [[mem["per_record_rec_s"]["median"], mem["bare_loop_rec_s"]["median"],
                      mem["per_record_vs_loop"], mem["startup_s"]["median"]]])
        kafka_rows = []
        peers = S.installed_peers()
        for client in ("kafka-python", "confluent"):
            for parts in (1, 8):
                kafka_rows.append(kafka_throughput(
                    bs, n_kafka if client == "kafka-python" else 2 * n_kafka, parts, client,
                    rounds, peers if (client, parts) == ("confluent", 1) else []))
        result["kafka"] = kafka_rows
        print_table("W2 through Kafka, parallelism 1: records / (last outTime - first inTime) "
                    "from the output read back, median (min-max)",
                    ["client", "partitions", "system", "rec/s", "min", "max", "delivered rec/s",
                     "vs loop", "delivered vs loop", "start-up s"],
                    [[k["client"], k["partitions"], r["system"], r["rec_s"]["median"],
                      r["rec_s"]["min"], r["rec_s"]["max"], r["delivered_rec_s"]["median"],
                      r["vs_loop"], r["delivered_vs_loop"], r["startup_s"]["median"]]
                     for k in kafka_rows for r in k["systems"]])
        lat_rows = []
        cap_mem = mem["per_record_rec_s"]["median"]
        cap_kafka = {c: max(next(r["rec_s"]["median"] for r in k["systems"]
                                 if r["system"] == "rayflow")
                            for k in kafka_rows if k["client"] == c)
                     for c in ("kafka-python", "confluent")}
        for frac in (0.25, 0.5, 0.75, 0.9):
            lat_rows.append({"path": "memory", "load": frac, "rate": round(cap_mem * frac),
                             **latency_in_memory(cap_mem * frac, secs)})
        for client in ("kafka-python", "confluent"):
            for frac in (0.25, 0.5, 0.75, 0.9):
                rate = cap_kafka[client] * frac
                lat_rows.append({"path": f"kafka/{client}", "load": frac, "rate": round(rate),
                                 **latency_kafka(bs, rate, secs, client)})
        result["latency"] = lat_rows
        print_table("W2 latency outTime - eventTime (ms); published at full load: "
                    "Flink 50/300, Storm 100/700",
                    ["path", "load", "target rec/s", "achieved", "p50 ms", "p99 ms"],
                    [[r["path"], r["load"], r["rate"], r["achieved_rec_s"], r["p50_ms"],
                      r["p99_ms"]] for r in lat_rows])
    finally:
        broker.stop()
    path = write_result("identity_quick" if quick else "identity", result)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
