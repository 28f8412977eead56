"""The ``rayflow`` command: a thin click layer over the library.

    rayflow demo --quick          # everything on embedded defaults
    rayflow kafka up | status | down
    rayflow run jobs/identity.py --records 10000
    rayflow bench identity --quick
    rayflow cluster validate cluster/aws.yaml (or cluster/k8s/) | up-local | down-local
    rayflow submit --address http://head:8265 -- python jobs/identity.py --address auto
    rayflow config defaults | show
    rayflow dashboard -o rayflow.json  # the Grafana dashboard of rayflow's metrics

``python -m rayflow`` runs the same command. One module of thin commands (each a few
lines over the library) keeps the whole command line readable in one place.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import click

from rayflow.errors import RayflowError

DIST_NAME = "rayflow-engine"  # the distribution (pip) name; the import name is rayflow
CONTEXT = {"help_option_names": ["-h", "--help"]}  # subcommands inherit it


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


def log_level(verbose: int, quiet: bool) -> int:
    """The logging level of ``-v`` (info), ``-vv`` (debug), ``-q`` (errors only), or neither
    (warnings)."""
    if quiet and verbose:
        raise click.UsageError("-q and -v exclude each other")
    if quiet:
        return logging.ERROR
    return {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)


@click.group(cls=_Group, context_settings=CONTEXT)
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
@click.option("-v", "--verbose", count=True, help="More log output: -v info, -vv debug.")
@click.option("-q", "--quiet", is_flag=True, help="Log errors only (Ray's start-up lines too).")
@click.version_option(package_name=DIST_NAME, prog_name="rayflow")
def main(debug: bool, verbose: int, quiet: bool) -> None:
    """rayflow: streams and MPI stages on Ray.

    Without --address, commands start a private local Ray; without --bootstrap, they start
    the embedded Kafka broker (Tansu). Settings: `rayflow config show`.
    """
    level = log_level(verbose, quiet)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("rayflow").setLevel(level)
    if quiet:
        logging.getLogger("ray").setLevel(logging.ERROR)


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
    from rayflow.config import load_config
    from rayflow.connectors import broker

    _emit(broker.up(port, timeout_s=load_config().kafka.startup_timeout_s), as_json)


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
@click.option("--resume", "resume", default=None, metavar="PATH",
              help="Resume the script's job from a durable checkpoint or savepoint "
                   "(a chk-N directory, or a run directory: its newest).")
@click.pass_context
def run(ctx: click.Context, script: str, address: str | None, bootstrap: str | None,
        resume: str | None) -> None:
    """Run a job script (e.g. jobs/identity.py) locally; extra arguments go to the script.

    Its private local Ray starts with the dashboard when ray[default] is installed (Ray
    prints its URL); RAYFLOW_RAY__INCLUDE_DASHBOARD=0 turns that off.
    """
    args = [sys.executable, script, *ctx.args]
    if address:
        args += ["--address", address]
    if bootstrap:
        args += ["--bootstrap", bootstrap]
    env = script_env(address)
    if resume:
        from rayflow.checkpoint_store import load_checkpoint

        load_checkpoint(resume)  # fails here, naming the path, if nothing is there
        env["RAYFLOW_RESUME_FROM"] = resume
    sys.exit(subprocess.call(args, env=env))


def script_env(address: str | None, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a job script `rayflow run` starts: with the dashboard on for a
    private local Ray when this Python can run it, unless the environment already says."""
    from rayflow._raycontext import dashboard_available

    env = dict(os.environ if environ is None else environ)
    if address is None and dashboard_available():
        env.setdefault("RAYFLOW_RAY__INCLUDE_DASHBOARD", "true")
    return env


