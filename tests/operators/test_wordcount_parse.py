"""W4's parser (jobs/wordcount.py): the vectorized Arrow path equals the record-by-record
path, and a batch with bad records still yields every good record plus one dead letter per
bad one, with its reason. No Ray."""

import json

import pyarrow as pa

from rayflow.core.operators import StepContext
from rayflow.examples.wordcount import ParseSentences, parse, parse_batch, sentences


def _expected(records):
    got = [(w, ev) for rec in records for w, ev, _ in parse(rec)]
    return [w for w, _ in got], [ev for _, ev in got]


def test_vectorized_parse_equals_record_parse():
    records = list(sentences(500, seed=3))
    records.append(json.dumps({"msgId": 9, "eventTime": 5, "sentence": "  a\tb  c \n d ",
                               "extra": [1]}).encode())
    table = parse_batch(records)
    assert table is not None
    words, evs = _expected(records)
    assert table.column("word").to_pylist() == words
    assert table.column("eventTime").to_pylist() == evs


def test_batch_with_bad_records_falls_back_and_keeps_every_good_record():
    good = list(sentences(40, seed=4))
    bad = [b'{"msgId": 1, "eventTime": 2', b"[1, 2]", b'{"msgId": 3, "sentence": "x"}',
           b'{"msgId": 4, "eventTime": 1, "sentence": "' + b"y " * 6000 + b'"}']
    records = good[:20] + bad + good[20:]
    assert parse_batch(records) is None
    logic = ParseSentences().build(StepContext("parse", 0, 1))
    out = logic.process(records, None)
    words, evs = _expected(good)
    assert isinstance(out.items, pa.Table)
    assert out.items.column("word").to_pylist() == words
    assert out.items.column("eventTime").to_pylist() == evs
    reasons = [d.reason for d in out.dead]
    assert len(reasons) == 4
    assert "JSON" in reasons[0] or "Expecting" in reasons[0]
    assert "not a JSON object" in reasons[1]
    assert "missing fields: eventTime" in reasons[2]
    assert "oversize record" in reasons[3]


def test_fast_path_output_has_the_record_paths_columns():
    records = list(sentences(10, seed=5))
    fast = ParseSentences().build(StepContext("parse", 0, 1)).process(records, None).items
    slow = ParseSentences().build(StepContext("parse", 0, 1)).process(
        records + [b"not json"], None).items
    assert fast.column_names == slow.column_names == ["word", "eventTime", "inTime"]
    assert fast.schema == slow.schema


def test_format_windows_writes_what_to_json_writes():
    import random

    from rayflow.examples.wordcount import format_windows, to_json
    from rayflow.operators.windows import WindowResult

    rnd = random.Random(7)
    words = ["vi", "a\"b", "back\\slash", "tab\x01", "ünï", "x" * 30]
    results = [WindowResult(rnd.choice(words), k, k + 1,
                            [rnd.randint(1, 10), 1.7e9 + rnd.random(), float(1_700_000_000 + k),
                             rnd.random() * 1e-7, 1e22 * rnd.random()]) for k in range(200)]
    fast = [json.loads(r) for r in format_windows(results)]
    slow = [json.loads(to_json(r)) for r in results]
    assert len({r.pop("outTime") for r in fast}) == 1  # one stamp for the batch
    for r in slow:
        r.pop("outTime")
    assert fast == slow  # the same JSON values, numbers read back to the same floats
    assert format_windows([]) == []
