"""The argument checks every layer codec applies: precision, shape, input values and encoded bytes.

Each raises CodecError naming the layer, so a bad message is dead-lettered with a reason that says what was wrong.
"""

from __future__ import annotations

import math
import operator

import numpy as np

from fedat.errors import CodecError

MIN_PRECISION = 0
MAX_PRECISION = 8


def check_precision(precision: int, name: str) -> int:
    """The precision as an int within MIN_PRECISION..MAX_PRECISION."""
    if isinstance(precision, bool):
        raise CodecError(f"layer '{name}': precision must be an int, got bool")
    try:
        p = operator.index(precision)
    except TypeError:
        raise CodecError(f"layer '{name}': precision must be an int, got {type(precision).__name__}") from None
    if not MIN_PRECISION <= p <= MAX_PRECISION:
        raise CodecError(f"layer '{name}': precision {p} outside {MIN_PRECISION}..{MAX_PRECISION}")
    return p


def check_shape(shape: tuple[int, ...], name: str) -> tuple[tuple[int, ...], int]:
    """The shape as a tuple of non-negative ints, and its number of values."""
    try:
        dims = tuple(operator.index(d) for d in shape)
    except TypeError:
        raise CodecError(f"layer '{name}': shape must be a tuple of ints, got {shape!r}") from None
    if any(d < 0 for d in dims):
        raise CodecError(f"layer '{name}': negative dimension in shape {dims}")
    return dims, math.prod(dims)


def as_real_array(values: np.ndarray, name: str) -> np.ndarray:
    """The values as a numpy array of real floats or ints."""
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError) as exc:
        raise CodecError(f"layer '{name}': not an array ({exc})") from None
    if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise CodecError(f"layer '{name}': unsupported dtype {arr.dtype} (need real floats or ints)")
    return arr


def as_float32(values: np.ndarray, name: str) -> np.ndarray:
    """The values as float32 in C order; a wider input that would overflow float32 is refused, not sent as inf."""
    arr = as_real_array(values, name)
    with np.errstate(over="ignore", invalid="ignore"):
        f32 = np.asarray(arr, dtype=np.float32, order="C")  # keeps a 0-d layer 0-d
    if arr.dtype.itemsize > 4 or np.issubdtype(arr.dtype, np.integer):
        overflow = np.isinf(f32) & ~np.isinf(arr)
        if overflow.any():
            i = int(np.flatnonzero(overflow.reshape(-1))[0])
            raise CodecError(f"layer '{name}': value at flat index {i} overflows float32")
    return f32


def as_bytes(data: bytes, name: str) -> np.ndarray:
    """Encoded data as a read-only uint8 view (no copy)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CodecError(f"layer '{name}': data must be bytes, got {type(data).__name__}")
    return np.frombuffer(data, dtype=np.uint8)