def checkout_report(root: Path) -> Any:
    """The benchmark report package of the checkout at ``root`` (``benchmarks/report/``): a tool
    of the repository, not of the installed library.

    Raises:
        RayflowError: ``root`` is not a rayflow checkout.
    """
    import importlib.util

    init = root / "benchmarks" / "report" / "__init__.py"
    if not init.is_file():
        raise RayflowError(f"`rayflow report` runs the report of a rayflow checkout "
                           f"(benchmarks/report/), and {root} is not one: run it from the "
                           "checkout's root")
    name = "_checkout_report"  # a top-level name: no parent package to import first
    loaded = sys.modules.get(name)
    if loaded is not None and Path(loaded.__file__ or "").resolve() == init.resolve():
        return loaded
    spec = importlib.util.spec_from_file_location(
        name, init, submodule_search_locations=[str(init.parent)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[key]  # another checkout's report
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


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


# -- configuration ----------------------------------------------------------------------------
@main.group("config")
def config_group() -> None:
    """The configuration tree: its commented defaults, and what is in effect here."""


@config_group.command("defaults")
@click.option("--out", "out_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Write to this file (e.g. rayflow/defaults.yaml) "
                                 "instead of printing.")
@click.option("--check", "check_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Exit 1 if this file differs from the generated text.")
def config_defaults(out_file: Path | None, check_file: Path | None) -> None:
    """Print the defaults as commented YAML, generated from the configuration models
    (what rayflow/defaults.yaml holds)."""
    from rayflow.config import render_defaults, write_defaults

    if check_file is not None:
        if not check_file.is_file() or check_file.read_text() != render_defaults():
            raise RayflowError(f"{check_file} is stale: regenerate it with "
                               f"`rayflow config defaults --out {check_file}`")
        click.echo(f"{check_file}: current")
        return
    if out_file is not None:
        click.echo(f"wrote {write_defaults(out_file)}")
        return
    click.echo(render_defaults(), nl=False)


@config_group.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of YAML.")
def config_show(as_json: bool) -> None:
    """Print the configuration in effect: defaults, the RAYFLOW_CONFIG file and RAYFLOW_*
    variables applied."""
    import yaml

    from rayflow.config import load_config

    data = load_config().model_dump()
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(yaml.safe_dump(data, sort_keys=False), nl=False)


# -- clusters and job submission (rayflow.deploy) ----------------------------------------------
@main.group()
def cluster() -> None:
    """Cluster specs (validate offline) and private local heads (up-local / down-local)."""


@cluster.command("validate")
@click.argument("file", type=click.Path())
@click.option("--rank-cpus", type=float, default=None,
              help="CPUs one gang rank asks for (default: hpc.rank_num_cpus).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable output.")
def cluster_validate(file: str, rank_cpus: float | None, as_json: bool) -> None:
    """Validate a cluster spec offline: a Ray cluster-launcher YAML (Ray's schema and
    rayflow's rules), or KubeRay manifests, a file or a directory of them such as
    cluster/k8s/ (KubeRay's CRD schemas and rayflow's rules)."""
    from rayflow.deploy.spec import ClusterSpecError, validate_file

    if Path(file).is_dir() or _is_manifest(file):
        _validate_manifests(file, as_json)
        return
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


def _is_manifest(file: str) -> bool:
    from rayflow.deploy.k8s import is_manifest

    try:
        return is_manifest(Path(file).read_text())
    except OSError:
        return False  # the cluster-spec path reports it


def _validate_manifests(path: str, as_json: bool) -> None:
    from rayflow.deploy.k8s import ManifestError, validate_manifest_dir, validate_manifest_file

    try:
        reports = (validate_manifest_dir(path) if Path(path).is_dir()
                   else [validate_manifest_file(path)])
    except ManifestError as exc:
        if as_json:
            click.echo(json.dumps({"file": exc.file, "valid": False, "document": exc.doc,
                                   "path": exc.path, "line": exc.line, "error": exc.message},
                                  indent=2))
            sys.exit(1)
        raise
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in reports], indent=2))
        return
    for r in reports:
        what = "; ".join(f"{x.kind} {x.name}" for x in r.resources)
        click.echo(f"{r.file}: valid ({what}; {r.schema})")


@main.command()
@click.option("-o", "--output", "out_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Write the dashboard to this file instead of printing it.")
def dashboard(out_file: Path | None) -> None:
    """Print (or write) the Grafana dashboard of rayflow's metrics.

    Import it in Grafana (Dashboards > New > Import) over the Prometheus that scrapes
    Ray's metrics (ray_rayflow_* series). See docs/operations.md.
    """
    from importlib import resources

    text = resources.files("rayflow").joinpath("dashboards").joinpath("rayflow.json").read_text()
    if out_file is None:
        click.echo(text, nl=False)
        return
    out_file.write_text(text)
    click.echo(f"wrote {out_file}", err=True)


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

    recorded = local.recorded_head()
    if recorded and local.head_processes(recorded):
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
              help="Uploaded with the job (.git, .venv, results, data, images left out); "
                   "given explicitly, it overrides the runtime env's.")
