"""The MPI-style communicator handed to every rank of an MPI stage.

Usage: ``total = comm.allreduce(local_sum, op="sum")`` inside ``fn(comm, *blocks)``

The API follows mpi4py's lowercase, object-based methods (``send``, ``recv``, ``sendrecv``,
``bcast``, ``reduce``, ``allreduce``, ``allgather``, ``reduce_scatter``, ``barrier``) plus
``sendrecv_replace``, MPI's ``PROC_NULL`` (:data:`PROC_NULL`) and a Cartesian topology
(:class:`CartComm`, non-periodic unless asked, as in MPI) with ``shift`` and row/column
sub-communicators.

Collectives are written once here, over two point-to-point primitives of a *transport*
(``send(dest, key, obj)``, non-blocking and buffered, and ``recv(src, key)``). A backend may
also offer native collectives for the world group (gloo does); sub-communicators always use
the point-to-point algorithms, since gloo supports a single world per process (subgroups
of a world of 4 gave wrong sums). The algorithms are "direct": every rank sends to its
peers at once, so a collective costs one message latency (two for small allreduces above
2 ranks and large ones above 4), which suits Ray's asynchronous actor calls better than a
ring of ``p - 1`` sequential hops.

Messages are matched by key ``(kind, context, tag, sequence)``: the sequence number counts
earlier messages between the same pair and tag on each side, so the match never depends on
arrival order. Results of reductions combine contributions in rank order, so every rank gets
bit-identical values (CG relies on this to take identical branches everywhere). Reductions
follow mpi4py: numpy arrays and scalars combine with numpy's ufuncs, Python objects with
Python's operators (exact integers, Fractions, Decimals).

An array must have the same shape and dtype on every rank (MPI's matching counts and types).
Since the allreduce algorithm depends on the array's size, ranks that break this rule may
take different algorithms; the first message of each rank carries a small header (the
algorithm, shape and dtype), the receiver checks it, and rank 0, which hears from every rank
whatever it chose, tells the others. Every rank then raises ``ValueError`` at once instead of
waiting for messages that never come. Messages of such a failed collective may be left
unread: do not go on using the group, as after an error in MPI.

The rooted collectives (``bcast``, ``gather``, ``scatter``, ``reduce``) must get the same
root on every rank (MPI's rule too). A rank that trusts another root waits for a rank that
sends nothing, or takes a message meant for someone else. As in MPI, that is not checked by
default; a root out of range raises at once on its rank. With ``check_roots=True``
(``hpc.check_collectives``) every rank sends one message to every other rank in the same
hop: the data where the algorithm has some to send, else a header alone, each naming the
collective, the root and (for the buffer forms) the buffer's size and type. Every rank
checks all of them and raises the same ``ValueError`` naming what each rank passed. The
price: a rooted collective then ends together on all ranks, as an ``allgather`` of the
header does, 3-5x the time of an unchecked small call on 2-4 ranks.

Arrays received may be read-only views of Ray's object store: copy before mutating.
No Ray is imported by this module. It is long because it is one contract: every collective
is written over the same transport and matching rules, and a backend conformance test
checks them together.
"""

from __future__ import annotations

import functools
import itertools
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rayflow.hpc.algorithms.cannon_index import split_sizes
from rayflow.hpc.backends.transport import Request, Transport
from rayflow.hpc.reduce import _describe, _fill, _Fold, check_op, reduce_values

# Arrays above this size are all-reduced as reduce-scatter + allgather (two hops, each rank
# moves ~2x its array) rather than all-to-all (one hop, each rank moves (p-1)x its array).
_LARGE_ALLREDUCE_BYTES = 256 * 1024


# Up to this many ranks small allreduces go all-to-all (one hop, p(p-1) messages).
_DIRECT_ALLREDUCE_MAX_RANKS = 2
# Up to this many ranks and bytes large allreduces go all-to-all too (each rank reduces the
# whole array; one hop); above, reduce-scatter + allgather (two hops, a p-th of the adds).
# Measured at 4 ranks on 2 cores: all-to-all 1.5-2x faster at 1 MiB, 1.9x slower at 64 MiB;
# the crossover between them was not measured more finely.
_DIRECT_LARGE_ALLREDUCE_MAX_RANKS = 4
_DIRECT_LARGE_ALLREDUCE_MAX_BYTES = 4 * 1024 * 1024


    # Optional: ``isend(dest, key, obj) -> Request`` sends without a snapshot (the caller
    # leaves ``obj`` unchanged until ``wait``); transports without it get a buffered send.
    # Optional: ``try_recv(src, key)`` returns the message, or :data:`NO_MESSAGE` at once if
    # it has not arrived; the MPI module polls it for ``ANY_SOURCE`` and ``Request.Test``.


#: Rank number of a missing neighbour (MPI's ``PROC_NULL``): a send to it does nothing and a
#: receive from it returns ``None`` at once. ``CartComm.shift`` returns it at the edges of a
#: non-periodic grid.
PROC_NULL = -2


