"""The ``rayflow`` command: a thin click layer over the library.

    rayflow demo --quick          # everything on embedded defaults
    rayflow kafka up | status | down
    rayflow run jobs/identity.py --records 10000
    rayflow bench identity --quick
    rayflow cluster validate cluster/aws.yaml | up-local | down-local
    rayflow submit --address http://head:8265 -- python jobs/identity.py --address auto
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click

from rayflow.errors import RayflowError


class _Group(click.Group):
    """Errors print as one line plus a hint; ``--debug`` shows the traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (RayflowError, ValueError, OSError, TimeoutError) as exc:
            if ctx.params.get("debug") or os.environ.get("RAYFLOW_DEBUG"):
                raise
            click.secho(f"error: {exc}", fg="red", err=True)
            click.echo("hint: run with --debug for the full traceback", err=True)
            sys.exit(1)


@click.group(cls=_Group)
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
@click.version_option(package_name="rayflow")
def main(debug: bool) -> None:
    """rayflow: streams and MPI stages on Ray.

    Without --address, commands start a private local Ray; without --bootstrap, they start
    the embedded Kafka broker (Tansu).
    """


def _emit(data: dict, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        for k, v in data.items():
            click.echo(f"{k}: {v}")


@main.group()
def kafka() -> None:
    """Start, inspect and stop the embedded Kafka broker (Tansu, in memory)."""


@kafka.command("up")
@click.option("--port", type=int, default=None, help="Port on 127.0.0.1 (a free one if omitted).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable output.")
def kafka_up(port: int | None, as_json: bool) -> None:
    """Start a detached broker; prints its bootstrap address (export it as
    RAYFLOW_KAFKA__BOOTSTRAP to use it from jobs)."""
    from rayflow.connectors import broker

    _emit(broker.up(port), as_json)


@kafka.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable output.")
def kafka_status(as_json: bool) -> None:
    """Show whether the detached broker runs, its PID and bootstrap address."""
    from rayflow.connectors import broker

    _emit(broker.status(), as_json)


@kafka.command("down")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable output.")
def kafka_down(as_json: bool) -> None:
    """Stop the detached broker (by PID)."""
    from rayflow.connectors import broker

    _emit(broker.down(), as_json)


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.option("--address", default=None, help="Ray address (a private local Ray if omitted).")
@click.option("--bootstrap", default=None, help="Kafka bootstrap (embedded broker if omitted).")
@click.pass_context
def run(ctx: click.Context, script: str, address: str | None, bootstrap: str | None) -> None:
    """Run a job script (e.g. jobs/identity.py) locally; extra arguments go to the script."""
    args = [sys.executable, script, *ctx.args]
    if address:
        args += ["--address", address]
    if bootstrap:
        args += ["--bootstrap", bootstrap]
    sys.exit(subprocess.call(args))


@main.command()
@click.argument("name")
@click.option("--quick", is_flag=True, help="Small sizes, for a check in CI.")
def bench(name: str, quick: bool) -> None:
    """Run benchmarks/bench_NAME.py (from a source checkout) and write its results JSON."""
    path = Path.cwd() / "benchmarks" / f"bench_{name}.py"
    if not path.exists():
        avail = sorted(p.stem[6:] for p in (Path.cwd() / "benchmarks").glob("bench_*.py"))
        raise RayflowError(f"no benchmark {name!r} here; available: {', '.join(avail) or 'none'}")
    sys.exit(subprocess.call([sys.executable, str(path), *(["--quick"] if quick else [])]))


@main.command()
@click.option("--quick", is_flag=True, help="Smaller inputs (about 30 s on 2 cores).")
@click.option("--address", default=None, help="Ray address (a private local Ray if omitted).")
@click.option("--bootstrap", default=None, help="Kafka bootstrap (embedded broker if omitted).")
@click.option("--inject-failure", is_flag=True,
              help="Kill a word-count actor mid-run: watch recovery keep the output exact.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def demo(quick: bool, address: str | None, bootstrap: str | None, inject_failure: bool,
         as_json: bool) -> None:
    """Run rayflow's capabilities end to end on embedded defaults and print a summary:
    exactly-once word count, image blur, Cannon and CG, and a stream feeding MPI stages."""
    from rayflow.demo import run_demo

    rows = run_demo(quick=quick, address=address, bootstrap=bootstrap,
                    inject_failure=inject_failure)
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))


# -- clusters and job submission (rayflow.deploy) ----------------------------------------------
@main.group()
def cluster() -> None:
    """Cluster specs (validate offline) and private local heads (up-local / down-local)."""


@cluster.command("validate")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--rank-cpus", type=float, default=None,
              help="CPUs one gang rank asks for (default: hpc.rank_num_cpus).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable output.")
def cluster_validate(file: str, rank_cpus: float | None, as_json: bool) -> None:
    """Validate a Ray cluster-launcher YAML offline: Ray's schema and rayflow's rules."""
    from rayflow.deploy.spec import ClusterSpecError, validate_file

    try:
        report = validate_file(file, rank_cpus)
    except ClusterSpecError as exc:
        if as_json:
            click.echo(json.dumps({"file": file, "valid": False, "path": exc.path,
                                   "line": exc.line, "error": exc.message}, indent=2))
            sys.exit(1)
        raise
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
        return
    types = ", ".join(f"{k} {v['resources']} x{v['min_workers']}..{v['max_workers']}"
                      for k, v in report.node_types.items())
    click.echo(f"{file}: valid ({report.provider}; {types}; idle timeout "
               f"{report.idle_timeout_minutes} min)")
    for w in report.warnings:
        click.secho(f"warning: {w.path}: {w.message}", fg="yellow", err=True)


