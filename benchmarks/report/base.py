"""What every section of the report shares: the run's context and its targets, number
formatting, tables, the machine line, and the plots (matplotlib's Agg canvas, no display)."""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_META_KEYS = {"benchmark", "date", "machine", "published", "quick", "plot"}


@dataclass
class _Check:
    """One target, judged on one result file."""

    workload: str
    target: str
    measured: str
    status: str  # "met", "missed", "not measured" or "reported"


@dataclass
class _Ctx:
    """What a section renderer needs besides its document."""

    results_dir: Path
    out_dir: Path
    plots_dir: Path
    plots: _Plotter
    checks: list[_Check] = field(default_factory=list)

    def link(self, path: Path) -> str:
        """``path`` relative to the report's directory, with forward slashes."""
        return Path(os.path.relpath(path.resolve(), self.out_dir.resolve())).as_posix()

    def check(self, workload: str, target: str, measured: str, ok: bool | None,
              status: str | None = None) -> None:
        if status is None:
            status = "not measured" if ok is None else ("met" if ok else "missed")
        self.checks.append(_Check(workload, target, measured, status))


# -- formatting -------------------------------------------------------------------------------

def _n(x: Any) -> str:
    """A number as a reader wants it: thousands separators, three significant digits."""
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        a = abs(x)
        if a >= 1000:
            return f"{x:,.0f}"
        if a >= 100:
            return f"{x:.0f}"
        if a >= 10:
            return f"{x:.1f}"
        if a >= 0.01:
            return f"{x:.3g}"
        return "0" if x == 0 else f"{x:.1e}"
    return str(x)


def _x(r: float | None) -> str:
    return "–" if r is None else f"{r:.2f}×"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_n(c) for c in r) + " |" for r in rows]
    return out + [""]


def _date(doc: dict) -> str:
    raw = doc.get("date")
    try:
        d = _dt.datetime.fromisoformat(str(raw))
    except ValueError:
        return str(raw or "unknown date")
    if d.tzinfo is not None:
        d = d.astimezone(_dt.timezone.utc)
    return d.strftime("%Y-%m-%d %H:%M UTC")


def _machine_line(doc: dict) -> str:
    m = doc.get("machine") or {}
    cores = m.get("logical_cores")
    phys = m.get("physical_cores")
    load = m.get("loadavg_1m")
    parts = [f"{cores if cores is not None else '?'} logical cores"
             + (f" ({phys} physical)" if phys else ""),
             m.get("cpu_model") or "unknown CPU"]
    if m.get("memory_gib") is not None:
        parts.append(f"{m['memory_gib']} GiB RAM")
    parts.append(f"load average {load if load is not None else '?'} (1 min, at the end of the run)")
    if m.get("python"):
        parts.append(f"Python {m['python']}")
    line = f"**Machine:** {', '.join(parts)}. **Date:** {_date(doc)}."
    if load is not None and cores and load > cores:
        line += (" The load was above the core count: it counts the benchmark's own "
                 "processes and anything else that ran, so absolute figures may be "
                 "pessimistic; the same-run ratios hold better.")
    return line


# -- plots ------------------------------------------------------------------------------------

class _Plotter:
    """Draws PNGs on matplotlib's Agg canvas; does nothing when matplotlib is missing."""

    def __init__(self, plots_dir: Path):
        self.plots_dir = plots_dir
        try:
            from matplotlib.figure import Figure
        except ImportError:  # matplotlib is in the bench/dev extras only
            self._figure = None
        else:
            self._figure = Figure

    @property
    def available(self) -> bool:
        return self._figure is not None

    def draw(self, name: str, ncols: int, fn: Callable[..., None]) -> Path | None:
        """Create a figure with ``ncols`` axes, let ``fn(*axes)`` fill it, save ``name``.png."""
        if self._figure is None:
            return None
        fig = self._figure(figsize=(6.2 * ncols, 4.4))
        axes = fig.subplots(1, ncols, squeeze=False)[0]
        fn(*axes)
        for ax in axes:
            ax.grid(True, alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
        fig.tight_layout()
        self.plots_dir.mkdir(parents=True, exist_ok=True)
        path = self.plots_dir / f"{name}.png"
        fig.savefig(path, dpi=100)
        return path


def _plot_line(ctx: _Ctx, path: Path | None, what: str) -> list[str]:
    if path is None:
        return [f"_Plot of {what} skipped: matplotlib is not installed "
                "(`pip install -e '.[bench]'`)._", ""]
    return [f"![{what}]({ctx.link(path)})", ""]


# -- sections without a fixed shape -----------------------------------------------------------

def _flat(row: dict) -> dict:
    out: dict = {}
    for k, v in row.items():
        if isinstance(v, dict):
            out.update({f"{k}.{k2}": v2 for k2, v2 in v.items() if not isinstance(v2, dict | list)})
        elif not isinstance(v, list):
            out[k] = v
    return out


def _generic(doc: dict, ctx: _Ctx) -> list[str]:
    lines: list[str] = []
    if doc.get("published"):
        lines += [f"Published: {doc['published']}", ""]
    scalars = {k: v for k, v in doc.items()
               if k not in _META_KEYS and not isinstance(v, dict | list)}
    lines += [f"- {k}: {_n(v)}" for k, v in scalars.items()]
    for k, v in doc.items():
        if k in _META_KEYS:
            continue
        if isinstance(v, dict):
            lines.append(f"- {k}: " + ", ".join(f"{k2} = {_n(v2)}" for k2, v2 in _flat(v).items()))
    lines.append("")
    for k, v in doc.items():
        if k not in _META_KEYS and isinstance(v, list) and v and all(isinstance(x, dict)
                                                                       for x in v):
            flat = [_flat(x) for x in v]
            cols = list(dict.fromkeys(c for f in flat for c in f))
            lines += [f"{k}:", ""] + _table(cols, [[f.get(c) for c in cols] for f in flat[:50]])
            if len(flat) > 50:
                lines += [f"({len(flat) - 50} more rows in the JSON.)", ""]
    name = str(doc.get("benchmark") or "")
    pngs = [ctx.results_dir / doc["plot"]] if doc.get("plot") else []
    pngs += sorted(p for p in ctx.results_dir.glob(f"{name}*.png") if p not in pngs) if name else []
    lines += [f"![{p.stem}]({ctx.link(p)})" for p in pngs if p.exists()]
    return lines + [""]
