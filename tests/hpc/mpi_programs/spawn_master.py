"""mpi4py's tutorial, dynamic process management: compute pi with five spawned ranks
(``spawn_cpi.py``, found from the current directory as in the tutorial; under rayflow also
from this script's). As the tutorial has it, with the workers' script renamed."""
# ruff: noqa: I001 - the tutorial's import order
from mpi4py import MPI
import numpy
import sys

comm = MPI.COMM_SELF.Spawn(sys.executable,
                           args=['spawn_cpi.py'],
                           maxprocs=5)

N = numpy.array(100, 'i')
comm.Bcast([N, MPI.INT], root=MPI.ROOT)
PI = numpy.array(0.0, 'd')
comm.Reduce(None, [PI, MPI.DOUBLE],
            op=MPI.SUM, root=MPI.ROOT)
print(PI)

comm.Disconnect()
