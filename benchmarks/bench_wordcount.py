"""W4 windowed word count (seed 003), Kafka to Kafka, every system measured the same way.

    python benchmarks/bench_wordcount.py [--quick] [--rounds 3]

On the embedded broker and a private local Ray. The input is realistic text: sentences of 16
words drawn by Zipf's law from a 10,000-word vocabulary (the anchor data: ~1,000 distinct
words, ~16 a sentence), the same pre-filled topic for every system. Each system writes the
same window records (word, window, count, min/max eventTime, min/max inTime, outTime); the
figures come from those records read back (``_streams``): sentences / (last outTime - first
inTime), a "delivered" figure up to the final flush or commit, and start-up apart. Systems
run in interleaved rounds; medians with the min-max are reported.

Systems: a plain confluent-kafka loop (consume -> parse -> count -> produce in one process,
the same client and settings as rayflow's connectors); rayflow at parallelism 1 (every step
chained in one process), 1 split (the window in a second process), 2 and 4; Bytewax and
Pathway where installed; the guarantees and state backends at parallelism 1 (exactly-once
and at-least-once also on ``LONG_FACTOR`` times the sentences); a 10^6-word
vocabulary (per-record state access) on the memory and RocksDB backends; kafka-python beside
its own plain loop; the time back to full rate after a failure.
"""

from __future__ import annotations

import pickle
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _streams as S  # noqa: E402
import click  # noqa: E402
from _common import print_table, ratio, write_result  # noqa: E402
from report.published import W4_WORDCOUNT as PUBLISHED  # noqa: E402

import rayflow as rf  # noqa: E402
from rayflow._raycontext import ensure_ray  # noqa: E402
from rayflow.connectors.kafka import produce  # noqa: E402
from rayflow.examples.wordcount import build_flow, sentences  # noqa: E402

WORDS_PER_SENTENCE = 16
# exactly-once against at-least-once also runs on this many times the sentences: the sink
# writes each epoch once its checkpoint is durable, so the epochs not yet written when the
# input ends are written after it (0.19-0.83 s on the 2-core VM), an end that a 1.5 s run
# cannot amortize and a long one does
LONG_FACTOR = 5


def word_counts(records: list[bytes]) -> dict[str, int]:
    """How often each word occurs in the input."""
    import json
    from collections import Counter

    return dict(Counter(w for r in records for w in json.loads(r)["sentence"].split()))


