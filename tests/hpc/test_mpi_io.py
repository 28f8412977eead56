"""MPI-IO (``MPI.File``) and the derived datatypes of its views, on ranks that are threads
(no Ray), against numpy and MPICH's figures. The same calls on a Ray gang, beside MPICH's
results and files, are in ``test_mpi_api_programs.py``."""

from __future__ import annotations

import numpy as np
import pytest

from rayflow.hpc import MPI
from rayflow.hpc.backends.transport import LocalTransport
from rayflow.hpc.comm import Communicator
from tests.hpc.test_mpi_api_threads import run_ranks


def err(call):
    """The MPI error class ``call`` raised, the name of another error, or None."""
    try:
        call()
    except MPI.Exception as exc:
        return exc.Get_error_class()
    except (NotImplementedError, TypeError, ValueError) as exc:
        return type(exc).__name__
    return None


def _one():
    return MPI.Intracomm(Communicator(LocalTransport()))


# (size, extent) of the same types under MPICH 5.0 with mpi4py 4.1
@pytest.mark.parametrize("make, size, extent", [
    (lambda: MPI.INT.Create_vector(3, 2, 4), 24, 40),
    (lambda: MPI.INT.Create_vector(10, 1, 3), 40, 112),
    (lambda: MPI.DOUBLE.Create_contiguous(5), 40, 40),
    (lambda: MPI.DOUBLE.Create_subarray([4, 5], [2, 3], [1, 1]), 48, 160),
    (lambda: MPI.DOUBLE.Create_subarray([4, 5], [2, 3], [1, 1], order=MPI.ORDER_FORTRAN),
     48, 160),
    (lambda: MPI.INT.Create_hvector(2, 3, 20), 24, 32),
    (lambda: MPI.INT.Create_vector(3, 1, 2).Create_contiguous(2), 24, 40),
    (lambda: MPI.INT.Create_vector(3, 1, 2).Create_resized(0, 24), 12, 24),
])
def test_derived_types_have_mpis_size_and_extent(make, size, extent):
    t = make()
    assert (t.Get_size(), t.Get_extent()) == (size, (0, extent))
    assert not t.is_predefined and MPI.INT.is_predefined


def test_a_subarrays_blocks_are_the_bytes_numpy_picks():
    for order, npo in ((MPI.ORDER_C, "C"), (MPI.ORDER_FORTRAN, "F")):
        t = MPI.DOUBLE.Create_subarray([4, 5, 3], [2, 3, 2], [1, 2, 1], order=order)
        index = np.arange(60).reshape((4, 5, 3), order=npo)
        want = index[1:3, 2:5, 1:3].reshape(-1, order=npo) * 8
        got = [off + i for off, n in t._layout() for i in range(0, n, 8)]
        assert got == want.tolist()


def test_a_vector_view_interleaves_the_ranks_items(tmp_path):
    """Each rank writes 2 tiles of 4 ints through a resized vector view; the file holds the
    ranks' items interleaved, and each rank reads its own back through the view."""
    path = str(tmp_path / "v.bin")

    def fn(c):
        r, p = c.rank, c.size
        fh = MPI.File.Open(c, path, MPI.MODE_RDWR | MPI.MODE_CREATE)
        view = MPI.INT.Create_vector(4, 1, p).Create_resized(0, 16 * p).Commit()
        fh.Set_view(4 * r, MPI.INT, view)
        fh.Write_all(np.arange(8, dtype="i4") * 10 + r)
        c.Barrier()
        fh.Seek(0)
        back = np.zeros(8, dtype="i4")
        fh.Read_all(back)
        fh.Close()
        return back.tolist()

    out = run_ranks(3, fn)
    for r, back in enumerate(out):
        assert back == [10 * i + r for i in range(8)]
    whole = np.fromfile(path, dtype="i4")
    assert whole.tolist() == [10 * i + r for i in range(8) for r in range(3)]