class _Failed:
    """Sent in place of a result when the rank that computed it raised: every rank re-raises.

    ``notify``: the ranks the receiver must pass the error on to (under the collective's
    first key), because they wait for a message from it that it will not otherwise send.
    """

    __slots__ = ("error", "notify")

    def __init__(self, error: BaseException, notify: Sequence[int] = ()):
        self.error = error
        self.notify = tuple(notify)


# The algorithms of an allreduce above 2 ranks. The choice depends on the array's size,
# which may differ between ranks by mistake, so every first message carries a header
# ``(algorithm, shape, dtype)`` (shape ``None`` and the type's description in place of the
# dtype for Python objects) that the receiver checks before using the data.
_A2A, _RS, _ROOT = "all-to-all", "reduce-scatter", "reduce-at-root"


def _header(algorithm: str, obj: Any) -> tuple:
    if isinstance(obj, np.ndarray):
        return (algorithm, obj.shape, obj.dtype)
    return (algorithm, None, _describe(obj))


def _header_text(hdr: tuple) -> str:
    text = hdr[2] if hdr[1] is None else f"an array of {hdr[2]} {hdr[1]}"
    return text + (f" split as {list(hdr[3])}" if len(hdr) > 3 else "")


def _mismatch_error(what: str, headers: dict[int, tuple]) -> ValueError:
    parts = ", ".join(f"rank {r}: {_header_text(h)}" for r, h in sorted(headers.items()))
    return ValueError(f"{what}: every rank must pass an array of the same shape and dtype; "
                      f"got {parts}")


def _root_text(root: Any) -> str:
    """How a rank's root shows in a rooted collective's header (ints of any type alike)."""
    if isinstance(root, (int, np.integer)) and not isinstance(root, bool):
        return str(int(root))
    return repr(root)


def _rooted_agree(headers: dict[int, tuple]) -> bool:
    """Whether the headers ``(collective, root, buffer)`` of a rooted collective agree; a
    buffer of ``None`` (an object form, or a rank whose buffers were wrong) matches any."""
    first = next(iter(headers.values()))
    bufs = {b for _, _, b in headers.values() if b is not None}
    return all(h[:2] == first[:2] for h in headers.values()) and len(bufs) <= 1


def _rooted_error(what: str, headers: dict[int, tuple]) -> ValueError:
    calls = {c for c, _, _ in headers.values()}
    sized = any(b is not None for _, _, b in headers.values())
    if len(calls) > 1:
        need = "call the same collective"
    else:
        need = "pass the same root" + (" and a buffer of the same size and type" if sized else "")
    parts = ", ".join(f"rank {r}: " + (f"{c} " if len(calls) > 1 else "") + f"root={root}"
                      + ("" if b is None else f" with {b}")
                      for r, (c, root, b) in sorted(headers.items()))
    return ValueError(f"{what}: every rank must {need}; got {parts}")


class _Mismatch(Exception):
    """A first message whose header differs from the receiver's (internal)."""

    def __init__(self, src: int, header: tuple):
        super().__init__(src, header)
        self.src, self.header = src, header


def _opened(msg: Any, src: int, mine: tuple) -> Any:
    """The data of a first message from ``src``, once its header matches ``mine``."""
    if isinstance(msg, _Failed):
        raise msg.error
    hdr, data = msg
    if hdr != mine:
        raise _Mismatch(src, hdr)
    return data


