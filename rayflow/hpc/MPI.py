"""mpi4py's ``MPI`` module, bound to the rank's rayflow communicator.

Usage: ``from rayflow.hpc import MPI; comm = MPI.COMM_WORLD; total = comm.allreduce(x, op=MPI.SUM)``

Inside a rank started by :func:`rayflow.hpc.run_mpi` (or ``rayflow mpirun``), ``from mpi4py
import MPI`` resolves to this module and ``COMM_WORLD`` spans the gang. Anywhere else
``COMM_WORLD`` is a world of one rank, as mpi4py's singleton start without ``mpiexec``.

Covered, with mpi4py's names and signatures: communicators (``Get_rank``, ``Get_size``,
``Dup``, ``Split``, ``Split_type``, ``Free``, ``Create_cart``, groups and ``Create``/
``Create_group``; Cartesian ``Get_coords``, ``Get_cart_rank``,
``Shift``, ``Sub``; graphs and distributed graphs with the neighbor collectives), the lowercase pickle methods (``send``, ``recv``, ``isend``, ``irecv``,
``sendrecv``, ``bcast``, ``scatter``, ``gather``, ``allgather``, ``alltoall``, ``reduce``,
``allreduce``, ``barrier``) with tags, :data:`ANY_SOURCE`, :data:`ANY_TAG` and
:class:`Status`, ``probe``/``iprobe``, and the uppercase buffer methods on numpy arrays or
``[buf, MPI.DOUBLE]`` specs (``Send`` ... ``Reduce_scatter_block``, ``Scan``, ``Exscan``,
the vector collectives ``Gatherv``, ``Scatterv``, ``Allgatherv``, ``Alltoallv`` and
``Reduce_scatter`` on ``[buf, counts, displs, type]`` specs, the non-blocking ``Ibarrier``
... ``Iexscan``, :data:`IN_PLACE`, :class:`Request`, persistent :class:`Prequest`),
matched probes (``mprobe``, :class:`Message`), and one-sided communication (:class:`Win`:
``Create``, ``Allocate``, ``Allocate_shared``; ``Put``, ``Get``, the accumulates, fences,
post-start-complete-wait and locks, served by :mod:`rayflow.hpc.rma`), and MPI-IO
(:class:`File`, with views through derived datatypes: ``Create_vector``, ``Create_subarray``
...).

Point-to-point follows MPI's matching rules: messages between a pair of ranks in one
communicator are numbered, and a receive takes the first message that matches its source
and tag, so messages of one (source, tag) never overtake each other; receives posted earlier
(``irecv``) match first. :data:`ANY_SOURCE` needs a receive that can look at any peer without
blocking: the transport's optional ``try_recv(src, key)`` (see :mod:`rayflow.hpc.backends.transport`), which
the module polls; a transport without it raises ``NotImplementedError`` for ``ANY_SOURCE``.
Collectives run on :class:`rayflow.hpc.comm.Communicator` and are matched in call order.

``Comm.Spawn`` starts Python scripts as new ranks (:mod:`rayflow.hpc.spawn`) joined to
their parents by an :class:`Intercomm` (``Comm.Get_parent`` in them).

``Intracomm.Create_intercomm`` joins two disjoint groups of one program by the same
:class:`Intercomm`.

Not supported, raising ``NotImplementedError`` naming the feature: dynamic windows
(``Win.Create_dynamic``), intercommunicators between separate programs (ports) and the
collectives on them other than those
:class:`Intercomm` lists, derived datatypes in communication (``Alltoallw``), and
buffer ``MAXLOC``/``MINLOC`` (the lowercase
methods support them on ``(value, index)`` pairs).

No Ray is imported by this module. It is one module, over 1,000 lines, because it mirrors
one namespace: mpi4py's ``MPI`` module, which programs import whole (``from mpi4py import
MPI``), so that the names, their constants and their classes are found where mpi4py users
look for them.
"""

from __future__ import annotations

import builtins
import ctypes
import errno
import functools
import itertools
import operator
import os
import pickle
import socket
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from rayflow.hpc import comm as _comm
from rayflow.hpc import reduce as _reduce
from rayflow.hpc import rma as _rma
from rayflow.hpc.backends import transport as _transport

# ------------------------------------------------------------------------------ constants
# The values of Open MPI, whose PROC_NULL (-2) rayflow's communicator already uses.
ANY_SOURCE = -1
ANY_TAG = -1
PROC_NULL = _comm.PROC_NULL
UNDEFINED = -32766
ROOT = -4
SUCCESS = 0
ERR_TYPE, ERR_OP, ERR_TRUNCATE, ERR_OTHER = 3, 9, 14, 16
# (the classes the window server sends back are its own: one definition of each)
ERR_ARG, ERR_WIN, ERR_RMA_SYNC, ERR_RMA_RANGE = (
    _rma.ERR_ARG, _rma.ERR_WIN, _rma.ERR_RMA_SYNC, _rma.ERR_RMA_RANGE)
ERR_ACCESS, ERR_AMODE, ERR_FILE_EXISTS, ERR_FILE, ERR_IO, ERR_NO_SUCH_FILE, ERR_READ_ONLY = (
    20, 21, 25, 27, 32, 37, 40)
ERR_RMA_SHARED, ERR_RMA_FLAVOR = 57, 58
TAG_UB = 2**31 - 1
IDENT, CONGRUENT, SIMILAR, UNEQUAL = 0, 1, 2, 3
THREAD_SINGLE, THREAD_FUNNELED, THREAD_SERIALIZED, THREAD_MULTIPLE = 0, 1, 2, 3
GRAPH, CART, DIST_GRAPH = 1, 2, 3
VERSION, SUBVERSION = 3, 1
COMM_TYPE_SHARED = 0  # (Split_type: the ranks of one machine)
ORDER_C, ORDER_FORTRAN = 56, 57
# MPI-IO (MPICH's values)
MODE_CREATE, MODE_RDONLY, MODE_WRONLY, MODE_RDWR = 1, 2, 4, 8
MODE_DELETE_ON_CLOSE, MODE_UNIQUE_OPEN, MODE_EXCL, MODE_APPEND, MODE_SEQUENTIAL = (
    16, 32, 64, 128, 256)
SEEK_SET, SEEK_CUR, SEEK_END = 600, 602, 604
# one-sided communication (MPICH's values)
LOCK_EXCLUSIVE, LOCK_SHARED = 234, 235
MODE_NOCHECK, MODE_NOSTORE, MODE_NOPUT, MODE_NOPRECEDE, MODE_NOSUCCEED = (
    1024, 2048, 4096, 8192, 16384)
WIN_BASE, WIN_SIZE, WIN_DISP_UNIT, WIN_CREATE_FLAVOR, WIN_MODEL = (
    1711276033, 1711276035, 1711276037, 1711276039, 1711276041)
WIN_FLAVOR_CREATE, WIN_FLAVOR_ALLOCATE, WIN_FLAVOR_DYNAMIC, WIN_FLAVOR_SHARED = 1, 2, 3, 4
WIN_SEPARATE, WIN_UNIFIED = 1, 2
INFO_NULL = None
UNWEIGHTED = ("UNWEIGHTED",)  # (a marker, as MPI.UNWEIGHTED: no weights)
WEIGHTS_EMPTY: list[int] = []


class _InPlace:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MPI.IN_PLACE"


#: Pass as the send buffer of a collective to use the receive buffer's data in place.
IN_PLACE = _InPlace()
BOTTOM = None


class Exception(RuntimeError):  # noqa: A001 - mpi4py's name (MPI.Exception)
    """An MPI error (mpi4py's ``MPI.Exception``), with ``Get_error_code()``."""

    def __init__(self, message: str, error_code: int = ERR_OTHER):
        super().__init__(message)
        self.error_code = error_code

    def Get_error_code(self) -> int:  # noqa: N802
        return self.error_code

    def Get_error_class(self) -> int:  # noqa: N802
        """The error's class (rayflow's codes are classes: ``MPI.ERR_RMA_SYNC`` ...)."""
        return self.error_code

    def Get_error_string(self) -> str:  # noqa: N802
        return str(self)

    error_class = property(Get_error_class)
    error_string = property(Get_error_string)


class Aborted(SystemExit):
    """Raised by :meth:`Comm.Abort`: the program ends on every rank with ``errorcode``."""

    def __init__(self, errorcode: int):
        super().__init__(errorcode)
        self.errorcode = errorcode


