"""Layer codecs: Google Encoded Polyline (lossy, vectorised numpy), raw float32 (lossless baseline), and the
registry of every codec a layer may name (the delta codec lives in `fedat.protocol.deltacodec`).

Polyline wire format, byte-identical to ``polyline.encode(pairs, precision)`` of polyline 2.0.4 as ASCII:
the layer is flattened in C order, padded with one 0.0 when its length is odd and read as (lat, lng) pairs.
Each value ``x`` is converted exactly to float64 and rounded like the package's ``_py2_round``::

    y = float64(x) * float64(10**p)
    r = copysign(floor(fabs(y) + 0.5), y)      # every step in IEEE float64

i.e. half away from zero, but with the float64 quirks that implies (``fabs(y) + 0.5`` itself rounds, so
0.49999999999999994 -> 1 and odd integers in [2**52, 2**53) -> the next even one).  Value ``i`` of the
flat array is delta-encoded against value ``i - 2`` (the previous pair's same coordinate; the first pair
against 0), zig-zagged, split into 5-bit chunks little end first with 0x20 as continuation bit, plus 63.

Bound: ``|r| < 2**61`` (``MAX_SCALED``).  Deltas then satisfy ``|d| < 2**62`` so the zig-zag value is below
2**63 (at most 13 chunks) and every step stays exact in int64/uint64; the decoder enforces the same bound,
so anything one side accepts the other round-trips.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fedat.errors import CodecError
from fedat.protocol.deltacodec import decode_delta, encode_delta
from fedat.protocol.layercheck import (
    MAX_PRECISION,
    MIN_PRECISION,
    as_bytes,
    as_float32,
    as_real_array,
    check_precision,
    check_shape,
)

__all__ = [
    "CODECS",
    "MAX_PRECISION",
    "MAX_SCALED",
    "MIN_PRECISION",
    "Codec",
    "CodecError",
    "decode_layer",
    "decode_raw",
    "encode_layer",
    "encode_raw",
]

# Exclusive bound on |round(x * 10**p)|; see the module docstring for why 2**61.
MAX_SCALED = 2**61

_OFFSET = 63
_CONT = 0x20
_MASK = 0x1F
# A zig-zag value below 2**63 needs at most ceil(63 / 5) chunks.
_MAX_CHUNKS = 13


class _Encoder(Protocol):
    def __call__(self, values: np.ndarray, precision: int, name: str, base: np.ndarray | None = None) -> bytes: ...


class _Decoder(Protocol):
    def __call__(
        self, data: bytes, shape: tuple[int, ...], precision: int, name: str, base: np.ndarray | None = None
    ) -> np.ndarray: ...


@dataclass(frozen=True)
class Codec:
    """A named codec; the name travels with the data so the receiver can pick the decoder.

    A `relative` codec encodes a layer against the base it is given (the model both ends hold) and needs that base
    to decode it; the others send every layer whole and ignore any base.
    """

    name: str
    encode: _Encoder
    decode: _Decoder
    relative: bool = False


def _describe_unencodable(flat: np.ndarray, scaled: np.ndarray, precision: int, name: str) -> CodecError:
    # Slow path, only on failure: find the first offending value to make the message actionable.
    bad_nan = np.flatnonzero(np.isnan(flat))
    if bad_nan.size:
        return CodecError(f"layer '{name}': NaN at flat index {bad_nan[0]}")
    bad_inf = np.flatnonzero(np.isinf(flat))
    if bad_inf.size:
        return CodecError(f"layer '{name}': {flat[bad_inf[0]]} at flat index {bad_inf[0]}")
    i = int(np.flatnonzero(scaled >= MAX_SCALED)[0])
    return CodecError(
        f"layer '{name}': value {float(flat[i])!r} at flat index {i} too large for precision {precision} "
        f"(|round(x * 10**{precision})| must be < 2**61)"
    )


def encode_layer(values: np.ndarray, precision: int = 4, name: str = "layer") -> bytes:
    """Encode a layer as a Google Encoded Polyline (ASCII bytes), identical to polyline 2.0.4's output."""
    p = check_precision(precision, name)
    arr = as_real_array(values, name)
    n = arr.size
    if n == 0:
        return b""
    # float32 -> float64 is exact, matching float(v) handed to the package as a Python float.
    flat = np.empty(n + (n & 1), dtype=np.float64)
    flat[:n] = arr.reshape(-1)
    flat[n:] = 0.0

    # Replicate _py2_round step by step in float64 so every tie and rounding quirk matches bit for bit.
    y = flat
    y *= float(10**p)
    mag = np.abs(y)
    mag += 0.5
    np.floor(mag, out=mag)
    # max() propagates NaN, so one reduction screens NaN, inf and the magnitude bound together.
    if not mag.max() < MAX_SCALED:
        raise _describe_unencodable(arr.reshape(-1).astype(np.float64), mag, p, name)
    np.copysign(mag, y, out=mag)
    r = mag.astype(np.int64)

    d = np.empty_like(r)
    d[:2] = r[:2]
    np.subtract(r[2:], r[:-2], out=d[2:])
    # Zig-zag: (d << 1) for d >= 0, ~(d << 1) for d < 0; |d| < 2**62 so nothing is lost.
    sign = d >> 63
    d <<= 1
    d ^= sign
    z = d.view(np.uint64)

    zmax = int(z.max())
    nchunks = max(1, -(-zmax.bit_length() // 5))
    if zmax < 2**32:
        # Typical layers need <= 4 chunks; uint32 halves the memory traffic of the column loop.
        z = z.astype(np.uint32)
    # One column per chunk position, only as wide as the largest value needs; compressing with the
    # presence mask then drops absent chunks while keeping row-major (value, chunk) order.
    table = np.empty((z.size, nchunks), dtype=np.uint8)
    present = np.empty((z.size, nchunks), dtype=bool)
    present[:, 0] = True
    for k in range(nchunks):
        col = ((z >> (5 * k)) & _MASK).astype(np.uint8)
        # The last column never continues: zmax itself fits in nchunks chunks.
        if k + 1 < nchunks:
            # A plain int threshold keeps the comparison in z's own dtype (a numpy uint64 would upcast).
            more = z >= 1 << (5 * (k + 1))
            col |= more.view(np.uint8) << 5
            present[:, k + 1] = more
        col += _OFFSET
        table[:, k] = col
    if nchunks == 1:
        return table.tobytes()
    # np.compress on the flat views is several times faster than boolean fancy indexing here.
    return np.compress(present.reshape(-1), table.reshape(-1)).tobytes()


def decode_layer(data: bytes, shape: tuple[int, ...], precision: int = 4, name: str = "layer") -> np.ndarray:
    """Decode Google Encoded Polyline bytes into a float32 array of the given shape."""
    p = check_precision(precision, name)
    dims, size = check_shape(shape, name)
    raw = as_bytes(data, name)
    if raw.size == 0:
        if size != 0:
            raise CodecError(f"layer '{name}': empty data but shape {dims} needs {size} values")
        return np.zeros(dims, dtype=np.float32)

    nbytes = raw.size
    # Chunk values (byte - 63), zero-padded so the per-chunk gathers below never run off the end.
    c = np.zeros(nbytes + _MAX_CHUNKS, dtype=np.uint8)
    np.subtract(raw, np.uint8(_OFFSET), out=c[:nbytes])  # uint8 wraps bytes below 63 to >= 193
    if c.max() > 63:
        i = int(np.flatnonzero(c[:nbytes] > 63)[0])
        raise CodecError(f"layer '{name}': invalid byte 0x{raw[i]:02x} at offset {i} (must be 63..126)")
    if c[nbytes - 1] >= _CONT:
        raise CodecError(f"layer '{name}': truncated data (last chunk has the continuation bit set)")

    ends = np.flatnonzero(c[:nbytes] < _CONT)
    count = ends.size
    expected = size + (size & 1)
    if count != expected:
        raise CodecError(
            f"layer '{name}': decoded {count} values but shape {dims} needs {expected}"
            + (" (including one pad value)" if size & 1 else "")
        )
    starts = np.empty_like(ends)
    starts[0] = 0
    np.add(ends[:-1], 1, out=starts[1:])
    longest = int((ends - starts).max()) + 1
    if longest > _MAX_CHUNKS:
        i = int(np.flatnonzero(ends - starts >= _MAX_CHUNKS)[0])
        raise CodecError(f"layer '{name}': value {i} spans more than {_MAX_CHUNKS} chunks")

    # Assemble values one chunk position at a time (a loop over <= 13 positions, never over values).
    # `alive` tracks whether the previous chunk of each value had its continuation bit set, which
    # masks out bytes that already belong to the next value. Six chunks (30 bits) fit in uint32.
    acc = np.uint32 if longest <= 6 else np.uint64
    head = c[starts]
    z = (head & np.uint8(_MASK)).astype(acc)
    alive = head >> 5
    idx = starts
    chunk = np.empty_like(head)
    for k in range(1, longest):
        idx = idx + 1 if k == 1 else np.add(idx, 1, out=idx)
        np.take(c, idx, out=chunk)
        part = chunk & np.uint8(_MASK)
        part *= alive
        if k == _MAX_CHUNKS - 1 and part.max() > 7:
            # The 13th chunk holds bits 60..64; anything above 3 bits would reach 2**63.
            i = int(np.flatnonzero(part > 7)[0])
            raise CodecError(f"layer '{name}': value {i} overflows 64 bits")
        wide = part.astype(acc)
        wide <<= 5 * k
        z |= wide
        chunk >>= 5
        alive &= chunk

    # Undo zig-zag: ~(z >> 1) when the low bit is set; z < 2**63 so the signed view is safe.
    sign = z & acc(1)
    z >>= 1
    signed = np.int32 if acc is np.uint32 else np.int64
    d = z.view(signed)
    d ^= np.negative(sign.view(signed))
    # Cumulative sums per coordinate. Each |delta| <= 2**62, so the first prefix sum to leave
    # (-2**61, 2**61) is still exact in int64 and the bound check below cannot be fooled by wraparound.
    r = np.cumsum(d.reshape(-1, 2), axis=0, dtype=np.int64).reshape(-1)
    if r.max() >= MAX_SCALED or r.min() <= -MAX_SCALED:
        # Compare both signs rather than abs(): a wrapped sum may be -2**63, whose abs() is negative.
        i = int(np.flatnonzero((r >= MAX_SCALED) | (r <= -MAX_SCALED))[0])
        raise CodecError(f"layer '{name}': value {i} exceeds the bound |round(x * 10**p)| < 2**61")
    if size & 1 and r[-1] != 0:
        raise CodecError(f"layer '{name}': pad value is {r[-1]}, expected 0")

    # int -> float64, divide, then round to float32: the package's `lat / factor` plus a float32 cast.
    out = np.empty(dims, dtype=np.float32)
    np.divide(r[:size], float(10**p), out=out.reshape(-1), dtype=np.float64, casting="same_kind")
    return out


def encode_raw(values: np.ndarray, name: str = "layer") -> bytes:
    """Encode a layer losslessly as little-endian float32 bytes in C order."""
    return as_float32(values, name).astype("<f4", copy=False).tobytes(order="C")


def decode_raw(data: bytes, shape: tuple[int, ...], name: str = "layer") -> np.ndarray:
    """Decode little-endian float32 bytes into a float32 array of the given shape."""
    dims, size = check_shape(shape, name)
    raw = as_bytes(data, name)
    if raw.size != 4 * size:
        raise CodecError(f"layer '{name}': {raw.size} bytes but shape {dims} needs {4 * size}")
    return raw.view("<f4").astype(np.float32).reshape(dims)


def _raw_encode(values: np.ndarray, precision: int = 4, name: str = "layer", base: np.ndarray | None = None) -> bytes:
    # Raw is lossless and whole; precision and base are accepted only so all codecs share one call signature.
    return encode_raw(values, name)


def _raw_decode(
    data: bytes, shape: tuple[int, ...], precision: int = 4, name: str = "layer", base: np.ndarray | None = None
) -> np.ndarray:
    return decode_raw(data, shape, name)


def _polyline_encode(
    values: np.ndarray, precision: int = 4, name: str = "layer", base: np.ndarray | None = None
) -> bytes:
    # Polyline always sends the layer whole.
    return encode_layer(values, precision, name)


def _polyline_decode(
    data: bytes, shape: tuple[int, ...], precision: int = 4, name: str = "layer", base: np.ndarray | None = None
) -> np.ndarray:
    return decode_layer(data, shape, precision, name)


def _delta_encode(values: np.ndarray, precision: int = 4, name: str = "layer", base: np.ndarray | None = None) -> bytes:
    return encode_delta(values, base, precision, name)


def _delta_decode(
    data: bytes, shape: tuple[int, ...], precision: int = 4, name: str = "layer", base: np.ndarray | None = None
) -> np.ndarray:
    return decode_delta(data, shape, base, precision, name)


CODECS: dict[str, Codec] = {
    "polyline": Codec("polyline", _polyline_encode, _polyline_decode),
    "raw": Codec("raw", _raw_encode, _raw_decode),
    "delta": Codec("delta", _delta_encode, _delta_decode, relative=True),
}
