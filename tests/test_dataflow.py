import pytest

import rayflow as rf
from rayflow import CollectSink, Dataflow, MemorySource
from rayflow.errors import ConfigError
from rayflow.operators.windows import TumblingWindow
from rayflow.runtime.plan import chains, make_plan


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


def _linear(par_map=1, par_sink=1, edge=None, opts=None):
    opts = opts or {}
    f = Dataflow("chain")
    s = f.source("src", MemorySource([1]))
    s = getattr(s, edge)() if edge == "rebalance" else s.key_by(str) if edge == "key" else s
    m = s.map("m", str, parallelism=par_map, **opts.get("m", {}))
    m.sink("out", CollectSink(), parallelism=par_sink, **opts.get("out", {}))
    return f


@pytest.mark.parametrize("kw, expected", [
    ({}, {"src": "src", "m": "src", "out": "src"}),  # all one-to-one at parallelism 1
    ({"edge": "rebalance"}, {"src": "src", "m": "src", "out": "src"}),  # one target anyway
    ({"edge": "key"}, {"src": "src", "m": "src", "out": "src"}),
    ({"par_map": 2, "par_sink": 2}, {"src": "src", "m": "m", "out": "m"}),  # forward 2 -> 2
    ({"par_map": 2, "par_sink": 2, "edge": "key"}, {"src": "src", "m": "m", "out": "m"}),
    ({"par_map": 2}, {"src": "src", "m": "m", "out": "out"}),  # 2 -> 1 needs a channel
    ({"opts": {"out": {"start_new_chain": True}}}, {"src": "src", "m": "src", "out": "out"}),
    ({"opts": {"m": {"disable_chaining": True}}}, {"src": "src", "m": "m", "out": "out"}),
    ({"opts": {"m": {"actor_num_cpus": 1}}}, {"src": "src", "m": "m", "out": "out"}),
    ({"opts": {"m": {"actor_env": {"A": "1"}}, "out": {"actor_env": {"A": "1"}}}},
     {"src": "src", "m": "m", "out": "m"}),  # same env: m and out chain, apart from src
])
def test_chains_follow_one_to_one_edges(kw, expected):
    opts = kw.pop("opts", {})
    assert chains(_linear(**kw, opts=opts)) == expected


def test_chains_take_fan_out_and_side_outputs_and_stop_at_inputs_of_two_chains_or_when_disabled():
    f = Dataflow("fan")
    s = f.source("src", MemorySource([1])).map("m", str)
    s.sink("a", CollectSink())
    s.sink("b", CollectSink())  # m feeds two steps: both chain, as in Flink
    s.side("late").sink("c", CollectSink())  # a side output chains too
    two = s.map("x", str).merge("both", f.source("src2", MemorySource([2])))
    two.map("y", str, parallelism=2)  # two inputs, then another parallelism: channels
    assert chains(f) == {"src": "src", "m": "src", "a": "src", "b": "src", "c": "src",
                         "x": "src", "src2": "src2", "both": "both", "y": "y"}
    assert set(chains(_linear(), enabled=False).values()) == {"src", "m", "out"}


def test_a_step_of_two_inputs_from_one_chain_chains_on_one_to_one_edges():
    f = Dataflow("two")
    a, b = f.source("src", MemorySource([1])).branch("split", bool)
    b2 = b.map("z", str)
    a.key_by(str).join("j", b2.key_by(str), TumblingWindow(1.0)).sink("out", CollectSink())
    a.merge("m", b.map("x", str, parallelism=2))  # one input needs a channel
    c, d = f.source("s2", MemorySource([1]), parallelism=2).branch("sp2", bool)
    c.merge("m2", d.map("y", str)).sink("o2", CollectSink(), parallelism=2)  # forward 2 -> 2
    c.key_by(str).merge("m3", d.map("w", str, parallelism=2), parallelism=2)  # keyed: a shuffle
    assert chains(f) == {"src": "src", "split": "src", "z": "src", "j": "src", "out": "src",
                         "x": "x", "m": "m", "s2": "s2", "sp2": "s2", "y": "s2", "m2": "s2",
                         "o2": "s2", "w": "s2", "m3": "m3"}


