"""The rayflow command line: help texts, the broker commands, and one-line errors."""

import json

from click.testing import CliRunner

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
    assert not broker_mod._alive(up["pid"])


def test_errors_are_one_line_with_a_hint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["bench", "nope"])
    assert res.exit_code == 1
    assert "error: no benchmark 'nope' here" in res.output
    assert "hint: run with --debug" in res.output
    assert "Traceback" not in res.output
