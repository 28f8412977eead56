"""mpi4py's tutorial, MPI-IO: collective I/O with NumPy arrays. As the tutorial has it but
for ``np.int``, which numpy 1.24 removed (``np.int_`` here), and the file's name, which
comes from the command line: ``python io_contig.py DIR``."""
# ruff: noqa: I001 - the tutorial's import order
import sys

from mpi4py import MPI
import numpy as np

amode = MPI.MODE_WRONLY|MPI.MODE_CREATE
comm = MPI.COMM_WORLD
fh = MPI.File.Open(comm, f"{sys.argv[1]}/datafile.contig", amode)

buffer = np.empty(10, dtype=np.int_)
buffer[:] = comm.Get_rank()

offset = comm.Get_rank()*buffer.nbytes
fh.Write_at_all(offset, buffer)

fh.Close()