@cluster.command("up-local")
@click.option("--num-cpus", default=2, show_default=True, help="Logical CPUs of the head.")
@click.option("--autoscale", "autoscale", type=click.Path(dir_okay=False), default=None,
              help="A fake multi-node spec (cluster/local-autoscale.yaml): autoscaling head.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable output.")
def cluster_up_local(num_cpus: int, autoscale: str | None, as_json: bool) -> None:
    """Start a private local head with the dashboard (free ports, own temp dir).

    Prints its addresses and PID; `rayflow cluster down-local` ends it by PID.
    """
    from rayflow.deploy import local

    if local.recorded_head() and local.head_processes(local.recorded_head()):
        raise RayflowError("a local head is already up; run `rayflow cluster down-local`")
    if autoscale:
        from rayflow.deploy.spec import validate_file

        validate_file(autoscale)
    head = local.start_head(num_cpus, autoscaling_config=autoscale, record=True)
    _emit({"pid": head.pid, "address": head.address, "dashboard": head.dashboard_url,
           "temp_dir": head.temp_dir, "started_s": head.started_s,
           "submit": f"rayflow submit --address {head.dashboard_url} -- python jobs/X.py "
                     f"--address auto"}, as_json)


@cluster.command("down-local")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable output.")
def cluster_down_local(as_json: bool) -> None:
    """Stop the head `up-local` started (by PID; never `ray stop`)."""
    from rayflow.deploy import local

    head = local.recorded_head()
    if head is None:
        _emit({"running": False, "stopped_processes": 0}, as_json)
        return
    n = local.stop_head(head)
    local.forget_recorded_head()
    _emit({"running": False, "pid": head["pid"], "stopped_processes": n}, as_json)


@main.command(context_settings={"ignore_unknown_options": True})
@click.option("--address", default=None,
              help="Job API (dashboard) address, e.g. http://head:8265 "
                   "(default: RAY_API_SERVER_ADDRESS, or http://127.0.0.1:8265).")
@click.option("--working-dir", default=".", show_default=True, type=click.Path(file_okay=False),
              help="Uploaded with the job (.git, .venv, results, data, images left out).")
@click.option("--no-working-dir", is_flag=True, help="Upload nothing.")
@click.option("--exclude", multiple=True, help="Another gitignore-style pattern to leave out.")
@click.option("--env", "env_pairs", multiple=True, metavar="NAME=VALUE",
              help="An environment variable of the job's driver.")
@click.option("--no-wait", is_flag=True, help="Return once the job is accepted.")
@click.option("--timeout", "timeout_s", type=float, default=None, help="Stop after seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary at the end.")
@click.argument("entrypoint", nargs=-1, type=click.UNPROCESSED, required=True)
def submit(address: str | None, working_dir: str, no_working_dir: bool, exclude: tuple,
           env_pairs: tuple, no_wait: bool, timeout_s: float | None, as_json: bool,
           entrypoint: tuple) -> None:
    """Submit a job to a Ray cluster and stream its logs; exits with the job's status.

        rayflow submit --address http://head:8265 -- python jobs/identity.py \\
            --address auto --bootstrap kafka:9092 --records 10000
    """
    from rayflow.deploy.submit import submit as do_submit

    env = {}
    for pair in env_pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--env {pair!r}: use NAME=VALUE")
        env[name] = value
    res = do_submit(list(entrypoint), address=address,
                    working_dir=None if no_working_dir else working_dir, extra_excludes=exclude,
                    env_vars=env, wait=not no_wait, timeout_s=timeout_s,
                    on_log=None if as_json else (lambda t: click.echo(t, nl=False)))
    summary = {"job_id": res.job_id, "status": res.status, "exit_code": res.exit_code,
               "submit_s": round(res.submit_s, 2), "total_s": round(res.total_s, 2),
               "working_dir_bytes": res.working_dir_bytes}
    if as_json:
        click.echo(json.dumps({**summary, "logs": res.logs}, indent=2))
    else:
        click.echo(f"job {res.job_id}: {res.status} (exit {res.exit_code}, "
                   f"{res.total_s:.1f} s)", err=True)
    if not no_wait:
        sys.exit(res.exit_code)


@main.command()
@click.option("--results", "results_dir", default="benchmarks/results", show_default=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="Directory of benchmark result JSON files.")
@click.option("--out", "out_file", default="BENCHMARKS.md", show_default=True,
              type=click.Path(dir_okay=False, path_type=Path), help="Markdown file to write.")
@click.option("--plots", "plots_dir", default=None,
              type=click.Path(file_okay=False, path_type=Path),
              help="Directory for the PNG plots (default: RESULTS/plots).")
def report(results_dir: Path, out_file: Path, plots_dir: Path | None) -> None:
    """Gather benchmark results (W1-W6 and more) into BENCHMARKS.md with plots: our figures,
    same-run baselines, published figures, ratios, machine, date and targets met or missed."""
    from rayflow.report import generate

    if not results_dir.is_dir():
        raise RayflowError(f"no results directory {results_dir}: run `rayflow bench <name>` "
                           "first, or pass --results DIR")
    path = generate(results_dir, out_file, plots_dir or results_dir / "plots")
    click.echo(f"wrote {path}")


if __name__ == "__main__":
    main()
