"""mpi4py's tutorial, MPI-IO: non-contiguous collective I/O with NumPy arrays and datatypes.
As the tutorial has it but for the file's name, which comes from the command line:
``python io_noncontig.py DIR``."""
# ruff: noqa: I001 - the tutorial's import order
import sys

from mpi4py import MPI
import numpy as np

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()

amode = MPI.MODE_WRONLY|MPI.MODE_CREATE
fh = MPI.File.Open(comm, f"{sys.argv[1]}/datafile.noncontig", amode)

item_count = 10

buffer = np.empty(item_count, dtype='i')
buffer[:] = rank

filetype = MPI.INT.Create_vector(item_count, 1, size)
filetype.Commit()

displacement = MPI.INT.Get_size()*rank
fh.Set_view(displacement, filetype=filetype)

fh.Write_all(buffer)
filetype.Free()
fh.Close()
