"""The arrays a service's state holds, named by their content: each is written to the broker once, when it first
appears, and a checkpoint refers to it by its digest.

A model in a state (a tier's latest model, a version of the history, a client's copy) is a list of numpy arrays that
never change once made: a transition builds new arrays and leaves the old ones alone. So an array is hashed once, the
first time a state holds it, and remembered by identity after that; the state codec writes a reference (the digest)
in its place, and the checkpoint that first holds it carries its bytes (`fedat.protocol.journal` says which one).
The registry marks such an array read-only, so that a transition that changed one in place would fail loudly
instead of leaving a digest that no longer names its content.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from fedat.errors import CheckpointError

DIGEST_BYTES = 16  # of SHA-256: collisions are out of reach for any number of models a service ever holds
MIN_BYTES = 64  # smaller arrays stay inline: a reference costs about as much as they do


def digest(a: np.ndarray) -> bytes:
    """An array's content digest: SHA-256 over its dtype, shape and bytes, cut to DIGEST_BYTES."""
    h = hashlib.sha256(f"{a.dtype.str}{a.shape}".encode())
    h.update(memoryview(np.ascontiguousarray(a)).cast("B"))
    return h.digest()[:DIGEST_BYTES]


@dataclass(frozen=True)
class Stored:
    """One array as a checkpoint carries it: its digest, dtype, shape and bytes."""

    digest: bytes
    dtype: str
    shape: tuple[int, ...]
    data: bytes | memoryview

    @classmethod
    def of(cls, key: bytes, a: np.ndarray) -> Stored:
        """The stored form of `a`, whose digest is `key` (no copy of its bytes)."""
        a = np.ascontiguousarray(a)
        return cls(key, a.dtype.str, tuple(a.shape), memoryview(a).cast("B"))

    @cached_property
    def array(self) -> np.ndarray:
        """The array back (read-only, one object however often it is asked for); CheckpointError if its bytes are
        not what its digest names."""
        try:
            a = np.frombuffer(self.data, dtype=np.dtype(self.dtype)).reshape(self.shape).copy()
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"stored model {self.digest.hex()} is damaged: {exc}") from None
        if digest(a) != self.digest:
            raise CheckpointError(f"stored model {self.digest.hex()}: its bytes do not match its digest")
        a.flags.writeable = False
        return a

    @property
    def nbytes(self) -> int:
        """Size of the array's bytes."""
        return len(self.data)


class Models:
    """The arrays of one service's states, by digest, each hashed once: what the last encoded state referred to."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[np.ndarray, bytes]] = {}  # the array is kept, so its id stays its own
        self.live: dict[bytes, np.ndarray] = {}  # what the state being encoded refers to

    def begin(self) -> None:
        """Start collecting the references of one state."""
        self.live = {}

    def reference(self, a: np.ndarray) -> bytes | None:
        """The digest the state codec writes for `a`, or None to write `a` inline (small, or not plain data)."""
        if a.nbytes < MIN_BYTES or a.dtype.hasobject:
            return None
        known = self._by_id.get(id(a))
        if known is None:
            key = digest(a)
            a.flags.writeable = False  # its digest is remembered by identity from now on
            self._by_id[id(a)] = (a, key)
        else:
            key = known[1]
        self.live[key] = a
        return key

    def end(self) -> dict[bytes, np.ndarray]:
        """The arrays the state referred to, by digest; arrays it no longer holds are forgotten."""
        keep = {id(a) for a in self.live.values()}
        self._by_id = {i: v for i, v in self._by_id.items() if i in keep}
        return self.live