class Communicator:
    """A group of ranks that exchange messages; rank ``r`` of this group is a world rank.

    Attributes:
        rank: this process's rank in the group (0-based).
        size: the number of ranks in the group.
        attempt: the stage attempt (0 on the first run, 1 after one recovery, ...).
    """

    def __init__(
        self,
        transport: Transport,
        members: Sequence[int] | None = None,
        context: tuple = ("world",),
        native: Any = None,
        attempt: int = 0,
        check_roots: bool = False,
    ):
        self._t = transport
        self.check_roots = check_roots  # rooted collectives check every rank's root
        self._members = list(range(transport.size)) if members is None else list(members)
        self._index = {w: i for i, w in enumerate(self._members)}
        self.rank = self._index[transport.rank]
        self.size = len(self._members)
        self._ctx = context
        self._native = native  # native world collectives (gloo), or None
        self.attempt = attempt
        self._send_seq: dict[tuple[int, Any], itertools.count] = defaultdict(itertools.count)
        self._recv_seq: dict[tuple[int, Any], itertools.count] = defaultdict(itertools.count)
        self._coll_seq = itertools.count()
        self._split_seq = itertools.count()

    # ----------------------------------------------------------------- helpers
    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, size={self.size}, context={self._ctx})"

    @property
    def backend(self) -> str:
        """The transport's backend name (``"ray"`` or ``"gloo"``)."""
        return getattr(self._t, "backend", "unknown")

    def _check_rank(self, r: Any, what: str, proc_null: bool = False) -> None:
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)):
            raise TypeError(f"{what} rank must be an int, got {r!r}")
        if proc_null and r == PROC_NULL:
            return
        if not 0 <= r < self.size:
            hint = " (PROC_NULL for no neighbour)" if proc_null else ""
            raise ValueError(
                f"{what} rank {r} out of range for a group of size {self.size}{hint}"
            )

    def _ckey(self, phase: str = "") -> tuple:
        return ("c", self._ctx, next(self._coll_seq), phase)

    def _send_to(self, dest: int, key: tuple, obj: Any) -> None:
        self._t.send(self._members[dest], key, obj)

    def _recv_from(self, src: int, key: tuple) -> Any:
        return self._t.recv(self._members[src], key)

    # ---------------------------------------------------------- point-to-point
    def send(self, obj: Any, dest: int, tag: int = 0) -> None:
        """Send ``obj`` to ``dest``; buffered, so it returns before the receiver reads it.

        A send to :data:`PROC_NULL` does nothing.
        """
        self._check_rank(dest, "destination", proc_null=True)
        if dest == PROC_NULL:
            return
        seq = next(self._send_seq[(dest, tag)])
        self._send_to(dest, ("p", self._ctx, tag, seq), obj)

    def isend(self, obj: Any, dest: int, tag: int = 0) -> Request:
        """Send ``obj`` to ``dest`` without copying it, as MPI's ``Isend``.

        ``obj`` must stay unchanged until the returned request's ``wait()``: the gloo backend
        sends straight from its buffer, where :meth:`send` copies it first. The Ray backend
        serialises at once (into the object store for large arrays), so its requests are
        complete on return. Messages match :meth:`recv` exactly like :meth:`send`'s. A send
        to :data:`PROC_NULL` returns a completed request.
        """
        self._check_rank(dest, "destination", proc_null=True)
        if dest == PROC_NULL:
            return Request()
        seq = next(self._send_seq[(dest, tag)])
        key = ("p", self._ctx, tag, seq)
        isend = getattr(self._t, "isend", None)
        if isend is None:
            self._send_to(dest, key, obj)
            return Request()
        return isend(self._members[dest], key, obj)

    def recv(self, source: int, tag: int = 0) -> Any:
        """Receive the next object sent by ``source`` with ``tag``.

        A receive from :data:`PROC_NULL` returns ``None`` at once.
        """
        self._check_rank(source, "source", proc_null=True)
        if source == PROC_NULL:
            return None
        seq = next(self._recv_seq[(source, tag)])
        return self._recv_from(source, ("p", self._ctx, tag, seq))

    def sendrecv(
        self, sendobj: Any, dest: int, source: int | None = None, sendtag: int = 0,
        recvtag: int | None = None,
    ) -> Any:
        """Send to ``dest`` and receive from ``source`` (default: ``dest``) without deadlock.

        Either side may be :data:`PROC_NULL` (the edge of a non-periodic grid): that half is
        skipped, and a receive from it returns ``None``.
        """
        self.send(sendobj, dest, sendtag)
        return self.recv(dest if source is None else source, sendtag if recvtag is None else recvtag)

    def sendrecv_replace(
        self, buf: np.ndarray, dest: int, source: int | None = None, sendtag: int = 0,
        recvtag: int | None = None,
    ) -> np.ndarray:
        """Send ``buf`` to ``dest`` and overwrite it with the array received from ``source``.

        The received array must have ``buf``'s shape; ``buf`` must be writable. A receive from
        :data:`PROC_NULL` leaves ``buf`` unchanged, as in MPI.
        """
        if not isinstance(buf, np.ndarray):
            raise TypeError(f"sendrecv_replace needs a numpy array buffer, got {type(buf).__name__}")
        src = dest if source is None else source
        got = self.sendrecv(buf, dest, source, sendtag, recvtag)
        if src == PROC_NULL:
            return buf
        got = np.asarray(got)
        if got.shape != buf.shape:
            raise ValueError(f"sendrecv_replace: received shape {got.shape}, buffer {buf.shape}")
        np.copyto(buf, got)
        return buf

    # ------------------------------------------------------------- collectives
    def barrier(self) -> None:
        """Return once every rank of the group has entered the barrier."""
        if self._native is not None:
            self._native.barrier()
            return
        self.allgather(None)

    def bcast(self, obj: Any, root: int = 0) -> Any:
        """Return ``root``'s ``obj`` on every rank.

        Raises:
            ValueError: with ``check_roots``, on every rank when the ranks pass
                different roots (each rank's root is named); at once on a rank whose
                root is out of range. Unchecked, a world group with native collectives
                (gloo) broadcasts with its backend; checked, over point-to-point messages
                as the Ray-native backend does.
        """
        if self._native is not None and not self.check_roots:
            self._check_rank(root, "root")
            return self._native.bcast(obj, root)
        return self._bcast(obj, root, "bcast")

    def _unchecked(self, root: Any, error: BaseException | None) -> bool:
        """Whether a rooted collective takes its plain path (``check_roots`` off): then
        this rank's own bad input raises here, as the root out of range does."""
        if self.check_roots:
            return False
        if error is not None:
            raise error
        self._check_rank(root, "root")
        return True

    def _bcast(self, obj: Any, root: Any, what: str, sig: str | None = None,
               error: BaseException | None = None) -> Any:
        if self._unchecked(root, error):
            if self.size == 1:
                return obj
            return self._plain_bcast(obj, root)
        mine = self.rank == root
        got = self._rooted(what, root, sig, error, to_all=obj if mine else None)
        return obj if mine else got[root]

    def _plain_bcast(self, obj: Any, root: int) -> Any:
        """A broadcast with no header: an unchecked ``bcast``, and the broadcast of an
        allreduce's result from rank 0 (its ranks have agreed already), under the next
        collective key (where :meth:`_stop_every_rank` sends its errors)."""
        key = self._ckey("bcast")
        if self.rank == root:
            self._t.send_many([self._members[r] for r in range(self.size) if r != root], key, obj)
            return obj
        return self._recv_from(root, key)

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        """Return the list of every rank's ``obj`` on ``root`` (``None`` elsewhere).

        Raises:
            ValueError: with ``check_roots``, on every rank when the ranks pass
                different roots; at once on a
                rank whose root is out of range.
        """
        return self._gather(obj, root, "gather")

    def _gather(self, obj: Any, root: Any, what: str, sig: str | None = None,
                error: BaseException | None = None) -> list[Any] | None:
        if self._unchecked(root, error):
            key = self._ckey("gather")
            if self.rank != root:
                self._send_to(root, key, obj)
                return None
            return [obj if r == root else self._recv_from(r, key) for r in range(self.size)]
        to = None if self.rank == root else {root: obj}
        got = self._rooted(what, root, sig, error, to=to)
        if self.rank != root:
            return None
        got[root] = obj
        return got

    def scatter(self, objs: Sequence[Any] | None, root: int = 0) -> Any:
        """Return ``objs[rank]`` of ``root``'s list on each rank.

        Raises:
            ValueError: when the root's ``objs`` is not one object per rank (with
                ``check_roots`` on every rank, as when the ranks pass different roots);
                at once on a rank whose root is out of range.
        """
        return self._scatter(objs, root, "scatter")

    def _scatter(self, objs: Sequence[Any] | None, root: Any, what: str,
                 sig: str | None = None, error: BaseException | None = None) -> Any:
        if self._unchecked(root, error):
            key = self._ckey("scatter")
            if self.rank == root:
                if objs is None or len(objs) != self.size:
                    raise ValueError(f"{what}: the root (rank {root}) must pass one object "
                                     f"per rank ({self.size})")
                for r in range(self.size):
                    if r != root:
                        self._send_to(r, key, objs[r])
                return objs[root]
            return self._recv_from(root, key)
        to = None
        if self.rank == root and error is None:
            try:
                n = len(objs)  # type: ignore[arg-type]
            except TypeError:
                n = None
            if n != self.size:
                passed = "None" if objs is None else (
                    f"a {type(objs).__name__}" if n is None else f"{n} objects")
                error = ValueError(f"{what}: the root (rank {root}) must pass one object per "
                                   f"rank ({self.size}), got {passed}")
            else:
                to = {r: objs[r] for r in range(self.size)}  # type: ignore[index]
        got = self._rooted(what, root, sig, error, to=to)
        return objs[root] if self.rank == root else got[root]  # type: ignore[index]

    def _rooted(self, what: str, root: Any, sig: str | None, error: BaseException | None,
                to_all: Any = None, to: dict[int, Any] | None = None) -> list[Any]:
        """The messages of a rooted collective: one to every other rank and one from each.

        Every message is headed by this rank's ``(what, root, sig)`` (``sig``: what the
        buffer forms must match, else ``None``); its payload is ``to[r]`` for rank ``r``, else
        ``to_all`` (``None`` for a header alone). Since every rank hears from every rank in
        the same hop, ranks that pass different roots all raise, instead of waiting for a
        root that sends nothing or taking a message meant for another; the root waits for
        the others' headers, so a rooted collective ends together on all ranks. ``error``
        (bad input on this rank) travels in place of the data, and every rank raises it.

        Returns the payloads received, by rank (``None`` at this rank's own index).

        Raises:
            ValueError: at once on a rank whose root is out of range (after telling the
                others, who raise naming the roots); on every rank when the headers differ.
        """
        key = self._ckey("rooted")  # one key for all: a rank in another collective is named
        hdr = (what, _root_text(root), sig)
        others = [r for r in range(self.size) if r != self.rank]
        try:
            self._check_rank(root, "root")
        except (TypeError, ValueError) as err:
            bad_root: BaseException | None = err
        else:
            bad_root = None
        failure = error if error is not None else bad_root
        if failure is not None:
            failed = _Failed(failure)
            if others:
                self._t.send_many([self._members[r] for r in others], key, (hdr, failed))
            if bad_root is not None:
                raise bad_root
        else:
            to = to or {}
            rest = [r for r in others if r not in to]
            if rest:
                self._t.send_many([self._members[r] for r in rest], key, (hdr, to_all))
            for r, payload in to.items():
                if r != self.rank:
                    self._send_to(r, key, (hdr, payload))
        got: list[Any] = [None] * self.size
        headers = {self.rank: hdr}
        for r in others:
            headers[r], got[r] = self._recv_from(r, key)
        if not _rooted_agree(headers):
            raise _rooted_error(what, headers)
        for r in range(self.size):
            if r == self.rank and error is not None:
                raise error
            if isinstance(got[r], _Failed):
                raise got[r].error
        return got

    def allgather(self, obj: Any) -> list[Any]:
        """Return the list of every rank's ``obj`` (index = rank) on every rank."""
        if self._native is not None:
            return self._native.allgather(obj)
        key = self._ckey("allgather")
        others = [r for r in range(self.size) if r != self.rank]
        if others:
            self._t.send_many([self._members[r] for r in others], key, obj)
        return [obj if r == self.rank else self._recv_from(r, key) for r in range(self.size)]

    def alltoall(self, objs: Sequence[Any]) -> list[Any]:
        """Send ``objs[r]`` to rank ``r``; return what each rank sent here (index = source)."""
        if len(objs) != self.size:
            raise ValueError(f"alltoall needs {self.size} objects, got {len(objs)}")
        key = self._ckey("alltoall")
        for r in range(self.size):
            if r != self.rank:
                self._send_to(r, key, objs[r])
        return [objs[r] if r == self.rank else self._recv_from(r, key) for r in range(self.size)]

    def reduce(self, obj: Any, op: str = "sum", root: int = 0) -> Any:
        """Combine every rank's ``obj`` with ``op``; the result on ``root`` only.

        numpy arrays combine elementwise (same shape and dtype on every rank), other objects
        with Python's operators, in rank order (see :func:`reduce_values`).

        Raises:
            ValueError: with ``check_roots``, on every rank when the ranks pass
                different roots; at once on a
                rank whose root is out of range; on the root, when the arrays differ.
        """
        check_op(op)
        vals = self._gather(obj, root, "reduce")
        return None if vals is None else reduce_values(vals, op, "reduce")

    def allreduce(self, obj: Any, op: str = "sum", out: np.ndarray | None = None) -> Any:
        """Combine every rank's ``obj`` with ``op``; the result everywhere.

        numpy arrays and scalars combine as numpy does (an array must have the same shape and
        dtype on every rank, else every rank raises ``ValueError``); Python objects combine
        with Python's operators as mpi4py does, so ``allreduce(2**62)`` on 4 ranks is
        ``2**64`` and a ``Fraction`` stays a ``Fraction``.

        ``out``: an array of ``obj``'s shape and dtype to write the result into (it may be
        ``obj`` itself) instead of a new array, as MPI's buffer ``Allreduce`` does; it is
        returned. Large arrays then combine straight from the peers' messages into it.
        """
        check_op(op)
        if out is not None and not (
            isinstance(obj, np.ndarray) and isinstance(out, np.ndarray)
            and out.shape == obj.shape and out.dtype == obj.dtype and out.flags.writeable
        ):
            raise ValueError(f"allreduce: out must be a writable array like the one sent "
                             f"({_describe(obj)}), got {_describe(out)}")
        if self._native is not None:
            got = self._native.allreduce(obj, op)
            if out is None:
                return got
            np.copyto(out, got)
            return out
        key = self._ckey("allreduce")
        if self.size <= _DIRECT_ALLREDUCE_MAX_RANKS:
            # both ranks send their whole value to each other: each sees the other's shape
            others = [r for r in range(self.size) if r != self.rank]
            if not others:
                return reduce_values([obj], op, "allreduce") if out is None else \
                    _fill(out, obj)
            self._t.send_many([self._members[r] for r in others], key, obj)
            (peer,) = others
            if isinstance(obj, np.ndarray) and obj.ndim >= 1 and obj.size:
                fold = _Fold(op, obj, self.rank, out, "allreduce")
                return self._recv_apply(peer, key, fold.with_peer)
            vals = [obj if r == self.rank else self._recv_from(r, key) for r in range(self.size)]
            got = reduce_values(vals, op, "allreduce")
            return got if out is None else _fill(out, got)
        large = isinstance(obj, np.ndarray) and obj.nbytes > _LARGE_ALLREDUCE_BYTES
        if large and obj.nbytes <= _DIRECT_LARGE_ALLREDUCE_MAX_BYTES \
                and self.size <= _DIRECT_LARGE_ALLREDUCE_MAX_RANKS:
            algorithm = _A2A
        elif large and obj.ndim >= 1 and obj.shape[0] >= self.size:
            algorithm = _RS
        else:
            algorithm = _ROOT
        hdr = _header(algorithm, obj)
        if algorithm == _A2A:
            # every rank sends its array once (one segment for its node's peers) and folds
            # all of them in rank order: one hop
            self._t.send_many([self._members[r] for r in range(self.size) if r != self.rank],
                              key, (hdr, obj))
            into = None if out is None or np.may_share_memory(out, obj) else out
            fold = _Fold(op, obj, self.rank, into, "allreduce", self.size)
            try:
                self._fold_ranks(fold, obj, key, hdr)
            except _Mismatch as m:
                raise self._disagreement(key, hdr, m, "allreduce") from None
            got = fold.result()
            if out is not None and got is not out:
                np.copyto(out, got)
                return out
            return got
        if algorithm == _RS:
            counts = split_sizes(obj.shape[0], self.size)
            if out is None:
                out = np.empty_like(obj)
            piece = self._reduce_scatter(obj, op, counts, key,
                                         None if np.may_share_memory(out, obj) else out,
                                         hdr, "allreduce")
            return self._allgather_into(piece, counts, out)
        # Reduce at rank 0, then broadcast: 2(p-1) messages in two hops instead of p(p-1) in
        # one; on few cores the message count, not the hop count, sets the time.
        if self.rank != 0:
            self._send_to(0, key, (hdr, obj))
            result = self._plain_bcast(None, 0)
            if isinstance(result, _Failed):
                # ranks that took another algorithm wait for a message from this one
                for r in result.notify:
                    if r != self.rank:
                        self._send_to(r, key, _Failed(result.error))
                raise result.error
            return result if out is None else _fill(out, result)
        msgs = [(hdr, obj)] + [self._recv_from(r, key) for r in range(1, self.size)]
        headers = {r: h for r, (h, _) in enumerate(msgs)}
        if any(h[0] != _ROOT for h in headers.values()):
            raise self._stop_every_rank(key, headers)
        try:
            result = reduce_values([v for _, v in msgs], op, "allreduce")
        except Exception as err:  # noqa: BLE001 - every rank raises it, not rank 0 alone
            self._plain_bcast(_Failed(err), 0)
            raise
        self._plain_bcast(result, 0)
        return result if out is None else _fill(out, result)

    @staticmethod
    def _fold_in(fold: _Fold, src: int, mine: tuple, msg: Any) -> None:
        fold.add(_opened(msg, src, mine), src)

    def _fold_ranks(self, fold: _Fold, mine: np.ndarray, key: tuple, hdr: tuple) -> None:
        """Fold this rank's ``mine`` and every other rank's first message (checked against
        ``hdr``) into ``fold``, in rank order."""
        for r in range(self.size):
            if r == self.rank:
                fold.add(mine, r)
            else:
                self._recv_apply(r, key, functools.partial(self._fold_in, fold, r, hdr))

    def _disagreement(self, key: tuple, mine: tuple, m: _Mismatch, what: str) -> ValueError:
        """The error for a first message from ``m.src`` whose header differs from ``mine``.

        The first messages come in rank order, so the ranks before ``m.src`` agreed with this
        one. Rank 0 receives a first message from every rank whatever algorithm each chose,
        so it reads the rest and makes sure every rank stops (:meth:`_stop_every_rank`).
        """
        headers = {r: mine for r in range(m.src) if r != self.rank}
        headers[self.rank], headers[m.src] = mine, m.header
        if self.rank != 0:
            return _mismatch_error(what, headers)
        for r in range(m.src + 1, self.size):
            got = self._recv_from(r, key)
            headers[r] = got[0] if isinstance(got, tuple) else mine
        return self._stop_every_rank(key, headers, what)

    def _stop_every_rank(self, key: tuple, headers: dict[int, tuple],
                         what: str = "allreduce") -> ValueError:
        """On rank 0, once the ranks disagree: tell every rank that waits, return the error.

        A rank that reduces at the root waits for the broadcast of the result: it gets the
        error instead. A rank of an all-to-all algorithm waits for a first message from every
        rank, rank 0 first: rank 0 sends it the error if it sent it no data, and otherwise
        asks the reduce-at-root ranks (which send it nothing) to pass the error on.
        """
        err = _mismatch_error(what, headers)
        sent_data = headers[0][0] != _ROOT
        waiting = [r for r, h in headers.items() if r and h[0] != _ROOT]
        bcast_key = ("c", self._ctx, key[2] + 1, "bcast")  # the key their bcast waits on
        for r, h in sorted(headers.items()):
            if r == 0:
                continue
            if h[0] == _ROOT:
                self._send_to(r, bcast_key, _Failed(err, waiting if sent_data else ()))
            elif not sent_data:
                self._send_to(r, key, _Failed(err))
        return err

    def _recv_apply(self, src: int, key: tuple, fn: Callable[[Any], Any]) -> Any:
        """``fn`` of the message from ``src``; without copying it where the transport can."""
        apply = getattr(self._t, "recv_apply", None)
        if apply is None:
            return fn(self._recv_from(src, key))
        return apply(self._members[src], key, fn)

    def _allgather_into(self, piece: np.ndarray, counts: Sequence[int], out: np.ndarray):
        """Every rank's ``piece`` (``counts[r]`` rows each) into ``out``, in rank order."""
        key = self._ckey("allgather")
        bounds = np.cumsum([0, *counts])
        others = [r for r in range(self.size) if r != self.rank]
        self._t.send_many([self._members[r] for r in others], key, piece)
        mine = out[bounds[self.rank] : bounds[self.rank + 1]]
        if not np.shares_memory(mine, piece):
            np.copyto(mine, piece)
        for r in others:
            dst = out[bounds[r] : bounds[r + 1]]
            self._recv_apply(r, key, functools.partial(_fill, dst, what=f"allgather from rank {r}"))
        return out

    def reduce_scatter(
        self, array: np.ndarray, op: str = "sum", counts: Sequence[int] | None = None
    ) -> np.ndarray:
        """Reduce ``array`` across ranks and return this rank's piece of the result.

        The array is split along axis 0 into ``counts`` rows per rank (default: near-equal
        pieces, larger first).
        """
        check_op(op)
        array = np.asarray(array)
        if array.ndim == 0:
            raise ValueError("reduce_scatter needs an array with at least one axis, got a scalar")
        counts = list(counts) if counts is not None else split_sizes(array.shape[0], self.size)
        if len(counts) != self.size or sum(counts) != array.shape[0]:
            raise ValueError(f"counts {counts} do not split {array.shape[0]} rows over {self.size}")
        if self._native is not None:
            return self._native.reduce_scatter(array, op, counts)
        hdr = ("reduce_scatter", array.shape, array.dtype, tuple(counts))
        return self._reduce_scatter(array, op, counts, self._ckey("reduce_scatter"),
                                    None, hdr, "reduce_scatter")

    def _reduce_scatter(self, array: np.ndarray, op: str, counts: Sequence[int], key: tuple,
                        out: np.ndarray | None, hdr: tuple, what: str):
        """This rank's piece of the reduction, folded in rank order as it arrives (into
        ``out``'s piece when given, which must not overlap ``array``).

        Each piece travels with ``hdr``, which describes the whole array (pieces alone may
        match when the arrays do not) and is checked on arrival.
        """
        bounds = np.cumsum([0, *counts])
        for r in range(self.size):
            if r != self.rank:
                self._send_to(r, key, (hdr, array[bounds[r] : bounds[r + 1]]))
        mine = array[bounds[self.rank] : bounds[self.rank + 1]]
        try:
            if mine.ndim == 0 or not mine.size:
                vals = [mine if r == self.rank else _opened(self._recv_from(r, key), r, hdr)
                        for r in range(self.size)]
                return reduce_values(vals, op, what)
            dst = None if out is None else out[bounds[self.rank] : bounds[self.rank + 1]]
            fold = _Fold(op, mine, self.rank, dst, what, self.size)
            self._fold_ranks(fold, mine, key, hdr)
        except _Mismatch as m:
            raise self._disagreement(key, hdr, m, what) from None
        return fold.result()

    # ---------------------------------------------------------------- topology
    def split(self, color: int, key: int = 0) -> Communicator:
        """Partition the group by ``color``; ranks are ordered by ``(key, rank)`` (MPI_Comm_split)."""
        seq = next(self._split_seq)
        pairs = self.allgather((color, key))
        members = sorted(
            (k, r) for r, (c, k) in enumerate(pairs) if c == color
        )
        world = [self._members[r] for _, r in members]
        return Communicator(self._t, world, (self._ctx, "split", seq, color), attempt=self.attempt,
                            check_roots=self.check_roots)

    def create_cart(
        self, dims: Sequence[int], periods: Sequence[bool] | None = None
    ) -> CartComm:
        """A Cartesian view of this group, ranks laid out row-major (MPI_Cart_create).

        Args:
            dims: the grid shape; its product must be the group size.
            periods: whether each dimension wraps around; by default none does, as in MPI
                (``shift`` then returns :data:`PROC_NULL` at the edges).

        Raises:
            ValueError: ``prod(dims)`` differs from the group size, or ``periods`` has another
                length than ``dims``.
        """
        dims = tuple(int(d) for d in dims)
        if not dims or any(d < 1 for d in dims):
            raise ValueError(f"cartesian dims must be positive, got {dims}")
        if int(np.prod(dims)) != self.size:
            raise ValueError(f"cartesian dims {dims} need {int(np.prod(dims))} ranks, group has {self.size}")
        periods = tuple(bool(p) for p in (periods if periods is not None else [False] * len(dims)))
        if len(periods) != len(dims):
            raise ValueError(f"periods {periods} must have one entry per dimension of {dims}")
        seq = next(self._split_seq)
        return CartComm(self._t, self._members, (self._ctx, "cart", seq, dims), dims, periods,
                        native=self._native, attempt=self.attempt)