class Errhandler:
    """What an MPI error does. rayflow's MPI raises :class:`Exception` (or a ValueError or
    TypeError naming the bad input) whichever is set, as mpi4py does under its default,
    ``ERRORS_RETURN``; an exception no rank catches fails the run and stops the others,
    as ``ERRORS_ARE_FATAL`` would."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"MPI.{self.name}"

    def Free(self) -> None:  # noqa: N802
        pass


ERRORS_RETURN = Errhandler("ERRORS_RETURN")
ERRORS_ARE_FATAL = Errhandler("ERRORS_ARE_FATAL")
ERRORS_ABORT = Errhandler("ERRORS_ABORT")


class Group:
    """An ordered set of processes (mpi4py's ``MPI.Group``): from ``comm.Get_group()``,
    narrowed with ``Incl``/``Excl``/``Range_incl``/``Range_excl`` or combined with
    ``Union``/``Intersection``/``Difference``; ``comm.Create(group)`` or
    ``comm.Create_group(group)`` makes its communicator."""

    def __init__(self, members: tuple[int, ...], me: int):
        self._members, self._me = tuple(members), me  # world ranks; this process's

    def __repr__(self) -> str:
        return f"<MPI.Group of {len(self._members)}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Group) and other._members == self._members

    def __hash__(self) -> int:
        return hash(self._members)

    def Get_size(self) -> int:  # noqa: N802
        return len(self._members)

    def Get_rank(self) -> int:  # noqa: N802
        """This process's rank in the group; ``UNDEFINED`` outside it."""
        return self._members.index(self._me) if self._me in self._members else UNDEFINED

    size = property(Get_size)
    rank = property(Get_rank)

    def _ranks(self, ranks: Sequence[int], where: str) -> list[int]:
        ranks = [int(r) for r in ranks]
        bad = [r for r in ranks if not 0 <= r < len(self._members)]
        if bad or len(set(ranks)) != len(ranks):
            raise ValueError(f"Group.{where}: ranks {ranks} must be distinct ranks of a group "
                             f"of {len(self._members)}")
        return ranks

    def _new(self, members: Sequence[int]) -> Group:
        return Group(tuple(members), self._me)

    def Incl(self, ranks: Sequence[int]) -> Group:  # noqa: N802
        return self._new([self._members[r] for r in self._ranks(ranks, "Incl")])

    def Excl(self, ranks: Sequence[int]) -> Group:  # noqa: N802
        gone = set(self._ranks(ranks, "Excl"))
        return self._new([m for r, m in enumerate(self._members) if r not in gone])

    @staticmethod
    def _expand(ranges: Sequence[tuple[int, int, int]]) -> list[int]:
        out = []
        for first, last, stride in ranges:
            if stride == 0:
                raise ValueError("Group.Range_incl: a stride of 0")
            out += list(range(first, last + (1 if stride > 0 else -1), stride))
        return out

    def Range_incl(self, ranks: Sequence[tuple[int, int, int]]) -> Group:  # noqa: N802
        return self.Incl(self._expand(ranks))

    def Range_excl(self, ranks: Sequence[tuple[int, int, int]]) -> Group:  # noqa: N802
        return self.Excl(self._expand(ranks))

    def Translate_ranks(self, ranks: Sequence[int] | None = None,  # noqa: N802
                        group: Group | None = None) -> list[int]:
        """The ranks in ``group`` of this group's ``ranks`` (all by default), ``UNDEFINED``
        where not in it; without ``group``, the world ranks."""
        ranks = list(range(len(self._members))) if ranks is None else \
            self._ranks(ranks, "Translate_ranks")
        if group is None:
            return [self._members[r] for r in ranks]
        index = {m: i for i, m in enumerate(group._members)}
        return [index.get(self._members[r], UNDEFINED) for r in ranks]

    def Compare(self, group: Group) -> int:  # noqa: N802
        if self._members == group._members:
            return IDENT
        return SIMILAR if set(self._members) == set(group._members) else UNEQUAL

    @classmethod
    def Union(cls, group1: Group, group2: Group) -> Group:  # noqa: N802
        """``group1``'s processes, then ``group2``'s not in it (MPI's order)."""
        return group1._new([*group1._members,
                            *(m for m in group2._members if m not in group1._members)])

    @classmethod
    def Intersection(cls, group1: Group, group2: Group) -> Group:  # noqa: N802
        return group1._new([m for m in group1._members if m in group2._members])

    @classmethod
    def Difference(cls, group1: Group, group2: Group) -> Group:  # noqa: N802
        return group1._new([m for m in group1._members if m not in group2._members])

    def Dup(self) -> Group:  # noqa: N802
        return self._new(self._members)

    def Free(self) -> None:  # noqa: N802
        pass


GROUP_EMPTY = Group((), -1)


# ------------------------------------------------------------------------------ datatypes
class Datatype:
    """An MPI datatype: a basic one (its name and the numpy dtype it stands for), or one
    derived from it (``Create_contiguous``, ``Create_vector``, ``Create_subarray``): items
    of the basic type at byte ``blocks`` ``(offset, length)`` within an ``extent``. Derived
    types describe the layout of a file view (``File.Set_view``); the communication calls
    take basic types."""

    def __init__(self, name: str, dtype: Any,
                 blocks: tuple[tuple[int, int], ...] | None = None, extent: int | None = None):
        self.name = name
        self.dtype = np.dtype(dtype)
        self._blocks = blocks  # None: a basic type, one item
        self._extent = self.dtype.itemsize if extent is None else extent
        self._committed = blocks is None  # (a derived type serves once committed, as in MPI)

    def __repr__(self) -> str:
        return f"MPI.{self.name}" if self._blocks is None else f"<MPI.Datatype {self.name}>"

    def Get_size(self) -> int:  # noqa: N802
        """Bytes of data (the gaps of a derived type not counted)."""
        return self.dtype.itemsize if self._blocks is None else sum(n for _, n in self._blocks)

    @property
    def size(self) -> int:
        return self.Get_size()

    def Get_extent(self) -> tuple[int, int]:  # noqa: N802
        """``(lower bound, extent)`` in bytes: a derived type's span, gaps included."""
        return 0, self._extent

    extent = property(lambda self: self._extent)
    lb = property(lambda self: 0)
    ub = property(lambda self: self._extent)

    def Get_name(self) -> str:  # noqa: N802
        return self.name

    @property
    def is_predefined(self) -> bool:
        return self._blocks is None

    def _layout(self) -> tuple[tuple[int, int], ...]:
        return ((0, self.dtype.itemsize),) if self._blocks is None else self._blocks

    def _derive(self, name: str, starts: Sequence[int], extent: int) -> Datatype:
        """A type of this one's layout at each byte offset of ``starts``, adjacent blocks
        merged."""
        blocks: list[list[int]] = []
        for start in starts:
            for off, n in self._layout():
                if blocks and blocks[-1][0] + blocks[-1][1] == start + off:
                    blocks[-1][1] += n
                else:
                    blocks.append([start + off, n])
        return Datatype(name, self.dtype, tuple((o, n) for o, n in blocks), extent)

    def Create_contiguous(self, count: int) -> Datatype:  # noqa: N802
        count = _check_int("Datatype.Create_contiguous", "count", count)
        return self._derive(f"contiguous({count})", [i * self._extent for i in range(count)],
                            count * self._extent)

    def Create_vector(self, count: int, blocklength: int, stride: int) -> Datatype:  # noqa: N802
        """``count`` blocks of ``blocklength`` items, block starts ``stride`` items apart."""
        return self._strided("vector", count, blocklength, stride, stride * self._extent)

    def Create_hvector(self, count: int, blocklength: int, stride: int) -> Datatype:  # noqa: N802
        """As :meth:`Create_vector`, the stride in bytes."""
        return self._strided("hvector", count, blocklength, stride, stride)

    def _strided(self, kind: str, count: Any, blocklength: Any, stride: int,
                 stride_bytes: int) -> Datatype:
        where = f"Datatype.Create_{kind}"
        count = _check_int(where, "count", count)
        blocklength = _check_int(where, "blocklength", blocklength)
        e = self._extent
        starts = [i * stride_bytes + j * e for i in range(count) for j in range(blocklength)]
        return self._derive(f"{kind}({count}, {blocklength}, {stride})", starts,
                            (count - 1) * stride_bytes + blocklength * e if count else 0)

    def Create_subarray(self, sizes: Sequence[int], subsizes: Sequence[int],  # noqa: N802
                        starts: Sequence[int], order: int = ORDER_C) -> Datatype:
        """The block ``starts .. starts + subsizes`` of an array of ``sizes`` items of this
        type (``order``: ``MPI.ORDER_C``, row-major, or ``MPI.ORDER_FORTRAN``); its extent
        is the whole array's."""
        if not len(sizes) == len(subsizes) == len(starts) or not sizes:
            raise ValueError("Create_subarray: sizes, subsizes and starts need one entry per "
                             "dimension")
        if any(st < 0 or sub < 0 or st + sub > n for n, sub, st in zip(sizes, subsizes, starts)):
            raise ValueError(f"Create_subarray: the block {list(starts)} + {list(subsizes)} "
                             f"is not inside {list(sizes)}")
        if order not in (ORDER_C, ORDER_FORTRAN):
            raise ValueError(f"Create_subarray: order must be MPI.ORDER_C or "
                             f"MPI.ORDER_FORTRAN, got {order!r}")
        npo: Literal["C", "F"] = "C" if order == ORDER_C else "F"
        index = np.arange(int(np.prod(sizes))).reshape(tuple(sizes), order=npo)
        block = index[tuple(slice(st, st + sub) for st, sub in zip(starts, subsizes))]
        picked = block.reshape(-1, order=npo)
        return self._derive(f"subarray({list(sizes)}, {list(subsizes)}, {list(starts)})",
                            (picked * self._extent).tolist(), int(index.size) * self._extent)

    def Create_resized(self, lb: int, extent: int) -> Datatype:  # noqa: N802
        """This type with another extent (its tiles in a file view, or an array of it,
        that far apart); a lower bound of 0 only."""
        if lb != 0:
            raise NotImplementedError("Datatype.Create_resized: a lower bound other than 0 is "
                                      "not supported by rayflow's MPI")
        extent = _check_int("Datatype.Create_resized", "extent (bytes)", extent)
        return Datatype(f"resized({self.name}, {extent})", self.dtype, self._layout(), extent)

    def Commit(self) -> Datatype:  # noqa: N802
        self._committed = True
        return self

    def Free(self) -> None:  # noqa: N802
        pass

    def Dup(self) -> Datatype:  # noqa: N802
        return self


_TYPES = {
    "BYTE": "u1", "CHAR": "S1", "SIGNED_CHAR": "i1", "UNSIGNED_CHAR": "u1", "BOOL": "?",
    "C_BOOL": "?", "SHORT": "i2", "UNSIGNED_SHORT": "u2", "INT": "i4", "UNSIGNED": "u4",
    "LONG": "i8", "UNSIGNED_LONG": "u8", "LONG_LONG": "i8", "UNSIGNED_LONG_LONG": "u8",
    "INT8_T": "i1", "INT16_T": "i2", "INT32_T": "i4", "INT64_T": "i8", "UINT8_T": "u1",
    "UINT16_T": "u2", "UINT32_T": "u4", "UINT64_T": "u8", "FLOAT": "f4", "DOUBLE": "f8",
    "LONG_DOUBLE": "g", "C_FLOAT_COMPLEX": "c8", "C_DOUBLE_COMPLEX": "c16", "COMPLEX": "c8",
    "DOUBLE_COMPLEX": "c16", "C_COMPLEX": "c8", "WCHAR": "U1", "AINT": "i8", "OFFSET": "i8",
    "COUNT": "i8",
}
for _name, _code in _TYPES.items():
    globals()[_name] = Datatype(_name, _code)
BYTE: Datatype
DOUBLE: Datatype
INT: Datatype
FLOAT: Datatype
LONG: Datatype
_BY_NAME = {n: globals()[n] for n in _TYPES}


def _completed(fn: Callable, *args: Any) -> Request:
    """The request of a non-blocking call carried out at once (an ``R``- transfer of a
    window, an ``I``- read or write of a file): ``fn(*args)``, then a completed request."""
    fn(*args)
    return Request(None, PROC_NULL)


def _check_int(where: str, name: str, value: Any, least: int = 0) -> int:
    """``value`` as an int, where it is one (not a bool) of at least ``least``: else a
    ValueError naming the call and the argument."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise ValueError(f"{where}: {name} must be an int >= {least}, got {value!r}")
    return int(value)


def _datatype_of(dtype: np.dtype) -> Datatype:
    got = _OF_DTYPE.get(dtype)
    if got is not None:
        return got
    for t in _BY_NAME.values():
        if t.dtype == dtype and t.name not in ("BYTE", "C_BOOL", "LONG_LONG", "C_COMPLEX"):
            _OF_DTYPE[dtype] = t
            return t
    raise TypeError(f"no MPI datatype for numpy dtype {dtype}")


_OF_DTYPE: dict[np.dtype, Datatype] = {}  # what ``_datatype_of`` found (a scan of ~40 types)


# ------------------------------------------------------------------------------ operations
def _seq_or_array(fn_array: Callable, fn_obj: Callable) -> Callable:
    def apply(x: Any, y: Any) -> Any:
        if isinstance(x, (np.ndarray, np.generic)) or isinstance(y, (np.ndarray, np.generic)):
            return fn_array(x, y)
        return fn_obj(x, y)

    return apply


def _loc(better: Callable[[Any, Any], bool]) -> Callable:
    def apply(x: Any, y: Any) -> Any:
        (u, i), (v, j) = x, y
        if better(v, u) or (v == u and j < i):
            return (v, j)
        return (u, i)

    return apply


class Op:
    """A reduction operation (``MPI.SUM`` ...) applied in rank order.

    numpy arrays and scalars combine with numpy's ufuncs; Python objects with Python's
    operators, as mpi4py's lowercase methods do (integers stay exact).
    """

    def __init__(self, name: str, fn: Callable[[Any, Any], Any], comm_op: str | None = None,
                 commute: bool = True):
        self.name = name
        self._fn = fn
        self._comm_op = comm_op  # the communicator's name for it, where it has one
        self._commute = commute

    def __repr__(self) -> str:
        return f"MPI.{self.name}"

    def __call__(self, x: Any, y: Any) -> Any:
        return self._fn(x, y)

    @classmethod
    def Create(cls, function: Callable, commute: bool = False) -> Op:  # noqa: N802
        """A user operation; ``function(invec, inoutvec, datatype)`` as in mpi4py is not
        supported, a two-argument ``function(x, y) -> result`` is."""
        return cls(getattr(function, "__name__", "user op"), function, None, commute)

    def Is_commutative(self) -> bool:  # noqa: N802
        return self._commute

    def Free(self) -> None:  # noqa: N802
        pass


SUM = Op("SUM", _seq_or_array(np.add, operator.add), "sum")
PROD = Op("PROD", _seq_or_array(np.multiply, operator.mul), "prod")
MIN = Op("MIN", _seq_or_array(np.minimum, _reduce._py_min), "min")
MAX = Op("MAX", _seq_or_array(np.maximum, _reduce._py_max), "max")
# Python objects combine to a bool, as mpi4py's ``MPI.LAND(2, 3) is True``
LAND = Op("LAND", _seq_or_array(np.logical_and, lambda x, y: bool(x) and bool(y)))
LOR = Op("LOR", _seq_or_array(np.logical_or, lambda x, y: bool(x) or bool(y)))
LXOR = Op("LXOR", _seq_or_array(np.logical_xor, lambda x, y: bool(x) != bool(y)))
BAND = Op("BAND", _seq_or_array(np.bitwise_and, operator.and_))
BOR = Op("BOR", _seq_or_array(np.bitwise_or, operator.or_))
BXOR = Op("BXOR", _seq_or_array(np.bitwise_xor, operator.xor))
MAXLOC = Op("MAXLOC", _loc(lambda a, b: a > b))
MINLOC = Op("MINLOC", _loc(lambda a, b: a < b))
REPLACE = Op("REPLACE", lambda x, y: y, commute=False)
NO_OP = Op("NO_OP", lambda x, y: x, commute=False)  # (an accumulate that only reads)


def _check_op(op: Any, where: str) -> Op:
    if not isinstance(op, Op):
        raise TypeError(f"{where}: op must be an MPI.Op (MPI.SUM, MPI.MAX, ...), got {op!r}")
    return op


def _fold(values: Sequence[Any], op: Op, where: str) -> Any:
    if op._comm_op is not None:  # the communicator's checks (same shape and dtype ...)
        return _reduce.reduce_values(values, op._comm_op, where)
    acc = values[0]
    for v in values[1:]:
        acc = op(acc, v)
    return acc


# ------------------------------------------------------------------------------ buffers
def _buffer(spec: Any, where: str, writable: bool = False) -> tuple[np.ndarray, Datatype]:
    """The flat array view and datatype of a buffer spec: ``buf``, ``[buf, type]`` or
    ``[buf, count, type]``."""
    if isinstance(spec, (list, tuple)):
        if len(spec) == 2:
            buf, dtype = spec
            count = None
        elif len(spec) == 3:
            buf, count, dtype = spec
            if isinstance(count, (list, tuple)):
                raise ValueError(f"{where}: a vector buffer spec [buf, (counts, displs), type] "
                                 "is for the v-variants (Gatherv ...); this call takes [buf, "
                                 "count, type]")
        else:
            raise ValueError(f"{where}: a buffer spec is buf, [buf, type] or [buf, count, type]; "
                             f"got a {type(spec).__name__} of {len(spec)} items")
    else:
        buf, dtype, count = spec, None, None
    if not isinstance(buf, np.ndarray):
        raise TypeError(f"{where}: the buffer must be a numpy array, got {type(buf).__name__}")
    if not buf.flags.c_contiguous:
        raise ValueError(f"{where}: the buffer must be C-contiguous")
    if writable and not buf.flags.writeable:
        raise ValueError(f"{where}: the receive buffer is read-only (copy it first)")
    flat = buf.reshape(-1)
    if dtype is None:
        dtype = _datatype_of(buf.dtype)
    elif not isinstance(dtype, Datatype):
        raise TypeError(f"{where}: the datatype must be an MPI datatype (MPI.DOUBLE ...), "
                        f"got {dtype!r}")
    elif not dtype.is_predefined:
        raise NotImplementedError(f"{where}: derived datatypes ({dtype!r}) in buffers are not "
                                  f"supported by rayflow's MPI; they serve file views "
                                  f"(File.Set_view)")
    elif dtype.dtype != buf.dtype:
        if dtype.dtype.itemsize != buf.dtype.itemsize:
            raise TypeError(f"{where}: buffer of {buf.dtype} does not hold {dtype} items")
        flat = flat.view(dtype.dtype)
    if count is not None:
        count = int(count)
        if not 0 <= count <= flat.size:
            raise ValueError(f"{where}: count {count} outside a buffer of {flat.size} items")
        flat = flat[:count]
    return flat, dtype


def _is_seq(x: Any) -> bool:
    return isinstance(x, (list, tuple, np.ndarray))


def _vblocks(spec: Any, parts: int, where: str, writable: bool = False) -> list[np.ndarray]:
    """The ``parts`` blocks (views) of a vector buffer spec, as mpi4py reads them: ``buf``
    or ``[buf, type]`` (equal blocks), ``[buf, counts]``, ``[buf, counts, type]``, ``[buf,
    (counts, displs)]``, ``[buf, (counts, displs), type]`` or ``[buf, counts, displs,
    type]``; ``counts`` a sequence (one per rank) or one int for every rank, ``displs``
    (offsets in items) the blocks one after the other where omitted or None."""
    counts: Any = None
    displs: Any = None
    if isinstance(spec, (list, tuple)):
        if not spec:
            raise ValueError(f"{where}: an empty buffer spec")
        buf, rest = spec[0], list(spec[1:])
        dtype = rest.pop() if rest and isinstance(rest[-1], Datatype) else None
        if len(rest) == 1:
            cd = rest[0]
            if isinstance(cd, tuple) and len(cd) == 2 and (_is_seq(cd[0]) or cd[1] is None):
                counts, displs = cd
            else:
                counts = cd
        elif len(rest) == 2:
            counts, displs = rest
        elif rest:
            raise ValueError(f"{where}: a vector buffer spec is [buf, counts, displs, type] "
                             f"at most; got {len(spec)} items")
        flat, _ = _buffer(buf if dtype is None else [buf, dtype], where, writable)
    else:
        flat, _ = _buffer(spec, where, writable)
    if counts is None:
        return _chunks(flat, parts, where)
    counts = [counts] * parts if isinstance(counts, (int, np.integer)) else list(counts)
    if len(counts) != parts or not all(isinstance(n, (int, np.integer)) and n >= 0
                                       for n in counts):
        raise ValueError(f"{where}: counts must be {parts} ints >= 0 (one per rank), got "
                         f"{counts!r}")
    if displs is None:
        displs = [0, *itertools.accumulate(counts[:-1])]
    displs = list(displs) if _is_seq(displs) else None
    if displs is None or len(displs) != parts or not all(
            isinstance(d, (int, np.integer)) and d >= 0 for d in displs):
        raise ValueError(f"{where}: displs must be {parts} ints >= 0 (one per rank)")
    for r, (n, d) in enumerate(zip(counts, displs)):
        if d + n > flat.size:
            raise ValueError(f"{where}: block {r} (displacement {d}, count {n}) ends past a "
                             f"buffer of {flat.size} items")
    return [flat[int(d):int(d) + int(n)] for n, d in zip(counts, displs)]


def _copy_block(block: np.ndarray, got: Any, where: str, rank: int) -> None:
    """Copy what rank ``rank`` sent into its block, which must hold exactly as many items
    (a collective's counts agree on every rank, as MPI requires)."""
    got = np.asarray(got)
    if got.size != block.size:
        raise ValueError(f"{where}: rank {rank} sent {got.size} items where this rank's "
                         f"counts give its block {block.size}")
    _copy_into(block, got, where)


def _chunks(flat: np.ndarray, parts: int, where: str) -> list[np.ndarray]:
    if flat.size % parts:
        raise ValueError(f"{where}: a buffer of {flat.size} items does not split into "
                         f"{parts} equal blocks")
    n = flat.size // parts
    return [flat[i * n:(i + 1) * n] for i in range(parts)]


def _copy_into(dst: np.ndarray, got: Any, where: str) -> int:
    got = np.asarray(got)
    if got.size > dst.size:
        raise Exception(f"{where}: message of {got.size} items truncated into a buffer of "
                        f"{dst.size}", 15)  # MPI_ERR_TRUNCATE
    dst[:got.size] = got.reshape(-1).view(dst.dtype) if got.dtype != dst.dtype and \
        got.dtype.itemsize == dst.dtype.itemsize else got.reshape(-1)
    return got.size


def _items(flat: np.ndarray | None) -> str | None:
    """How a buffer shows in a rooted collective's check: its items and dtype."""
    return None if flat is None else f"{flat.size} items of {flat.dtype}"


def _same_items(where: str, what: str, a: np.ndarray, other: str, b: np.ndarray) -> None:
    if a.size != b.size or a.dtype != b.dtype:
        raise ValueError(f"{where}: the root's {what} ({_items(a)}) does not match its {other} "
                         f"({_items(b)})")


def _private(obj: Any) -> Any:
    """A copy of a received object that shares no memory with the channel it came from."""
    if isinstance(obj, np.ndarray):
        return obj.copy()
    return pickle.loads(pickle.dumps(obj, protocol=5))  # arrays in band: copied


# ------------------------------------------------------------------------------ status
class Status:
    """What a receive matched: ``Get_source()``, ``Get_tag()``, ``Get_count(datatype)``."""

    def __init__(self) -> None:
        self.source = ANY_SOURCE
        self.tag = ANY_TAG
        self.error = SUCCESS
        self._nbytes = 0
        self._obj: Any = None
        self._pickled = False
        self._cancelled = False

    def _set(self, source: int, tag: int, obj: Any, is_buffer: bool) -> None:
        """What a receive (or a probe) matched; from ``PROC_NULL``: nothing, no items."""
        self._cancelled = False
        if source == PROC_NULL:
            self.source, self.tag, self._nbytes, self._pickled = PROC_NULL, ANY_TAG, 0, False
            return
        self.source, self.tag = source, tag
        if is_buffer:
            self._nbytes, self._pickled = int(np.asarray(obj).nbytes), False
        else:
            self._obj, self._pickled = obj, True

    def Get_source(self) -> int:  # noqa: N802
        return self.source

    def Get_tag(self) -> int:  # noqa: N802
        return self.tag

    def Get_error(self) -> int:  # noqa: N802
        return self.error

    def Is_cancelled(self) -> bool:  # noqa: N802
        """Whether the request was cancelled (``Request.Cancel``) instead of completed."""
        return self._cancelled

    cancelled = property(Is_cancelled)

    def Get_count(self, datatype: Datatype | None = None) -> int:  # noqa: N802
        """Items of ``datatype`` received (bytes by default; a pickled message counts the
        bytes of its pickle, as in mpi4py)."""
        if self._pickled:
            self._nbytes = len(pickle.dumps(self._obj, protocol=pickle.HIGHEST_PROTOCOL))
            self._pickled = False
        size = 1 if datatype is None else datatype.Get_size()
        return self._nbytes // size

    def Get_elements(self, datatype: Datatype) -> int:  # noqa: N802
        return self.Get_count(datatype)

    count = property(lambda self: self.Get_count())


# ------------------------------------------------------------------------------ requests
class Request:
    """A non-blocking operation. ``Wait``/``Test`` for buffer methods, ``wait``/``test`` for
    the lowercase ones (returning the received object)."""

    def __init__(self, comm: Comm | None = None, source: int = PROC_NULL, tag: int = ANY_TAG,
                 buf: np.ndarray | None = None, where: str = "irecv"):
        self._comm = comm
        self.source, self.tag = source, tag
        self._buf = buf
        self._where = where
        self._done = comm is None  # a send, or a receive from PROC_NULL
        self._cancelled = False
        self._value: Any = None
        self._status: tuple[int, int, Any, bool] = (source, tag, None, buf is not None)

    def _complete(self, source: int, tag: int, obj: Any, is_buffer: bool) -> None:
        if self._buf is not None:
            if not is_buffer:
                raise TypeError(f"{self._where}: the message from rank {source} (tag {tag}) "
                                "was sent with a lowercase method; receive it with recv")
            _copy_into(self._buf, obj, self._where)
        self._value = obj
        self._status = (source, tag, obj, is_buffer)
        self._done = True

    def _fill(self, status: Status | None) -> None:
        if status is not None:
            status._set(*self._status)
            status._cancelled = self._cancelled

    def Wait(self, status: Status | None = None) -> bool:  # noqa: N802
        if not self._done:
            self._comm._progress_until(self)  # type: ignore[union-attr]  # (a receive has a comm)
        self._fill(status)
        return True

    def Test(self, status: Status | None = None) -> bool:  # noqa: N802
        if not self._done:
            self._comm._progress_once(self)  # type: ignore[union-attr]  # (a receive has a comm)
        if self._done:
            self._fill(status)
        return self._done

    def wait(self, status: Status | None = None) -> Any:
        self.Wait(status)
        return self._value

    def test(self, status: Status | None = None) -> tuple[bool, Any]:
        done = self.Test(status)
        return done, (self._value if done else None)

    def Cancel(self) -> None:  # noqa: N802
        """Cancel a receive that no message has matched yet: it completes at once, its
        status says so (``Is_cancelled``), and the message it would have taken stays for
        the next receive. A send (buffered: out already), a completed receive and a
        non-blocking collective are not cancelled."""
        comm = self._comm
        if self._done or comm is None or not any(r is self for r in comm._posted):
            return
        comm._posted = [r for r in comm._posted if r is not self]
        self._cancelled, self._done = True, True
        self._status = (PROC_NULL, ANY_TAG, None, self._buf is not None)

    cancel = Cancel

    def Free(self) -> None:  # noqa: N802
        pass

    @staticmethod
    def Waitall(requests: Sequence[Request], statuses: list[Status] | None = None) -> bool:  # noqa: N802
        for i, r in enumerate(requests):
            r.Wait(None if statuses is None else statuses[i])
        return True

    @staticmethod
    def waitall(requests: Sequence[Request], statuses: list[Status] | None = None) -> list[Any]:
        return [r.wait(None if statuses is None else statuses[i]) for i, r in enumerate(requests)]

    @staticmethod
    def Testall(requests: Sequence[Request], statuses: list[Status] | None = None) -> bool:  # noqa: N802
        return all([r.Test(None if statuses is None else statuses[i])
                    for i, r in enumerate(requests)])

    @staticmethod
    def testall(requests: Sequence[Request]) -> tuple[bool, list[Any] | None]:
        flags = [r.Test() for r in requests]
        return (True, [r._value for r in requests]) if all(flags) else (False, None)

    @staticmethod
    def Waitany(requests: Sequence[Request], status: Status | None = None) -> int:  # noqa: N802
        if not requests:
            return UNDEFINED
        delay = _POLL_MIN_S
        while True:
            for i, r in enumerate(requests):
                if r.Test(status):
                    return i
            comm = next((r._comm for r in requests if r._comm is not None), None)
            if comm is not None:
                delay = comm._pause(delay)
            else:
                time.sleep(delay)
                delay = min(delay * 2, _POLL_MAX_S)

    @staticmethod
    def waitany(requests: Sequence[Request], status: Status | None = None) -> tuple[int, Any]:
        i = Request.Waitany(requests, status)
        return i, (requests[i]._value if i != UNDEFINED else None)


class Prequest(Request):
    """A persistent request (``Send_init``/``Recv_init``): each ``Start`` begins the same
    send or receive again, each ``Wait`` or ``Test`` completes it; inactive (before the
    first ``Start``, after a ``Wait``), ``Wait`` returns at once."""

    def __init__(self, begin: Callable[[], Request], where: str):
        super().__init__(None, PROC_NULL, ANY_TAG, None, where)
        self._begin = begin
        self._active: Request | None = None

    def Start(self) -> None:  # noqa: N802
        if self._active is not None and not self._active._done:
            raise Exception(f"{self._where}: Start on a request still active (Wait for it "
                            f"first)", ERR_OTHER)
        self._active = self._begin()
        self._done = self._active._done

    @staticmethod
    def Startall(requests: Sequence[Prequest]) -> None:  # noqa: N802
        for r in requests:
            r.Start()

    def Wait(self, status: Status | None = None) -> bool:  # noqa: N802
        if self._active is None:
            self._fill(status)
        else:
            self._active.Wait(status)
            self._value, self._done = self._active._value, True
        return True

    def Test(self, status: Status | None = None) -> bool:  # noqa: N802
        if self._active is None:
            self._fill(status)
            return True
        self._done = self._active.Test(status)
        self._value = self._active._value
        return self._done

    def Cancel(self) -> None:  # noqa: N802
        if self._active is not None:
            self._active.Cancel()
            self._done = self._active._done


class Message:
    """A message matched by ``mprobe``/``improbe`` and taken out of matching: only its
    own ``recv``/``Recv`` (or ``irecv``/``Irecv``) receives it, once."""

    def __init__(self, entry: tuple[int, int, Any, bool] | None):
        self._entry = entry  # (source, tag, message, sent as a buffer)

    def __bool__(self) -> bool:
        return self._entry is not None

    def _take(self, status: Status | None, where: str) -> tuple[int, int, Any, bool]:
        if self._entry is None:
            raise Exception(f"Message.{where}: the message was received already (or is "
                            f"MESSAGE_NULL)", ERR_OTHER)
        entry, self._entry = self._entry, None
        if status is not None:
            status._set(*entry)
        return entry

    def recv(self, status: Status | None = None) -> Any:
        source, tag, obj, is_buffer = self._take(status, "recv")
        if is_buffer and source != PROC_NULL:
            raise TypeError(f"Message.recv: the message from rank {source} (tag {tag}) was "
                            f"sent with a buffer method; receive it with Recv")
        return None if source == PROC_NULL else obj

    def Recv(self, buf: Any, status: Status | None = None) -> None:  # noqa: N802
        flat, _ = _buffer(buf, "Message.Recv", writable=True)
        source, tag, obj, is_buffer = self._take(status, "Recv")
        if source == PROC_NULL:
            return
        if not is_buffer:
            raise TypeError(f"Message.Recv: the message from rank {source} (tag {tag}) was "
                            f"sent with a lowercase method; receive it with recv")
        _copy_into(flat, obj, "Message.Recv")

    def irecv(self) -> Request:
        req = Request(None, PROC_NULL)
        req._value = self.recv()
        return req

    def Irecv(self, buf: Any) -> Request:  # noqa: N802
        self.Recv(buf)
        return Request(None, PROC_NULL)


MESSAGE_NULL = Message(None)


def _try_recv_of(c: _comm.Communicator) -> Callable[[int, tuple], Any]:
    """The transport's receive that does not block (``try_recv``), which ``ANY_SOURCE``,
    ``Request.Test`` and ``iprobe`` need: NotImplementedError on a transport without."""
    try_recv = getattr(c._t, "try_recv", None)
    if try_recv is None:
        raise NotImplementedError(
            f"ANY_SOURCE, Request.Test and iprobe need a transport that can look for a "
            f"message without blocking (try_recv); the {c.backend!r} backend has none "
            f"(Wait works)")
    return try_recv


class _CollRequest(Request):
    """A non-blocking collective. What it sends went out when it was called (sends are
    buffered, so a call never waits on another rank); what it receives, one message from
    each rank in ``sources`` under the collective's ``key``, is taken by ``Wait`` (or by
    ``Test``, where the transport can look without blocking), in any order, and
    ``finish({rank: message})`` then writes the result into the receive buffer."""

    def __init__(self, comm: Comm, key: tuple, sources: Sequence[int],
                 finish: Callable[[dict], Any], where: str):
        super().__init__(comm, PROC_NULL, ANY_TAG, None, where)
        self._got: dict[int, Any] = {}
        self._key, self._waiting, self._finish = key, list(sources), finish
        if not self._waiting:
            self._end()

    def _end(self) -> None:
        self._finish(self._got)
        self._got = {}
        self._done = True

    def Wait(self, status: Status | None = None) -> bool:  # noqa: N802
        if not self._done:
            c = self._comm._c  # type: ignore[union-attr]  # (a collective has its comm)
            for src in self._waiting:
                self._got[src] = c._recv_from(src, self._key)
            self._waiting = []
            self._end()
        self._fill(status)
        return True

    def Test(self, status: Status | None = None) -> bool:  # noqa: N802
        if not self._done:
            c = self._comm._c  # type: ignore[union-attr]
            try_recv = _try_recv_of(c)
            still = []
            for src in self._waiting:
                got = try_recv(c._members[src], self._key)
                if got is _transport.NO_MESSAGE:
                    still.append(src)
                else:
                    self._got[src] = got
            self._waiting = still
            if not still:
                self._end()
        if self._done:
            self._fill(status)
        return self._done


# ANY_SOURCE looks at every peer; the pause between empty rounds doubles up to the maximum
# (on the direct transport it ends as soon as a peer sends).
_POLL_MIN_S = 20e-6
_POLL_MAX_S = 2e-3
_NOTHING = object()


# ------------------------------------------------------------------------------ communicators
class Comm:
    """An MPI communicator (mpi4py's ``Intracomm``) over a rayflow :class:`Communicator`."""

    def __init__(self, base: _comm.Communicator | None = None):
        self._bind_base(base)

    def _bind_base(self, base: _comm.Communicator | None) -> None:
        self._base = base
        self._freed = False
        self._send_seq: dict[int, itertools.count] = defaultdict(itertools.count)
        self._recv_next: dict[int, int] = defaultdict(int)
        self._unmatched: dict[int, deque] = defaultdict(deque)  # src -> (arrival, tag, obj, buf?)
        self._posted: list[Request] = []
        self._arrivals = itertools.count()
        self._dup_seq = itertools.count()
        self._group_seq: dict[tuple, int] = {}  # (group, tag) -> communicators made of it
        self._win_seq = itertools.count()  # windows made on it (each rank in the same order)
        self._nbr_seq = itertools.count()  # neighbor collectives on it (a topology's)
        self._icc_seq = itertools.count()  # intercommunicators it made (Create_intercomm)
        self._errhandler = ERRORS_RETURN

    # ------------------------------------------------------------ basics
    @property
    def _c(self) -> _comm.Communicator:
        if self._freed:
            raise Exception("this communicator was freed (Comm.Free)", 5)  # MPI_ERR_COMM
        if self._base is None:
            raise Exception("MPI.COMM_NULL cannot communicate", 5)
        return self._base

    def __repr__(self) -> str:
        if self._base is None:
            return "<MPI.COMM_NULL>"
        return f"<{type(self).__name__} rank={self._base.rank} size={self._base.size}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Comm) and other._base is self._base

    def __hash__(self) -> int:
        return id(self._base)

    def __bool__(self) -> bool:
        return self._base is not None

    def Get_rank(self) -> int:  # noqa: N802
        return self._c.rank

    def Get_size(self) -> int:  # noqa: N802
        return self._c.size

    rank = property(Get_rank)
    size = property(Get_size)

    def Get_group(self) -> Group:  # noqa: N802
        """The processes of this communicator, in its rank order."""
        c = self._c
        return Group(tuple(c._members), c._t.rank)

    group = property(Get_group)

    def Create(self, group: Group) -> Comm:  # noqa: N802
        """A communicator of ``group``'s processes (a subset of this one's), ranked in the
        group's order; ``COMM_NULL`` on the others. Every rank of this communicator calls
        it."""
        rank = self._in_group(group, "Create")
        return self.Split(UNDEFINED if rank == UNDEFINED else 0, rank)

    def Create_group(self, group: Group, tag: int = 0) -> Comm:  # noqa: N802
        """As :meth:`Create`, but only the group's processes call it (the others go on);
        ``COMM_NULL`` on a caller outside it."""
        if self._in_group(group, "Create_group") == UNDEFINED:
            return COMM_NULL
        c = self._c
        members = group._members
        # every member makes the same context: this communicator's, the group, the tag, and
        # how many times its members made one of that group and tag before
        n = self._group_seq.get((members, tag), 0)
        self._group_seq[(members, tag)] = n + 1
        return Intracomm(_comm.Communicator(c._t, list(members),
                                            (c._ctx, "group", tag, members, n),
                                            attempt=c.attempt, check_roots=c.check_roots))

    def _in_group(self, group: Group, where: str) -> int:
        """This process's rank in ``group`` (``UNDEFINED`` outside it), after checking that
        the group's processes all belong to this communicator."""
        if not isinstance(group, Group):
            raise TypeError(f"Comm.{where}: an MPI.Group, got {group!r}")
        outside = set(group._members) - set(self._c._members)
        if outside:
            raise ValueError(f"Comm.{where}: the group has processes outside this "
                             f"communicator (world ranks {sorted(outside)})")
        return group.Get_rank()

    def Is_inter(self) -> bool:  # noqa: N802
        return False

    def Is_intra(self) -> bool:  # noqa: N802
        return True

    def Get_topology(self) -> int:  # noqa: N802
        return UNDEFINED

    topology = property(Get_topology)

    def Set_name(self, name: str) -> None:  # noqa: N802
        self._name = name

    def Get_name(self) -> str:  # noqa: N802
        return getattr(self, "_name", "")

    def Dup(self) -> Comm:  # noqa: N802
        """A communicator with the same ranks and its own message space."""
        c = self._c
        seq = next(self._dup_seq)
        return type(self)._wrap(c, (c._ctx, "dup", seq))

    Clone = Dup

    @classmethod
    def _wrap(cls, c: _comm.Communicator, ctx: tuple) -> Comm:
        if isinstance(c, _comm.CartComm):
            base: _comm.Communicator = _comm.CartComm(c._t, c._members, ctx, c.dims, c.periods,
                                                      attempt=c.attempt)
            return Cartcomm(base)
        return Intracomm(_comm.Communicator(c._t, c._members, ctx, attempt=c.attempt,
                                            check_roots=c.check_roots))

    def Split(self, color: int = 0, key: int = 0) -> Comm:  # noqa: N802
        """Partition by ``color`` (``UNDEFINED``: this rank joins none and gets ``COMM_NULL``),
        ranks ordered by ``(key, rank)``."""
        sub = self._c.split(color, key)
        if color == UNDEFINED:
            return COMM_NULL
        return Intracomm(sub)

    def Split_type(self, split_type: int, key: int = 0, info: Any = None) -> Comm:  # noqa: N802
        """``COMM_TYPE_SHARED``: the ranks on this rank's machine (by host name), ordered by
        ``(key, rank)``; ``UNDEFINED``: none (``COMM_NULL``). Collective, as ``Split``."""
        if split_type == UNDEFINED:
            return self.Split(UNDEFINED, key)
        if split_type != COMM_TYPE_SHARED:
            raise ValueError(f"Split_type: split_type {split_type!r} is not "
                             f"MPI.COMM_TYPE_SHARED or MPI.UNDEFINED")
        hosts = self._c.allgather(socket.gethostname())
        return self.Split(sorted(set(hosts)).index(hosts[self._c.rank]), key)

    def Set_errhandler(self, errhandler: Errhandler) -> None:  # noqa: N802
        """Kept for ``Get_errhandler``; errors raise whichever is set (see
        :class:`Errhandler`)."""
        if not isinstance(errhandler, Errhandler):
            raise TypeError(f"Set_errhandler: an MPI.Errhandler (MPI.ERRORS_RETURN ...), got "
                            f"{errhandler!r}")
        self._errhandler = errhandler

    def Get_errhandler(self) -> Errhandler:  # noqa: N802
        return self._errhandler

    def Free(self) -> None:  # noqa: N802
        if self is COMM_WORLD or self is COMM_SELF:
            raise Exception("MPI.COMM_WORLD and MPI.COMM_SELF cannot be freed", 5)
        self._c  # noqa: B018 - freeing twice is an error, as in MPI
        self._freed = True

    def Disconnect(self) -> None:  # noqa: N802
        self.Free()

    def Create_cart(self, dims: Sequence[int], periods: Sequence[bool] | None = None,  # noqa: N802
                    reorder: bool = False) -> Cartcomm:
        """A Cartesian communicator over the first ``prod(dims)`` ranks (the others get
        ``COMM_NULL``), row-major; ``reorder`` is accepted and ignored."""
        c = self._c
        dims = [int(d) for d in dims]
        n = int(np.prod(dims)) if dims else 1
        if n > c.size:
            raise ValueError(f"Create_cart: dims {dims} need {n} ranks, the communicator has "
                             f"{c.size}")
        base = c.split(0 if c.rank < n else UNDEFINED, c.rank) if n < c.size else c
        if c.rank >= n:
            return COMM_NULL  # type: ignore[return-value]
        return Cartcomm(base.create_cart(dims, periods))

    def Create_graph(self, index: Sequence[int], edges: Sequence[int],  # noqa: N802
                     reorder: bool = False) -> Graphcomm:
        """A graph over the first ``len(index)`` ranks (the others get ``COMM_NULL``): node
        ``i``'s neighbors are ``edges[index[i-1]:index[i]]``. Collective; ``reorder`` is
        accepted and ignored."""
        c = self._c
        index, edges = [int(i) for i in index], [int(e) for e in edges]
        n = len(index)
        if n > c.size or any(b < a for a, b in zip([0, *index], index)) or (
                index and index[-1] != len(edges)):
            raise ValueError(f"Create_graph: index {index} must be non-decreasing, end at "
                             f"len(edges) = {len(edges)}, and name at most {c.size} nodes")
        _ranks_list(edges, n, "Create_graph")
        base = c.split(0 if c.rank < n else UNDEFINED, c.rank)
        if c.rank >= n:
            return COMM_NULL  # type: ignore[return-value]
        return Graphcomm(base, index, edges)

    def Create_dist_graph_adjacent(self, sources: Sequence[int],  # noqa: N802
                                   destinations: Sequence[int], sourceweights: Any = None,
                                   destweights: Any = None, info: Any = None,
                                   reorder: bool = False) -> Distgraphcomm:
        """This rank's sources and destinations, as it lists them (and their weights).
        Collective; ``reorder`` is accepted and ignored."""
        c = self._c
        src = _ranks_list(sources, c.size, "Create_dist_graph_adjacent")
        dst = _ranks_list(destinations, c.size, "Create_dist_graph_adjacent")
        sw = _weights(sourceweights, len(src), "Create_dist_graph_adjacent")
        dw = _weights(destweights, len(dst), "Create_dist_graph_adjacent")
        if (sw is None) != (dw is None):
            raise ValueError("Create_dist_graph_adjacent: weights for both the sources and "
                             "the destinations, or for neither")
        base = self.Dup()._c
        return Distgraphcomm(base, src, dst, None if sw is None else (sw, dw or []))

    def Create_dist_graph(self, sources: Sequence[int], degrees: Sequence[int],  # noqa: N802
                          destinations: Sequence[int], weights: Any = None,
                          info: Any = None, reorder: bool = False) -> Distgraphcomm:
        """Edges given by any rank: from ``sources[i]`` to the next ``degrees[i]`` entries
        of ``destinations``. Collective: every rank learns its own sources and
        destinations (ordered by the rank that gave the edge, then as it gave them)."""
        c = self._c
        src = _ranks_list(sources, c.size, "Create_dist_graph")
        dst = _ranks_list(destinations, c.size, "Create_dist_graph")
        degs = [int(d) for d in degrees]
        if len(degs) != len(src) or sum(degs) != len(dst) or any(d < 0 for d in degs):
            raise ValueError(f"Create_dist_graph: degrees {degs} must give one count per "
                             f"source and add up to the {len(dst)} destinations")
        w = _weights(weights, len(dst), "Create_dist_graph")
        starts = list(itertools.accumulate(degs, initial=0))
        mine = [(s, d, None if w is None else w[starts[i] + j])
                for i, s in enumerate(src) for j, d in enumerate(dst[starts[i]:starts[i + 1]])]
        everyone = c.allgather((mine, w is not None))
        edges = [e for part, _ in everyone for e in part]
        weighted = any(flag for _, flag in everyone)
        ins = [(s, wt) for s, d, wt in edges if d == c.rank]
        outs = [(d, wt) for s, d, wt in edges if s == c.rank]
        base = self.Dup()._c
        return Distgraphcomm(base, [s for s, _ in ins], [d for d, _ in outs],
                             ([wt or 0 for _, wt in ins], [wt or 0 for _, wt in outs])
                             if weighted else None)

    def Create_intercomm(self, local_leader: int, peer_comm: Comm,  # noqa: N802
                         remote_leader: int, tag: int = 0) -> Intercomm:
        """An intercommunicator between this communicator's group and another, disjoint
        one: collective over both groups. Their leaders, ``local_leader`` (a rank of this
        communicator) and ``remote_leader`` (the other's, a rank of ``peer_comm``, which
        holds both leaders; only the leaders' ``peer_comm`` counts), exchange their groups
        over ``peer_comm`` with ``tag``, and each tells its group."""
        c = self._c
        if not 0 <= local_leader < c.size:
            raise ValueError(f"Create_intercomm: local_leader {local_leader} out of range for "
                             f"a communicator of size {c.size}")
        # this group, and how many intercommunicators it made before (so that two made by
        # the same groups have contexts of their own)
        mine = (tuple(c._members), next(self._icc_seq))
        verdict: tuple = (None, None)
        if c.rank == local_leader:
            try:
                if not isinstance(peer_comm, Comm):
                    raise TypeError(f"Create_intercomm: peer_comm must be an MPI.Comm, got "
                                    f"{peer_comm!r}")
                theirs = peer_comm.sendrecv(mine, remote_leader, tag, None, remote_leader, tag)
                if set(theirs[0]) & set(mine[0]):
                    raise ValueError(f"Create_intercomm: the two groups share processes "
                                     f"(world ranks {sorted(set(theirs[0]) & set(mine[0]))})")
                verdict = (theirs, None)
            except builtins.Exception as exc:  # noqa: BLE001 - raised on every rank of the group
                verdict = (None, exc)
        theirs, error = self.bcast(verdict, local_leader)
        if error is not None:
            raise error
        remote = list(theirs[0])
        # both groups name it alike; the group whose leader has the lower world rank goes
        # first in a Merge where both pass the same high
        ctx = ("intercomm", *sorted([mine, theirs]), tag)
        low_first = mine[0][0] < remote[0]
        joint = list(mine[0]) + remote if low_first else remote + list(mine[0])
        return Intercomm.between(c._t, remote, c.rank, c.size, ctx, joint, low_first,
                                 c.attempt)

    def Spawn(self, command: str, args: Sequence[str] | None = None,  # noqa: N802
              maxprocs: int = 1, info: Any = INFO_NULL, root: int = 0,
              errcodes: list | None = None) -> Intercomm:
        """Start ``maxprocs`` new ranks running a Python script (``command`` a Python
        interpreter, ``args`` the script and its arguments): collective over this
        communicator, the ``root`` starts them (a gang of new Ray ranks). Returns the
        intercommunicator to them; theirs is ``Comm.Get_parent()``, their
        ``COMM_WORLD`` their own. See :mod:`rayflow.hpc.spawn`."""
        from rayflow.hpc.spawn import spawn

        return spawn(self, command, args, maxprocs, root, errcodes)

    @staticmethod
    def Get_parent() -> Comm:  # noqa: N802
        """In a rank that ``Spawn`` started: the intercommunicator to its parents; else
        ``COMM_NULL``."""
        return _parent[0] if _parent and _parent[0] is not None else COMM_NULL

    def Abort(self, errorcode: int = 0) -> None:  # noqa: N802
        """End the program on every rank with exit status ``errorcode``."""
        raise Aborted(int(errorcode))

    # ------------------------------------------------------------ matching engine
    def _check_peer(self, r: Any, what: str, wildcard: bool = False) -> int:
        c = self._c
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)):
            raise TypeError(f"{what} rank must be an int, got {r!r}")
        r = int(r)
        if r == PROC_NULL or (wildcard and r == ANY_SOURCE):
            return r
        if not 0 <= r < c.size:
            extra = ", ANY_SOURCE" if wildcard else ""
            raise ValueError(f"{what} rank {r} out of range for a communicator of size "
                             f"{c.size} (or PROC_NULL{extra})")
        return r

    @staticmethod
    def _check_tag(tag: Any, what: str, wildcard: bool = False) -> int:
        if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)):
            raise TypeError(f"{what} must be an int, got {tag!r}")
        tag = int(tag)
        if wildcard and tag == ANY_TAG:
            return tag
        if not 0 <= tag <= TAG_UB:
            raise ValueError(f"{what} {tag} must be in 0..{TAG_UB}"
                             + (" (or ANY_TAG)" if wildcard else ""))
        return tag

    def _key(self, seq: int) -> tuple:
        return ("mpi", self._c._ctx, seq)

    def _post_send(self, obj: Any, dest: int, tag: int, is_buffer: bool) -> None:
        c = self._c
        dest = self._check_peer(dest, "destination")
        tag = self._check_tag(tag, "tag")
        if dest == PROC_NULL:
            return
        if dest == c.rank:  # to itself: straight into the matching engine (a snapshot)
            if isinstance(obj, np.ndarray):
                obj = obj.copy()
            self._arrive(dest, tag, obj, is_buffer)
            return
        seq = next(self._send_seq[dest])
        c._t.send(c._members[dest], self._key(seq), (tag, is_buffer, obj))

    def _arrive(self, src: int, tag: int, obj: Any, is_buffer: bool, view: bool = False) -> None:
        """Match a message that came in. ``view``: its arrays view the channel's memory,
        valid during this call only: a buffer receive copies them into its buffer, anything
        else keeps a copy."""
        for i, req in enumerate(self._posted):
            if req.source in (ANY_SOURCE, src) and req.tag in (ANY_TAG, tag):
                del self._posted[i]
                if view and req._buf is not None and is_buffer:
                    req._complete(src, tag, obj, is_buffer)  # copies into the buffer
                    filled = req._buf[:np.asarray(obj).size]
                    req._value, req._status = filled, (src, tag, filled, is_buffer)
                else:
                    req._complete(src, tag, _private(obj) if view else obj, is_buffer)
                return
        self._unmatched[src].append((next(self._arrivals), tag, _private(obj) if view else obj,
                                     is_buffer))

    def _pull(self, src: int, block: bool, into_buffer: bool = False) -> bool:
        """Take the next message from ``src`` off the transport; whether one came.
        ``into_buffer``: a buffer receive waits, which may copy straight from the channel."""
        c = self._c
        key = self._key(self._recv_next[src])
        if block:
            apply = getattr(c._t, "recv_apply", None) if into_buffer else None
            if apply is not None:
                apply(c._members[src], key,
                      lambda got: self._arrive(src, got[0], got[2], got[1], view=True))
                self._recv_next[src] += 1
                return True
            got = c._t.recv(c._members[src], key)
        else:
            got = _try_recv_of(c)(c._members[src], key)
            if got is _transport.NO_MESSAGE:
                return False
        self._recv_next[src] += 1
        tag, is_buffer, obj = got
        self._arrive(src, tag, obj, is_buffer)
        return True

    def _post_recv(self, source: int, tag: int, buf: np.ndarray | None, where: str) -> Request:
        source = self._check_peer(source, "source", wildcard=True)
        tag = self._check_tag(tag, "tag", wildcard=True)
        if source == PROC_NULL:
            return Request(None, PROC_NULL, ANY_TAG, buf, where)
        req = Request(self, source, tag, buf, where)
        entry = self._take_unmatched(source, tag)
        if entry is not None:
            req._complete(*entry)
        else:
            self._posted.append(req)
        return req

    def _take_unmatched(self, source: int, tag: int) -> tuple[int, int, Any, bool] | None:
        """The kept message a receive from ``source`` with ``tag`` takes (see
        :meth:`_find_unmatched`), out of the kept ones: ``(source, tag, message, sent as a
        buffer)``; None if none."""
        hit = self._find_unmatched(source, tag)
        if hit is None:
            return None
        _, src, j = hit
        _, t, obj, is_buffer = self._unmatched[src][j]
        del self._unmatched[src][j]
        return src, t, obj, is_buffer

    def _find_unmatched(self, source: int, tag: int) -> tuple[int, int, int] | None:
        """The message kept (arrived, not matched yet) that a receive from ``source`` with
        ``tag`` takes: the first to arrive of those that match, as ``(arrival, source,
        index in its source's list)``; None if none."""
        best = None
        for src, box in self._unmatched.items():
            if source not in (ANY_SOURCE, src):
                continue
            for j, (arrival, t, _, _) in enumerate(box):
                if tag in (ANY_TAG, t):
                    if best is None or arrival < best[0]:
                        best = (arrival, src, j)
                    break
        return best

    def _peers(self) -> list[int]:
        c = self._c
        return [r for r in range(c.size) if r != c.rank]

    def _progress_once(self, req: Request) -> None:
        peers = self._peers() if req.source == ANY_SOURCE else [req.source]
        for src in peers:
            if src != self._c.rank:
                while not req._done and self._pull(src, block=False):
                    pass
            if req._done:
                return

    def _progress_until(self, req: Request) -> None:
        if req.source != ANY_SOURCE:
            if req.source == self._c.rank:
                raise Exception(f"deadlock: rank {req.source} waits for a message to itself "
                                f"(tag {req.tag}) that was never sent", ERR_OTHER)
            while not req._done:
                self._pull(req.source, block=True, into_buffer=req._buf is not None)
            return
        peers = self._peers()
        if not peers:
            raise Exception("deadlock: a receive from ANY_SOURCE on a single rank with no "
                            "message sent to itself", ERR_OTHER)
        delay = _POLL_MIN_S
        while not req._done:
            before = next(self._arrivals)
            self._progress_once(req)
            if req._done:
                return
            if next(self._arrivals) - before > 1:  # something arrived: look again at once
                delay = _POLL_MIN_S
                continue
            delay = self._pause(delay)

    def _pause(self, delay: float) -> float:
        """Wait ``delay`` seconds for a peer to send, and return the next, doubled pause:
        the direct transport wakes on its doorbell when a peer sends; others sleep."""
        wait = getattr(self._c._t, "wait_any", None)
        if wait is not None:
            wait(delay)
        else:
            time.sleep(delay)
        return min(delay * 2, _POLL_MAX_S)

    # ------------------------------------------------------------ point-to-point, objects
    def send(self, obj: Any, dest: int, tag: int = 0) -> None:
        """Send a picklable object (buffered: returns before it is received)."""
        self._post_send(obj, dest, tag, is_buffer=False)

    ssend = send
    bsend = send

    def isend(self, obj: Any, dest: int, tag: int = 0) -> Request:
        self._post_send(obj, dest, tag, is_buffer=False)
        return Request(None, PROC_NULL)

    issend = isend
    ibsend = isend

    def recv(self, buf: Any = None, source: int = ANY_SOURCE, tag: int = ANY_TAG,
             status: Status | None = None) -> Any:
        """Receive the first object from ``source`` with ``tag`` (wildcards allowed)."""
        return self._post_recv(source, tag, None, "recv").wait(status)

    def irecv(self, buf: Any = None, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        return self._post_recv(source, tag, None, "irecv")

    def sendrecv(self, sendobj: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG,
                 status: Status | None = None) -> Any:
        self.send(sendobj, dest, sendtag)
        return self.recv(None, source, recvtag, status)

    def probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG,
              status: Status | None = None) -> bool:
        """Wait until a message from ``source`` with ``tag`` (wildcards allowed) can be
        received, and describe it in ``status`` without receiving it: the next receive
        with the same source and tag gets that message."""
        return self._probe(source, tag, status, True, "probe")

    def iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG,
               status: Status | None = None) -> bool:
        """Whether a message from ``source`` with ``tag`` can be received now (``status``
        describes it); nothing is received."""
        return self._probe(source, tag, status, False, "iprobe")

    Probe = probe
    Iprobe = iprobe

    def mprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG,
               status: Status | None = None) -> Message:
        """As :meth:`probe`, and the message is taken out of matching: only the returned
        :class:`Message` receives it (no other receive or probe sees it)."""
        self._probe(source, tag, status, True, "mprobe")
        return self._take_matched(source, tag)

    def improbe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG,
                status: Status | None = None) -> Message | None:
        """As :meth:`iprobe`, with the message taken as :meth:`mprobe` takes it; None
        when none can be received now."""
        if not self._probe(source, tag, status, False, "improbe"):
            return None
        return self._take_matched(source, tag)

    Mprobe = mprobe
    Improbe = improbe

    def _take_matched(self, source: int, tag: int) -> Message:
        if source == PROC_NULL:
            return Message((PROC_NULL, ANY_TAG, None, True))
        entry = self._take_unmatched(source, tag)
        assert entry is not None  # (the probe found it; nothing else ran since)
        return Message(entry)

    def _probe(self, source: int, tag: int, status: Status | None, block: bool,
               where: str) -> bool:
        source = self._check_peer(source, "source", wildcard=True)
        tag = self._check_tag(tag, "tag", wildcard=True)
        if source == PROC_NULL:  # (MPI: at once, from PROC_NULL, with no items)
            if status is not None:
                status._set(PROC_NULL, ANY_TAG, None, True)
            return True
        rank = self._c.rank
        peers = [p for p in (self._peers() if source == ANY_SOURCE else [source])
                 if p != rank]
        delay = _POLL_MIN_S
        while True:
            hit = self._find_unmatched(source, tag)
            if hit is not None:
                if status is not None:
                    _, src, j = hit
                    _, t, obj, is_buffer = self._unmatched[src][j]
                    status._set(src, t, obj, is_buffer)
                return True
            if block and not peers:
                raise Exception(f"deadlock: {where} on rank {rank} waits for a message that "
                                f"no other rank can send", ERR_OTHER)
            if block and source != ANY_SOURCE:
                self._pull(source, block=True)  # the next message from it, whichever tag
                continue
            before = next(self._arrivals)
            for src in peers:
                while self._pull(src, block=False):
                    pass
            if self._find_unmatched(source, tag) is not None:
                continue
            if not block:
                return False
            if next(self._arrivals) - before > 1:  # something came: look again at once
                delay = _POLL_MIN_S
                continue
            delay = self._pause(delay)

    # ------------------------------------------------------------ point-to-point, buffers
    def Send(self, buf: Any, dest: int, tag: int = 0) -> None:  # noqa: N802
        flat, _ = _buffer(buf, "Send")
        self._post_send(flat, dest, tag, is_buffer=True)  # a send snapshots it

    Ssend = Send
    Bsend = Send
    Rsend = Send

    def Isend(self, buf: Any, dest: int, tag: int = 0) -> Request:  # noqa: N802
        self.Send(buf, dest, tag)
        return Request(None, PROC_NULL)

    Issend = Isend
    Ibsend = Isend
    Irsend = Isend

    def Recv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG,  # noqa: N802
             status: Status | None = None) -> None:
        flat, _ = _buffer(buf, "Recv", writable=True)
        self._post_recv(source, tag, flat, "Recv").Wait(status)

    def Irecv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:  # noqa: N802
        flat, _ = _buffer(buf, "Irecv", writable=True)
        return self._post_recv(source, tag, flat, "Irecv")

    def Send_init(self, buf: Any, dest: int, tag: int = 0) -> Prequest:  # noqa: N802
        """A persistent send of ``buf``: each ``Start`` sends what it holds then."""
        return Prequest(lambda: self.Isend(buf, dest, tag), "Send_init")

    Ssend_init = Send_init
    Bsend_init = Send_init
    Rsend_init = Send_init

    def Recv_init(self, buf: Any, source: int = ANY_SOURCE,  # noqa: N802
                  tag: int = ANY_TAG) -> Prequest:
        """A persistent receive into ``buf``: each ``Start`` posts it again."""
        return Prequest(lambda: self.Irecv(buf, source, tag), "Recv_init")

    def Sendrecv(self, sendbuf: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,  # noqa: N802
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG,
                 status: Status | None = None) -> None:
        self.Send(sendbuf, dest, sendtag)
        self.Recv(recvbuf, source, recvtag, status)

    def Sendrecv_replace(self, buf: Any, dest: int, sendtag: int = 0,  # noqa: N802
                         source: int = ANY_SOURCE, recvtag: int = ANY_TAG,
                         status: Status | None = None) -> None:
        flat, _ = _buffer(buf, "Sendrecv_replace", writable=True)
        self._post_send(flat, dest, sendtag, is_buffer=True)  # snapshotted before the receive
        self._post_recv(source, recvtag, flat, "Sendrecv_replace").Wait(status)

    # ------------------------------------------------------------ collectives, objects
    def barrier(self) -> None:
        self._c.barrier()

    Barrier = barrier

    def bcast(self, obj: Any = None, root: int = 0) -> Any:
        return self._c.bcast(obj, root)

    def scatter(self, sendobj: Sequence[Any] | None = None, root: int = 0) -> Any:
        return self._c.scatter(sendobj, root)

    def gather(self, sendobj: Any, root: int = 0) -> list[Any] | None:
        return self._c.gather(sendobj, root)

    def allgather(self, sendobj: Any) -> list[Any]:
        return self._c.allgather(sendobj)

    def alltoall(self, sendobj: Sequence[Any]) -> list[Any]:
        return self._c.alltoall(sendobj)

    def reduce(self, sendobj: Any, op: Op = SUM, root: int = 0) -> Any:
        op = _check_op(op, "reduce")
        if op._comm_op is not None and not isinstance(sendobj, tuple):
            return self._c.reduce(sendobj, op._comm_op, root)
        vals = self._c._gather(sendobj, root, "reduce")
        return None if vals is None else _fold(vals, op, "reduce")

    def allreduce(self, sendobj: Any, op: Op = SUM) -> Any:
        op = _check_op(op, "allreduce")
        if op._comm_op is not None and not isinstance(sendobj, tuple):
            return self._c.allreduce(sendobj, op._comm_op)
        return _fold(self._c.allgather(sendobj), op, "allreduce")

    def scan(self, sendobj: Any, op: Op = SUM) -> Any:
        op = _check_op(op, "scan")
        vals = self._c.allgather(sendobj)[: self._c.rank + 1]
        return _fold(vals, op, "scan")

    def exscan(self, sendobj: Any, op: Op = SUM) -> Any:
        op = _check_op(op, "exscan")
        vals = self._c.allgather(sendobj)[: self._c.rank]
        return _fold(vals, op, "exscan") if vals else None

    # ------------------------------------------------------------ collectives, buffers
    # The rooted buffer collectives: every rank's buffer travels described (its items and
    # dtype) with the root it passed, and a rank whose own buffers are wrong still takes
    # part, with the error in place of its data: every rank then raises instead of waiting.
    def Bcast(self, buf: Any, root: int = 0) -> None:  # noqa: N802
        c = self._c
        if c._native is not None:
            flat, _ = _buffer(buf, "Bcast", writable=True)
            got = c.bcast(flat if c.rank == root else None, root)
            if c.rank != root:
                _copy_into(flat, got, "Bcast")
            return
        mine: np.ndarray | None = None
        error = None
        try:
            mine = _buffer(buf, "Bcast", writable=True)[0]
        except builtins.Exception as err:  # every rank raises it (see above)
            error = err
        got = c._bcast(mine if c.rank == root else None, root, "Bcast", _items(mine), error)
        if c.rank != root:
            _copy_into(mine, got, "Bcast")  # type: ignore[arg-type]  # (no error: a buffer)

    def _send_flat(self, sendbuf: Any, recvflat: np.ndarray | None, where: str) -> np.ndarray:
        if sendbuf is IN_PLACE:
            if recvflat is None:
                raise ValueError(f"{where}: IN_PLACE needs a receive buffer")
            return recvflat.copy()
        flat, _ = _buffer(sendbuf, where)
        return flat

    @staticmethod
    def _buffer_op(op: Any, where: str) -> Op:
        op = _check_op(op, where)
        if op is MAXLOC or op is MINLOC:
            raise NotImplementedError(f"{where}: MPI.{op.name} on buffers needs pair datatypes "
                                      "(MPI.DOUBLE_INT ...), which rayflow's MPI does not "
                                      "support; use the lowercase method on (value, index) pairs")
        return op

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Op = SUM, root: int = 0) -> None:  # noqa: N802
        is_root = self._c.rank == root
        mine, recvflat, error = None, None, None
        try:
            op = self._buffer_op(op, "Reduce")
            recvflat = _buffer(recvbuf, "Reduce", writable=True)[0] if is_root else None
            if sendbuf is IN_PLACE and not is_root:
                raise ValueError("Reduce: IN_PLACE is for the root's send buffer only")
            mine = self._send_flat(sendbuf, recvflat, "Reduce")
        except builtins.Exception as err:  # every rank raises it
            error = err
        vals = self._c._gather(mine, root, "Reduce", _items(mine), error)
        if vals is not None:  # (only at the root, which has recvflat)
            _copy_into(recvflat, _fold(vals, op, "Reduce"), "Reduce")  # type: ignore[arg-type]

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Op = SUM) -> None:  # noqa: N802
        op = self._buffer_op(op, "Allreduce")
        recvflat, _ = _buffer(recvbuf, "Allreduce", writable=True)
        # IN_PLACE: the receive buffer itself is sent (a send snapshots it first)
        direct = self._c._native is None
        mine = recvflat if sendbuf is IN_PLACE and direct else \
            self._send_flat(sendbuf, recvflat, "Allreduce")
        if op._comm_op is not None:
            if direct and mine.shape == recvflat.shape and mine.dtype == recvflat.dtype:
                # straight into the receive buffer, no result array in between
                self._c.allreduce(mine, op._comm_op, out=recvflat)
                return
            out = self._c.allreduce(mine, op._comm_op)
        else:
            out = _fold(self._c.allgather(mine), op, "Allreduce")
        _copy_into(recvflat, out, "Allreduce")

    def Gather(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:  # noqa: N802
        self._gather_blocks("Gather", sendbuf, recvbuf, root, vector=False)

    def _gather_blocks(self, where: str, sendbuf: Any, recvbuf: Any, root: int,
                       vector: bool) -> None:
        """Every rank's send buffer into the root's block for it: equal blocks (Gather,
        where every rank's buffer travels described as one, checked against the root's
        blocks) or blocks of their own lengths (Gatherv, each checked at the root)."""
        c = self._c
        is_root = c.rank == root
        mine, blocks, error = None, None, None
        try:
            if is_root:
                blocks = self._iblocks(recvbuf, where, vector, writable=True)
            if sendbuf is IN_PLACE:
                if not is_root:
                    raise ValueError(f"{where}: IN_PLACE is for the root's send buffer only")
                mine = blocks[root].copy()  # type: ignore[index]  # (the root has blocks)
            else:
                mine = _buffer(sendbuf, where)[0]
            if is_root and not vector:
                _same_items(where, "send buffer", mine, "receive buffer's blocks",
                            blocks[root])  # type: ignore[index]
        except builtins.Exception as err:  # every rank raises it
            error = err
        vals = c._gather(mine, root, where, None if vector else _items(mine), error)
        if vals is not None:  # (only at the root, which has blocks)
            for r, (block, v) in enumerate(zip(blocks, vals)):  # type: ignore[arg-type]
                if vector:
                    _copy_block(block, v, where, r)
                else:
                    _copy_into(block, v, where)

    def Scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:  # noqa: N802
        c = self._c
        is_root = c.rank == root
        parts, recvflat, block, error = None, None, None, None
        try:
            if is_root:
                parts = [p.copy() for p in _chunks(_buffer(sendbuf, "Scatter")[0], c.size,
                                                    "Scatter")]
                block = parts[root]
            if recvbuf is IN_PLACE:
                if not is_root:
                    raise ValueError("Scatter: IN_PLACE is for the root's receive buffer only")
            else:
                recvflat = _buffer(recvbuf, "Scatter", writable=True)[0]
                if is_root:
                    _same_items("Scatter", "receive buffer", recvflat, "send buffer's blocks",
                                block)  # type: ignore[arg-type]
                block = recvflat
        except builtins.Exception as err:  # every rank raises it
            error = err
        got = c._scatter(parts, root, "Scatter", _items(block), error)
        if recvflat is not None:
            _copy_into(recvflat, got, "Scatter")

    def Allgather(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        c = self._c
        recvflat, _ = _buffer(recvbuf, "Allgather", writable=True)
        chunks = _chunks(recvflat, c.size, "Allgather")
        mine = chunks[c.rank].copy() if sendbuf is IN_PLACE else _buffer(sendbuf, "Allgather")[0]
        for chunk, v in zip(chunks, c.allgather(mine)):
            _copy_into(chunk, v, "Allgather")

    def Alltoall(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        c = self._c
        recvflat, _ = _buffer(recvbuf, "Alltoall", writable=True)
        sendflat = self._send_flat(sendbuf, recvflat, "Alltoall")
        got = c.alltoall([p.copy() for p in _chunks(sendflat, c.size, "Alltoall")])
        for chunk, v in zip(_chunks(recvflat, c.size, "Alltoall"), got):
            _copy_into(chunk, v, "Alltoall")

    def Scan(self, sendbuf: Any, recvbuf: Any, op: Op = SUM) -> None:  # noqa: N802
        """Rank ``r`` gets ``op`` over the send buffers of ranks 0..r, elementwise."""
        self._prefix("Scan", sendbuf, recvbuf, op, inclusive=True).Wait()

    def Exscan(self, sendbuf: Any, recvbuf: Any, op: Op = SUM) -> None:  # noqa: N802
        """Rank ``r`` gets ``op`` over the send buffers of ranks 0..r-1; rank 0's receive
        buffer is left as it is (MPI leaves it undefined)."""
        self._prefix("Exscan", sendbuf, recvbuf, op, inclusive=False).Wait()

    def Reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Op = SUM) -> None:  # noqa: N802
        op = self._buffer_op(op, "Reduce_scatter_block")
        c = self._c
        recvflat, _ = _buffer(recvbuf, "Reduce_scatter_block", writable=True)
        sendflat = self._send_flat(sendbuf, recvflat, "Reduce_scatter_block")
        parts = _chunks(sendflat, c.size, "Reduce_scatter_block")
        got = c.alltoall([p.copy() for p in parts])
        _copy_into(recvflat, _fold(got, op, "Reduce_scatter_block"), "Reduce_scatter_block")

    # ------------------------------------------------------------ vector collectives
    def Gatherv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:  # noqa: N802
        """Every rank's send buffer, of its own length, into the root's block for it
        (``recvbuf`` a vector spec: ``[buf, counts, displs, type]`` ...)."""
        self._gather_blocks("Gatherv", sendbuf, recvbuf, root, vector=True)

    def Scatterv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:  # noqa: N802
        """The root's block for each rank (``sendbuf`` a vector spec) into that rank's
        receive buffer."""
        c = self._c
        is_root = c.rank == root
        parts, recvflat, error = None, None, None
        try:
            if is_root:
                parts = [b.copy() for b in _vblocks(sendbuf, c.size, "Scatterv")]
            if recvbuf is IN_PLACE:
                if not is_root:
                    raise ValueError("Scatterv: IN_PLACE is for the root's receive buffer only")
            else:
                recvflat = _buffer(recvbuf, "Scatterv", writable=True)[0]
        except builtins.Exception as err:  # every rank raises it
            error = err
        got = c._scatter(parts, root, "Scatterv", None, error)
        if recvflat is not None:
            _copy_into(recvflat, got, "Scatterv")

    def Allgatherv(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        """Every rank's send buffer, of its own length, into every rank's block for it."""
        self._iallgather("Allgatherv", sendbuf, recvbuf, vector=True).Wait()

    def Alltoallv(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        """Block ``r`` of each rank's send buffer to rank ``r``, into its block for the
        sender (both vector specs)."""
        self._ialltoall("Alltoallv", sendbuf, recvbuf, vector=True).Wait()

    def Reduce_scatter(self, sendbuf: Any, recvbuf: Any,  # noqa: N802
                       recvcounts: Sequence[int] | None = None, op: Op = SUM) -> None:
        """Reduce every rank's send buffer elementwise, then rank ``r`` keeps the
        ``recvcounts[r]`` items of block ``r`` (by default each rank's receive buffer
        length). With ``IN_PLACE`` the receive buffer holds the input, and ``recvcounts``
        is needed; the result goes to its start."""
        self._reduce_scatter("Reduce_scatter", sendbuf, recvbuf, recvcounts, op).Wait()

    # ------------------------------------------------------------ non-blocking collectives
    # Each sends what it has to send at once and returns a request whose Wait receives the
    # rest: one message from each rank it needs, under one collective key drawn in call
    # order (as every rank calls its collectives in the same order, the keys agree).
    def _icoll(self, where: str, sends: dict[int, Any], sources: Sequence[int],
               finish: Callable[[dict], Any]) -> Request:
        c = self._c
        key = c._ckey(where)
        for dest, obj in sends.items():
            c._send_to(dest, key, obj)
        return _CollRequest(self, key, sources, finish, where)

    def _others(self) -> list[int]:
        return [r for r in range(self._c.size) if r != self._c.rank]

    def Ibarrier(self) -> Request:  # noqa: N802
        """A barrier whose Wait returns once every rank has called it."""
        return self._icoll("Ibarrier", dict.fromkeys(self._others()), self._others(),
                           lambda got: None)

    def Ibcast(self, buf: Any, root: int = 0) -> Request:  # noqa: N802
        flat, _ = _buffer(buf, "Ibcast", writable=True)
        root = self._check_peer(root, "root")
        if self._c.rank == root:
            return self._icoll("Ibcast", dict.fromkeys(self._others(), flat), (),
                               lambda got: None)
        return self._icoll("Ibcast", {}, (root,),
                           lambda got: _copy_into(flat, got[root], "Ibcast"))

    def _iblocks(self, spec: Any, where: str, vector: bool,
                 writable: bool = False) -> list[np.ndarray]:
        """The per-rank blocks of a buffer: equal (``Gather``, ``Igather`` ...) or of a
        vector spec (``Gatherv``, ``Igatherv`` ...)."""
        if vector:
            return _vblocks(spec, self._c.size, where, writable)
        return _chunks(_buffer(spec, where, writable)[0], self._c.size, where)

    def Igather(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Request:  # noqa: N802
        return self._igather("Igather", sendbuf, recvbuf, root, vector=False)

    def Igatherv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Request:  # noqa: N802
        return self._igather("Igatherv", sendbuf, recvbuf, root, vector=True)

    def _igather(self, where: str, sendbuf: Any, recvbuf: Any, root: int,
                 vector: bool) -> Request:
        c, root = self._c, self._check_peer(root, "root")
        if c.rank != root:
            return self._icoll(where, {root: _buffer(sendbuf, where)[0]}, (), lambda got: None)
        blocks = self._iblocks(recvbuf, where, vector, writable=True)
        if sendbuf is not IN_PLACE:
            _copy_block(blocks[root], _buffer(sendbuf, where)[0], where, root)
        return self._icoll(where, {}, self._others(), self._into_blocks(blocks, where))

    @staticmethod
    def _into_blocks(blocks: list[np.ndarray], where: str) -> Callable[[dict], None]:
        """A request's finish: what each rank sent into its block."""
        def finish(got: dict) -> None:
            for r, v in got.items():
                _copy_block(blocks[r], v, where, r)
        return finish

    def Iscatter(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Request:  # noqa: N802
        return self._iscatter("Iscatter", sendbuf, recvbuf, root, vector=False)

    def Iscatterv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Request:  # noqa: N802
        return self._iscatter("Iscatterv", sendbuf, recvbuf, root, vector=True)

    def _iscatter(self, where: str, sendbuf: Any, recvbuf: Any, root: int,
                  vector: bool) -> Request:
        c, root = self._c, self._check_peer(root, "root")
        recvflat = None if recvbuf is IN_PLACE else _buffer(recvbuf, where, writable=True)[0]
        if c.rank != root:
            if recvflat is None:
                raise ValueError(f"{where}: IN_PLACE is for the root's receive buffer only")
            return self._icoll(where, {}, (root,),
                               lambda got: _copy_into(recvflat, got[root], where))
        parts = self._iblocks(sendbuf, where, vector)
        if recvflat is not None:
            if vector:
                _copy_into(recvflat, parts[root], where)
            else:
                _copy_block(recvflat, parts[root], where, root)
        return self._icoll(where, {r: parts[r] for r in self._others()}, (), lambda got: None)

    def Iallgather(self, sendbuf: Any, recvbuf: Any) -> Request:  # noqa: N802
        return self._iallgather("Iallgather", sendbuf, recvbuf, vector=False)

    def Iallgatherv(self, sendbuf: Any, recvbuf: Any) -> Request:  # noqa: N802
        return self._iallgather("Iallgatherv", sendbuf, recvbuf, vector=True)

    def _iallgather(self, where: str, sendbuf: Any, recvbuf: Any, vector: bool) -> Request:
        c = self._c
        blocks = self._iblocks(recvbuf, where, vector, writable=True)
        mine = blocks[c.rank].copy() if sendbuf is IN_PLACE else _buffer(sendbuf, where)[0]
        _copy_block(blocks[c.rank], mine, where, c.rank)
        return self._icoll(where, dict.fromkeys(self._others(), mine), self._others(),
                           self._into_blocks(blocks, where))

    def Ialltoall(self, sendbuf: Any, recvbuf: Any) -> Request:  # noqa: N802
        return self._ialltoall("Ialltoall", sendbuf, recvbuf, vector=False)

    def Ialltoallv(self, sendbuf: Any, recvbuf: Any) -> Request:  # noqa: N802
        return self._ialltoall("Ialltoallv", sendbuf, recvbuf, vector=True)

    def _ialltoall(self, where: str, sendbuf: Any, recvbuf: Any, vector: bool) -> Request:
        c = self._c
        blocks = self._iblocks(recvbuf, where, vector, writable=True)
        parts = [b.copy() for b in (blocks if sendbuf is IN_PLACE else
                                    self._iblocks(sendbuf, where, vector))]
        _copy_block(blocks[c.rank], parts[c.rank], where, c.rank)
        return self._icoll(where, {r: parts[r] for r in self._others()}, self._others(),
                           self._into_blocks(blocks, where))

    def _ireduce(self, where: str, sendbuf: Any, recvbuf: Any, op: Any, to: Sequence[int],
                 split: Sequence[int] | str | None) -> Request:
        """Every rank's buffer to the ranks ``to``, which fold what they get in rank order
        into their receive buffer; with ``split``, rank ``r`` gets block ``r`` of each
        rank's buffer only (``"equal"`` blocks, or blocks of the given counts)."""
        op = self._buffer_op(op, where)
        c = self._c
        recvflat = _buffer(recvbuf, where, writable=True)[0] if c.rank in to or \
            sendbuf is IN_PLACE else None
        mine = self._send_flat(sendbuf, recvflat, where).copy()
        blocks = None if split is None else _chunks(mine, c.size, where) if split == "equal" \
            else _vblocks([mine, list(split)], c.size, where)
        sends = {r: (blocks[r] if blocks is not None else mine) for r in to if r != c.rank}
        if c.rank not in to:
            return self._icoll(where, sends, (), lambda got: None)
        own = blocks[c.rank] if blocks is not None else mine

        def finish(got: dict) -> None:
            vals = [own if r == c.rank else got[r] for r in range(c.size)]
            _copy_into(recvflat, _fold(vals, op, where), where)  # type: ignore[arg-type]
        return self._icoll(where, sends, self._others(), finish)

    def Ireduce(self, sendbuf: Any, recvbuf: Any, op: Op = SUM, root: int = 0) -> Request:  # noqa: N802
        root = self._check_peer(root, "root")
        if sendbuf is IN_PLACE and self._c.rank != root:
            raise ValueError("Ireduce: IN_PLACE is for the root's send buffer only")
        return self._ireduce("Ireduce", sendbuf, recvbuf, op, (root,), split=None)

    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Op = SUM) -> Request:  # noqa: N802
        return self._ireduce("Iallreduce", sendbuf, recvbuf, op, range(self._c.size),
                             split=None)

    def Ireduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Op = SUM) -> Request:  # noqa: N802
        """Each rank folds block ``rank`` of every rank's send buffer; the blocks travel
        straight to the rank that folds them."""
        return self._ireduce("Ireduce_scatter_block", sendbuf, recvbuf, op,
                             range(self._c.size), split="equal")

    def Ireduce_scatter(self, sendbuf: Any, recvbuf: Any,  # noqa: N802
                        recvcounts: Sequence[int] | None = None, op: Op = SUM) -> Request:
        """As :meth:`Reduce_scatter`, non-blocking. Without ``recvcounts`` the ranks first
        tell each other their receive buffer lengths (a blocking exchange)."""
        return self._reduce_scatter("Ireduce_scatter", sendbuf, recvbuf, recvcounts, op)

    def _reduce_scatter(self, where: str, sendbuf: Any, recvbuf: Any,
                        recvcounts: Sequence[int] | None, op: Any) -> Request:
        """Block ``r`` (``recvcounts[r]`` items) of every rank's send buffer to rank ``r``,
        which folds them: a ``Reduce_scatter`` waits for it, an ``Ireduce_scatter``
        returns it."""
        recvflat, _ = _buffer(recvbuf, where, writable=True)
        if recvcounts is None:
            if sendbuf is IN_PLACE:
                raise ValueError(f"{where}: IN_PLACE needs recvcounts (the receive buffer "
                                 f"holds the whole input)")
            recvcounts = self._c.allgather(int(recvflat.size))
        items = recvflat.size if sendbuf is IN_PLACE else _buffer(sendbuf, where)[0].size
        if sum(recvcounts) != items:
            raise ValueError(f"{where}: recvcounts {list(recvcounts)} add up to "
                             f"{sum(recvcounts)} items; the send buffer has {items}")
        return self._ireduce(where, sendbuf, recvbuf, op, range(self._c.size),
                             split=list(recvcounts))

    def Iscan(self, sendbuf: Any, recvbuf: Any, op: Op = SUM) -> Request:  # noqa: N802
        return self._prefix("Iscan", sendbuf, recvbuf, op, inclusive=True)

    def Iexscan(self, sendbuf: Any, recvbuf: Any, op: Op = SUM) -> Request:  # noqa: N802
        return self._prefix("Iexscan", sendbuf, recvbuf, op, inclusive=False)

    def _prefix(self, where: str, sendbuf: Any, recvbuf: Any, op: Any,
                inclusive: bool) -> Request:
        """Each rank's buffer to the ranks above it, which fold those of the ranks below
        them (and their own, ``inclusive``) in rank order: a ``Scan`` (``Exscan``) waits for
        it, an ``Iscan`` returns it."""
        op = self._buffer_op(op, where)
        c = self._c
        recvflat, _ = _buffer(recvbuf, where, writable=True)
        mine = self._send_flat(sendbuf, recvflat, where).copy()
        below = list(range(c.rank))

        def finish(got: dict) -> None:
            vals = [got[r] for r in below] + ([mine] if inclusive else [])
            if vals:
                _copy_into(recvflat, _fold(vals, op, where), where)
        return self._icoll(where, dict.fromkeys(range(c.rank + 1, c.size), mine), below,
                           finish)

    def _unsupported(name: str, what: str) -> Callable:  # type: ignore[misc]  # noqa: N805 - a class-body helper
        def method(self: Comm, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError(f"Comm.{name} ({what}) is not supported by rayflow's MPI")

        method.__name__ = name
        return method

    Alltoallw = _unsupported("Alltoallw", "derived datatypes per block")


class Intracomm(Comm):
    """An intracommunicator (every communicator here is one)."""


class Intercomm(Comm):
    """An intercommunicator: two disjoint groups, this rank's (``Get_rank``, ``Get_size``)
    and the remote one (``Get_remote_size``), as ``Spawn`` and ``Get_parent`` give. A
    point-to-point call names a rank of the remote group. The rooted collectives follow
    MPI's rules for two groups: in the root's group the root passes ``MPI.ROOT`` and the
    others ``MPI.PROC_NULL``; in the other group every rank passes the root's rank there.
    ``bcast``/``Bcast`` and ``scatter`` go from the root to the remote group,
    ``reduce``/``Reduce`` and ``gather`` from the remote group to the root; ``allgather``
    and ``allreduce`` give each group the remote group's values. ``Barrier`` spans both
    groups; ``Merge`` makes one intracommunicator of them."""

    def __init__(self, base: _comm.Communicator | None = None, local_rank: int = 0,
                 local_size: int = 0, joint: _comm.Communicator | None = None,
                 low_first: bool = True):
        super().__init__(base)
        self._local = (local_rank, local_size)
        self._joint = joint  # both groups (Barrier, Merge)
        self._low_first = low_first  # this group goes first in a Merge where both pass
        #                              the same high (Spawn's parents; Create_intercomm's
        #                              group holding the lower world rank)
        self._closers: list[Callable[[], None]] = []
        self._merge_seq = itertools.count()
        if base is not None:
            self._coll = Comm(_comm.Communicator(base._t, base._members, (base._ctx, "coll"),
                                                 attempt=base.attempt))

    @classmethod
    def between(cls, transport: Any, remote: list[int], local_rank: int, local_size: int,
                ctx: Any, joint: list[int] | None = None, low_first: bool = True,
                attempt: int = 0) -> Intercomm:
        """The intercommunicator from this process (rank ``local_rank`` of its group of
        ``local_size``) to the ``remote`` group's transport ranks, in message space
        ``ctx``; ``joint`` lists both groups' transport ranks in order (None: every rank of
        ``transport``)."""
        return cls(_comm.Communicator(transport, [*remote, transport.rank], ctx,
                                      attempt=attempt),
                   local_rank, local_size,
                   _comm.Communicator(transport, joint, (ctx, "joint"), attempt=attempt),
                   low_first)

    def Get_rank(self) -> int:  # noqa: N802
        self._c  # noqa: B018 - (COMM_NULL or freed: an error)
        return self._local[0]

    def Get_size(self) -> int:  # noqa: N802
        self._c  # noqa: B018
        return self._local[1]

    def Get_remote_size(self) -> int:  # noqa: N802
        return self._c.size - 1  # (the remote group, then this rank)

    rank = property(Get_rank)
    size = property(Get_size)
    remote_size = property(Get_remote_size)

    def Is_inter(self) -> bool:  # noqa: N802
        return True

    def Is_intra(self) -> bool:  # noqa: N802
        return False

    def _check_peer(self, r: Any, what: str, wildcard: bool = False) -> int:
        r = super()._check_peer(r, what, wildcard)
        if r == self._c.size - 1:  # (this rank's own place in the base)
            raise ValueError(f"{what} rank {r} out of range for a remote group of size "
                             f"{r} (or PROC_NULL)")
        return r

    def Dup(self) -> Intercomm:  # noqa: N802
        c = self._c
        dup = Intercomm(_comm.Communicator(c._t, c._members, (c._ctx, "dup",
                                                              next(self._dup_seq)),
                                           attempt=c.attempt),
                        *self._local, self._joint, self._low_first)
        return dup

    Clone = Dup

    # ------------------------------------------------------------ collectives of two groups
    def _role(self, root: Any, where: str) -> str:
        """``"root"``, ``"idle"`` (PROC_NULL: the root's group, not the root) or
        ``"remote"`` (the other group, whose root is ``root``)."""
        if root == ROOT:
            return "root"
        if root == PROC_NULL:
            return "idle"
        self._check_peer(root, f"{where}: root")
        return "remote"

    def barrier(self) -> None:
        assert self._joint is not None
        self._c  # noqa: B018
        self._joint.barrier()

    Barrier = barrier

    def bcast(self, obj: Any = None, root: int = 0) -> Any:
        role = self._role(root, "bcast")
        if role == "root":
            for r in range(self.Get_remote_size()):
                self._coll.send(obj, r)
            return None  # (as mpi4py's: the root's group gets nothing back)
        return None if role == "idle" else self._coll.recv(None, root)

    def Bcast(self, buf: Any, root: int = 0) -> None:  # noqa: N802
        role = self._role(root, "Bcast")
        if role == "root":
            for r in range(self.Get_remote_size()):
                self._coll.Send(buf, r)
        elif role == "remote":
            self._coll.Recv(buf, root)

    def scatter(self, sendobj: Any = None, root: int = 0) -> Any:
        role = self._role(root, "scatter")
        if role == "root":
            items = list(sendobj)
            if len(items) != self.Get_remote_size():
                raise ValueError(f"scatter: {len(items)} items for a remote group of "
                                 f"{self.Get_remote_size()}")
            for r, item in enumerate(items):
                self._coll.send(item, r)
            return None
        return None if role == "idle" else self._coll.recv(None, root)

    def gather(self, sendobj: Any, root: int = 0) -> list | None:
        role = self._role(root, "gather")
        if role == "root":
            return [self._coll.recv(None, r) for r in range(self.Get_remote_size())]
        if role == "remote":
            self._coll.send(sendobj, root)
        return None

    def reduce(self, sendobj: Any, op: Op = SUM, root: int = 0) -> Any:
        op = _check_op(op, "reduce")
        vals = self.gather(sendobj, root)
        return None if vals is None else _fold(vals, op, "reduce")

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Op = SUM, root: int = 0) -> None:  # noqa: N802
        role = self._role(root, "Reduce")
        if role == "remote":
            self._coll.Send(sendbuf, root)
        elif role == "root":
            op = self._buffer_op(op, "Reduce")
            flat, _ = _buffer(recvbuf, "Reduce", writable=True)
            vals = []
            for r in range(self.Get_remote_size()):
                part = np.empty_like(flat)
                self._coll.Recv(part, r)
                vals.append(part)
            _copy_into(flat, _fold(vals, op, "Reduce"), "Reduce")

    def allgather(self, sendobj: Any) -> list:
        for r in range(self.Get_remote_size()):
            self._coll.send(sendobj, r, tag=1)
        return [self._coll.recv(None, r, tag=1) for r in range(self.Get_remote_size())]

    def allreduce(self, sendobj: Any, op: Op = SUM) -> Any:
        return _fold(self.allgather(sendobj), _check_op(op, "allreduce"), "allreduce")

    def Merge(self, high: bool = False) -> Intracomm:  # noqa: N802
        """One intracommunicator of both groups: the group that passed ``high=False``
        first (where both passed the same, the group of the parents)."""
        assert self._joint is not None
        joint = self._joint
        theirs = self.allgather(bool(high))[0]
        mine_first = (not high and theirs) or (bool(high) == theirs and self._low_first)
        local = [m for m in joint._members if m in self._group_members()]
        remote = [m for m in joint._members if m not in local]
        members = local + remote if mine_first else remote + local
        return Intracomm(_comm.Communicator(joint._t, members,
                                            (joint._ctx, "merge", next(self._merge_seq)),
                                            attempt=joint.attempt))

    def _group_members(self) -> set[int]:
        """The transport ranks of this rank's group."""
        assert self._joint is not None
        remote = set(self._c._members[:-1])
        return {m for m in self._joint._members if m not in remote}

    def Disconnect(self) -> None:  # noqa: N802
        """Wait for both groups (collective), then free it and end what it holds (the
        spawned ranks' channels, and at the spawning root their gang once they ended)."""
        self.barrier()
        self.Free()

    def Free(self) -> None:  # noqa: N802
        self._c  # noqa: B018 - freeing twice is an error, as in MPI
        self._freed = True
        closers, self._closers = self._closers, []
        for close in closers:
            close()


def _not_on_intercomm(name: str) -> Callable[..., Any]:
    def refuse(self: Intercomm, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{name} on an intercommunicator is not supported by "
                                  f"rayflow's MPI (bcast, Bcast, scatter, gather, reduce, "
                                  f"Reduce, allgather, allreduce, Barrier and Merge are)")
    return refuse


for _name in ("Split", "Split_type", "Create", "Create_group", "Create_intercomm",
              "Create_cart", "Create_graph",
              "Create_dist_graph_adjacent", "Create_dist_graph", "Spawn", "alltoall", "scan",
              "exscan", "Allreduce", "Gather", "Scatter", "Allgather", "Alltoall", "Scan",
              "Exscan", "Reduce_scatter_block", "Gatherv", "Scatterv", "Allgatherv",
              "Alltoallv", "Reduce_scatter", "Ibarrier", "Ibcast", "Igather", "Igatherv",
              "Iscatter", "Iscatterv", "Iallgather", "Iallgatherv", "Ialltoall", "Ialltoallv",
              "Ireduce", "Iallreduce", "Ireduce_scatter_block", "Ireduce_scatter", "Iscan",
              "Iexscan"):
    setattr(Intercomm, _name, _not_on_intercomm(_name))


class Topocomm(Intracomm):
    """A communicator with neighbors (mpi4py's ``Topocomm``: Cartesian, graph and
    distributed graph): the neighbor collectives send to each destination and receive from
    each source, in the order of those lists (a neighbor listed twice is two edges, matched
    in order; ``PROC_NULL``, a Cartesian edge off a non-periodic grid, sends and receives
    nothing)."""

    def _edges(self) -> tuple[list[int], list[int]]:
        """``(sources, destinations)``, ranks of this communicator."""
        raise NotImplementedError

    @property
    def degrees(self) -> tuple[int, int]:
        sources, dests = self._edges()
        return len(sources), len(dests)

    indegree = property(lambda self: self.degrees[0])
    outdegree = property(lambda self: self.degrees[1])
    inedges = property(lambda self: list(self._edges()[0]))
    outedges = property(lambda self: list(self._edges()[1]))
    inoutedges = property(lambda self: tuple(list(e) for e in self._edges()))

    def _exchange(self, parts: Sequence[Any], where: str) -> list[Any]:
        """``parts[i]`` to the i-th destination; one message from each source, in order."""
        c = self._c
        sources, dests = self._edges()
        if len(parts) != len(dests):
            raise ValueError(f"{where}: {len(parts)} items to send, the communicator has "
                             f"{len(dests)} destinations")
        seq = next(self._nbr_seq)
        send_keys, recv_keys = self._edge_keys(sources, dests)
        mine: dict[Any, Any] = {}  # edges to this rank itself, by their key
        for d, k, obj in zip(dests, send_keys, parts):
            if d == PROC_NULL:
                continue
            if d == c.rank:
                mine[k] = _private(obj)  # (a snapshot, as a send takes)
            else:
                c._send_to(d, ("nbr", c._ctx, seq, k), obj)
        return [None if s == PROC_NULL else mine.pop(k) if s == c.rank
                else c._recv_from(s, ("nbr", c._ctx, seq, k))
                for s, k in zip(sources, recv_keys)]

    @staticmethod
    def _edge_keys(sources: list[int], dests: list[int]) -> tuple[list[Any], list[Any]]:
        """What tells the edges between two ranks apart: their order (the k-th edge from a
        rank to another meets the other's k-th edge from it)."""
        def nth(ranks: list[int]) -> list[Any]:
            seen: Counter = Counter()
            keys = []
            for q in ranks:
                keys.append((q, seen[q]))
                seen[q] += 1
            return keys

        sent, got = nth(dests), nth(sources)
        return [k for _, k in sent], [k for _, k in got]

    def neighbor_allgather(self, sendobj: Any) -> list[Any]:
        """``sendobj`` to every destination; the sources' objects, in order (None from
        ``PROC_NULL``)."""
        return self._exchange([sendobj] * self.outdegree, "neighbor_allgather")

    def neighbor_alltoall(self, sendobj: Sequence[Any]) -> list[Any]:
        """``sendobj[i]`` to the i-th destination; the sources' objects, in order."""
        return self._exchange(list(sendobj), "neighbor_alltoall")

    def _into(self, blocks: list[np.ndarray], got: list[Any], where: str) -> None:
        for block, g in zip(blocks, got):
            if g is not None:  # (PROC_NULL leaves its block as it was)
                _copy_into(block, g, where)

    def Neighbor_allgather(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        flat, _ = _buffer(sendbuf, "Neighbor_allgather")
        out, _ = _buffer(recvbuf, "Neighbor_allgather", writable=True)
        self._into(_chunks(out, self.indegree, "Neighbor_allgather"),
                   self._exchange([flat] * self.outdegree, "Neighbor_allgather"),
                   "Neighbor_allgather")

    def Neighbor_alltoall(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        flat, _ = _buffer(sendbuf, "Neighbor_alltoall")
        out, _ = _buffer(recvbuf, "Neighbor_alltoall", writable=True)
        self._into(_chunks(out, self.indegree, "Neighbor_alltoall"),
                   self._exchange(_chunks(flat, self.outdegree, "Neighbor_alltoall"),
                                  "Neighbor_alltoall"), "Neighbor_alltoall")

    def Neighbor_allgatherv(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        flat, _ = _buffer(sendbuf, "Neighbor_allgatherv")
        self._into(_vblocks(recvbuf, self.indegree, "Neighbor_allgatherv", writable=True),
                   self._exchange([flat] * self.outdegree, "Neighbor_allgatherv"),
                   "Neighbor_allgatherv")

    def Neighbor_alltoallv(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        self._into(_vblocks(recvbuf, self.indegree, "Neighbor_alltoallv", writable=True),
                   self._exchange(_vblocks(sendbuf, self.outdegree, "Neighbor_alltoallv"),
                                  "Neighbor_alltoallv"), "Neighbor_alltoallv")


class Graphcomm(Topocomm):
    """A communicator with a graph topology (``Create_graph``): node ``i``'s neighbors
    are ``edges[index[i-1]:index[i]]``, both its sources and its destinations."""

    def __init__(self, base: _comm.Communicator, index: list[int], edges: list[int]):
        super().__init__(base)
        self._index, self._graph_edges = index, edges

    def Get_topology(self) -> int:  # noqa: N802
        return GRAPH

    def Get_topo(self) -> tuple[list[int], list[int]]:  # noqa: N802
        return list(self._index), list(self._graph_edges)

    topo = property(Get_topo)
    index = property(lambda self: list(self._index))
    edges = property(lambda self: list(self._graph_edges))

    def Get_dims(self) -> tuple[int, int]:  # noqa: N802
        return len(self._index), len(self._graph_edges)

    dims = property(Get_dims)
    nnodes = property(lambda self: len(self._index))
    nedges = property(lambda self: len(self._graph_edges))

    def Get_neighbors(self, rank: int) -> list[int]:  # noqa: N802
        r = self._check_peer(rank, "Get_neighbors")
        return self._graph_edges[self._index[r - 1] if r else 0:self._index[r]]

    def Get_neighbors_count(self, rank: int) -> int:  # noqa: N802
        return len(self.Get_neighbors(rank))

    neighbors = property(lambda self: self.Get_neighbors(self.Get_rank()))
    nneighbors = property(lambda self: len(self.neighbors))

    def _edges(self) -> tuple[list[int], list[int]]:
        mine = self.neighbors
        return mine, mine


class Distgraphcomm(Topocomm):
    """A communicator with a distributed graph topology (``Create_dist_graph_adjacent``,
    ``Create_dist_graph``): each rank knows its own sources and destinations."""

    def __init__(self, base: _comm.Communicator, sources: list[int], dests: list[int],
                 weights: tuple[list[int], list[int]] | None):
        super().__init__(base)
        self._sources, self._dests, self._weights = sources, dests, weights

    def Get_topology(self) -> int:  # noqa: N802
        return DIST_GRAPH

    def Get_dist_neighbors_count(self) -> tuple[int, int, bool]:  # noqa: N802
        return len(self._sources), len(self._dests), self._weights is not None

    def Get_dist_neighbors(self) -> tuple[list[int], list[int],  # noqa: N802
                                          tuple[list[int], list[int]] | None]:
        w = self._weights
        return (list(self._sources), list(self._dests),
                None if w is None else (list(w[0]), list(w[1])))

    def _edges(self) -> tuple[list[int], list[int]]:
        return self._sources, self._dests


def _ranks_list(ranks: Any, size: int, where: str) -> list[int]:
    out = [int(r) for r in ranks]
    bad = [r for r in out if not 0 <= r < size]
    if bad:
        raise ValueError(f"{where}: ranks {bad} out of range for a communicator of {size}")
    return out


def _weights(weights: Any, n: int, where: str) -> list[int] | None:
    if weights is None or weights is UNWEIGHTED:
        return None
    w = [int(x) for x in weights]
    if len(w) != n:
        raise ValueError(f"{where}: {len(w)} weights for {n} edges")
    return w


class Cartcomm(Topocomm):
    """A communicator with a Cartesian topology (``Create_cart``)."""

    @property
    def _cart(self) -> _comm.CartComm:
        return self._c  # type: ignore[return-value]

    def Get_topology(self) -> int:  # noqa: N802
        return CART

    def Get_dim(self) -> int:  # noqa: N802
        return len(self._cart.dims)

    ndim = dim = property(Get_dim)
    dims = property(lambda self: list(self._cart.dims))
    periods = property(lambda self: [bool(p) for p in self._cart.periods])
    coords = property(lambda self: list(self._cart.coords))

    def Get_topo(self) -> tuple[list[int], list[bool], list[int]]:  # noqa: N802
        return self.dims, self.periods, self.coords

    topo = property(Get_topo)

    def Get_coords(self, rank: int) -> list[int]:  # noqa: N802
        rank = self._check_peer(rank, "Get_coords")
        return list(self._cart.get_coords(rank))

    def Get_cart_rank(self, coords: Sequence[int]) -> int:  # noqa: N802
        return self._cart.get_cart_rank(list(coords))

    def Shift(self, direction: int, disp: int = 1) -> tuple[int, int]:  # noqa: N802
        """``(source, dest)`` of a shift; ``PROC_NULL`` past a non-periodic edge."""
        return self._cart.shift(direction, disp)

    def _edges(self) -> tuple[list[int], list[int]]:
        # per dimension, the neighbor below then the one above (MPI's order), both ways
        near = [r for d in range(len(self._cart.dims)) for r in self.Shift(d, 1)]
        return near, near

    @staticmethod
    def _edge_keys(sources: list[int], dests: list[int]) -> tuple[list[Any], list[Any]]:
        # by direction: what a rank sends upward arrives in the block of its upper neighbor
        # that comes from below, even where both neighbors are one rank (a periodic
        # dimension of one or two)
        n = len(dests) // 2
        return ([(d, way) for d in range(n) for way in "-+"],
                [(d, way) for d in range(n) for way in "+-"])

    def Sub(self, remain_dims: Sequence[bool]) -> Cartcomm:  # noqa: N802
        remain = list(remain_dims)
        if len(remain) != len(self._cart.dims):
            raise ValueError(f"Sub: remain_dims {remain} must have one entry per dimension of "
                             f"{self.dims}")
        return Cartcomm(self._cart.sub(remain))


def Compute_dims(nnodes: int, dims: int | Sequence[int]) -> list[int]:  # noqa: N802
    """A balanced grid of ``nnodes`` (MPI_Dims_create): zeros in ``dims`` are filled,
    largest first."""
    dims = [0] * dims if isinstance(dims, int) else [int(d) for d in dims]
    fixed = int(np.prod([d for d in dims if d > 0])) if any(d > 0 for d in dims) else 1
    free = [i for i, d in enumerate(dims) if d == 0]
    if nnodes % fixed:
        raise ValueError(f"Compute_dims: {nnodes} nodes do not fit fixed dims {dims}")
    left = nnodes // fixed
    if not free:
        if left != 1:
            raise ValueError(f"Compute_dims: dims {dims} do not multiply to {nnodes}")
        return dims
    factors: list[int] = []
    n, p = left, 2
    while p * p <= n:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    if n > 1:
        factors.append(n)
    out = [1] * len(free)
    for f in sorted(factors, reverse=True):
        out[out.index(min(out))] *= f
    for i, v in zip(free, sorted(out, reverse=True)):
        dims[i] = v
    return dims


# ------------------------------------------------------------------------------ one-sided
def _rma_ufunc(name: str) -> Callable:
    """The element-wise function of a predefined operation, for accumulates."""
    return _RMA_UFUNCS[name]


_RMA_UFUNCS: dict[str, Callable] = {
    "SUM": np.add, "PROD": np.multiply, "MIN": np.minimum, "MAX": np.maximum,
    "LAND": np.logical_and, "LOR": np.logical_or, "LXOR": np.logical_xor,
    "BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor,
}


def _rma_op(op: Any, where: str) -> str:
    """The name of an operation that an accumulate may use (MPI allows the predefined
    ones, ``REPLACE`` and ``NO_OP``)."""
    if not isinstance(op, Op) or (op.name not in _RMA_UFUNCS
                                  and op.name not in ("REPLACE", "NO_OP")):
        raise Exception(f"Win.{where}: op must be a predefined MPI.Op (MPI.SUM, MPI.MAX, "
                        f"MPI.REPLACE, MPI.NO_OP ...), got {op!r}", ERR_OP)
    return op.name


class _WinState:
    """A window's own state at one rank: its memory and the ranks' servers, and the access
    epochs this rank has open as an origin."""

    def __init__(self, comm: Comm, wid: tuple, memory: np.ndarray, disp_unit: int,
                 flavor: int, peers: list, keep: Any = None):
        self.comm = comm  # the window's own communicator (a Dup of the one it was made on)
        self.wid, self.memory, self.disp_unit, self.flavor = wid, memory, disp_unit, flavor
        self.client = _rma.Client([p[0] for p in peers],
                                  getattr(comm._c._t, "timeout_s", None))
        self.sizes = [p[1] for p in peers]
        self.units = [p[2] for p in peers]
        self.keep = keep  # what the memory lives in (a shared segment), kept while open
        self.fence = False  # an epoch opened by a fence (until a fence with MODE_NOSUCCEED)
        self.started: list[int] | None = None  # the targets of Start, until Complete
        self.locked: dict[int, bool] = {}  # target -> exclusive
        self.lock_all = False
        self.shared: list | None = None  # Allocate_shared: each rank's part of the segment
        self.name = ""


class Win:
    """An RMA window (mpi4py's ``MPI.Win``): memory that the ranks of a communicator put,
    get and accumulate into without the owner's part in each transfer.

    ``Win.Create(memory, disp_unit, comm=...)`` exposes an array of the program's;
    ``Win.Allocate(size, ...)`` and ``Win.Allocate_shared(size, ...)`` allocate the memory
    (``np.frombuffer(win, dtype)`` views it; with ``Allocate_shared`` the ranks of one
    machine map one segment, and ``Shared_query(rank)`` gives another rank's part for loads
    and stores). Synchronization: ``Fence``; ``Post``/``Start``/``Complete``/``Wait``;
    ``Lock``/``Unlock``, ``Lock_all``/``Unlock_all`` and ``Flush``. A get returns with its
    data; puts and accumulates go out without waiting and are done at their target by the
    next flush, unlock, fence or complete (see :mod:`rayflow.hpc.rma`), and a target makes
    progress without calling MPI.
    """

    __slots__ = ()  # (an instance is also a ctypes array of the window's bytes: _win_class)

    @classmethod
    def Create(cls, memory: Any, disp_unit: int = 1, info: Any = None,  # noqa: N802
               comm: Comm | None = None) -> Win:
        """A window over ``memory`` (a writable, C-contiguous numpy array; ``None`` or
        ``MPI.BOTTOM`` for none at this rank). Collective over ``comm`` (``COMM_SELF`` by
        default)."""
        if memory is None:
            backing: Any = bytearray()
        elif isinstance(memory, (list, tuple, np.ndarray)):  # an array or [array, type]
            backing = _buffer(memory, "Win.Create", writable=True)[0]
        elif isinstance(memory, bytearray):
            backing = memory
        else:
            raise TypeError(f"Win.Create: memory must be a writable numpy array, a bytearray "
                            f"or None, got {type(memory).__name__}")
        return cls._make(backing, disp_unit, comm, WIN_FLAVOR_CREATE, "Create")

    @classmethod
    def Allocate(cls, size: int, disp_unit: int = 1, info: Any = None,  # noqa: N802
                 comm: Comm | None = None) -> Win:
        """A window over ``size`` new bytes (zeroed) at this rank. Collective."""
        return cls._make(bytearray(_check_int("Win.Allocate", "size (bytes)", size)), disp_unit, comm,
                         WIN_FLAVOR_ALLOCATE, "Allocate")

    @classmethod
    def Allocate_shared(cls, size: int, disp_unit: int = 1, info: Any = None,  # noqa: N802
                        comm: Comm | None = None) -> Win:
        """As :meth:`Allocate`, the ranks' memory one shared segment, each rank's part
        after the parts of the ranks below it, which ``Shared_query`` hands out. The ranks
        of ``comm`` must share a machine (``comm.Split_type(MPI.COMM_TYPE_SHARED)`` gives
        such a communicator). Collective."""
        from rayflow.hpc.backends import shm

        comm = COMM_SELF if comm is None else comm
        c = comm._c
        size = _check_int("Win.Allocate_shared", "size (bytes)", size)
        parts = c.allgather((socket.gethostname(), size))
        if len({host for host, _ in parts}) > 1:
            raise Exception("Win.Allocate_shared: the ranks of the communicator are on more "
                            "than one machine; split it with Split_type(MPI.COMM_TYPE_SHARED)",
                            ERR_RMA_SHARED)
        total = sum(n for _, n in parts)
        seg = shm.Segment.create(shm.Segment.DATA + total, "rayflow-win") if c.rank == 0 \
            else None
        address = c.bcast(seg.fill([]) if seg is not None else None, 0)
        mm = seg.mapping if seg is not None else shm.Segment.map(address)
        data = memoryview(mm)[shm.Segment.DATA:shm.Segment.DATA + total]
        starts = list(itertools.accumulate((n for _, n in parts), initial=0))
        views = [data[starts[r]:starts[r] + n] for r, (_, n) in enumerate(parts)]
        c.barrier()  # every rank has mapped the segment: rank 0 may close it at Free
        win = cls._make(views[c.rank], disp_unit, comm, WIN_FLAVOR_SHARED, "Allocate_shared",
                        keep=(seg, mm))
        win._st.shared = views
        return win

    @classmethod
    def Create_dynamic(cls, info: Any = None, comm: Comm | None = None) -> Win:  # noqa: N802
        raise NotImplementedError("dynamic windows (Win.Create_dynamic, Attach, Detach) are "
                                  "not supported by rayflow's MPI")

    def Attach(self, memory: Any) -> None:  # noqa: N802
        self.Create_dynamic()

    def Detach(self, memory: Any) -> None:  # noqa: N802
        self.Create_dynamic()

    @classmethod
    def _make(cls, backing: Any, disp_unit: Any, comm: Comm | None, flavor: int,
              where: str, keep: Any = None) -> Win:
        comm = COMM_SELF if comm is None else comm
        if not isinstance(comm, Comm):
            raise TypeError(f"Win.{where}: comm must be an MPI communicator, got {comm!r}")
        disp_unit = _check_int(f"Win.{where}", "disp_unit", disp_unit, least=1)
        c = comm._c
        own = comm.Dup()  # the window's fences and frees, apart from the program's calls
        wid = (c._ctx, "win", next(comm._win_seq))
        win = _win_class(memoryview(backing).nbytes).from_buffer(backing)  # type: ignore[attr-defined]
        memory = np.frombuffer(win, np.uint8)
        server = _rma.server(_rma_ufunc)
        server.register((wid, c.rank), memory, disp_unit)
        # (the allgather also tells every rank that every window is registered)
        peers = c.allgather((server.address, memory.size, disp_unit))
        win._s = _WinState(own, wid, memory, disp_unit, flavor, peers, keep)
        return win

    @property
    def _st(self) -> _WinState:
        st = getattr(self, "_s", None)
        if st is None:
            raise Exception("this window was freed (Win.Free)", ERR_WIN)
        return st

    def __bool__(self) -> bool:
        return getattr(self, "_s", None) is not None

    def __repr__(self) -> str:
        st = getattr(self, "_s", None)
        return "<MPI.WIN_NULL>" if st is None else f"<MPI.Win of {st.memory.size} bytes>"

    def Free(self) -> None:  # noqa: N802
        """Release the window once every rank has called Free (collective)."""
        st = self._st
        self._flush()
        st.comm.Barrier()  # no rank accesses it any more
        _rma.server(_rma_ufunc).unregister((st.wid, st.comm._c.rank))
        if st.keep is not None and st.keep[0] is not None:
            st.keep[0].close()  # the shared segment's descriptor (mappings live on)
        del self._s  # type: ignore[attr-defined]

    free = Free

    # ------------------------------------------------------------ what it is
    def tomemory(self) -> memoryview:
        """This rank's window memory, as bytes (``np.frombuffer(win.tomemory(), dtype)``)."""
        self._st  # noqa: B018 - a freed window has none
        return memoryview(self).cast("B")  # type: ignore[arg-type]  # (a ctypes array too)

    def Shared_query(self, rank: int) -> tuple[memoryview, int]:  # noqa: N802
        """``(memory, disp_unit)`` of ``rank``'s part of an ``Allocate_shared`` window
        (``PROC_NULL``: the first part that is not empty)."""
        st = self._st
        if st.shared is None:
            raise Exception("Win.Shared_query: the window was not made by "
                            "Win.Allocate_shared", ERR_RMA_FLAVOR)
        if rank == PROC_NULL:
            rank = next((r for r, n in enumerate(st.sizes) if n), 0)
        return st.shared[st.comm._check_peer(rank, "Shared_query")], st.units[rank]

    def Get_group(self) -> Group:  # noqa: N802
        return self._st.comm.Get_group()

    group = property(Get_group)

    def Get_attr(self, keyval: int) -> int | None:  # noqa: N802
        st = self._st
        return {WIN_BASE: ctypes.addressof(self), WIN_SIZE: st.memory.size,  # type: ignore[arg-type]
                WIN_DISP_UNIT: st.disp_unit, WIN_CREATE_FLAVOR: st.flavor,
                WIN_MODEL: WIN_UNIFIED}.get(keyval)

    @property
    def attrs(self) -> tuple[int, int, int]:
        """``(base address, size in bytes, disp_unit)``."""
        st = self._st
        return ctypes.addressof(self), st.memory.size, st.disp_unit  # type: ignore[arg-type]

    @property
    def flavor(self) -> int:
        return self._st.flavor

    @property
    def model(self) -> int:
        return WIN_UNIFIED

    def Set_name(self, name: str) -> None:  # noqa: N802
        self._st.name = name

    def Get_name(self) -> str:  # noqa: N802
        return self._st.name

    name = property(Get_name, Set_name)

    # ------------------------------------------------------------ transfers
    def _target(self, target_rank: int, where: str) -> int:
        """The target's rank, checked to lie in an access epoch of this rank."""
        st = self._st
        rank = st.comm._check_peer(target_rank, f"Win.{where} target")
        if rank == PROC_NULL:
            return rank
        if not (st.fence or st.lock_all or rank in st.locked
                or (st.started is not None and rank in st.started)):
            raise Exception(f"Win.{where}: rank {rank} is in no access epoch of this rank "
                            f"(call Win.Fence, Win.Start or Win.Lock first)", ERR_RMA_SYNC)
        return rank

    def _call(self, rank: int, request: tuple, wait: bool = True) -> Any:
        """``request`` to ``rank``'s server: its reply, or (``wait=False``: a put or an
        accumulate) sent on, its reply read at the next flush or synchronization."""
        st = self._st
        full = (request[0], (st.wid, rank), st.comm._c.rank, *request[1:])
        try:
            return st.client.call(rank, full) if wait else st.client.post(rank, full)
        except _rma.RMAError as exc:
            raise Exception(str(exc), exc.error_class) from None

    def _flush(self, rank: int | None = None) -> None:
        """Wait until this rank's puts and accumulates to ``rank`` (None: every rank) are
        done at their targets."""
        try:
            self._st.client.flush(rank)
        except _rma.RMAError as exc:
            raise Exception(str(exc), exc.error_class) from None

    @staticmethod
    def _where_to(target: Any, count: int, dtype: Datatype, where: str
                  ) -> tuple[int, int, Datatype]:
        """``(displacement, count, datatype)`` at the target, from ``target`` as mpi4py
        reads it: None, a displacement, or ``(disp[, count[, datatype]])``; what is not
        given is the origin's."""
        disp = 0
        if target is None:
            pass
        elif isinstance(target, (int, np.integer)) and not isinstance(target, bool):
            disp = int(target)
        elif isinstance(target, (list, tuple)) and len(target) <= 3:
            if len(target) >= 1:
                disp = int(target[0])
            if len(target) >= 2:
                count = int(target[1])
            if len(target) == 3:
                if not isinstance(target[2], Datatype):
                    raise TypeError(f"Win.{where}: the target's datatype must be an MPI "
                                    f"datatype, got {target[2]!r}")
                if not target[2].is_predefined:
                    raise NotImplementedError(f"Win.{where}: derived target datatypes "
                                              f"({target[2]!r}) are not supported by "
                                              f"rayflow's MPI")
                dtype = target[2]
        else:
            raise ValueError(f"Win.{where}: target must be a displacement or (disp, count, "
                             f"datatype), got {target!r}")
        return disp, count, dtype

    def _transfer(self, kind: str, origin: Any, target_rank: int, target: Any,
                  op: str | None = None, result: Any = None) -> None:
        where = {"put": "Put", "get": "Get", "acc": "Accumulate",
                 "get_acc": "Get_accumulate"}[kind]
        rank = self._target(target_rank, where)
        flat, dtype = _buffer(origin, where, writable=kind == "get")
        if rank == PROC_NULL:
            return
        disp, count, tdtype = self._where_to(target, flat.size, dtype, where)
        if tdtype.dtype != dtype.dtype:
            raise Exception(f"Win.{where}: the origin's {dtype} and the target's {tdtype} "
                            f"differ", ERR_TYPE)
        if kind == "get":
            if count > flat.size:
                raise Exception(f"Win.{where}: {count} items of the target do not fit the "
                                f"origin's {flat.size}", ERR_TRUNCATE)
            got = self._call(rank, ("data", ("get", disp, dtype.dtype, count)))
            flat[:count] = got
            return
        if kind == "get_acc":
            rflat, rtype = _buffer(result, where, writable=True)
            if rtype.dtype != dtype.dtype or rflat.size < count or flat.size < count:
                raise Exception(f"Win.{where}: the origin and result buffers must hold "
                                f"{count} items of {dtype}", ERR_TYPE)
            rflat[:count] = self._call(rank, ("data", ("get_acc", disp, dtype.dtype, count,
                                                       flat[:count].copy(), op)))
            return
        if flat.size > count:
            raise Exception(f"Win.{where}: {flat.size} items of the origin do not fit the "
                            f"target's {count}", ERR_TRUNCATE)
        st = self._st
        try:  # here, not at the flush that reads the target's answer
            _rma.check_range(st.sizes[rank], st.units[rank], disp, dtype.dtype, flat.size,
                             kind)
        except _rma.RMAError as exc:
            raise Exception(str(exc), exc.error_class) from None
        request = ("put", disp, dtype.dtype, flat.size, flat.copy()) if kind == "put" else \
            ("acc", disp, dtype.dtype, flat.size, flat.copy(), op)
        self._call(rank, ("data", request), wait=False)

    def Put(self, origin: Any, target_rank: int, target: Any = None) -> None:  # noqa: N802
        self._transfer("put", origin, target_rank, target)

    def Get(self, origin: Any, target_rank: int, target: Any = None) -> None:  # noqa: N802
        self._transfer("get", origin, target_rank, target)

    def Accumulate(self, origin: Any, target_rank: int, target: Any = None,  # noqa: N802
                   op: Op = SUM) -> None:
        self._transfer("acc", origin, target_rank, target, _rma_op(op, "Accumulate"))

    def Get_accumulate(self, origin: Any, result: Any, target_rank: int,  # noqa: N802
                       target: Any = None, op: Op = SUM) -> None:
        self._transfer("get_acc", origin, target_rank, target,
                       _rma_op(op, "Get_accumulate"), result)

    def Fetch_and_op(self, origin: Any, result: Any, target_rank: int,  # noqa: N802
                     target_disp: int = 0, op: Op = SUM) -> None:
        """``result`` gets the target's item at ``target_disp``, which becomes ``op`` of
        it and ``origin``'s one item (atomically)."""
        self._single("Fetch_and_op", (origin, result), target_rank)
        self._transfer("get_acc", origin, target_rank, (target_disp, 1),
                       _rma_op(op, "Fetch_and_op"), result)

    def Compare_and_swap(self, origin: Any, compare: Any, result: Any,  # noqa: N802
                         target_rank: int, target_disp: int = 0) -> None:
        """``result`` gets the target's item at ``target_disp``, replaced by ``origin``'s
        where it equals ``compare``'s (atomically)."""
        where = "Compare_and_swap"
        (o, dtype), (cmp, ctype), (r, rtype) = self._single(where, (origin, compare, result),
                                                           target_rank)
        rank = self._target(target_rank, where)
        if rank == PROC_NULL:
            return
        if not dtype.dtype == ctype.dtype == rtype.dtype:
            raise Exception(f"Win.{where}: origin, compare and result must be of one "
                            f"datatype", ERR_TYPE)
        r[:1] = self._call(rank, ("data", ("cas", int(target_disp), dtype.dtype, o[0],
                                            cmp[0])))

    @staticmethod
    def _single(where: str, bufs: tuple, target_rank: int) -> list:
        out = []
        for i, b in enumerate(bufs):
            flat, dtype = _buffer(b, where, writable=i == len(bufs) - 1)
            if flat.size != 1 and target_rank != PROC_NULL:
                raise ValueError(f"Win.{where}: expecting a single element, got {flat.size}")
            out.append((flat, dtype))
        return out

    def Rput(self, origin: Any, target_rank: int, target: Any = None) -> Request:  # noqa: N802
        return _completed(self.Put, origin, target_rank, target)

    def Rget(self, origin: Any, target_rank: int, target: Any = None) -> Request:  # noqa: N802
        return _completed(self.Get, origin, target_rank, target)

    def Raccumulate(self, origin: Any, target_rank: int, target: Any = None,  # noqa: N802
                    op: Op = SUM) -> Request:
        return _completed(self.Accumulate, origin, target_rank, target, op)

    def Rget_accumulate(self, origin: Any, result: Any, target_rank: int,  # noqa: N802
                        target: Any = None, op: Op = SUM) -> Request:
        return _completed(self.Get_accumulate, origin, result, target_rank, target, op)

    # ------------------------------------------------------------ synchronization
    def Fence(self, assertion: int = 0) -> None:  # noqa: N802
        """End the epoch of the last fence and open the next (``MPI.MODE_NOSUCCEED``: none).
        Collective."""
        st = self._st
        self._flush()
        st.comm.Barrier()
        st.fence = not assertion & MODE_NOSUCCEED

    def _ranks_of(self, group: Group, where: str) -> list[int]:
        members = self._st.comm._c._members
        if not isinstance(group, Group):
            raise TypeError(f"Win.{where}: an MPI.Group, got {group!r}")
        outside = [m for m in group._members if m not in members]
        if outside:
            raise ValueError(f"Win.{where}: the group has processes outside the window's "
                             f"communicator (world ranks {outside})")
        return [members.index(m) for m in group._members]

    def Post(self, group: Group, assertion: int = 0) -> None:  # noqa: N802
        """Expose this rank's window to the origins of ``group`` (until ``Wait``)."""
        me = self._st.comm._c.rank
        self._call(me, ("post", self._ranks_of(group, "Post")))

    def Start(self, group: Group, assertion: int = 0) -> None:  # noqa: N802
        """Access the windows of ``group``'s ranks, once each has posted to this rank."""
        st = self._st
        if st.started is not None:
            raise Exception("Win.Start: an access epoch is open (Win.Complete first)",
                            ERR_RMA_SYNC)
        targets = self._ranks_of(group, "Start")
        for t in targets:
            self._call(t, ("start",))
        st.started = targets

    def Complete(self) -> None:  # noqa: N802
        st = self._st
        if st.started is None:
            raise Exception("Win.Complete without Win.Start", ERR_RMA_SYNC)
        for t in st.started:
            self._call(t, ("complete",))
        st.started = None

    def Wait(self) -> None:  # noqa: N802
        """Wait until every origin of this rank's ``Post`` has called ``Complete``."""
        self._call(self._st.comm._c.rank, ("wait",))

    def Test(self) -> bool:  # noqa: N802
        return bool(self._call(self._st.comm._c.rank, ("test",)))

    def Lock(self, rank: int, lock_type: int = LOCK_EXCLUSIVE,  # noqa: N802
             assertion: int = 0) -> None:
        """Lock ``rank``'s window (``LOCK_EXCLUSIVE`` or ``LOCK_SHARED``), waiting until no
        other rank's lock conflicts."""
        st = self._st
        if lock_type not in (LOCK_EXCLUSIVE, LOCK_SHARED):
            raise ValueError(f"Win.Lock: lock_type must be MPI.LOCK_EXCLUSIVE or "
                             f"MPI.LOCK_SHARED, got {lock_type!r}")
        r = st.comm._check_peer(rank, "Win.Lock target")
        if r == PROC_NULL:
            return
        self._call(r, ("lock", lock_type == LOCK_EXCLUSIVE))
        st.locked[r] = lock_type == LOCK_EXCLUSIVE

    def Unlock(self, rank: int) -> None:  # noqa: N802
        st = self._st
        r = st.comm._check_peer(rank, "Win.Unlock target")
        if r == PROC_NULL:
            return
        self._call(r, ("unlock",))
        st.locked.pop(r, None)

    def Lock_all(self, assertion: int = 0) -> None:  # noqa: N802
        """A shared lock on every rank's window."""
        st = self._st
        for r in range(st.comm._c.size):
            self._call(r, ("lock", False))
        st.lock_all = True

    def Unlock_all(self) -> None:  # noqa: N802
        st = self._st
        if not st.lock_all:
            raise Exception("Win.Unlock_all without Win.Lock_all", ERR_RMA_SYNC)
        for r in range(st.comm._c.size):
            self._call(r, ("unlock",))
        st.lock_all = False

    def Flush(self, rank: int) -> None:  # noqa: N802
        """Wait until this rank's puts and accumulates to ``rank`` are done there."""
        r = self._st.comm._check_peer(rank, "Win.Flush target")
        if r != PROC_NULL:
            self._flush(r)

    def Flush_all(self) -> None:  # noqa: N802
        self._flush()

    # (the origin's buffer is free once a put returns: it was copied; local completion is
    # completion at the target here)
    Flush_local = Flush
    Flush_local_all = Flush_all
    Sync = Flush_all

    def Set_errhandler(self, errhandler: Errhandler) -> None:  # noqa: N802
        self._st.comm.Set_errhandler(errhandler)

    def Get_errhandler(self) -> Errhandler:  # noqa: N802
        return self._st.comm.Get_errhandler()


@functools.lru_cache(maxsize=256)  # (a window keeps its class: an evicted one lives on)
def _win_class(nbytes: int) -> type:
    """The class of a window of ``nbytes``: :class:`Win`, and a ctypes array of its bytes
    over the window's memory, so that ``np.frombuffer(win, dtype)`` views it (as mpi4py's
    buffer interface of a window does) on any Python."""
    return type("Win", (Win, ctypes.c_char * nbytes), {"__module__": __name__})


WIN_NULL = None


# ------------------------------------------------------------------------------ MPI-IO
def _file_error(exc: OSError, path: str, where: str) -> Exception:
    """An OS error of a file call as MPI's error class."""
    code = {errno.ENOENT: ERR_NO_SUCH_FILE, errno.EEXIST: ERR_FILE_EXISTS,
            errno.EACCES: ERR_ACCESS, errno.EPERM: ERR_ACCESS,
            errno.EROFS: ERR_READ_ONLY}.get(exc.errno or 0, ERR_IO)
    return Exception(f"File.{where} {path!r}: {exc.strerror}", code)


class File:
    """A file that the ranks of a communicator open together and read and write at their
    own offsets (mpi4py's ``MPI.File``, MPI-IO). Every rank reaches the file at the path it
    was opened by: on one machine any path does, on a cluster the path must be on a file
    system that every node mounts.

    A view (``Set_view(disp, etype, filetype)``) says which bytes of the file a rank sees:
    from byte ``disp`` on, the filetype's blocks, tiled by its extent (``Create_vector``,
    ``Create_subarray`` ...); offsets and the file pointer count etypes of the view. Reads
    and writes go straight to the file (``os.pread``/``os.pwrite``), so the collective ones
    (``Write_at_all`` ...) are the independent ones called by every rank, and a write is in
    the file once it returns (``Sync`` flushes it to the disk)."""

    def __init__(self, comm: Comm, path: str, fd: int, amode: int):
        self._comm, self._path, self._fd, self._amode = comm, path, fd, amode
        self._disp, self._etype, self._filetype = 0, _BY_NAME["BYTE"], _BY_NAME["BYTE"]
        self._pos = 0  # the individual file pointer, in etypes of the view
        self._ptr: Win | None = None  # the shared one (see Open)
        self._atomic = False
        if amode & MODE_APPEND:
            self._pos = os.fstat(fd).st_size

    @classmethod
    def Open(cls, comm: Comm, filename: Any, amode: int = MODE_RDONLY,  # noqa: N802
             info: Any = None) -> File:
        """Open ``filename`` on every rank of ``comm`` (collective). ``amode``: exactly one
        of ``MODE_RDONLY``, ``MODE_WRONLY``, ``MODE_RDWR``, with ``MODE_CREATE``,
        ``MODE_EXCL``, ``MODE_APPEND``, ``MODE_DELETE_ON_CLOSE`` (``MODE_UNIQUE_OPEN``,
        ``MODE_SEQUENTIAL`` accepted)."""
        if not isinstance(comm, Comm):
            raise TypeError(f"File.Open: comm must be an MPI communicator, got {comm!r}")
        path = os.fspath(filename)
        access = [m for m in (MODE_RDONLY, MODE_WRONLY, MODE_RDWR) if amode & m]
        known = (MODE_RDONLY | MODE_WRONLY | MODE_RDWR | MODE_CREATE | MODE_EXCL | MODE_APPEND
                 | MODE_DELETE_ON_CLOSE | MODE_UNIQUE_OPEN | MODE_SEQUENTIAL)
        if len(access) != 1 or amode & ~known or (
                amode & MODE_RDONLY and amode & (MODE_CREATE | MODE_EXCL)):
            raise Exception(f"File.Open {path!r}: amode {amode} must hold exactly one of "
                            f"MODE_RDONLY, MODE_WRONLY and MODE_RDWR (MODE_RDONLY without "
                            f"MODE_CREATE and MODE_EXCL)", ERR_AMODE)
        flags = {MODE_RDONLY: os.O_RDONLY, MODE_WRONLY: os.O_WRONLY,
                 MODE_RDWR: os.O_RDWR}[access[0]] | getattr(os, "O_CLOEXEC", 0)
        c = comm._c
        # rank 0 creates it (once, for MODE_EXCL); the others open what it made
        first = flags | (os.O_CREAT if amode & MODE_CREATE else 0) | (
            os.O_EXCL if amode & MODE_EXCL else 0)
        fd, error = -1, None
        if c.rank == 0:
            try:
                fd = os.open(path, first, 0o666)
            except OSError as exc:
                error = _file_error(exc, path, "Open")
        error = c.bcast(error, 0)
        if error is None and c.rank != 0:
            try:
                fd = os.open(path, flags)
            except OSError as exc:
                error = _file_error(exc, path, "Open")
        errors = c.allgather(error)  # one rank failing fails the open everywhere
        failed = next((e for e in errors if e is not None), None)
        if failed is not None:
            if fd >= 0:
                os.close(fd)
            raise failed
        f = cls(comm.Dup(), path, fd, amode)
        # the shared file pointer: a counter in a window at rank 0, in an epoch that stays
        # open while the file does (one request per move of it)
        f._ptr = Win.Allocate(8 if f._comm.Get_rank() == 0 else 0, disp_unit=8, comm=f._comm)
        if f._comm.Get_rank() == 0:
            np.frombuffer(f._ptr.tomemory(), np.int64)[0] = f._pos  # (the end with MODE_APPEND)
        f._ptr.Lock_all()
        f._comm.Barrier()  # (every rank sees the counter set)
        return f

    @classmethod
    def Delete(cls, filename: Any, info: Any = None) -> None:  # noqa: N802
        path = os.fspath(filename)
        try:
            os.unlink(path)
        except OSError as exc:
            raise _file_error(exc, path, "Delete") from None

    @property
    def _f(self) -> int:
        if self._fd < 0:
            raise Exception(f"File {self._path!r} is closed", ERR_FILE)
        return self._fd

    def __bool__(self) -> bool:
        return self._fd >= 0

    def __repr__(self) -> str:
        return f"<MPI.File {self._path!r}{'' if self._fd >= 0 else ' (closed)'}>"

    def Close(self) -> None:  # noqa: N802
        """Close it on every rank (collective); ``MODE_DELETE_ON_CLOSE`` deletes it then."""
        fd = self._f
        if self._ptr is not None:
            self._ptr.Unlock_all()
            self._ptr.Free()  # (a barrier: every rank's writes are in)
            self._ptr = None
        else:
            self._comm.Barrier()  # every rank's writes are in
        os.close(fd)
        self._fd = -1
        if self._amode & MODE_DELETE_ON_CLOSE:
            self._on_root(lambda: os.unlink(self._path), "Close")

    def Get_size(self) -> int:  # noqa: N802
        return os.fstat(self._f).st_size

    size = property(Get_size)

    def _on_root(self, fn: Callable[[], Any], where: str) -> None:
        """Collective: ``fn()`` at rank 0 once every rank is here; what it raised is raised
        on every rank (so none waits for a rank that failed)."""
        self._comm.Barrier()
        outcome: builtins.Exception | None = None
        if self._comm.Get_rank() == 0:
            try:
                fn()
            except OSError as exc:
                outcome = _file_error(exc, self._path, where)
            except builtins.Exception as exc:  # noqa: BLE001 - raised on every rank below
                outcome = exc
        outcome = self._comm._c.bcast(outcome, 0)
        if outcome is not None:
            raise outcome

    def Set_size(self, size: int) -> None:  # noqa: N802
        """Truncate or extend it to ``size`` bytes (collective)."""
        fd = self._f
        self._on_root(lambda: os.ftruncate(fd, int(size)), "Set_size")

    def Preallocate(self, size: int) -> None:  # noqa: N802
        fd = self._f

        def grow() -> None:
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, int(size))
        self._on_root(grow, "Preallocate")

    def Get_amode(self) -> int:  # noqa: N802
        return self._amode

    amode = property(Get_amode)

    def Get_group(self) -> Group:  # noqa: N802
        return self._comm.Get_group()

    group = property(Get_group)

    def Sync(self) -> None:  # noqa: N802
        os.fsync(self._f)

    def Set_atomicity(self, flag: bool) -> None:  # noqa: N802
        self._atomic = bool(flag)  # (each call is one pwrite: atomic enough for a view's block)

    def Get_atomicity(self) -> bool:  # noqa: N802
        return self._atomic

    # ------------------------------------------------------------ views
    def Set_view(self, disp: int = 0, etype: Datatype | None = None,  # noqa: N802
                 filetype: Datatype | None = None, datarep: str = "native",
                 info: Any = None) -> None:
        """See from byte ``disp`` on, through ``filetype`` (tiled by its extent), counting in
        ``etype`` items (``MPI.BYTE`` both, by default); the file pointer goes to 0."""
        self._f  # noqa: B018
        etype = _BY_NAME["BYTE"] if etype is None else etype
        filetype = etype if filetype is None else filetype
        if not isinstance(etype, Datatype) or not isinstance(filetype, Datatype):
            raise TypeError("File.Set_view: etype and filetype must be MPI datatypes")
        for t in (etype, filetype):
            if not t._committed:
                raise Exception(f"File.Set_view: {t!r} is not committed (call its Commit() "
                                f"first)", ERR_TYPE)
        if datarep != "native":
            raise NotImplementedError(f"File.Set_view: data representation {datarep!r} is not "
                                      f"supported by rayflow's MPI ('native' is)")
        if disp < 0 or filetype.Get_size() % etype.Get_size():
            raise Exception(f"File.Set_view: displacement {disp} must be >= 0 and the "
                            f"filetype ({filetype!r}) whole etypes ({etype!r})", ERR_ARG)
        self._disp, self._etype, self._filetype, self._pos = int(disp), etype, filetype, 0
        self._set_shared(0, SEEK_SET)  # (collective, as Set_view is)

    def Get_view(self) -> tuple[int, Datatype, Datatype]:  # noqa: N802
        return self._disp, self._etype, self._filetype

    def _ranges(self, offset: int, nbytes: int) -> list[tuple[int, int]]:
        """The ``(file byte, length)`` runs of ``nbytes`` bytes of the view from etype
        ``offset`` on."""
        ft = self._filetype
        blocks, extent, per_tile = ft._layout(), ft._extent, ft.Get_size()
        if per_tile == 0:
            raise Exception("File: the view's filetype holds no data", ERR_ARG)
        pos = offset * self._etype.Get_size()  # bytes of the view before the first one
        out: list[tuple[int, int]] = []
        while nbytes > 0:
            tile, within = divmod(pos, per_tile)
            for off, n in blocks:
                if within >= n:
                    within -= n
                    continue
                take = min(n - within, nbytes)
                start = self._disp + tile * extent + off + within
                if out and out[-1][0] + out[-1][1] == start:
                    out[-1] = (out[-1][0], out[-1][1] + take)
                else:
                    out.append((start, take))
                pos, nbytes, within = pos + take, nbytes - take, 0
                if nbytes == 0:
                    break
        return out

    def Get_byte_offset(self, offset: int) -> int:  # noqa: N802
        """The file byte at etype ``offset`` of the view."""
        runs = self._ranges(int(offset), 1)
        return runs[0][0]

    # ------------------------------------------------------------ data
    def _items(self, buf: Any, where: str, writable: bool) -> np.ndarray:
        flat, dtype = _buffer(buf, f"File.{where}", writable=writable)
        if flat.nbytes % self._etype.Get_size():
            raise Exception(f"File.{where}: {flat.nbytes} bytes are not whole etypes of the "
                            f"view ({self._etype!r})", ERR_ARG)
        return flat

    def _write(self, offset: int, buf: Any, where: str) -> int:
        fd = self._f
        if not self._amode & (MODE_WRONLY | MODE_RDWR):
            raise Exception(f"File.{where}: {self._path!r} was opened read-only", ERR_READ_ONLY)
        data = self._items(buf, where, False).data.cast("B")
        done = 0
        for start, n in self._ranges(offset, data.nbytes):
            os.pwrite(fd, data[done:done + n], start)
            done += n
        return data.nbytes // self._etype.Get_size()

    def _read(self, offset: int, buf: Any, where: str, status: Status | None) -> int:
        fd = self._f
        if self._amode & MODE_WRONLY:
            raise Exception(f"File.{where}: {self._path!r} was opened write-only", ERR_ACCESS)
        data = self._items(buf, where, True).data.cast("B")
        done = 0
        for start, n in self._ranges(offset, data.nbytes):
            got = os.preadv(fd, [data[done:done + n]], start)
            done += got
            if got < n:  # the end of the file
                break
        if status is not None:
            status.source, status.tag, status._nbytes, status._pickled = (
                PROC_NULL, ANY_TAG, done, False)
        return done // self._etype.Get_size()

    def Write_at(self, offset: int, buf: Any, status: Status | None = None) -> None:  # noqa: N802
        self._write(int(offset), buf, "Write_at")

    def Read_at(self, offset: int, buf: Any, status: Status | None = None) -> None:  # noqa: N802
        self._read(int(offset), buf, "Read_at", status)

    def Write(self, buf: Any, status: Status | None = None) -> None:  # noqa: N802
        self._pos += self._write(self._pos, buf, "Write")

    def Read(self, buf: Any, status: Status | None = None) -> None:  # noqa: N802
        self._pos += self._read(self._pos, buf, "Read", status)

    # the collective forms: every rank calls them; each rank's part goes straight to the file
    Write_at_all, Read_at_all = Write_at, Read_at
    Write_all, Read_all = Write, Read

    def Iwrite_at(self, offset: int, buf: Any) -> Request:  # noqa: N802
        return _completed(self.Write_at, offset, buf)

    def Iread_at(self, offset: int, buf: Any) -> Request:  # noqa: N802
        return _completed(self.Read_at, offset, buf)

    def Iwrite(self, buf: Any) -> Request:  # noqa: N802
        return _completed(self.Write, buf)

    def Iread(self, buf: Any) -> Request:  # noqa: N802
        return _completed(self.Read, buf)

    Iwrite_at_all, Iread_at_all, Iwrite_all, Iread_all = Iwrite_at, Iread_at, Iwrite, Iread

    def Seek(self, offset: int, whence: int = SEEK_SET) -> None:  # noqa: N802
        """Move the individual file pointer (etypes of the view)."""
        self._pos = self._whence(offset, whence, self._pos, "Seek")

    def _whence(self, offset: int, whence: int, now: int, where: str) -> int:
        """Where a seek from ``now`` by ``offset`` (``SEEK_SET``, ``SEEK_CUR``, ``SEEK_END``)
        lands, in etypes of the view."""
        if whence not in (SEEK_SET, SEEK_CUR, SEEK_END):
            raise ValueError(f"File.{where}: whence must be MPI.SEEK_SET, SEEK_CUR or "
                             f"SEEK_END, got {whence!r}")
        pos = int(offset) + (0 if whence == SEEK_SET else now if whence == SEEK_CUR
                             else self._end_etypes())
        if pos < 0:
            raise Exception(f"File.{where}: position {pos} is before the view's start",
                            ERR_ARG)
        return pos

    def Get_position(self) -> int:  # noqa: N802
        return self._pos

    def _end_etypes(self) -> int:
        """The etypes of the view up to the file's end."""
        end = self.Get_size() - self._disp
        ft = self._filetype
        tiles, rest = divmod(max(end, 0), ft._extent or 1)
        seen = sum(max(0, min(n, rest - off)) for off, n in ft._layout())
        return (tiles * ft.Get_size() + seen) // self._etype.Get_size()

    # ------------------------------------------------------------ the shared file pointer
    def _take(self, n: int) -> int:
        """Move the shared file pointer ``n`` etypes on; where it was (atomically)."""
        ptr, old = self._ptr, np.zeros(1, np.int64)
        assert ptr is not None  # (an open file has one)
        ptr.Fetch_and_op(np.array([n], np.int64), old, 0, 0, op=SUM)
        return int(old[0])

    def _set_shared(self, offset: int, whence: int) -> None:
        """Collective: rank 0 moves the shared file pointer (as :meth:`Seek` does the
        individual one)."""
        self._f  # noqa: B018

        def move() -> None:
            new = self._whence(offset, whence, self.Get_position_shared(), "Seek_shared")
            assert self._ptr is not None
            self._ptr.Put(np.array([new], np.int64), 0)
            self._ptr.Flush(0)  # (done before the others look)
        self._on_root(move, "Seek_shared")

    def _etypes(self, buf: Any, where: str) -> int:
        return self._items(buf, where, False).nbytes // self._etype.Get_size()

    def Write_shared(self, buf: Any, status: Status | None = None) -> None:  # noqa: N802
        """Write at the shared file pointer, which moves past it (ranks in any order)."""
        self._write(self._take(self._etypes(buf, "Write_shared")), buf, "Write_shared")

    def Read_shared(self, buf: Any, status: Status | None = None) -> None:  # noqa: N802
        self._read(self._take(self._etypes(buf, "Read_shared")), buf, "Read_shared", status)

    def _ordered(self, buf: Any, where: str) -> int:
        """Collective: where this rank's part starts, the parts in rank order from the
        shared file pointer on (which moves past them all)."""
        n = self._etypes(buf, where)
        c = self._comm._c
        sizes = c.allgather(n)
        base = c.bcast(self._take(sum(sizes)) if c.rank == 0 else None, 0)
        return base + sum(sizes[:c.rank])

    def Write_ordered(self, buf: Any, status: Status | None = None) -> None:  # noqa: N802
        """Collective: the ranks' buffers one after the other, in rank order, at the shared
        file pointer."""
        self._write(self._ordered(buf, "Write_ordered"), buf, "Write_ordered")

    def Read_ordered(self, buf: Any, status: Status | None = None) -> None:  # noqa: N802
        self._read(self._ordered(buf, "Read_ordered"), buf, "Read_ordered", status)

    def Seek_shared(self, offset: int, whence: int = SEEK_SET) -> None:  # noqa: N802
        """Collective: move the shared file pointer (etypes of the view)."""
        self._set_shared(offset, whence)

    def Get_position_shared(self) -> int:  # noqa: N802
        ptr, now = self._ptr, np.zeros(1, np.int64)
        assert ptr is not None
        ptr.Get_accumulate(np.zeros(1, np.int64), now, 0, op=NO_OP)
        return int(now[0])

    def Iwrite_shared(self, buf: Any) -> Request:  # noqa: N802
        return _completed(self.Write_shared, buf)

    def Iread_shared(self, buf: Any) -> Request:  # noqa: N802
        return _completed(self.Read_shared, buf)

    def Write_ordered_begin(self, buf: Any) -> None:  # noqa: N802
        self.Write_ordered(buf)

    def Read_ordered_begin(self, buf: Any) -> None:  # noqa: N802
        self.Read_ordered(buf)

    # split collectives: the transfer at the begin, nothing left for the end
    def Write_at_all_begin(self, offset: int, buf: Any) -> None:  # noqa: N802
        self.Write_at(offset, buf)

    def Read_at_all_begin(self, offset: int, buf: Any) -> None:  # noqa: N802
        self.Read_at(offset, buf)

    def Write_all_begin(self, buf: Any) -> None:  # noqa: N802
        self.Write(buf)

    def Read_all_begin(self, buf: Any) -> None:  # noqa: N802
        self.Read(buf)

    def _end(self, buf: Any, status: Status | None = None) -> None:
        self._f  # noqa: B018

    Write_at_all_end = Read_at_all_end = Write_all_end = Read_all_end = _end
    Write_ordered_end = Read_ordered_end = _end

    def Get_type_extent(self, datatype: Datatype) -> int:  # noqa: N802
        return datatype.extent

    def Set_errhandler(self, errhandler: Errhandler) -> None:  # noqa: N802
        self._comm.Set_errhandler(errhandler)

    def Get_errhandler(self) -> Errhandler:  # noqa: N802
        return self._comm.Get_errhandler()


FILE_NULL = None


# ------------------------------------------------------------------------------ the world
COMM_NULL = Comm(None)
_parent: list[Intercomm | None] = [None]  # a spawned rank's intercomm to its parents
COMM_WORLD = Intracomm(None)
COMM_SELF = Intracomm(None)
_bound: list[_comm.Communicator] = []


def _bind(world: _comm.Communicator | None) -> None:
    """Make ``COMM_WORLD`` this rank's ``world`` (``None``: a world of one rank) and start
    every message count afresh (a rank actor runs one program after another)."""
    if world is None:
        world = _comm.Communicator(_transport.LocalTransport())
    else:
        _rma.forget_windows()  # (a new program: the last one's windows are nobody's)
    _bound[:] = [world]
    COMM_WORLD._bind_base(world)
    COMM_SELF._bind_base(_comm.Communicator(world._t, [world._members[world.rank]],
                                            ("self",), attempt=world.attempt))


# A program run outside a rank: a world of one, as mpi4py without mpiexec.
_bind(None)


def Wtime() -> float:  # noqa: N802
    """Seconds since an arbitrary start (monotonic), as MPI_Wtime."""
    return time.perf_counter()


def Wtick() -> float:  # noqa: N802
    return time.get_clock_info("perf_counter").resolution


def Get_processor_name() -> str:  # noqa: N802
    return socket.gethostname()


def Get_version() -> tuple[int, int]:  # noqa: N802
    return VERSION, SUBVERSION


def Get_library_version() -> str:  # noqa: N802
    return "rayflow MPI (mpi4py-compatible subset over Ray)"


def Init() -> None:  # noqa: N802
    pass


def Init_thread(required: int = THREAD_MULTIPLE) -> int:  # noqa: N802
    return THREAD_SINGLE


def Finalize() -> None:  # noqa: N802
    pass


def Is_initialized() -> bool:  # noqa: N802
    return True


def Is_finalized() -> bool:  # noqa: N802
    return False


def Query_thread() -> int:  # noqa: N802
    return THREAD_SINGLE


_UNSUPPORTED = {
    "Info": "MPI.Info",
    "Grequest": "generalized requests (MPI.Grequest)",
    "Open_port": "dynamic processes (MPI.Open_port)",
    "Lookup_name": "dynamic processes (MPI.Lookup_name)",
    "Attach_buffer": "MPI.Attach_buffer",
    "DOUBLE_INT": "pair datatypes for MAXLOC/MINLOC (MPI.DOUBLE_INT)",
    "FLOAT_INT": "pair datatypes for MAXLOC/MINLOC (MPI.FLOAT_INT)",
    "LONG_INT": "pair datatypes for MAXLOC/MINLOC (MPI.LONG_INT)",
    "TWOINT": "pair datatypes for MAXLOC/MINLOC (MPI.TWOINT)",
}


def __getattr__(name: str) -> Any:
    if name in _UNSUPPORTED:
        raise NotImplementedError(f"{_UNSUPPORTED[name]} is not supported by rayflow's MPI")
    raise AttributeError(f"module 'MPI' has no attribute {name!r} (rayflow's MPI covers "
                         "mpi4py's communicators, point-to-point and collectives)")

