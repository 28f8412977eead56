import pytest

from rayflow import CollectSink, Dataflow, MemorySource
from rayflow.errors import ConfigError
from rayflow.runtime.plan import make_plan


def test_duplicate_and_bad_step_ids_are_rejected():
    f = Dataflow("x")
    s = f.source("in", MemorySource([1]))
    with pytest.raises(ConfigError, match="used twice"):
        s.map("in", str)
    with pytest.raises(ConfigError, match="letters, digits"):
        s.map("bad id!", str)
    with pytest.raises(ConfigError, match="parallelism"):
        s.map("m", str, parallelism=0)


def test_dangling_stream_is_an_error_naming_the_step():
    f = Dataflow("x")
    f.source("in", MemorySource([1])).map("m", str)
    with pytest.raises(ConfigError, match=r"\['m'\] goes nowhere"):
        f.validate()


def test_plan_channels_and_end_of_stream_counts():
    f = Dataflow("x")
    s = f.source("in", MemorySource([1]), parallelism=2)
    s.map("fwd", str, parallelism=2).key_by(len).map("keyed", str, parallelism=3).sink(
        "out", CollectSink(), parallelism=3)
    plan = make_plan(f)
    assert plan.order == ["in", "fwd", "keyed", "out"]
    # forward with equal parallelism is one-to-one
    assert [e.target_instances for e in plan.outputs[("in", 1)]] == [(1,)]
    assert plan.expected_eos[("fwd", 0)] == 1
    # hash edges connect all to all
    assert plan.outputs[("fwd", 0)][0].partitioning == "hash"
    assert plan.expected_eos[("keyed", 2)] == 2
    assert plan.expected_eos[("out", 0)] == 1


def test_forward_with_different_parallelism_becomes_rebalance():
    f = Dataflow("x")
    f.source("in", MemorySource([1])).map("m", str, parallelism=2).sink("out", CollectSink())
    plan = make_plan(f)
    assert plan.outputs[("in", 0)][0].partitioning == "rebalance"
    assert plan.expected_eos[("out", 1)] == 1


def test_importing_rayflow_does_not_import_ray():
    import subprocess
    import sys

    code = "import sys, rayflow, rayflow.dataflow, rayflow.operators.stateless; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
