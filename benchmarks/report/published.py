"""The published figures the benchmarks compare with, in one place: the benchmark scripts
record them in their results, and the report falls back on them for results that lack them.

The studies ran on other hardware: compare shapes and ratios with these, and read absolute
figures against the baselines measured in the same run.
"""

from __future__ import annotations

# W1, Storm vs IBM Streams on images, Tables 2 and 3 (after tuning):
# side px -> (Storm memory MB, Streams memory MB, Storm images/s, Streams images/s)
W1_IMAGES: dict[int, tuple[float, float, float, float]] = {
    50: (220, 165, 1002, 1186), 100: (250, 166, 730, 611), 200: (284, 166, 202, 210),
    400: (310, 166, 108, 42.3), 600: (320, 169, 49.6, 23.6), 800: (400, 170, 32.5, 14.5),
    1000: (460, 178, 24, 9.51), 1200: (580, 200, 14.4, 5.91),
}

# W2 identity and W3 sleep (Flink vs Storm, one thread): records/s and latency near full load
W2_IDENTITY: dict = {
    "storm_rec_s": 87_000, "flink_rec_s": 350_000,
    "storm_latency_ms": {"p50": 100, "p99": 700}, "flink_latency_ms": {"p50": 50, "p99": 300},
    "sleep_rec_s_per_thread": 900,
}

# W4 windowed word count (Flink vs Storm, one thread): records/s, and the relative costs of
# exactly-once (Flink), at-most-once (Storm's gain) and RocksDB state (Flink)
W4_WORDCOUNT: dict = {
    "storm_rec_s": 12_000, "flink_rec_s": 43_000, "flink_eos_vs_alo_slowdown": 0.063,
    "storm_amo_vs_alo_speedup": 0.168, "flink_rocksdb_vs_memory": 0.1,
}

# W5 and W6, Blaze (Spark + MPI)
W5_CANNON = ("Blaze Cannon 57-68% faster than Spark MLlib BlockMatrix.multiply "
             "(20,160^2 on n^2 cores)")
W6_CG = ("Blaze CG 51-94% faster per iteration than the Spark broadcast baseline "
         "(32,000^2, varying cores); 58-92% at 32 cores, varying size")

# W7 Nexmark: Flink 1.13, events/s per core (the nexmark suite's README: 8 cores x 3 workers,
# 100 M events)
W7_FLINK_PER_CORE: dict[str, float] = {
    "q0": 155.0e3, "q1": 157.9e3, "q2": 175.2e3, "q5": 22.1e3, "q7": 12.3e3, "q8": 146.1e3,
    "q9": 14.2e3, "q11": 39.7e3, "q12": 75.7e3, "q13": 130.7e3, "q16": 18.7e3, "q20": 19.0e3,
}
