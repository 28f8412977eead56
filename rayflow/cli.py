"""The ``rayflow`` command: a thin click layer over the library.

    rayflow demo --quick          # everything on embedded defaults
    rayflow kafka up | status | down
    rayflow run jobs/identity.py --records 10000
    rayflow bench identity --quick
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
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def demo(quick: bool, address: str | None, bootstrap: str | None, as_json: bool) -> None:
    """Run rayflow's capabilities end to end on embedded defaults and print a summary."""
    from rayflow.demo import run_demo

    rows = run_demo(quick=quick, address=address, bootstrap=bootstrap)
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))


if __name__ == "__main__":
    main()