def _check(fig: dict, records: list[bytes], counts: dict[str, int], partial: bool = True) -> dict:
    """Every word of the input counted once: the windows' counts sum to the words (to the
    words in complete windows, for a peer that, having no count window of its own, emits
    none for a word's last, unfinished one)."""
    import json

    counted = sum(json.loads(r)["count"] for r in records)
    fig["words_counted"] = counted
    want = sum(counts.values()) if partial else sum(10 * (c // 10) for c in counts.values())
    if counted != want:
        raise AssertionError(f"{counted} words counted, {want} expected")
    return fig


def plain(bs: str, topic: str, n: int, client: str, counts: dict[str, int]):
    def run(_round: int) -> dict:
        out = S.new_topic(bs, "wc-plain")
        t0 = time.time()
        t_done = S.run_plain("wordcount", client, bs, topic, out, n)
        recs = S.read_back(bs, out)
        return _check(S.figures(n, recs, S.wordcount_stamps, t0, t_done), recs, counts)
    return run


def rayflow(bs: str, topic: str, n: int, counts: dict[str, int], parallelism: int = 1,
            split: bool = False,
            guarantee: str = "at_least_once", backend: str = "memory", state_dir: str = "",
            client: str = "confluent"):
    def run(_round: int) -> dict:
        out = S.new_topic(bs, "wc-rf")
        flow = build_flow(topic, out, bs, parallelism, name=f"wc-{time.time_ns()}",
                          client=client, split=split)
        t0 = time.time()
        job = rf.run(flow, background=True,
                     checkpoint={"processing_guarantee": guarantee,
                                 "state_backend": backend, "state_dir": state_dir,
                                 "interval_s": 0.5})
        processes = len(job.actors())  # while it runs: its actors are gone after the end
        job.wait()
        m = job.metrics()["sink"]
        recs = S.read_back(bs, out)
        fig = _check(S.figures(n, recs, S.wordcount_stamps, t0, m["delivered_time"]), recs,
                     counts)
        if "span_s" in fig:  # from the last record out to the final flush or commit returned
            fig["end_s"] = round(fig["delivered_s"] - fig["span_s"], 3)
        chks = sorted(c["duration_s"] for c in job.checkpoints() if c["status"] == "completed")
        latest = job.last_checkpoint()
        fig.update(job_rec_s=round(job.throughput()), checkpoints=len(chks),
                   checkpoint_ms_median=round(1000 * chks[len(chks) // 2], 1) if chks else None,
                   checkpoint_handle_bytes=len(pickle.dumps(latest.handles)) if latest else 0,
                   processes=processes)
        return fig
    return run


def peer(name: str, bs: str, topic: str, n: int, counts: dict[str, int]):
    from peers_stream import run_peer

    def run(_round: int) -> dict:
        out = S.new_topic(bs, f"wc-{name}")
        r = run_peer(name, "wordcount", bs, topic, out, n)
        recs = S.read_back(bs, out)
        fig = _check(S.figures(n, recs, S.wordcount_stamps, r["t_launch"], r["t_done"]), recs,
                     counts, partial=False)
        fig.update(version=r.get("version"), workers=r.get("workers"), notes=r.get("notes"))
        return fig
    return run


def recovery_run(bs: str, n: int, client: str) -> dict:
    """Back to full rate after a failure, at default settings (checkpoints every 2 s,
    at-least-once): the window actor is killed mid-stream; the sink's output rate is sampled
    every 0.1 s. Full rate: the mean rate over the 1.5 s before the kill. Reported: seconds
    from the kill until a 0.5 s window runs at >= 80% of it again."""
    import threading

    import ray

    topic, out = S.new_topic(bs, "wc-rin"), S.new_topic(bs, "wc-rout")
    produce(bs, topic, sentences(n, vocabulary=10_000, words=WORDS_PER_SENTENCE),
            client="confluent")
    job = rf.run(build_flow(topic, out, bs, 1, name=f"wc-rec-{time.time_ns()}", client=client,
                            split=True), background=True)
    waiter = threading.Thread(target=job.wait, daemon=True)
    waiter.start()
    samples: list[tuple[float, int, int]] = []  # (time, generation, sink records)
    t_kill = None
    t0 = time.monotonic()
    while waiter.is_alive() and time.monotonic() - t0 < 120:
        gen = len(job.recoveries)
        try:
            count = job.metrics()["sink"]["records_in"]
            samples.append((time.monotonic(), gen, count))
        except Exception:  # noqa: BLE001 - an instance is gone: no sample
            pass
        if t_kill is None and samples and samples[-1][2] > 0 and \
                time.monotonic() - next(t for t, _, c in samples if c > 0) > 2.0:
            t_kill = time.monotonic()
            ray.kill(job.hosts[("count", 0)], no_restart=True)
        time.sleep(0.1)
    waiter.join(timeout=120)

    def rate(lo: float, hi: float) -> float | None:
        pts = [(t, g, c) for t, g, c in samples if lo <= t <= hi]
        gens = {g for _, g, _ in pts}
        if len(pts) < 2 or len(gens) != 1:
            return None
        return (pts[-1][2] - pts[0][2]) / (pts[-1][0] - pts[0][0])

    full = rate(t_kill - 1.5, t_kill) if t_kill else None
    back = None
    if full:
        for t, _, _ in samples:
            r = rate(t, t + 0.5)
            if t > t_kill and r is not None and r >= 0.8 * full:
                back = round(t - t_kill, 2)
                break
    return {"pre_failure_windows_per_sec": round(full) if full else None, "back_to_full_rate_s": back,
            "restart_s": job.recoveries[0]["restart_s"] if job.recoveries else None,
            "recoveries": len(job.recoveries), "state": job.status(),
            "checkpoint_interval_s": job.config.checkpoint.interval_s}


def _rows(group: dict[str, dict], base: str) -> list[dict]:
    """One row per system: medians, min-max, and the median ratio to ``base``."""
    rows = []
    for name, res in group.items():
        rows.append({"system": name, **{k: res[k] for k in res if k != "rounds"},
                     "vs_base": S.median_ratio(res, group[base]),
                     "delivered_vs_base": S.median_ratio(res, group[base], "delivered_rec_s"),
                     "rounds": res["rounds"]})
    return rows


def _print(title: str, rows: list[dict]) -> None:
    def mm(r: dict, k: str) -> str:
        s = r.get(k) or {}
        return "-" if s.get("median") is None else \
            f"{s['median']:,.0f} ({s['min']:,.0f}-{s['max']:,.0f})"
    print_table(title, ["system", "rec/s median (min-max)", "delivered rec/s", "vs base",
                        "delivered vs base", "start-up s"],
                [[r["system"], mm(r, "rec_s"), mm(r, "delivered_rec_s"), r["vs_base"],
                  r["delivered_vs_base"], (r.get("startup_s") or {}).get("median")]
                 for r in rows])


@click.command()
@click.option("--quick", is_flag=True, help="Small sizes and one round, for a check.")
@click.option("--rounds", default=3, show_default=True, help="interleaved rounds")
def main(quick: bool, rounds: int) -> None:
    n = 20_000 if quick else 150_000
    rounds = 1 if quick else rounds
    ensure_ray(None)
    broker = rf.EmbeddedBroker().start()
    bs = broker.bootstrap
    state_dir = tempfile.mkdtemp(prefix="rayflow-wc-")
    result: dict = {"published": PUBLISHED, "quick": quick, "sentences": n, "rounds": rounds,
                    "data": f"Zipf over 10,000 words, {WORDS_PER_SENTENCE} words a sentence",
                    "client": "confluent",
                    "peers_note": "the peers emit no window for a word's last, unfinished "
                                  "count window; rayflow and the plain loop close those at the "
                                  "end of the input"}
    try:
        topic = S.new_topic(bs, "wc-in")
        data = list(sentences(n, vocabulary=10_000, words=WORDS_PER_SENTENCE))
        produce(bs, topic, data, client="confluent")
        counts = word_counts(data)
        # 1. throughput and scaling, beside the plain loop and the peers
        systems = {"plain loop": plain(bs, topic, n, "confluent", counts),
                   "rayflow p1": rayflow(bs, topic, n, counts),
                   "rayflow p1 split": rayflow(bs, topic, n, counts, split=True),
                   "rayflow p2": rayflow(bs, topic, n, counts, 2),
                   "rayflow p4": rayflow(bs, topic, n, counts, 4)}
        for p in S.installed_peers():
            systems[f"{p} (1 worker)"] = peer(p, bs, topic, n, counts)
        print("\nthroughput, interleaved rounds:")
        scaling = _rows(S.interleaved(systems, rounds), "plain loop")
        result["scaling"] = scaling
        _print(f"W4, {n:,} sentences (Zipf, 10k words), base: the plain confluent loop",
               scaling)
        # 2. guarantees and state backends at parallelism 1 (commits inside the span)
        systems = {"at-least-once": rayflow(bs, topic, n, counts),
                   "exactly-once": rayflow(bs, topic, n, counts, guarantee="exactly_once"),
                   "at-most-once": rayflow(bs, topic, n, counts, guarantee="at_most_once"),
                   "filesystem": rayflow(bs, topic, n, counts, backend="filesystem",
                                         state_dir=state_dir),
                   "rocksdb": rayflow(bs, topic, n, counts, backend="rocksdb",
                                      state_dir=state_dir)}
        print("\nguarantees and backends, interleaved rounds:")
        guar = _rows(S.interleaved(systems, rounds), "at-least-once")
        result["guarantees"] = guar
        _print("W4 guarantees and state backends, parallelism 1, base: at-least-once, memory",
               guar)
        # 2b. exactly-once against at-least-once on a longer input, where the last epoch's
        # commit after the end of the input is a small part of the run
        long_n = LONG_FACTOR * n
        long_topic = S.new_topic(bs, "wc-in-long")
        long_data = list(sentences(long_n, vocabulary=10_000, words=WORDS_PER_SENTENCE))
        produce(bs, long_topic, long_data, client="confluent")
        long_counts = word_counts(long_data)
        del long_data
        systems = {"at-least-once": rayflow(bs, long_topic, long_n, long_counts),
                   "exactly-once": rayflow(bs, long_topic, long_n, long_counts,
                                           guarantee="exactly_once")}
        print(f"\nguarantees on {long_n:,} sentences, interleaved rounds:")
        guar_long = _rows(S.interleaved(systems, rounds), "at-least-once")
        result["long_sentences"] = long_n
        result["guarantees_long"] = guar_long
        _print(f"W4 guarantees on {long_n:,} sentences, parallelism 1, base: at-least-once",
               guar_long)
        # 3. a million-word vocabulary: state touched for nearly every record
        big = S.new_topic(bs, "wc-in-1m")
        big_data = list(sentences(n, vocabulary=1_000_000, words=WORDS_PER_SENTENCE, seed=1))
        produce(bs, big, big_data, client="confluent")
        big_counts = word_counts(big_data)
        del big_data
        systems = {"plain loop": plain(bs, big, n, "confluent", big_counts),
                   "memory": rayflow(bs, big, n, big_counts),
                   "rocksdb": rayflow(bs, big, n, big_counts, backend="rocksdb",
                                      state_dir=state_dir)}
        print("\n10^6-word vocabulary, interleaved rounds:")
        keys = _rows(S.interleaved(systems, rounds), "memory")
        result["million_words"] = keys
        _print("W4 on a 10^6-word vocabulary (Zipf), base: rayflow, memory state", keys)
        # 4. the pure-Python client beside its own plain loop
        systems = {"plain loop (kafka-python)": plain(bs, topic, n, "kafka-python", counts),
                   "rayflow p1 (kafka-python)": rayflow(bs, topic, n, counts,
                                                        client="kafka-python")}
        print("\nkafka-python, interleaved rounds:")
        kp = _rows(S.interleaved(systems, rounds), "plain loop (kafka-python)")
        result["kafka_python"] = kp
        _print("W4 with kafka-python, base: the plain kafka-python loop", kp)
        result["recovery"] = recovery_run(bs, 120_000 if quick else 600_000, "confluent")
        print(f"recovery: {result['recovery']}")
        by = {r["system"]: r for r in guar}
        result["eos_vs_alo"] = by["exactly-once"]["delivered_vs_base"]
        result["eos_vs_alo_long"] = next(r["delivered_vs_base"] for r in guar_long
                                         if r["system"] == "exactly-once")
        result["amo_vs_alo"] = by["at-most-once"]["vs_base"]
        result["filesystem_vs_memory"] = by["filesystem"]["vs_base"]
        result["rocksdb_vs_memory_1m_words"] = next(
            r["vs_base"] for r in keys if r["system"] == "rocksdb")
        result["vs_flink"] = ratio(
            next(r["rec_s"]["median"] for r in scaling if r["system"] == "rayflow p1"),
            PUBLISHED["flink_rec_s"])
    finally:
        broker.stop()
    path = write_result("wordcount_quick" if quick else "wordcount", result)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