def test_file_errors_name_the_call_and_carry_mpis_class(tmp_path):
    c = _one()

    p = tmp_path / "f.bin"
    assert err(lambda: MPI.File.Open(c, p, MPI.MODE_RDONLY)) == MPI.ERR_NO_SUCH_FILE
    assert err(lambda: MPI.File.Open(c, p, MPI.MODE_RDONLY | MPI.MODE_CREATE)) == MPI.ERR_AMODE
    assert err(lambda: MPI.File.Open(c, p, MPI.MODE_RDWR | MPI.MODE_WRONLY)) == MPI.ERR_AMODE
    assert err(lambda: MPI.File.Open(c, p, MPI.MODE_CREATE)) == MPI.ERR_AMODE
    fh = MPI.File.Open(c, p, MPI.MODE_WRONLY | MPI.MODE_CREATE)
    fh.Write_at(0, np.arange(4, dtype="u1"))
    assert err(lambda: fh.Read_at(0, np.zeros(2, "u1"))) == MPI.ERR_ACCESS
    assert err(lambda: fh.Set_view(0, MPI.INT, MPI.INT.Create_vector(2, 1, 2))) == MPI.ERR_TYPE
    fh.Set_view(0, MPI.INT)
    assert err(lambda: fh.Write_at(0, np.zeros(3, "u1"))) == MPI.ERR_ARG  # not whole ints
    assert err(lambda: fh.Seek(-1)) == MPI.ERR_ARG
    assert err(lambda: fh.Seek_shared(-1)) == MPI.ERR_ARG
    assert err(lambda: fh.Set_view(0, MPI.INT, datarep="external32")) == "NotImplementedError"
    fh.Close()
    assert err(lambda: fh.Write_at(0, np.zeros(1, "u1"))) == MPI.ERR_FILE  # closed
    assert err(lambda: MPI.File.Open(c, p, MPI.MODE_WRONLY | MPI.MODE_CREATE
                                     | MPI.MODE_EXCL)) == MPI.ERR_FILE_EXISTS
    ro = MPI.File.Open(c, p, MPI.MODE_RDONLY)
    assert err(lambda: ro.Write_at(0, np.zeros(1, "u1"))) == MPI.ERR_READ_ONLY
    ro.Close()
    # a derived type describes a view, not a message: refused where a buffer is sent
    vec = MPI.DOUBLE.Create_vector(2, 1, 2).Commit()
    assert err(lambda: c.Send([np.zeros(4), vec], dest=0)) == "NotImplementedError"
    assert err(lambda: MPI.DOUBLE.Create_vector(-1, 1, 1)) == "ValueError"
    assert err(lambda: MPI.DOUBLE.Create_subarray([4], [3], [2])) == "ValueError"
    MPI.File.Delete(p)
    assert err(lambda: MPI.File.Delete(p)) == MPI.ERR_NO_SUCH_FILE


def test_append_mode_starts_at_the_end_and_delete_on_close_removes(tmp_path):
    c = _one()
    p = tmp_path / "log.bin"
    p.write_bytes(b"abc")
    fh = MPI.File.Open(c, p, MPI.MODE_WRONLY | MPI.MODE_APPEND)
    assert fh.Get_position() == 3
    fh.Write(np.frombuffer(b"de", dtype="u1"))
    fh.Close()
    assert p.read_bytes() == b"abcde"
    fh = MPI.File.Open(c, p, MPI.MODE_RDWR | MPI.MODE_DELETE_ON_CLOSE)
    fh.Iwrite_at(0, np.frombuffer(b"X", dtype="u1")).Wait()
    got = np.zeros(5, "u1")
    fh.Iread_at(0, got).Wait()
    assert got.tobytes() == b"Xbcde"
    fh.Close()
    assert not p.exists()


def test_the_shared_file_pointer_hands_out_each_place_once_and_orders_by_rank(tmp_path):
    """Write_shared from every rank, 20 times each: every record lands whole, none over
    another; Write_ordered puts the ranks' blocks in rank order after them; the pointer
    then stands at the end, and Seek_shared moves it for everyone."""
    path = str(tmp_path / "log.bin")

    def fn(c):
        r = c.rank
        fh = MPI.File.Open(c, path, MPI.MODE_RDWR | MPI.MODE_CREATE)
        fh.Set_view(0, MPI.INT)
        for i in range(20):
            fh.Write_shared(np.array([r, i], dtype="i4"))
        c.Barrier()
        fh.Write_ordered(np.full(r + 1, 100 + r, dtype="i4"))
        end = fh.Get_position_shared()
        fh.Seek_shared(2, MPI.SEEK_SET)
        first = np.zeros(2, dtype="i4")
        c.Barrier()
        if r == 0:
            fh.Read_shared(first)
        c.Barrier()
        after = fh.Get_position_shared()
        fh.Close()
        return end, first.tolist(), after

    out = run_ranks(3, fn)
    data = np.fromfile(path, dtype="i4")
    pairs = data[:2 * 60].reshape(60, 2).tolist()
    assert sorted(map(tuple, pairs)) == sorted((r, i) for r in range(3) for i in range(20))
    for r in range(3):  # each rank's records in the order it wrote them
        assert [i for q, i in pairs if q == r] == list(range(20))
    assert data[120:].tolist() == [100, 101, 101, 102, 102, 102]
    assert [end for end, _, _ in out] == [126] * 3
    assert out[0][1] == pairs[1] and [after for _, _, after in out] == [4] * 3


def test_a_collective_call_that_fails_at_rank_0_fails_on_every_rank(tmp_path):
    """Seek_shared before the start, Set_size of a file opened read-only, a
    DELETE_ON_CLOSE file deleted meanwhile: rank 0 does the work, and every rank raises
    its error (none waits for the others in vain)."""
    path = tmp_path / "f.bin"
    path.write_bytes(b"0123456789")

    def fn(c):
        fh = MPI.File.Open(c, path, MPI.MODE_RDONLY)
        got = [err(lambda: fh.Seek_shared(-1)), err(lambda: fh.Set_size(4))]
        fh.Close()
        gone = tmp_path / "gone.bin"
        fh = MPI.File.Open(c, gone, MPI.MODE_WRONLY | MPI.MODE_CREATE
                           | MPI.MODE_DELETE_ON_CLOSE)
        c.Barrier()
        if c.rank == 0:
            gone.unlink()
        got.append(err(fh.Close))
        return got

    out = run_ranks(3, fn)
    assert out[0][0] == MPI.ERR_ARG and out[0][2] == MPI.ERR_NO_SUCH_FILE
    assert out[0][1] is not None and all(got == out[0] for got in out)
    assert path.read_bytes() == b"0123456789"