@pytest.mark.parametrize("make, message", [
    (lambda: rf.GeneratorSource(str, count=-1), "GeneratorSource: count must be an int >= 0"),
    (lambda: rf.GeneratorSource(str, count=2.5), "GeneratorSource: count .* got 2.5"),
    (lambda: rf.GeneratorSource(str, count=5, rate=0), "GeneratorSource: rate must be a "
                                                       "number > 0 or None"),
    (lambda: rf.GeneratorSource(str, rate=float("nan")), "GeneratorSource: rate .* got nan"),
    (lambda: rf.MemorySource(5), "MemorySource: records must be a list, .* got int"),
    (lambda: rf.MemorySource(x for x in "ab"), "MemorySource: records .* got generator"),
    (lambda: rf.EmbeddedBroker(port=70000), "EmbeddedBroker: port must be 1-65535"),
    (lambda: rf.EmbeddedBroker(timeout_s=0), "EmbeddedBroker: timeout_s must be a number > 0"),
])
def test_a_source_or_broker_that_cannot_work_is_an_error_where_it_is_made(make, message):
    """A negative count or a zero rate (a source that would wait forever), records that
    are not a batch: refused where the spec is made, naming it and the field."""
    with pytest.raises(ValueError, match=message):
        make()


def test_sources_take_numpy_numbers_and_arrays():
    import numpy as np

    assert rf.GeneratorSource(str, count=np.int64(3), rate=np.float64(2.0)).count == 3
    assert len(rf.MemorySource(np.arange(4)).records) == 4


def _keyed():
    return Dataflow("fns").source("in", MemorySource([1, 2])).key_by(str)


@pytest.mark.parametrize("add, message", [
    (lambda s: s.map("m", 5), "step 'm': map\\(\\) needs a function, got 5"),
    (lambda s: s.flat_map("fm", [1]), "step 'fm': flat_map\\(\\) needs a function"),
    (lambda s: s.filter("f", None), "step 'f': filter\\(\\) needs a function, got None"),
    (lambda s: s.inspect("i", "print"), "step 'i': inspect\\(\\) needs a function"),
    (lambda s: s.map_batches("mb", 1.0), "step 'mb': map_batches\\(\\) needs a function"),
    (lambda s: s.branch("b", True), "step 'b': branch\\(\\) needs a function"),
    (lambda s: s.stateful_map("sm", "x"), "step 'sm': stateful_map\\(\\) needs a function"),
    (lambda s: s.stateful_map_batches("smb", 0), "step 'smb': stateful_map_batches\\(\\)"),
    (lambda s: s.enrich_cached("e", {}, ttl_s=1), "step 'e': enrich_cached\\(\\) needs a"),
    (lambda s: s.key_by(7), "key_by\\(\\) after step 'in' needs a function or a field name"),
    (lambda s: s.window("w", "tumbling", __import__("rayflow.operators.windows", fromlist=[
        "x"]).Count()), "step 'w': window: the windower must be a CountWindow"),
    (lambda s: s.window("w", TumblingWindow(1.0), sum),
     "step 'w': window: the aggregator must have create\\(\\), add\\(acc, record\\)"),
])
def test_a_step_given_what_cannot_run_is_an_error_naming_it(add, message):
    """Met when the flow is defined, not as an error in every record once it runs."""
    with pytest.raises(ConfigError, match=message):
        add(_keyed())


def test_a_window_takes_an_aggregator_of_its_own_that_does_not_subclass_aggregator(
        ray_session):
    """Duck typing, as the guide says: create, add, merge, result."""
    class Longest:
        def create(self):
            return ""

        def add(self, acc, word):
            return max(acc, word, key=len)

        def merge(self, a, b):
            return max(a, b, key=len)

        def result(self, acc):
            return acc

    f = Dataflow("own")
    (f.source("in", MemorySource(["a", "bbb", "cc"])).key_by(lambda w: "all")
      .window("w", __import__("rayflow.operators.windows", fromlist=["x"]).CountWindow(3),
              Longest())
      .sink("out", CollectSink()))
    assert [r.value for r in f.run(timeout_s=60).collect("out")] == ["bbb"]
