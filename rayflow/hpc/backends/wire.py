"""The wire format of direct channels: a record is a pickle-5 header plus the raw bytes of
the arrays it carries (small arrays inline, larger ones as out-of-band buffers), written
into a ring or a shared-memory segment and decoded without a copy where it can be.
No Ray is imported by this module.
"""

from __future__ import annotations

import io
import pickle
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from rayflow.hpc.backends import shm

#: Array buffers from this size on leave the pickle stream (protocol-5 out-of-band buffers).
#: Below it, a message's round trip through the pickle stream took 7.5-12 us here against
#: 28-32 us out of band (1-16 KiB arrays, encode + record + decode, timeit on 2 cores).
OOB_BYTES = 16 * 1024
_SEG_FLAG = 1 << 31
_II = struct.Struct("<II")  # a record's header length and buffer count (| _SEG_FLAG)


def _small_array(dtype: str, shape: tuple, data: bytes) -> np.ndarray:
    """A small array from its bytes (writable, as every received array is: it owns a copy)."""
    return np.frombuffer(bytearray(data), dtype).reshape(shape)


class _Pickler(pickle.Pickler):
    """Pickles small plain arrays as dtype, shape and bytes. numpy's own protocol-5 reduce
    of a 1-element array took ~16 us to pickle and ~10 us to load here (against ~5 us
    in all this way), the bulk of a small buffer message (``Allreduce`` of 8 bytes)."""

    def reducer_override(self, obj: Any) -> Any:
        if _is_small(obj):
            return _small_array, (obj.dtype.str, obj.shape, obj.tobytes())
        return NotImplemented


def _is_small(obj: Any) -> bool:
    return (type(obj) is np.ndarray and obj.nbytes < OOB_BYTES and obj.dtype.kind in _PLAIN
            and obj.flags.c_contiguous)


_PLAIN = frozenset("biufcmM")  # dtypes that ``dtype.str`` names exactly
_ATOMS = (type(None), bool, int, float, str, bytes)


def _encode(stage: str, key: Any, obj: Any) -> tuple[bytes, list[memoryview]]:
    """The pickle header of ``(stage, key, obj)`` and its large array buffers (not copied)."""
    bufs: list[memoryview] = []

    def out_of_band(pb: pickle.PickleBuffer) -> bool:
        raw = pb.raw()
        if raw.nbytes < OOB_BYTES:
            return True  # small: inside the pickle stream
        bufs.append(raw)
        return False

    msg = (stage, key, obj)
    if type(obj) in _ATOMS:  # no arrays: the plain pickler is quicker
        return pickle.dumps(msg, protocol=5), bufs
    if _is_small(obj):
        # a small array alone (a collective's message): its dtype, shape and bytes for the
        # plain pickler; 2.2 us to encode and 2.3 us to decode here, against 4.7 and 3.9
        # through the subclass below
        return pickle.dumps((stage, key, obj.dtype.str, obj.shape, obj.tobytes()),
                            protocol=5), bufs
    f = io.BytesIO()
    _Pickler(f, protocol=5, buffer_callback=out_of_band).dump(msg)
    return f.getvalue(), bufs


def _message(msg: tuple) -> tuple:
    """``(stage, key, obj)`` of an unpickled header; a small array alone travels as
    ``(stage, key, dtype, shape, bytes)`` (:func:`_encode`)."""
    if len(msg) == 5:
        return msg[0], msg[1], _small_array(*msg[2:])
    return msg


def _record(hdr: bytes, bufs: Sequence[memoryview], flag: int = 0) -> tuple[list, int]:
    """Ring record parts: ``u32 hdr_len | u32 nbuf | u64 len * nbuf | hdr | (pad, buf) *``."""
    prefix = bytearray(_II.pack(len(hdr), len(bufs) | flag))
    for b in bufs:
        prefix += b.nbytes.to_bytes(8, "little")
    parts: list = [bytes(prefix), hdr]
    n = len(prefix) + len(hdr)
    for b in bufs:
        pad = -n & 7
        if pad:
            parts.append(b"\0" * pad)
        parts.append(b)
        n += pad + b.nbytes
    return parts, n


def _decode_record(view: memoryview, maps: shm.SegmentMaps, copy: bool = True) -> tuple:
    """``(stage, key, obj)`` of a ring record.

    With ``copy`` the arrays are copied out of the ring (and out of the segment, which its
    sender reuses once the record is consumed); without it they view that memory, valid
    only until the record is consumed (:meth:`DirectTransport.recv_apply`).
    """
    hlen, word = _II.unpack_from(view)
    if word == 0:  # the common case: everything inside the pickle stream
        return _message(pickle.loads(view[8 : 8 + hlen]))
    nbuf = word & ~_SEG_FLAG
    pos = 8 + 8 * nbuf
    hdr = view[pos : pos + hlen]
    if word & _SEG_FLAG:  # the pickle stream and its buffers in a segment
        views = maps.views(pickle.loads(hdr))
        if not copy:
            return pickle.loads(views[0], buffers=views[1:])
        try:
            return pickle.loads(views[0], buffers=[bytearray(v) for v in views[1:]])
        finally:
            for v in views:
                v.release()
    pos += hlen
    bufs: list = []
    for i in range(nbuf):
        n = int.from_bytes(view[8 + 8 * i : 16 + 8 * i], "little")
        pos += -pos & 7
        # copied: writable arrays, and the ring space can be handed back
        bufs.append(bytearray(view[pos : pos + n]) if copy else view[pos : pos + n])
        pos += n
    return pickle.loads(hdr, buffers=bufs)


def _snapshot(parts: list) -> list:
    """Private copies of the parts that view the caller's arrays."""
    return [p if isinstance(p, bytes) else bytes(p) for p in parts]
