import numpy as np
import pyarrow as pa
import pytest

from rayflow.core.records import (
    concat,
    nbytes,
    num_rows,
    partition_indices,
    stable_hash,
    stable_order,
    take,
)


def test_num_rows_and_nbytes_per_container():
    arr = np.zeros((10, 3), dtype=np.float64)
    table = pa.table({"a": np.arange(5)})
    assert num_rows([1, 2]) == 2 and num_rows(arr) == 10 and num_rows(table) == 5
    assert nbytes(arr) == 240
    assert nbytes(table) == table.nbytes
    assert nbytes([b"x" * 100] * 10) >= 1000


def test_nbytes_of_objects_scales_with_size():
    small = [{"k": "v"}] * 100
    big = [{"k": "v" * 10_000}] * 100
    assert nbytes(big) > 100 * 10_000 > nbytes(small)


def test_stable_hash_is_process_independent():
    # crc32 of the UTF-8 bytes: fixed values, whatever PYTHONHASHSEED is
    assert stable_hash("word") == 3287381265
    assert stable_hash(7) == 7


@pytest.mark.parametrize("n", [1, 3, 4])
def test_partition_indices_groups_equal_keys(n):
    items = [f"k{i % 11}" for i in range(200)]
    groups = partition_indices(items, lambda x: x, n)
    assert sorted(np.concatenate(groups).tolist()) == list(range(200))
    owner = {}
    for g, idx in enumerate(groups):
        for i in idx:
            assert owner.setdefault(items[i], g) == g
    # order within a group is the input order
    for idx in groups:
        assert list(idx) == sorted(idx)


def test_partition_columnar_keys():
    arr = np.arange(100)
    groups = partition_indices(arr, lambda b: b % 10, 4)
    for g, idx in enumerate(groups):
        assert all((arr[idx] % 10) % 4 == g)


def test_take_and_concat_roundtrip():
    t = pa.table({"a": np.arange(6)})
    idx = np.array([4, 0])
    assert take([5, 6, 7, 8, 9], idx) == [9, 5]
    assert take(np.arange(10, 20), idx).tolist() == [14, 10]
    assert take(t, idx)["a"].to_pylist() == [4, 0]
    assert concat([[1], [2, 3]]) == [1, 2, 3]
    assert concat([t, t]).num_rows == 12


@pytest.mark.parametrize("distinct", [1, 3, 1 << 16, (1 << 16) + 1, 200_000])
def test_stable_order_is_numpys_stable_argsort(distinct):
    # 16-bit codes where they fit (radix sort), 64-bit above: the same order either way
    rng = np.random.default_rng(distinct)
    codes = rng.integers(0, distinct, 50_000)
    assert np.array_equal(stable_order(codes, distinct), np.argsort(codes, kind="stable"))