@click.option("--no-working-dir", is_flag=True, help="Upload nothing.")
@click.option("--exclude", multiple=True, help="Another gitignore-style pattern to leave out.")
@click.option("--env", "env_pairs", multiple=True, metavar="NAME=VALUE",
              help="An environment variable of the job's driver.")
@click.option("--runtime-env", "runtime_env_file", default=None,
              type=click.Path(exists=True, dir_okay=False),
              help="A YAML file with a runtime_env (pip, env_vars, ...), as for ray job submit.")
@click.option("--runtime-env-json", default=None, help="A runtime_env as JSON.")
@click.option("--submission-id", default=None, help="The job's id (Ray makes one if omitted).")
@click.option("--entrypoint-num-cpus", type=float, default=None,
              help="CPUs reserved for the entrypoint command (the job's driver) itself.")
@click.option("--entrypoint-num-gpus", type=float, default=None,
              help="GPUs reserved for the entrypoint command itself.")
@click.option("--entrypoint-memory", type=int, default=None,
              help="Memory (bytes) reserved for the entrypoint command itself.")
@click.option("--no-wait", is_flag=True, help="Return once the job is accepted.")
@click.option("--timeout", "timeout_s", type=float, default=None, help="Stop after seconds.")
@click.option("--connect-timeout", "connect_timeout_s", type=float, default=10.0,
              show_default=True, help="Seconds the job API may take to answer at all.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary at the end.")
@click.argument("entrypoint", nargs=-1, type=click.UNPROCESSED, required=True)
@click.pass_context
def submit(ctx: click.Context, address: str | None, working_dir: str, no_working_dir: bool,
           exclude: tuple, env_pairs: tuple, runtime_env_file: str | None,
           runtime_env_json: str | None, submission_id: str | None,
           entrypoint_num_cpus: float | None, entrypoint_num_gpus: float | None,
           entrypoint_memory: int | None, no_wait: bool, timeout_s: float | None,
           connect_timeout_s: float, as_json: bool, entrypoint: tuple) -> None:
    """Submit a job to a Ray cluster and stream its logs; exits with the job's status.
    Ctrl-C detaches (the job keeps running), as with ray job submit.

    \b
        rayflow submit --address http://head:8265 -- python jobs/identity.py \\
            --address auto --bootstrap kafka:9092 --records 10000
    """
    from rayflow.deploy.submit import Detached
    from rayflow.deploy.submit import submit as do_submit

    env = {}
    for pair in env_pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--env {pair!r}: use NAME=VALUE")
        env[name] = value
    base = read_runtime_env(runtime_env_file, runtime_env_json)
    wd: str | None = None if no_working_dir else working_dir
    if "working_dir" in base and not no_working_dir and \
            ctx.get_parameter_source("working_dir") == click.core.ParameterSource.DEFAULT:
        theirs = str(base["working_dir"])
        wd = theirs if Path(theirs).is_dir() else None  # a remote URI is Ray's to fetch
    try:
        res = do_submit(list(entrypoint), address=address, working_dir=wd,
                        extra_excludes=exclude, env_vars=env, runtime_env=base,
                        wait=not no_wait, timeout_s=timeout_s,
                        on_log=None if as_json else (lambda t: click.echo(t, nl=False)),
                        submission_id=submission_id, entrypoint_num_cpus=entrypoint_num_cpus,
                        entrypoint_num_gpus=entrypoint_num_gpus,
                        entrypoint_memory=entrypoint_memory,
                        connect_timeout_s=connect_timeout_s)
    except Detached as d:
        click.echo(f"\n{d}", err=True)
        sys.exit(130)
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


