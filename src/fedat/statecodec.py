"""A service's state value <-> msgpack bytes: frozen dataclasses, tuples, maps, enums, numpy arrays, wire messages.

No pickle: only the classes a service registers can come back, so a state written by another version of the code
fails loudly (naming the class or the version) instead of being misread.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import fields, is_dataclass
from typing import Any

import msgpack
import numpy as np

from fedat import wire

_DATACLASS, _ARRAY, _MAP, _ENUM, _FROZENSET, _MESSAGE = 1, 2, 3, 4, 5, 6


class StateError(ValueError):
    """Persisted state that this code cannot read; the text says why."""


class StateCodec:
    """Encodes one service's state; `version` changes whenever the state's shape does."""

    def __init__(self, version: int, types: Iterable[type]):
        self.version = version
        self.types = {t.__name__: t for t in types}
        # registered dataclass -> its init fields' names: a service saves its state after every message, and
        # dataclasses.fields() per object cost ~5 % of a simulated run
        self._fields: dict[type, tuple[str, ...]] = {}

    def encode(self, state: Any) -> bytes:
        """The state as msgpack bytes."""
        return msgpack.packb({"v": self.version, "state": state}, default=self._default, use_bin_type=True)

    def decode(self, data: bytes) -> Any:
        """The state back; StateError if it was written by an incompatible version or names an unknown class."""
        try:
            body = msgpack.unpackb(data, ext_hook=self._ext, use_list=False, raw=False, strict_map_key=False)
        except StateError:
            raise
        except Exception as exc:  # msgpack raises several unrelated types for garbage
            raise StateError(f"state is not valid msgpack ({type(exc).__name__}: {exc})") from None
        if not isinstance(body, Mapping) or body.get("v") != self.version:
            got = body.get("v") if isinstance(body, Mapping) else None
            raise StateError(f"state version {got!r} is not the version this code reads ({self.version})")
        return body["state"]

    def _pack(self, value: Any) -> bytes:
        return msgpack.packb(value, default=self._default, use_bin_type=True)

    def _default(self, value: Any) -> msgpack.ExtType:
        names = self._fields.get(type(value))
        if names is not None:
            return msgpack.ExtType(_DATACLASS, self._pack([type(value).__name__, [getattr(value, n) for n in names]]))
        if isinstance(value, wire.KINDS_TUPLE):
            return msgpack.ExtType(_MESSAGE, wire.encode(value))
        if isinstance(value, enum.Enum):
            return msgpack.ExtType(_ENUM, self._pack([self._name(type(value)), value.value]))
        if is_dataclass(value) and not isinstance(value, type):
            name = self._name(type(value))  # refuses an unregistered class before it is cached
            self._fields[type(value)] = tuple(f.name for f in fields(value) if f.init)
            return msgpack.ExtType(
                _DATACLASS, self._pack([name, [getattr(value, n) for n in self._fields[type(value)]]])
            )
        if isinstance(value, np.ndarray):
            a = np.ascontiguousarray(value)
            return msgpack.ExtType(_ARRAY, self._pack([a.dtype.str, list(a.shape), memoryview(a).cast("B")]))
        if isinstance(value, Mapping):
            return msgpack.ExtType(_MAP, self._pack([[k, v] for k, v in value.items()]))
        if isinstance(value, frozenset):
            return msgpack.ExtType(_FROZENSET, self._pack(sorted(value)))
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

    def _ext(self, code: int, data: bytes) -> Any:
        if code == _MESSAGE:
            return wire.decode(data)
        value = msgpack.unpackb(data, ext_hook=self._ext, use_list=False, raw=False, strict_map_key=False)
        if code == _DATACLASS:
            name, values = value
            return self._cls(name)(*values)
        if code == _ENUM:
            name, v = value
            return self._cls(name)(v)
        if code == _ARRAY:
            dtype, shape, buf = value
            return np.frombuffer(buf, dtype=np.dtype(dtype)).reshape(shape).copy()
        if code == _MAP:
            return {k: v for k, v in value}
        if code == _FROZENSET:
            return frozenset(value)
        raise StateError(f"unknown state extension type {code}")
