"""The rayflow command line: help texts, the broker commands, one-line errors, log levels,
the dashboard of local Ray, and the demo's summary."""

import json
import logging
import re
import subprocess
import sys
import warnings

import pytest
from click.testing import CliRunner

from rayflow import cli
from rayflow._procs import alive
from rayflow.cli import main
from rayflow.connectors import broker as broker_mod


def test_help_lists_and_explains_commands():
    out = CliRunner().invoke(main, ["--help"]).output
    for cmd in ("demo", "kafka", "run", "bench"):
        assert cmd in out
    assert "embedded Kafka broker" in CliRunner().invoke(main, ["kafka", "--help"]).output


def test_kafka_up_status_down(tmp_path, monkeypatch):
    monkeypatch.setattr(broker_mod, "STATE_DIR", tmp_path)
    monkeypatch.setattr(broker_mod, "STATE_FILE", tmp_path / "broker.json")
    r = CliRunner()
    up = json.loads(r.invoke(main, ["kafka", "up", "--json"]).stdout)
    try:
        assert up["running"] and up["bootstrap"].startswith("127.0.0.1:")
        st = json.loads(r.invoke(main, ["kafka", "status", "--json"]).stdout)
        assert st["pid"] == up["pid"] and st["running"]
    finally:
        down = json.loads(r.invoke(main, ["kafka", "down", "--json"]).stdout)
    assert down["running"] is False
    assert not alive(up["pid"])


def test_errors_are_one_line_with_a_hint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["bench", "nope"])
    assert res.exit_code == 1
    assert "error: no benchmark 'nope' here" in res.output
    assert "hint: run with --debug" in res.output
    assert "Traceback" not in res.output


# -- help, module entry point, log levels ------------------------------------------------------


@pytest.mark.parametrize("args", [[], ["submit"], ["cluster"], ["cluster", "validate"],
                                  ["kafka", "up"], ["config", "defaults"], ["demo"], ["run"]])
def test_dash_h_is_help_everywhere(args):
    res = CliRunner().invoke(main, [*args, "-h"])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("Usage: ")
    assert res.output == CliRunner().invoke(main, [*args, "--help"]).output


