"""mpi4py's MPI-IO calls: opening modes and their errors, explicit offsets, the individual
file pointer, views through vector and subarray filetypes, sizes, non-blocking and split
collective forms, the shared file pointer. Each rank's results go to DIR/rank<r>.txt, the files it writes under DIR:
`mpiexec -n N python io.py DIR` (MPICH 5.0, mpi4py 4.1) wrote the results in io_mpich_n<N>/
for 1, 3 and 5 ranks, which the tests compare with this program's under rayflow.

    python io.py DIR"""
import sys

import numpy as np
from mpi4py import MPI

c = MPI.COMM_WORLD
r, p = c.Get_rank(), c.Get_size()
d = sys.argv[1]
out = []


def show(name, v):
    out.append(f"{name}: {v}")


def error_class(call):
    try:
        call()
    except MPI.Exception as exc:
        return exc.Get_error_class()
    return None


show("open_missing", error_class(lambda: MPI.File.Open(c, f"{d}/missing.bin", MPI.MODE_RDONLY))
     == MPI.ERR_NO_SUCH_FILE)

# explicit offsets, then the individual file pointer
fh = MPI.File.Open(c, f"{d}/a.bin", MPI.MODE_RDWR | MPI.MODE_CREATE)
show("amode", fh.Get_amode() == MPI.MODE_RDWR | MPI.MODE_CREATE)
fh.Write_at(8 * 4 * r, np.arange(4, dtype="f8") + 10 * r)
c.Barrier()
back = np.zeros(4)
fh.Read_at(8 * 4 * ((r + 1) % p), back)
show("read_at_right", back.tolist())
fh.Seek(8 * 4 * p + 2 * r)
fh.Write(np.array([r, 255 - r], dtype="u1"))
show("position", fh.Get_position())
fh.Seek(-2, MPI.SEEK_CUR)
two = np.zeros(2, dtype="u1")
fh.Read(two)
show("seek_cur_read", (two.tolist(), fh.Get_position()))
c.Barrier()
show("size", fh.Get_size())
st = MPI.Status()
tail = np.full(8, 7, dtype="u1")
fh.Read_at(fh.Get_size() - 3, tail, st)  # past the end: a short read
show("short_read", (st.Get_count(MPI.BYTE), tail.tolist()))
fh.Seek(0, MPI.SEEK_END)
show("seek_end", fh.Get_position())
fh.Close()
# (MPICH gives rank 0 the class and the others an internal error: both are shown as failing)
excl = error_class(lambda: MPI.File.Open(c, f"{d}/a.bin",
                                         MPI.MODE_WRONLY | MPI.MODE_CREATE | MPI.MODE_EXCL))
show("excl_exists", excl == MPI.ERR_FILE_EXISTS if r == 0 else excl is not None)

# a vector view: rank r sees every p-th int from int r on (the vector resized to 3 p ints,
# so that its tiles follow each other)
fh = MPI.File.Open(c, f"{d}/b.bin", MPI.MODE_WRONLY | MPI.MODE_CREATE)
fh.Set_view(4 * r, MPI.INT, MPI.INT.Create_vector(3, 1, p).Create_resized(0, 12 * p).Commit())
fh.Write_all(np.arange(3, dtype="i4") * 100 + r)
fh.Write_all(np.arange(3, dtype="i4") * 100 + 10 + r)  # the next tile
show("byte_offset", (fh.Get_byte_offset(0), fh.Get_byte_offset(4), fh.Get_position()))
fh.Close()
fh = MPI.File.Open(c, f"{d}/b.bin", MPI.MODE_RDONLY)
whole = np.zeros(6 * p, dtype="i4")
fh.Read_at_all(0, whole)
show("vector_file", whole.tolist())
fh.Close()

# subarrays: each rank writes its rows and its columns of a 2-D array, then reads it whole
rows, cols = 2 * p, 3
fh = MPI.File.Open(c, f"{d}/c.bin", MPI.MODE_RDWR | MPI.MODE_CREATE)
mine = MPI.DOUBLE.Create_subarray([rows, cols], [2, cols], [2 * r, 0])
show("uncommitted", error_class(lambda: fh.Set_view(0, MPI.DOUBLE, mine)) is not None)
fh.Set_view(0, MPI.DOUBLE, mine.Commit())
fh.Write_at_all(0, np.full((2, cols), r + 0.5))
fh.Set_view(8 * rows * cols, MPI.DOUBLE,
            MPI.DOUBLE.Create_subarray([cols, rows], [cols, 2], [0, 2 * r]).Commit())
req = fh.Iwrite_at_all(0, np.arange(cols * 2, dtype="d") + 100 * r)
req.Wait()
c.Barrier()
fh.Set_view(0, MPI.DOUBLE)
both = np.zeros(2 * rows * cols)
fh.Read_at_all_begin(0, both)
fh.Read_at_all_end(both)
show("subarray_file", both.tolist())
show("view", (fh.Get_view()[0], fh.Get_view()[1].Get_size()))
fh.Set_size(8)
show("set_size", fh.Get_size())
fh.Close()

# the shared file pointer: records from every rank (in any order), then blocks in rank order
fh = MPI.File.Open(c, f"{d}/d.bin", MPI.MODE_RDWR | MPI.MODE_CREATE)
fh.Set_view(0, MPI.INT)
for i in range(3):
    fh.Write_shared(np.array([r, i], dtype="i4"))
c.Barrier()
fh.Write_ordered(np.full(r + 1, 100 + r, dtype="i4"))
# (where the pointer stands now, MPICH's ROMIO answers 24 on some ranks and 0 on others)
fh.Seek_shared(0)
recs = np.zeros(2 * 3, dtype="i4")
fh.Read_ordered(recs)
c.Barrier()
whole = np.zeros(6 * p + p * (p + 1) // 2, dtype="i4")
fh.Read_at_all(0, whole)
pairs = whole[:6 * p].reshape(-1, 2).tolist()
show("shared_records", (sorted(map(tuple, pairs)), whole[6 * p:].tolist(),
                        [i for q, i in pairs if q == r]))
fh.Seek_shared(-1, MPI.SEEK_END)
show("seek_shared_end", fh.Get_position_shared())
fh.Close()

# delete on close, and Delete
fh = MPI.File.Open(c, f"{d}/gone.bin", MPI.MODE_WRONLY | MPI.MODE_CREATE
                   | MPI.MODE_DELETE_ON_CLOSE)
fh.Write_at(r, np.array([r], dtype="u1"))
fh.Close()
show("deleted_on_close", error_class(lambda: MPI.File.Open(c, f"{d}/gone.bin",
                                                           MPI.MODE_RDONLY)) is not None)
c.Barrier()
if r == 0:
    MPI.File.Delete(f"{d}/b.bin")
c.Barrier()
show("deleted", error_class(lambda: MPI.File.Open(c, f"{d}/b.bin", MPI.MODE_RDONLY))
     == MPI.ERR_NO_SUCH_FILE)

c.Barrier()
with open(f"{d}/rank{r}.txt", "w") as f:
    f.write("\n".join(out) + "\n")
