"""The Grafana dashboard shipped in the package parses, and its queries name only series that
rayflow exports (and every exported series has a panel)."""

from __future__ import annotations

import json
import re
from importlib import resources

from click.testing import CliRunner

from rayflow import metrics as m
from rayflow.cli import main


def _dashboard() -> dict:
    return json.loads(resources.files("rayflow").joinpath("dashboards", "rayflow.json")
                      .read_text())


def _exprs(d: dict) -> list[str]:
    out = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
    out += [v["definition"] for v in d["templating"]["list"] if "definition" in v]
    return out


def test_the_dashboard_names_only_exported_series_and_shows_them_all():
    d = _dashboard()
    named = {s for e in _exprs(d) for s in re.findall(r"\bray_rayflow_\w+", e)}
    assert named <= set(m.SERIES), named - set(m.SERIES)
    # a histogram is shown through its buckets (quantiles) or its _sum/_count
    shown = {re.sub(r"_(bucket|sum|count)$", "", s) for s in named}
    exported = {re.sub(r"_(bucket|sum|count)$", "", s) for s in m.SERIES}
    assert shown == exported


def test_queries_group_by_rayflows_labels_only():
    for e in _exprs(_dashboard()):
        for group in re.findall(r"by \(([^)]*)\)", e):
            labels = {x.strip() for x in group.split(",")}
            assert labels <= set(m.STEP_LABELS) | {"le"}, e
        for sel in re.findall(r"\{([^}]*)\}", e):
            for label in re.findall(r"(\w+)=~?", sel):
                assert label in m.STEP_LABELS, e


def test_panels_have_unique_ids_and_every_target_a_datasource():
    d = _dashboard()
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    assert d["uid"] == "rayflow"
    for p in d["panels"]:
        for t in p.get("targets", []):
            assert t["datasource"]["uid"] == "${datasource}"


def test_cli_prints_and_writes_it(tmp_path):
    r = CliRunner().invoke(main, ["dashboard"])
    assert r.exit_code == 0 and json.loads(r.output) == _dashboard()
    out = tmp_path / "d.json"
    r = CliRunner().invoke(main, ["dashboard", "-o", str(out)])
    assert r.exit_code == 0 and json.loads(out.read_text()) == _dashboard()
    r = CliRunner().invoke(main, ["dashboard", "--bogus"])
    assert r.exit_code == 2 and "No such option" in r.output and "--bogus" in r.output