def test_python_dash_m_rayflow_runs_the_cli():
    proc = subprocess.run([sys.executable, "-m", "rayflow", "-h"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Usage: rayflow ")
    version = subprocess.run([sys.executable, "-m", "rayflow", "--version"],
                             capture_output=True, text=True, timeout=120)
    from importlib.metadata import version as dist_version

    assert version.stdout.strip() == f"rayflow, version {dist_version('rayflow-engine')}"


@pytest.mark.parametrize("flags,level", [([], logging.WARNING), (["-v"], logging.INFO),
                                         (["-vv"], logging.DEBUG), (["-q"], logging.ERROR)])
def test_verbose_and_quiet_set_the_log_level(flags, level):
    res = CliRunner().invoke(main, [*flags, "config", "defaults", "--check",
                                    str(cli.Path(cli.__file__).with_name("defaults.yaml"))])
    assert res.exit_code == 0, res.output
    assert logging.getLogger("rayflow").level == level


def test_quiet_and_verbose_together_are_a_usage_error():
    res = CliRunner().invoke(main, ["-q", "-v", "config", "show"])
    assert res.exit_code == 2 and "-q and -v exclude each other" in res.output


# -- local Ray with its dashboard ---------------------------------------------------------------
def test_run_turns_the_dashboard_on_for_a_private_ray_only(monkeypatch):
    from rayflow import _raycontext

    monkeypatch.setattr(_raycontext, "dashboard_available", lambda: True)
    assert cli.script_env(None, {})["RAYFLOW_RAY__INCLUDE_DASHBOARD"] == "true"
    assert "RAYFLOW_RAY__INCLUDE_DASHBOARD" not in cli.script_env("auto", {})
    kept = cli.script_env(None, {"RAYFLOW_RAY__INCLUDE_DASHBOARD": "0"})
    assert kept["RAYFLOW_RAY__INCLUDE_DASHBOARD"] == "0"
    monkeypatch.setattr(_raycontext, "dashboard_available", lambda: False)
    assert "RAYFLOW_RAY__INCLUDE_DASHBOARD" not in cli.script_env(None, {})


def test_demo_starts_its_local_ray_with_the_dashboard(monkeypatch):
    from rayflow import _raycontext, demo

    seen = {}

    class Stop(Exception):
        pass

    def fake_ensure_ray(address, **kw):
        seen.update(kw, address=address)
        raise Stop

    monkeypatch.setattr(_raycontext, "ensure_ray", fake_ensure_ray)
    monkeypatch.setattr(_raycontext, "dashboard_available", lambda: True)
    with pytest.raises(Stop):
        demo.run_demo(quick=True)
    assert seen == {"address": None, "num_cpus": 4, "include_dashboard": True,
                    # quiet: Ray's start-up lines and the actors' INFO lines stay out
                    "logging_level": logging.ERROR,
                    "runtime_env": {"env_vars": {"RAYFLOW_LOG_LEVEL": "WARNING"}}}


def test_dashboard_url_without_deprecation_warnings(ray_session):
    from rayflow._raycontext import dashboard_url

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        url = dashboard_url()
    assert [w for w in caught if issubclass(w.category, DeprecationWarning)] == []
    assert url is None  # the test session's Ray runs without a dashboard


# -- the demo's summary at 80 columns -------------------------------------------------------------
ROWS = [
    {"demo": "W4 word count (exactly-once)", "records": "20,000", "rate": "12,345 rec/s",
     "latency p50/p99": "120/480 ms", "checkpoints": 12, "recoveries": 1, "dead letters": 2,
     "check": "ok"},
    {"demo": "W5 Cannon 1024x1024, 2x2 gang", "rate in the stage": "12.3 GFLOP/s",
     "wall with gang start": "8.1 s", "relative error": "1.2e-15", "check": "ok"},
    {"demo": "stream -> CG stage per window", "windows": 16, "rate": "-",
     "check": "MISMATCH (15 windows, expected 16)"},
]


def test_demo_summary_reads_at_80_columns():
    import io

    from rich.console import Console

    from rayflow.demo import summary_table

    buf = io.StringIO()
    Console(file=buf, width=80, color_system=None).print(summary_table(ROWS))
    lines = buf.getvalue().splitlines()
    assert max(len(ln) for ln in lines) <= 80
    cells = [[c.strip() for c in ln.strip("│").split("│")] for ln in lines if ln.startswith("│")]
    assert ["W4 word count (exactly-once)", "ok"] in cells
    assert ["rate", "12,345 rec/s"] in cells and ["latency p50/p99", "120/480 ms"] in cells
    assert ["rate in the stage", "12.3 GFLOP/s"] in cells
    assert ["stream -> CG stage per window", "MISMATCH (15 windows, expected 16)"] in cells
    assert not any(c[0] == "rate" and c[1] == "-" for c in cells)  # no empty figures
    assert len(cells) == 3 + 6 + 3 + 1  # a title row per demo, one row per figure


def test_kafka_up_waits_as_long_as_the_config_says(monkeypatch):
    got = {}
    monkeypatch.setattr(broker_mod, "up", lambda port=None, timeout_s=20.0: got.update(
        port=port, timeout_s=timeout_s) or {"running": True})
    monkeypatch.setenv("RAYFLOW_KAFKA__STARTUP_TIMEOUT_S", "42.5")
    res = CliRunner().invoke(main, ["kafka", "up", "--json"])
    assert res.exit_code == 0, res.output
    assert got == {"port": None, "timeout_s": 42.5}


def test_run_resume_passes_the_checkpoint_to_the_script(tmp_path):
    """`rayflow run --resume PATH` checks PATH and hands it to the script's rayflow.run."""
    from rayflow.checkpoint import CompletedCheckpoint
    from rayflow.checkpoint_store import CheckpointStore

    script = tmp_path / "show.py"
    script.write_text("import os; print('RESUME', os.environ.get('RAYFLOW_RESUME_FROM'))\n")
    bad = CliRunner().invoke(main, ["run", "--resume", str(tmp_path / "nothing"), str(script)])
    assert bad.exit_code != 0 and "no completed checkpoint" in bad.output
    store = CheckpointStore(str(tmp_path / "run"))
    path = store.write(CompletedCheckpoint(4, {("s", 0): 1}, 0.0, 1.0), {"job": "x"})
    out = subprocess.run([sys.executable, "-m", "rayflow", "run", "--resume", path,
                          str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"RESUME {path}" in out.stdout


# -- the demo's progress -------------------------------------------------------------------------
def test_demo_progress_is_plain_lines_without_a_terminal(capsys):
    import io

    from rich.console import Console

    from rayflow.demo import _Steps

    steps = _Steps(Console(file=io.StringIO(), force_terminal=False), total=1)
    with steps, steps.step("W1 image blur") as update:
        update(3, 10)  # no bar to move: nothing printed
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "[rayflow demo] W1 image blur ..."
    assert re.fullmatch(r"\[rayflow demo\] W1 image blur: done in \d+\.\d s", out[1])
    assert len(out) == 2


def test_demo_progress_draws_bars_on_a_terminal_and_keeps_one_line_per_step():
    import io

    from rich.console import Console

    from rayflow.demo import _Steps

    buf = io.StringIO()
    steps = _Steps(Console(file=buf, force_terminal=True, width=80), total=2)
    with steps:
        with steps.step("W4 word count") as update:
            update(5, 10)
            assert steps.progress.tasks[-1].completed == 5
            assert steps.progress.tasks[-1].total == 10
        assert steps.progress.tasks[0].completed == 1  # the demo's own bar moved
    from rich.text import Text

    assert "✓ W4 word count (" in Text.from_ansi(buf.getvalue()).plain