class CartComm(Communicator):
    """A communicator with a Cartesian (row-major) topology.

    Attributes:
        dims: the grid shape.
        periods: whether each dimension wraps around.
        coords: this rank's grid coordinates.
    """

    def __init__(self, transport, members, context, dims, periods, native=None, attempt=0):
        super().__init__(transport, members, context, native=native, attempt=attempt)
        self.dims = tuple(dims)
        self.periods = tuple(periods)
        self.coords = self.get_coords(self.rank)

    def get_coords(self, rank: int) -> tuple[int, ...]:
        """Coordinates of ``rank`` (row-major)."""
        return tuple(int(c) for c in np.unravel_index(rank, self.dims))

    def get_cart_rank(self, coords: Sequence[int]) -> int:
        """The rank at ``coords``; periodic dimensions wrap, others raise when out of range."""
        if len(coords) != len(self.dims):
            raise ValueError(f"coordinates {tuple(coords)} do not match a {len(self.dims)}-D grid")
        wrapped = []
        for c, d, per in zip(coords, self.dims, self.periods):
            if per:
                c %= d
            elif not 0 <= c < d:
                raise ValueError(f"coordinates {tuple(coords)} outside non-periodic grid {self.dims}")
            wrapped.append(c)
        return int(np.ravel_multi_index(wrapped, self.dims))

    def shift(self, direction: int, disp: int = 1) -> tuple[int, int]:
        """``(source, dest)`` ranks for a shift by ``disp`` along ``direction`` (MPI_Cart_shift).

        Data sent to ``dest`` moves ``+disp`` along the axis. At the edges of a non-periodic
        dimension the missing neighbour is :data:`PROC_NULL`, so the MPI idiom
        ``cart.sendrecv(x, dest=dest, source=source)`` works on every rank: the edge ranks
        skip the send, or receive ``None``.
        """
        if not 0 <= direction < len(self.dims):
            raise ValueError(f"direction {direction} out of range for a {len(self.dims)}-D grid")

        def neighbour(step: int) -> int:
            c = list(self.coords)
            c[direction] += step
            if not self.periods[direction] and not 0 <= c[direction] < self.dims[direction]:
                return PROC_NULL
            return self.get_cart_rank(c)

        return neighbour(-disp), neighbour(disp)

    def shift_replace(self, buf: np.ndarray, direction: int, disp: int = 1) -> np.ndarray:
        """Move ``buf`` by ``disp`` along ``direction`` in place.

        On a non-periodic dimension the ranks at the far edge keep their ``buf`` (nothing
        arrives from :data:`PROC_NULL`), as ``MPI_Sendrecv_replace`` does.
        """
        source, dest = self.shift(direction, disp)
        return self.sendrecv_replace(buf, dest, source)

    def shift_obj(self, obj: Any, direction: int, disp: int = 1) -> Any:
        """Send ``obj`` ``disp`` steps along ``direction``; return what arrives from the other side.

        ``None`` arrives at the edge of a non-periodic dimension.
        """
        source, dest = self.shift(direction, disp)
        if source == self.rank == dest:
            return obj
        return self.sendrecv(obj, dest, source)

    def sub(self, remain_dims: Sequence[bool]) -> Communicator:
        """The sub-grid keeping the dimensions where ``remain_dims`` is true (MPI_Cart_sub).

        For a 2-D grid, ``sub([False, True])`` is this rank's row and ``sub([True, False])``
        its column. Built above point-to-point messaging, never as backend subgroups.
        """
        remain = tuple(bool(x) for x in remain_dims)
        fixed = tuple(c if not keep else None for c, keep in zip(self.coords, remain))
        members = []
        for r in range(self.size):
            cr = self.get_coords(r)
            if all(f is None or cr[a] == f for a, f in enumerate(fixed)):
                members.append(self._members[r])
        sub_dims = tuple(d for d, keep in zip(self.dims, remain) if keep)
        sub_periods = tuple(p for p, keep in zip(self.periods, remain) if keep)
        seq = next(self._split_seq)
        return CartComm(self._t, members, (self._ctx, "sub", seq, remain, fixed), sub_dims,
                        sub_periods, native=None, attempt=self.attempt)

    def row(self) -> CartComm:
        """This rank's row of a 2-D grid (ranks ordered by column)."""
        return self.sub([False, True])  # type: ignore[return-value]

    def col(self) -> CartComm:
        """This rank's column of a 2-D grid (ranks ordered by row)."""
        return self.sub([True, False])  # type: ignore[return-value]


