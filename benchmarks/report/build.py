"""The report assembled: one section per workload, the targets table, BENCHMARKS.md."""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rayflow.errors import RayflowError

from .base import _Ctx, _generic, _machine_line, _Plotter, _table
from .hpc import _collectives, _mpi_api, _w5, _w6
from .scaling import _scaling
from .streams import _w1, _w2, _w3, _w4, _w7, _w7_kafka, other_checks


def _autoscale(doc: dict, ctx: _Ctx) -> list[str]:
    ctx.check("Autoscaling", "scale up to the needed nodes and back to the minimum within the "
              "idle timeout; no data lost across rescale", "see the section", None,
              status="reported")
    return _generic(doc, ctx)


def _stream_solve(doc: dict, ctx: _Ctx) -> list[str]:
    ctx.check("Streams + MPI stages", "exactly-once under failure, backpressure through the "
              "stage, gang reused across windows where faster", "see the section", None,
              status="reported")
    return _generic(doc, ctx)


# -- assembling ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Spec:
    key: str  # the workload label used in the targets table
    title: str
    bench: str  # results/<bench>.json, `rayflow bench <bench>`
    render: Callable[[dict, _Ctx], list[str]]
    optional: bool = False  # only shown when results exist


_SPECS = [
    _Spec("W1", "W1 — Image stream, Gaussian blur (Storm vs IBM Streams)", "images", _w1),
    _Spec("W2", "W2 — Identity (Flink vs Storm)", "identity", _w2),
    _Spec("W3", "W3 — Sleep (Flink vs Storm)", "sleep", _w3),
    _Spec("W4", "W4 — Windowed word count (Flink vs Storm)", "wordcount", _w4),
    _Spec("W5", "W5 — Cannon's matrix multiplication (Blaze: Spark + MPI)", "cannon", _w5),
    _Spec("W6", "W6 — Conjugate gradient (Blaze: Spark + MPI)", "cg", _w6),
    _Spec("W7", "W7 — Nexmark (Flink 1.13 per-core figures)", "nexmark", _w7),
    _Spec("W7 Kafka", "W7 — Nexmark through Kafka", "nexmark_kafka", _w7_kafka, optional=True),
    _Spec("Autoscaling", "Autoscaling", "autoscale", _autoscale, optional=True),
    _Spec("Streams + MPI stages", "Streams + MPI stages", "stream_solve", _stream_solve,
          optional=True),
    _Spec("Collectives", "MPI-stage collectives (rayflow vs mpi4py on MPICH)", "collectives",
          _collectives, optional=True),
    _Spec("mpi4py programs", "mpi4py programs: `rayflow mpirun` vs `mpiexec`", "mpi_api",
          _mpi_api, optional=True),
    _Spec("Many cores", "Many cores: collectives, Cannon, CG, Nexmark and W3 on 16 cores",
          "scaling", _scaling, optional=True),
]


def _load(results_dir: Path, bench: str) -> tuple[dict | None, Path | None, str | None]:
    """The full result if present, else the quick one: (doc, path, error)."""
    for name in (bench, f"{bench}_quick"):
        path = results_dir / f"{name}.json"
        if path.exists():
            try:
                doc = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                return None, path, f"{type(exc).__name__}: {exc}"
            if not isinstance(doc, dict):
                return None, path, "not a JSON object"
            return doc, path, None
    return None, None, None


def _section(spec: _Spec, ctx: _Ctx) -> list[str]:
    lines = [f"## {spec.title}", ""]
    doc, path, err = _load(ctx.results_dir, spec.bench)
    how = f"run `rayflow bench {spec.bench}`"
    if path is None:
        ctx.check(spec.key, "all targets", f"not yet measured: `rayflow bench {spec.bench}`", None)
        return lines + [f"_Not yet measured: {how}, then `rayflow report`._", ""]
    if err is not None:
        ctx.check(spec.key, "all targets", f"unreadable {path.name}", None)
        return lines + [f"_Could not read `{path.name}` ({err}); {how} again._", ""]
    assert doc is not None  # _load gives a document, or an error or no path
    lines += [f"Source: `{ctx.link(path)}`. " + _machine_line(doc), ""]
    if path.stem.endswith("_quick") or doc.get("quick"):
        lines += [f"> From a `--quick` run (small sizes, indicative only): {how} for the full "
                  "figures.", ""]
    before = len(ctx.checks)
    try:
        body = spec.render(doc, ctx)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError) as exc:
        del ctx.checks[before:]
        ctx.check(spec.key, "all targets", f"unexpected shape of {path.name}", None)
        return lines + [f"_`{path.name}` has an unexpected shape ({type(exc).__name__}: {exc}); "
                        f"{how} again with this version of rayflow._", ""]
    lines += body
    mine = ctx.checks[before:]
    met = [c.target for c in mine if c.status == "met"]
    missed = [c.target for c in mine if c.status == "missed"]
    open_ = [c.target for c in mine if c.status == "not measured"]
    if met or missed or open_:
        verdict = (f"**Targets:** {len(met)} met, {len(missed)} missed"
                   + (f", {len(open_)} not measured" if open_ else "") + ".")
        if missed:
            verdict += " Missed: " + "; ".join(missed) + "."
        if open_:
            verdict += " Not measured: " + "; ".join(open_) + "."
        lines += [verdict, ""]
    return lines


