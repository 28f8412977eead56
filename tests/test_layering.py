"""The layers show in the imports: the user API, the pure logic and the connectors import no
Ray when they load (a fresh interpreter per module), and no pure module imports the runtime."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "rayflow"

PURE = [
    "rayflow", "rayflow.dataflow", "rayflow.config", "rayflow.checkpoint",
    "rayflow.checkpoint_store", "rayflow.core.records", "rayflow.metrics",
    "rayflow.core.operators", "rayflow.operators.stateless", "rayflow.operators.windows",
    "rayflow.operators.windows.logic", "rayflow.operators.keyed", "rayflow.operators.queues",
    "rayflow.operators.watermarks", "rayflow.operators.image", "rayflow.operators.image.tiling",
    "rayflow.state",
    "rayflow.core.connectors", "rayflow.connectors.memory", "rayflow.connectors.kafka",
    "rayflow.hpc.comm", "rayflow.hpc.reduce", "rayflow.hpc.MPI", "rayflow.hpc.algorithms",
    "rayflow.hpc.algorithms.cannon_index", "rayflow.hpc.algorithms.cg_math",
    "rayflow.hpc.backends", "rayflow.hpc.backends.transport", "rayflow.hpc.backends.wire",
    "rayflow.hpc.backends.links", "rayflow.hpc.backends.channels", "rayflow.hpc.backends.shm",
    "rayflow.examples.wordcount", "rayflow.runtime.alignment", "rayflow.runtime.plan",
    "rayflow.runtime.inflight", "rayflow.runtime.pace",
]


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports_no_ray(module):
    code = f"import sys, {module}; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", f"importing {module} imports ray"


def _top_level_imports(path: Path) -> set[str]:
    """Modules imported at load time (not inside functions)."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", ["operators", "state", "connectors"])
def test_lower_layers_do_not_import_the_runtime(package):
    for path in (PKG / package).rglob("*.py"):
        bad = {m for m in _top_level_imports(path)
               if m.startswith(("rayflow.runtime", "rayflow.deploy", "rayflow.cli"))}
        assert not bad, f"{path.relative_to(PKG.parent)} imports {sorted(bad)} at load time"


def test_hpc_backends_import_nothing_above_them():
    """The transport layer knows no communicator, stage or algorithm: the collectives are
    written over it (``hpc/comm.py``), not it over them."""
    allowed = ("rayflow.hpc.backends", "rayflow.hpc.reduce")
    for path in (PKG / "hpc" / "backends").rglob("*.py"):
        bad = {m for m in _top_level_imports(path)
               if m.startswith("rayflow.") and not m.startswith(allowed)}
        assert not bad, f"{path.relative_to(PKG.parent)} imports {sorted(bad)} at load time"


def test_pure_modules_import_no_upper_layer():
    upper = ("ray", "ray.", "rayflow.runtime", "rayflow.hpc", "rayflow.deploy", "rayflow.cli")
    for mod in ["checkpoint", "checkpoint_store", "config", "batches", "dataflow"]:
        bad = {m for m in _top_level_imports(PKG / f"{mod}.py")
               if m == "ray" or m.startswith(upper[1:])}
        assert not bad, f"rayflow/{mod}.py imports {sorted(bad)} at load time"


def _all_imports(path: Path) -> set[str]:
    """Every module imported anywhere in the file, inside functions too."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_no_import_cycle_through_the_api():
    """The API and the pure layers never import the runtime, the HPC stages, deploy or the
    CLI, not even inside a function (``Dataflow.run`` goes through the ``rayflow`` facade),
    so no cycle closes lazily either."""
    upper = ("rayflow.runtime", "rayflow.hpc", "rayflow.deploy", "rayflow.cli")
    files = [PKG / f"{m}.py" for m in ("dataflow", "config", "checkpoint", "checkpoint_store",
                                        "batches", "metrics", "errors")]
    files += [p for d in ("operators", "state", "connectors") for p in (PKG / d).rglob("*.py")]
    for path in files:
        bad = {m for m in _all_imports(path) if m.startswith(upper)}
        assert not bad, f"{path.relative_to(PKG.parent)} imports {sorted(bad)}"


def test_the_contracts_import_nothing_but_each_other():
    """``rayflow/core`` is the bottom layer: every other package imports it, it imports
    no other part of rayflow (inside functions neither)."""
    for path in (PKG / "core").rglob("*.py"):
        bad = {m for m in _all_imports(path)
               if m.startswith("rayflow") and not m.startswith("rayflow.core")}
        assert not bad, f"{path.relative_to(PKG.parent)} imports {sorted(bad)}"