def read_runtime_env(path: str | None, as_json: str | None) -> dict:
    """The runtime_env of ``--runtime-env FILE`` (YAML) or ``--runtime-env-json`` (one of
    them), as a mapping."""
    import yaml

    if path and as_json:
        raise click.UsageError("give --runtime-env or --runtime-env-json, not both")
    if path:
        try:
            data = yaml.safe_load(Path(path).read_text())
        except yaml.YAMLError as exc:
            raise RayflowError(f"--runtime-env {path}: not valid YAML: {exc}") from None
        where = f"--runtime-env {path}"
    elif as_json:
        try:
            data = json.loads(as_json)
        except ValueError as exc:
            raise RayflowError(f"--runtime-env-json: not valid JSON: {exc}") from None
        where = "--runtime-env-json"
    else:
        return {}
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RayflowError(f"{where}: a runtime_env is a mapping, got {type(data).__name__}")
    return data


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
    """Gather benchmark results (W1-W7 and more) into BENCHMARKS.md with plots: our figures,
    same-run baselines, published figures, ratios, machine, date and targets met or missed.
    Runs the report of the rayflow checkout in the current directory (benchmarks/report/)."""
    generate = checkout_report(Path.cwd()).generate
    if not results_dir.is_dir():
        raise RayflowError(f"no results directory {results_dir}: run `rayflow bench <name>` "
                           "first, or pass --results DIR")
    path = generate(results_dir, out_file, plots_dir or results_dir / "plots")
    click.echo(f"wrote {path}")


@main.command(context_settings={"ignore_unknown_options": True})
@click.option("-n", "-np", "--np", "num_ranks", type=click.IntRange(min=1), required=True,
              help="Number of MPI ranks.")
@click.option("--address", default=None, help="Ray address (a private local Ray if omitted).")
@click.option("--backend", type=click.Choice(["ray", "gloo"]), default=None,
              help="Rank transport (default hpc.backend: ray).")
@click.option("--retries", type=click.IntRange(min=0), default=0, show_default=True,
              help="Rerun the whole program this many times after a failed attempt.")
@click.option("--rank-cpus", type=float, default=None, help="CPUs reserved per rank.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def mpirun(num_ranks: int, address: str | None, backend: str | None, retries: int,
           rank_cpus: float | None, command: tuple[str, ...]) -> None:
    """Run an mpi4py program on N gang-scheduled Ray ranks, as `mpiexec -n N` would:
    `rayflow mpirun -n 4 -- python prog.py ARGS` (or `python -m mpi4py prog.py ARGS`). With
    `python -m mpi4py.futures prog.py`, rank 0 runs the program and the other ranks are its
    MPIPoolExecutor's workers.

    `from mpi4py import MPI` resolves to rayflow.hpc.MPI in every rank; output lines are
    prefixed with the rank (`[0] ...`) and the exit status is the worst rank's.
    """
    from rayflow._raycontext import ensure_ray
    from rayflow.hpc.mpirun import MPIRunError, run_mpi

    args = list(command)
    if args and os.path.basename(args[0]).startswith("python"):
        args = args[1:]
    if not args:
        raise click.UsageError("no program: give it as `-- python prog.py ARGS`")
    futures = args[:2] == ["-m", "mpi4py.futures"]
    if args[:2] in (["-m", "mpi4py"], ["-m", "mpi4py.futures"]):
        # python -m mpi4py prog.py: mpi4py's runner, which aborts every rank when one raises
        # (as rayflow mpirun does for any program); with .futures rank 0 runs the program
        # and the others are its executors' workers
        if len(args) < 3:
            raise click.UsageError(f"no program after {' '.join(args[:2])}: give it as "
                                   f"`-- python {' '.join(args[:2])} prog.py ARGS`")
        args = args[2:]
    if args[0].startswith("-"):
        raise click.UsageError(f"unknown option {args[0]!r} before the program (of python's "
                               "own options only `-m mpi4py` and `-m mpi4py.futures` are "
                               "supported); give the program as `-- python prog.py ARGS`")
    if not os.path.isfile(args[0]):  # before Ray starts, which takes seconds
        raise FileNotFoundError(f"MPI program {args[0]!r} not found")
    if address:
        os.environ.setdefault("RAY_AUTH_MODE", "token")  # a client by address needs the token
    ensure_ray(address)
    try:
        result = run_mpi(args[0], num_ranks, args=args[1:], backend=backend, retries=retries,
                         rank_num_cpus=rank_cpus, futures=futures)
    except MPIRunError as exc:
        click.secho(f"rayflow mpirun: {exc}", fg="red", err=True)
        sys.exit(exc.result.exit_code)
    sys.exit(result.exit_code)


if __name__ == "__main__":
    main()
