"""W1 image blur (seed 000: Storm vs IBM Streams, Tables 2 and 3), with a same-run baseline.

    python benchmarks/bench_images.py            # N = 1000 images at each of 8 sizes
    python benchmarks/bench_images.py --quick    # N = 100, sizes 50, 400, 1200

For each side (50 … 1200 px) it writes N synthetic PNG files, then measures on them:
  * ``loop``: one process, one OpenCV thread: read, decode, blur 5×5 sigma 3, encode PNG;
    the limit a framework can approach per core, and its per-phase times;
  * ``loop x2``: the same loop in two processes at once, on every other file: what both
    cores do with no framework (the honest ceiling for ``both``);
  * ``p1``: rayflow, parallelism 1 per step, in two chains: read → decode | blur → encode;
  * ``blur2``: the blur step at parallelism 2;
  * ``both``: both cores: two chains, each read → decode → blur → encode.
Throughput is N / (max write time − min read time), from a run with no instrumentation.
Memory comes from a second run of each configuration on the first ``--memory-count`` files:
the peak USS of the driver, Ray's processes and every worker above the idle Ray
(``rayflow.memprobe``), and the object store's peak, both in MB. The two are separate because
reading every process's smaps four times a second took 7–9% of the throughput on 2 cores,
and the loop baseline runs without it. Results: ``benchmarks/results/images[_quick].json`` and PNG plots.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import multiprocessing as mp  # noqa: E402

import click  # noqa: E402
import cv2  # noqa: E402
import numpy as np  # noqa: E402
from _common import RESULTS_DIR, print_table, ratio, write_result  # noqa: E402
from report.published import W1_IMAGES as PUBLISHED  # noqa: E402

from rayflow.examples.image_blur import tuned_env  # noqa: E402

SIZES = [50, 100, 200, 400, 600, 800, 1000, 1200]
CONFIGS = {
    # parallelism 1 per step, two chains: read + decode | blur + encode (two cores overlap)
    "p1": {"readers": 1, "blur_parallelism": 1, "writers": 1, "split": True},
    "blur2": {"readers": 1, "blur_parallelism": 2, "writers": 1},
    # both cores: two chains of read + decode + blur + encode, no image crosses an actor
    "both": {"readers": 2, "blur_parallelism": 2, "writers": 2},
}
# the job's malloc settings for each shape, from the configured process profiles:
# split_pipeline where images cross actors (p1, blur2), whole_pipeline where each chain runs
# the whole pipeline (both); see tuned_profile in rayflow/examples/image_blur.py
for _cfg in CONFIGS.values():
    _cfg["actor_env"] = tuned_env(**_cfg)


def opencv_loop(files: list[Path]) -> dict:
    """The plain single-process loop on the same files, with per-phase times."""
    cv2.setNumThreads(1)
    t_read = t_dec = t_blur = t_enc = 0.0
    t0 = time.perf_counter()
    for f in files:
        a = time.perf_counter()
        data = f.read_bytes()
        b = time.perf_counter()
        img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
        c = time.perf_counter()
        out = cv2.GaussianBlur(img, (5, 5), 3, sigmaY=3)
        d = time.perf_counter()
        ok, _ = cv2.imencode(".png", out)
        e = time.perf_counter()
        t_read += b - a
        t_dec += c - b
        t_blur += d - c
        t_enc += e - d
    total = time.perf_counter() - t0
    n = len(files)
    return {"img_s": round(n / total, 2),
            "ms": {"read": round(1e3 * t_read / n, 3), "decode": round(1e3 * t_dec / n, 3),
                   "blur": round(1e3 * t_blur / n, 3), "encode": round(1e3 * t_enc / n, 3)}}


def _loop_half(files: list[str]) -> float:
    opencv_loop([Path(f) for f in files])
    return time.perf_counter()


def opencv_loop_2proc(files: list[Path]) -> float:
    """The plain loop in two processes at once, each on every other file: what two cores
    do with no framework at all (images/s over the wall time of both)."""
    ctx = mp.get_context("spawn")
    with ctx.Pool(2) as pool:
        pool.map(_loop_half, [[str(f) for f in files[:4]]] * 2)  # start and warm both
        t0 = time.perf_counter()
        ends = pool.map(_loop_half, [[str(f) for f in files[i::2]] for i in range(2)])
    return round(len(files) / (max(ends) - t0), 2)


def ceiling(step_ms: dict, cfg: dict, cores: int) -> float:
    """Images/s the measured per-step times allow: each actor is one thread running a chain
    of steps, so a chain at parallelism p does at most p / (sum of its steps' times)
    images/s, and all steps share ``cores`` cores."""
    from rayflow.examples.image_blur import build_flow
    from rayflow.runtime.plan import chains

    flow = build_flow("unused", **cfg)
    par = {s.step_id: s.parallelism for s in flow.steps}
    per_chain: dict[str, float] = {}
    for step, head in chains(flow).items():
        per_chain[head] = per_chain.get(head, 0.0) + step_ms.get(step, 0.0)
    bound = min(1000.0 * par[h] / t for h, t in per_chain.items() if t > 0)
    shared = 1000.0 * cores / max(sum(step_ms.values()), 1e-9)
    return round(min(bound, shared), 1)


def _files_and_loops(d: str, n: int, side: int) -> tuple[list[str], float, dict]:
    """Writes the image set and runs both plain loops on it (in a helper process)."""
    from rayflow.connectors.images import write_image_set

    t0 = time.time()
    files = write_image_set(d, n, side)
    gen_s = time.time() - t0
    opencv_loop(files[: min(20, n)])  # warm the page cache and OpenCV
    loop = opencv_loop(files)
    loop["two_process_img_s"] = opencv_loop_2proc(files)
    return [str(f) for f in files], gen_s, loop


def run_size(side: int, n: int, workdir: Path, configs: list[str], memory_count: int,
             memory_runs: int) -> dict:
    from concurrent.futures import ProcessPoolExecutor

    from rayflow.examples.image_blur import run_w1

    d = workdir / f"s{side}"
    # images and loops in a helper process: the driver, whose growth the memory probe counts
    # as part of the job, then holds no freed image buffers of its own
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as ex:
        names, gen_s, loop = ex.submit(_files_and_loops, str(d), n, side).result()
    files = [Path(f) for f in names]
    row = {"side": side, "n": n, "png_kb": round(sum(f.stat().st_size for f in files) / n / 1e3, 1),
           "gen_s": round(gen_s, 1), "loop": loop}
    mem_dir = workdir / f"s{side}-mem"
    mem_dir.mkdir(exist_ok=True)
    n_mem = min(n, memory_count)
    for f in files[:n_mem]:
        (mem_dir / f.name).symlink_to(f)
    for name in configs:
        res = run_w1(str(d), measure_memory=False, **CONFIGS[name])
        assert res["images_written"] == n and res["dead_letters"] == 0, res
        mems = []
        for _ in range(memory_runs):
            mem = run_w1(str(mem_dir), measure_memory=True, **CONFIGS[name])
            assert mem["images_written"] == n_mem and mem["dead_letters"] == 0, mem
            mems.append(mem)
        # the run of median peak (memory runs of a few hundred images vary by +-20%)
        mems.sort(key=lambda m: m["memory"]["uss_peak_above_idle_mb"])
        mem = mems[len(mems) // 2]
        res["memory"] = {**mem["memory"], "images": n_mem, "runs": len(mems),
                         "uss_peak_above_idle_mb_runs": [m["memory"]["uss_peak_above_idle_mb"]
                                                         for m in mems],
                         "throughput_img_s_while_probed": mem["throughput_img_s"]}
        res["ceiling_img_s"] = ceiling(res["step_ms_per_image"], CONFIGS[name], 2)
        res["vs_loop"] = ratio(res["throughput_img_s"], loop["img_s"])
        res["vs_two_process_loop"] = ratio(res["throughput_img_s"], loop["two_process_img_s"])
        row[name] = res
        print(f"  {side:>5} px {name:>6}: {res['throughput_img_s']:8.1f} img/s "
              f"(loop {loop['img_s']:.1f}, x{res['vs_loop']}), ceiling {res['ceiling_img_s']}, "
              f"USS +{res['memory']['uss_peak_above_idle_mb']} MB, "
              f"store {res['memory']['object_store_peak_mb']} MB", flush=True)
    shutil.rmtree(mem_dir, ignore_errors=True)
    shutil.rmtree(d, ignore_errors=True)
    return row


def plot(rows: list[dict], configs: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sides = [r["side"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    a.plot(sides, [r["loop"]["img_s"] for r in rows], "k--o", label="OpenCV loop (1 core)")
    for c in configs:
        a.plot(sides, [r[c]["throughput_img_s"] for r in rows], "-o", label=f"rayflow {c}")
    a.plot(sides, [PUBLISHED[s][2] for s in sides], ":s", label="Storm (published)")
    a.plot(sides, [PUBLISHED[s][3] for s in sides], ":^", label="Streams (published)")
    a.set(xlabel="image side (px)", ylabel="images/s", yscale="log", title="W1 throughput")
    a.legend(fontsize=8)
    for c in configs:
        b.plot(sides, [r[c]["memory"]["uss_peak_above_idle_mb"] for r in rows], "-o",
               label=f"rayflow {c}: USS above idle")
    b.plot(sides, [r[configs[0]]["memory"]["object_store_peak_mb"] for r in rows], "-x",
           label=f"rayflow {configs[0]}: object store peak")
    b.plot(sides, [PUBLISHED[s][0] for s in sides], ":s", label="Storm (published)")
    b.plot(sides, [PUBLISHED[s][1] for s in sides], ":^", label="Streams (published)")
    b.set(xlabel="image side (px)", ylabel="MB", title="W1 peak memory", ylim=(0, None))
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


@click.command()
@click.option("--quick", is_flag=True, help="N=100 at 50, 400 and 1200 px.")
@click.option("--count", type=int, default=None, help="Images per size (default 1000).")
@click.option("--sizes", default=None, help="Comma-separated sides, px.")
@click.option("--configs", default="p1,blur2,both", show_default=True)
@click.option("--memory-count", type=int, default=300, show_default=True,
              help="Images in each configuration's separate memory run.")
@click.option("--memory-runs", type=int, default=3, show_default=True,
              help="Memory runs per configuration and size; the median peak is reported.")
def main(quick, count, sizes, configs, memory_count, memory_runs):
    from rayflow._raycontext import ensure_ray
    from rayflow.connectors.images import write_image_set
    from rayflow.examples.image_blur import LOCAL_RAY, run_w1

    n = count or (100 if quick else 1000)
    sides = [int(s) for s in sizes.split(",")] if sizes else ([50, 400, 1200] if quick else SIZES)
    configs = configs.split(",")
    ensure_ray(None, **LOCAL_RAY)
    rows = []
    with tempfile.TemporaryDirectory(prefix="w1-bench-") as tmp:
        # one job first: the driver's one-time growth (imports, Ray's client state, ~30 MB)
        # would otherwise count in the first configuration's memory at the first size
        warm = Path(tmp) / "warm"
        write_image_set(warm, 20, 50)
        for name in configs:
            run_w1(str(warm), **CONFIGS[name])
        for side in sides:
            rows.append(run_size(side, n, Path(tmp), configs, memory_count,
                                 1 if quick else memory_runs))
    name = "images_quick" if quick or n < 1000 else "images"
    table = []
    for r in rows:
        s = r["side"]
        table.append([s, r["loop"]["img_s"], r["loop"]["two_process_img_s"]]
                     + [r[c]["throughput_img_s"] for c in configs]
                     + [r[c]["vs_loop"] for c in configs] + [r["both" if "both" in configs
                                                              else configs[0]]["ceiling_img_s"]]
                     + [PUBLISHED[s][2], PUBLISHED[s][3]] if s in PUBLISHED else [None] * 2)
    print_table(f"W1 throughput, images/s (N={n}, this machine)",
                ["px", "loop", "loop x2"] + configs + [f"{c}/loop" for c in configs]
                + ["ceiling(both)", "Storm", "Streams"], table)
    print_table("W1 per-image ms: loop phases | rayflow p1 steps (busy − backpressure)",
                ["px", "read", "decode", "blur", "encode", "p1 read", "p1 decode", "p1 blur",
                 "p1 write", "p1 ceiling"],
                [[r["side"], *r["loop"]["ms"].values(),
                  *r[configs[0]]["step_ms_per_image"].values(), r[configs[0]]["ceiling_img_s"]]
                 for r in rows])
    mem = [[r["side"]] + [r[c]["memory"]["uss_peak_above_idle_mb"] for c in configs]
           + [r[c]["memory"]["object_store_peak_mb"] for c in configs]
           + list(PUBLISHED.get(r["side"], (None, None))[:2]) for r in rows]
    print_table("W1 peak memory, MB (USS above idle Ray; object store peak)",
                ["px"] + [f"USS {c}" for c in configs] + [f"store {c}" for c in configs]
                + ["Storm", "Streams"], mem)
    first, last = rows[0], rows[-1]
    growth = {c: ratio(last[c]["memory"]["uss_peak_above_idle_mb"],
                       first[c]["memory"]["uss_peak_above_idle_mb"]) for c in configs}
    print(f"\nmemory growth {first['side']} -> {last['side']} px (USS above idle): {growth}"
          f"  (target <= 1.5; Streams 1.2, Storm 2.6)")
    png = RESULTS_DIR / f"{name}.png"
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    plot(rows, configs, png)
    path = write_result(name, {"n": n, "sizes": sides, "configs": CONFIGS, "rows": rows,
                               "memory_images": min(n, memory_count),
                               "memory_runs": 1 if quick else memory_runs,
                               "memory_growth": growth, "published": PUBLISHED,
                               "plot": png.name})
    print(f"wrote {path} and {png}")


if __name__ == "__main__":
    main()