def _other_sections(ctx: _Ctx) -> list[str]:
    known = {s.bench for s in _SPECS} | {f"{s.bench}_quick" for s in _SPECS}
    paths = sorted(p for p in ctx.results_dir.glob("*.json") if p.stem not in known)
    full = {p.stem for p in paths}
    paths = [p for p in paths if not (p.stem.endswith("_quick") and p.stem[:-6] in full)]
    if not paths:
        return []
    lines = ["## Other results", ""]
    for path in paths:
        lines += [f"### {path.stem}", ""]
        try:
            doc = json.loads(path.read_text())
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as exc:
            lines += [f"_Could not read `{path.name}` ({exc})._", ""]
            continue
        lines += [f"Source: `{ctx.link(path)}`. " + _machine_line(doc), ""]
        lines += _generic(doc, ctx)
        other_checks(path.stem, doc, ctx)
    return lines


def generate(results_dir: Path, out_path: Path, plots_dir: Path) -> Path:
    """Write the benchmark report from the result files in ``results_dir``.

    Args:
        results_dir: the directory of ``<benchmark>.json`` files written by
            ``benchmarks/_common.py::write_result`` (``<name>_quick.json`` is used only when
            the full ``<name>.json`` is missing, and flagged as such).
        out_path: the Markdown file to write (``BENCHMARKS.md``).
        plots_dir: where the PNG plots go; the report links them by relative path.

    Returns:
        ``out_path``.

    Raises:
        RayflowError: ``results_dir`` does not exist.

    Example:
        >>> from pathlib import Path
        >>> generate(Path("benchmarks/results"), Path("BENCHMARKS.md"),
        ...          Path("benchmarks/results/plots"))  # doctest: +SKIP
        PosixPath('BENCHMARKS.md')
    """
    results_dir, out_path, plots_dir = Path(results_dir), Path(out_path), Path(plots_dir)
    if not results_dir.is_dir():
        raise RayflowError(f"no results directory {results_dir}: run `rayflow bench <name>` "
                           "first, or pass --results DIR")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    ctx = _Ctx(results_dir, out_path.parent, plots_dir, _Plotter(plots_dir))
    body: list[str] = []
    for spec in _SPECS:
        if spec.optional and _load(results_dir, spec.bench)[1] is None:
            continue
        body += _section(spec, ctx)
    body += _other_sections(ctx)

    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = [
        "# rayflow benchmarks", "",
        f"Generated by `rayflow report` on {now} from `{ctx.link(results_dir)}/*.json`; "
        "regenerate it with `rayflow bench <name>` then `rayflow report`. The workloads are "
        "those of three published studies and the Nexmark suite (W1–W7, described in "
        "[docs/workloads.md](docs/workloads.md)). Published figures "
        "came from other hardware: compare shapes and ratios with them, and read absolute "
        "figures against the baselines measured in the same run. Ratios are rayflow ÷ the "
        "other (for speeds: higher is better for rayflow; for times and latencies: lower). "
        "Targets are the project's own: the published figures, and peers and baselines "
        "measured in the same run.", "",
        "## Targets at a glance", "",
    ]
    mark = {"met": "met", "missed": "**missed**", "not measured": "not measured",
            "reported": "reported"}
    head += _table(["workload", "target", "measured", "status"],
                   [[c.workload, c.target, c.measured, mark[c.status]] for c in ctx.checks])
    counts = {s: sum(c.status == s for c in ctx.checks) for s in mark}
    head += [f"{counts['met']} met, {counts['missed']} missed, {counts['not measured']} not "
             f"measured, {counts['reported']} reported without a pass/fail bound.", ""]
    if not ctx.plots.available:
        head += ["_matplotlib is not installed: plots were skipped._", ""]
    out_path.write_text("\n".join(head + body).rstrip() + "\n")
    return out_path
