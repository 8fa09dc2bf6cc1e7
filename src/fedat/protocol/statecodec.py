"""A service's state value <-> msgpack bytes: frozen dataclasses, tuples, maps, enums, numpy arrays, wire messages.

No pickle: only the classes a service registers can come back, so a state written by another version of the code
fails loudly (naming the class or the version) instead of being misread.

A dataclass is saved as its init fields' values in order. So a class may gain fields at its end, each with a
default, without a new version: a state saved before reads them as their defaults (the barrier's `bases`). Any
other change of shape (a field removed, reordered or retyped) needs a new `version`, and an older state is refused.
A state saved by newer code, with more fields than this code knows, is refused too (StateError naming the class).

An array held in several places of one state (ASO-Fed's copy of a tier model for each of its clients, the global
model that is also the newest of a history) is written once; its other places refer to it by its order of first
appearance, and decode as the same object again. A state written before such references existed has none and
reads as ever; code older than them refuses a state that has one ("unknown state extension type 7").

A state is a value: nothing in it changes after it is made (a transition builds new mappings and copies). So a frozen
dataclass or a wire message the new state shares with the state encoded last (a round still collecting, the tier
assignment) is written as the bytes it was encoded to then, not packed again, unless it holds an array (their
references are numbered per encode). `StateCodec.verify` re-encodes every such part and raises StateError if it
changed in place: the property tests run with it.

Given a `store` (`fedat.protocol.modelstore.Models.reference`), an array it names by digest is written as that
digest instead of its bytes, and reading it back needs the stored arrays (`models`, by digest): the checkpoint that
carries the state and the ones before it hold them (`fedat.protocol.journal`). A state with such a reference is only
ever saved in a checkpoint of format 2, which older code refuses by its format.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields, is_dataclass
from typing import Any

import msgpack
import numpy as np

from fedat.errors import CheckpointError, StateError  # noqa: F401 (re-exported)
from fedat.protocol import wire
from fedat.protocol.modelstore import Stored

_DATACLASS, _ARRAY, _MAP, _ENUM, _FROZENSET, _MESSAGE, _SAME_ARRAY, _STORED = 1, 2, 3, 4, 5, 6, 7, 8

Store = Callable[[np.ndarray], bytes | None]  # an array's digest, or None to write it inline


class StateCodec:
    """Encodes one service's state; `version` changes whenever the state's shape does."""

    verify = False  # re-encode every part reused from the last state and refuse one that changed in place

    def __init__(self, version: int, types: Iterable[type]):
        self.version = version
        self.types = {t.__name__: t for t in types}
        # registered dataclass -> its init fields' names: a service saves its state after every message, and
        # dataclasses.fields() per object cost ~5 % of a simulated run
        self._fields: dict[type, tuple[str, ...]] = {}
        # the last encode's frozen parts without arrays, by identity (each held, so that its id stays its own)
        self._parts: dict[int, tuple[Any, msgpack.ExtType]] = {}

    def encode(self, state: Any, store: Store | None = None) -> bytes:
        """The state as msgpack bytes; with `store`, the arrays it names are written as their digests."""
        enc = _Encoding(self, store)
        data = enc.pack({"v": self.version, "state": state})
        self._parts = enc.parts
        return data

    def decode(self, data: bytes, models: Mapping[bytes, Stored] | None = None) -> Any:
        """The state back, its stored arrays from `models`; StateError if it was written by an incompatible version,
        names an unknown class or refers to an array `models` lacks."""
        try:
            body = _Decoding(self, models).unpack(data)
        except (StateError, CheckpointError):  # a stored model that is not what its digest names is the latter
            raise
        except Exception as exc:  # msgpack raises several unrelated types for garbage
            raise StateError(f"state is not valid msgpack ({type(exc).__name__}: {exc})") from None
        if not isinstance(body, Mapping) or body.get("v") != self.version:
            got = body.get("v") if isinstance(body, Mapping) else None
            raise StateError(f"state version {got!r} is not the version this code reads ({self.version})")
        return body["state"]

    def _default(self, value: Any, enc: _Encoding) -> msgpack.ExtType:
        part = self._parts.get(id(value))
        if part is not None and part[0] is value:
            if self.verify and self._packed(value, enc) != part[1]:
                raise StateError(f"a {type(value).__name__} of the state changed in place after it was saved")
            enc.parts[id(value)] = part
            return part[1]
        refs = enc.array_refs
        ext = self._packed(value, enc)
        if enc.array_refs == refs and _frozen(value):
            enc.parts[id(value)] = (value, ext)
        return ext

    def _packed(self, value: Any, enc: _Encoding) -> msgpack.ExtType:
        names = self._fields.get(type(value))
        if names is not None:
            return msgpack.ExtType(_DATACLASS, enc.pack([type(value).__name__, [getattr(value, n) for n in names]]))
        if isinstance(value, wire.KINDS_TUPLE):
            return msgpack.ExtType(_MESSAGE, wire.encode(value))
        if isinstance(value, enum.Enum):
            return msgpack.ExtType(_ENUM, enc.pack([self._name(type(value)), value.value]))
        if is_dataclass(value) and not isinstance(value, type):
            name = self._name(type(value))  # refuses an unregistered class before it is cached
            self._fields[type(value)] = tuple(f.name for f in fields(value) if f.init)
            return msgpack.ExtType(_DATACLASS, enc.pack([name, [getattr(value, n) for n in self._fields[type(value)]]]))
        if isinstance(value, np.ndarray):
            enc.array_refs += 1
            seen = enc.arrays.get(id(value))
            if seen is not None:
                return msgpack.ExtType(_SAME_ARRAY, enc.pack(seen[0]))
            enc.arrays[id(value)] = (len(enc.arrays), value)  # the array stays referenced, so its id stays its own
            key = enc.store(value) if enc.store is not None else None
            if key is not None:
                return msgpack.ExtType(_STORED, key)
            a = np.ascontiguousarray(value)
            return msgpack.ExtType(_ARRAY, enc.pack([a.dtype.str, list(a.shape), memoryview(a).cast("B")]))
        if isinstance(value, Mapping):
            return msgpack.ExtType(_MAP, enc.pack([[k, v] for k, v in value.items()]))
        if isinstance(value, frozenset):
            return msgpack.ExtType(_FROZENSET, enc.pack(sorted(value)))
        if isinstance(value, np.integer | np.floating):
            return value.item()
        raise StateError(f"cannot persist a {type(value).__name__} in a service state")

    def _name(self, cls: type) -> str:
        if self.types.get(cls.__name__) is not cls:
            raise StateError(f"{cls.__name__} is not registered with this state codec")
        return cls.__name__

    def _cls(self, name: str) -> type:
        if name not in self.types:
            raise StateError(f"persisted state names class {name!r}, which this code does not know")
        return self.types[name]

    def _ext(self, code: int, data: bytes, dec: _Decoding) -> Any:
        if code == _MESSAGE:
            return wire.decode(data)
        if code == _STORED:
            stored = dec.models.get(bytes(data))
            if stored is None:
                raise StateError(f"state refers to stored model {bytes(data).hex()}, which no checkpoint read holds")
            dec.arrays.append(stored.array)
            return stored.array
        value = dec.unpack(data)
        if code == _DATACLASS:
            name, values = value
            cls = self._cls(name)
            known = self._fields.get(cls) or tuple(f.name for f in fields(cls) if f.init)
            if len(values) > len(known):
                raise StateError(f"persisted {name} has {len(values)} fields, this code knows {len(known)}")
            return cls(*values)
        if code == _ENUM:
            name, v = value
            return self._cls(name)(v)
        if code == _ARRAY:
            dtype, shape, buf = value
            array = np.frombuffer(buf, dtype=np.dtype(dtype)).reshape(shape).copy()
            dec.arrays.append(array)
            return array
        if code == _SAME_ARRAY:
            if not isinstance(value, int) or not 0 <= value < len(dec.arrays):
                raise StateError(f"state refers to array {value!r}, but only {len(dec.arrays)} came before it")
            return dec.arrays[value]
        if code == _MAP:
            return {k: v for k, v in value}
        if code == _FROZENSET:
            return frozenset(value)
        raise StateError(f"unknown state extension type {code}")


def _frozen(value: Any) -> bool:
    """A frozen dataclass instance (wire messages are)."""
    params = getattr(type(value), "__dataclass_params__", None)
    return params is not None and params.frozen


class _Encoding:
    """One encode: the arrays written so far, by identity, so that a repeated one is written once."""

    def __init__(self, codec: StateCodec, store: Store | None):
        self.codec, self.store = codec, store
        self.arrays: dict[int, tuple[int, np.ndarray]] = {}
        self.array_refs = 0  # arrays met so far, repeats included: a part that met none may be reused
        self.parts: dict[int, tuple[Any, msgpack.ExtType]] = {}  # the parts this state shares with the next

    def pack(self, value: Any) -> bytes:
        return msgpack.packb(value, default=self.default, use_bin_type=True)

    def default(self, value: Any) -> msgpack.ExtType:
        return self.codec._default(value, self)


class _Decoding:
    """One decode: the arrays read so far, in order of first appearance (the encoder's depth-first order)."""

    def __init__(self, codec: StateCodec, models: Mapping[bytes, Stored] | None):
        self.codec, self.models = codec, models or {}
        self.arrays: list[np.ndarray] = []

    def unpack(self, data: bytes) -> Any:
        return msgpack.unpackb(data, ext_hook=self.ext, use_list=False, raw=False, strict_map_key=False)

    def ext(self, code: int, data: bytes) -> Any:
        return self.codec._ext(code, data, self)
