"""The benchmark report: ``benchmarks/results/*.json`` into ``BENCHMARKS.md`` with PNG plots.

    rayflow report [--results benchmarks/results] [--out BENCHMARKS.md]

A tool of the repository, not of the library: ``rayflow report`` runs it from a checkout.
One section per reference workload (W1–W7, described in ``docs/workloads.md``), plus
"Autoscaling" and "Streams + MPI stages" when their results exist, and "Other results" for any
file it does not know. Each section shows our figures, the baselines and peers measured in
the same run, the published figures (:mod:`published`), the ratios, the machine and date of
the run, and which of the project's targets are met. A missing result file gives a section
that says how to measure it; a file of an unexpected shape gives a section that says so.
Neither stops the report. Plots use matplotlib's Agg canvas (no display, no pyplot state);
without matplotlib the report is written without them.
"""

from .build import generate

__all__ = ["generate"]
