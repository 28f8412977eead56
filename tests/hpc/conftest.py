"""Fixtures of the HPC tests: gangs reused across tests (a gang start costs seconds here)."""

from __future__ import annotations

import pytest


def _gang(size: int, backend: str = "ray"):
    from rayflow.hpc import Gang

    # Half a logical CPU per rank: the 8-CPU test Ray then fits a 3x3 gang, a 2x2 gang and the
    # small gangs of the recovery tests at once (the machine has 2 real cores anyway).
    return Gang(size, backend=backend, rank_num_cpus=0.5, gang_timeout_s=60)


@pytest.fixture(scope="session")
def gang4(ray_session):
    g = _gang(4).start()
    yield g
    g.shutdown()


# The 3x3 and gloo gangs serve one module each; releasing them after it keeps the 8 logical
# CPUs free for the next module's gangs.
@pytest.fixture(scope="module")
def gang9(ray_session):
    g = _gang(9).start()
    yield g
    g.shutdown()


@pytest.fixture(scope="module")
def gloo_gang4(ray_session):
    pytest.importorskip("torch")
    g = _gang(4, backend="gloo").start()
    yield g
    g.shutdown()
