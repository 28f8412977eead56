"""The stages rayflow ships, over :class:`~rayflow.hpc.comm.Communicator`: Cannon's
multiplication (:mod:`.cannon`, its index algebra pure in :mod:`.cannon_index`), conjugate
gradient (:mod:`.cg`, its numerics pure in :mod:`.cg_math`) and the baselines they are
measured against (:mod:`.baselines`). Importing this package imports no Ray.
"""
