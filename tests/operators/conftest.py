"""Fixtures of the operator tests (no Ray)."""

import pytest

from rayflow.state import backend_from_name


@pytest.fixture(params=["memory", "filesystem", "rocksdb"])
def backend(request, tmp_path):
    """Each state backend in turn, with its files under the test's temporary directory."""
    if request.param == "rocksdb":
        pytest.importorskip("rocksdict")
    return backend_from_name(request.param, str(tmp_path))
