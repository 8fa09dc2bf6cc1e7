"""The delta codec: a layer as its difference from a base both ends hold, quantised to polyline's error bound and
entropy-coded with zstd.

An update is sent against the model its task carried, exactly as the receiver decodes it (never a rounded copy of
an earlier update), so each message's error is bounded on its own and nothing accumulates over rounds. A whole
model (a global model, which no pool worker holds an earlier version of) is the same thing against the zero model.

Layout of a layer's `data` (integers little-endian; docs/wire-format.md §5.4 is the normative text)::

    offset size field
    0      1    format: 1
    1      1    base: 0 = the zero model, 1 = the message's base model (an update: the model its task carried)
    2      1    kind: 0 = quantised, 1 = exact (the float32 bit patterns XOR the base's), 2 = grid-times and
                3 = grid-over (a model on a grid, lossless against the base's integers on that grid)
    3      1    shift s: low bits of each value in a plane of their own (quantised, grid: 0..7; exact: 0)
    4      1    width w: bytes per value of the rest, z >> s (quantised, grid: 1..8; exact: 4)
    5      8    step: float64 (quantised, grid-times: 0 < step <= 10**-p; exact: 0.0; grid-over: 10**p)
    13     ...  one zstd frame that declares its content size, n * (w + (s > 0)) bytes, in C order: when s > 0 a
                plane of n bytes holding the low s bits of every value, then w byte planes of z >> s, plane j
                holding byte j (least significant first)

Quantised: ``q = rint((x - b) / step)`` in float64, sent zig-zagged (``z = (q << 1) ^ (q >> 63)``); decoded as
``float32(b + q * step)`` in float64 arithmetic (x the client's float32 weight, b the base's). The step is 10**-p
less a margin for the float64 steps and the final float32 rounding (see `_step`), so every decoded value is within
0.5 * 10**-p of the weight the client computed: the bound holds after the float32 rounding, not only before it.
When float32 cannot honour the bound at that precision (|x| * 2**-24 close to 0.5 * 10**-p), or a value is too far
from the base for 61 bits, the layer is sent exact instead: its float32 bits XOR the base's, error 0.

Grid: a model whose every value is ``float32(k * step)`` (grid-times: a delta layer sent whole) or
``float32(k / 10**p)`` (grid-over: a polyline layer) for integers k, sent to a receiver that holds an earlier model:
the integers are sent as ``q = k - rint(b * 10**p)`` or ``k - rint(b / step)`` in float64 (the base's integers on the
same grid), and the receiver rebuilds k and the value by the same formulas. It is lossless: the receiver holds the
model bit for bit as if it had been sent whole, so a global model can go to a client against the version it holds
and nothing drifts (`encode_on_grid` refuses a model that is not exactly on its grid).

Planes let zstd's entropy coder (Huffman, at least a bit per byte) see the nearly uniform low bits apart from the
skewed high ones. Where values need more than a byte but z >> s would fit in one, with s the bit length of the mean
z less 4, the encoder splits off those s low bits: splitting at the byte instead leaves a high byte of ~1.5 bits of
entropy that Huffman codes in ~2 (1.5-5 % of an update at p=4; elsewhere the split costs more than it saves, so
there is none). It ends a zstd block at each plane so that each gets its own Huffman table.

A receiver never inflates more than the layer's own shape needs: the frame's header must declare exactly the bytes
that shape needs, checked before decompression, and callers check the shape against the model they hold first.
The frame carries zstd's content checksum, so a corrupted payload is refused rather than decoded into another
model (the message as a whole is covered by its signature).
"""

from __future__ import annotations

import math
import struct

import numpy as np
import zstandard

from fedat.errors import CodecError
from fedat.protocol.layercheck import as_bytes, as_float32, check_precision, check_shape

__all__ = [
    "FORMAT",
    "GRID_OVER",
    "GRID_TIMES",
    "HEADER",
    "LEVEL",
    "decode_delta",
    "encode_delta",
    "encode_on_grid",
    "header",
]

FORMAT = 1
BASE_ZERO, BASE_MESSAGE = 0, 1
QUANTISED, EXACT, GRID_TIMES, GRID_OVER = 0, 1, 2, 3
GRIDS = (GRID_TIMES, GRID_OVER)
HEADER = struct.Struct("<BBBBBd")  # format, base, kind, shift, width, step: 13 bytes
# zstd level 1: on these planes as small as level 3 or 19 (within 1 %), 1.5x level 3's speed and 40x level 19's;
# 9 % smaller than zlib (bench/bench_codec.py).
LEVEL = 1
# |q| < 2**61, as polyline's bound: zig-zag values then fit 62 bits, every step exact in int64/uint64.
MAX_Q = 2**61
# The frame's window; zstd's own default limit, so any standard encoder's frame is accepted.
MAX_WINDOW = 2**27
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
# float32's relative rounding error is 2**-24; the float64 steps of encoder and decoder add a few 2**-53 each.
_F32 = 2.0**-24
_F64 = 2.0**-48


def header(data: bytes) -> tuple[int, int, int, int, int, float]:
    """(format, base, kind, shift, width, step) of an encoded layer, unchecked."""
    return HEADER.unpack_from(data)


def _step(precision: int, top: float, spread: float) -> float:
    """The largest quantisation step whose decoded values stay within 0.5 * 10**-p after every rounding.

    With step s the quantisation error is at most s/2; decoding adds the float32 rounding of a value of magnitude at
    most top + 0.5 * 10**-p (2**-24 relative) and the float64 roundings of (x - b) / s, q * s and b + q * s (a few
    2**-53 of top + spread). Twice the budget left after those is the step.
    """
    half = 0.5 * 10.0**-precision
    return 2.0 * (half - _F32 * (top + 2.0 * half) - _F64 * (top + spread))


def _planes(z: np.ndarray, shift: int, width: int) -> list[bytes]:
    """The low `shift` bits of unsigned ints as one plane (if any), then the byte planes of the rest."""
    out = []
    if shift:
        out.append((z & (1 << shift) - 1).astype(np.uint8).tobytes())
        z = z >> shift
    if width == 1:
        return [*out, z.astype(np.uint8).tobytes()]
    wide = next(w for w in (1, 2, 4, 8) if w >= width)
    cols = z.astype(_UINT[wide], copy=False).view(np.uint8).reshape(-1, wide)
    return out + [cols[:, j].tobytes() for j in range(width)]


def _compress(planes: list[bytes], level: int) -> bytes:
    size = sum(len(p) for p in planes)
    cobj = zstandard.ZstdCompressor(level=level, write_checksum=True, write_content_size=True).compressobj(size=size)
    out = []
    for j, plane in enumerate(planes):
        out.append(cobj.compress(plane))
        if j + 1 < len(planes):  # the last plane ends with the frame itself
            out.append(cobj.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK))
    out.append(cobj.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH))
    return b"".join(out)


def _check_base(base: np.ndarray | None, dims: tuple[int, ...], name: str) -> np.ndarray | None:
    if base is None:
        return None
    b = as_float32(base, name)
    if b.shape != dims:
        raise CodecError(f"layer '{name}': base has shape {b.shape}, the layer {dims}")
    if not np.isfinite(b).all():
        raise CodecError(f"layer '{name}': the base holds NaN or inf")
    return b


def encode_delta(
    values: np.ndarray, base: np.ndarray | None = None, precision: int = 4, name: str = "layer", level: int = LEVEL
) -> bytes:
    """Encode a layer against `base` (None: the zero model), every decoded value within 0.5 * 10**-precision."""
    p = check_precision(precision, name)
    x = as_float32(values, name)
    b = _check_base(base, x.shape, name)
    flat = x.reshape(-1)
    # max/min propagate NaN, so one pair of reductions screens NaN and inf and gives the magnitude.
    top = max(float(flat.max(initial=0.0)), -float(flat.min(initial=0.0)))
    if not math.isfinite(top):
        bad = int(np.flatnonzero(~np.isfinite(flat))[0])
        raise CodecError(f"layer '{name}': {flat[bad]} at flat index {bad}")
    base_kind = BASE_ZERO if b is None else BASE_MESSAGE
    d = flat.astype(np.float64)
    if b is not None:
        d -= b.reshape(-1)
    spread = max(float(d.max(initial=0.0)), -float(d.min(initial=0.0)))
    step = _step(p, top, spread)
    # One bit more than 10**-p asks for is the most a quantised layer may cost; past that (or past 61 bits) the
    # layer goes exact, which also covers precisions finer than float32 resolves at this magnitude.
    if step >= 0.5 * 10.0**-p and spread / step < MAX_Q - 1:
        d /= step
        np.rint(d, out=d)
        z, shift, width = _zigzag(d, spread / step)
        kind = QUANTISED
    else:
        bits = flat.view(np.uint32)
        z = bits if b is None else bits ^ b.reshape(-1).view(np.uint32)
        shift, width, step, kind = 0, 4, 0.0, EXACT
    return HEADER.pack(FORMAT, base_kind, kind, shift, width, step) + _compress(_planes(z, shift, width), level)


def _zigzag(q: np.ndarray, top: float) -> tuple[np.ndarray, int, int]:
    """Integers in float64 (|q| <= top < 2**61) as zig-zag unsigned ints, with the shift and width to plane them."""
    # Zig-zag in int32 when |q| < 2**30 (every update at a sane precision): half the memory traffic of int64.
    q = q.astype(np.int32 if top < 2**30 else np.int64)
    sign = q >> (8 * q.itemsize - 1)
    q <<= 1
    q ^= sign
    z = q.view(np.uint32 if q.itemsize == 4 else np.uint64)
    top_z = int(z.max(initial=0))
    z = z.astype(next(t for t in (np.uint8, np.uint16, np.uint32, np.uint64) if top_z < 1 << (8 * t().itemsize)))
    shift = min(7, max(0, int(z.mean()).bit_length() - 4)) if top_z >= 256 else 0
    if top_z >> shift >= 256:
        shift = 0  # split off low bits only where that leaves the rest in one plane (see the module docstring)
    width = max(1, -(-(top_z >> shift).bit_length() // 8))
    return z, shift, width


def _on_grid(k: np.ndarray, kind: int, step: float) -> np.ndarray:
    """float32 values of grid integers k (float64): k * step (grid-times) or k / step (grid-over, step = 10**p)."""
    v = k * step if kind == GRID_TIMES else k / step
    return v.astype(np.float32)


def _grid_ints(x: np.ndarray, kind: int, step: float) -> np.ndarray:
    """The nearest grid integers of float32 values, in float64."""
    v = x.astype(np.float64)
    v = v / step if kind == GRID_TIMES else v * step
    return np.rint(v, out=v)


def encode_on_grid(
    values: np.ndarray, base: np.ndarray, kind: int, step: float, name: str = "layer", level: int = LEVEL
) -> bytes | None:
    """Encode a model that lies exactly on a grid against the receiver's `base`, losslessly; None if it is not on it.

    `kind` GRID_TIMES: every value is float32(k * step) (a delta layer sent whole, `step` from its header);
    GRID_OVER: float32(k / step) with step = 10**p (a polyline layer at precision p).
    """
    if kind not in GRIDS or not (math.isfinite(step) and step > 0.0):
        raise CodecError(f"layer '{name}': grid kind {kind} with step {step!r}")
    x = as_float32(values, name)
    b = _check_base(base, x.shape, name)
    flat = x.reshape(-1)
    if not np.isfinite(flat).all():
        return None
    k = _grid_ints(flat, kind, step)
    if np.abs(k).max(initial=0.0) >= 2.0**52 or not np.array_equal(
        _on_grid(k, kind, step).view(np.uint32), flat.view(np.uint32)
    ):
        return None  # not exactly on the grid: only a whole model can carry it
    q = k - _grid_ints(b.reshape(-1), kind, step)
    top = float(np.abs(q).max(initial=0.0))
    if top >= MAX_Q - 1:
        return None
    z, shift, width = _zigzag(q, top)
    return HEADER.pack(FORMAT, BASE_MESSAGE, kind, shift, width, step) + _compress(_planes(z, shift, width), level)


def _fail(name: str, why: str) -> CodecError:
    return CodecError(f"layer '{name}': {why}")


def _inflate(frame: bytes, expected: int, name: str) -> np.ndarray:
    """The frame's content, refused before any inflation unless its header declares exactly `expected` bytes."""
    if frame[:4] != _ZSTD_MAGIC:
        raise _fail(name, "delta data does not hold a zstd frame after its header")
    try:
        params = zstandard.get_frame_parameters(frame)
    except zstandard.ZstdError as exc:
        raise _fail(name, f"unreadable zstd frame header ({exc})") from None
    if params.content_size == zstandard.CONTENTSIZE_UNKNOWN:
        raise _fail(name, "the zstd frame does not declare its content size")
    if params.content_size != expected:
        raise _fail(name, f"the zstd frame declares {params.content_size} bytes, the layer's shape needs {expected}")
    if params.dict_id:
        raise _fail(name, f"the zstd frame needs dictionary {params.dict_id}; delta frames use none")
    if params.window_size > MAX_WINDOW:
        raise _fail(name, f"the zstd frame's window of {params.window_size} bytes exceeds {MAX_WINDOW}")
    if expected == 0:
        return np.zeros(0, np.uint8)
    try:
        out = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW).decompress(frame, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise _fail(name, f"corrupt zstd frame ({exc})") from None
    if len(out) != expected:
        raise _fail(name, f"the zstd frame inflated to {len(out)} bytes, the layer's shape needs {expected}")
    return np.frombuffer(out, dtype=np.uint8)


def decode_delta(
    data: bytes, shape: tuple[int, ...], base: np.ndarray | None = None, precision: int = 4, name: str = "layer"
) -> np.ndarray:
    """Decode a delta layer into float32 of `shape`; a layer sent against the message's base needs that `base`."""
    p = check_precision(precision, name)
    dims, n = check_shape(shape, name)
    raw = as_bytes(data, name)
    if raw.size < HEADER.size:
        raise _fail(name, f"delta data of {raw.size} bytes is shorter than its {HEADER.size}-byte header")
    fmt, base_kind, kind, shift, width, step = HEADER.unpack_from(raw)
    if fmt != FORMAT:
        raise _fail(name, f"delta format {fmt}, this code reads {FORMAT}")
    if base_kind not in (BASE_ZERO, BASE_MESSAGE):
        raise _fail(name, f"unknown delta base {base_kind} (0 = zero model, 1 = the message's base model)")
    if kind == QUANTISED or kind in GRIDS:
        what = "quantised" if kind == QUANTISED else "grid"
        if kind in GRIDS and base_kind != BASE_MESSAGE:
            raise _fail(name, f"grid kind {kind} is sent against the message's base model, not the zero model")
        if not 1 <= width <= 8:
            raise _fail(name, f"{what} width {width} outside 1..8")
        if not 0 <= shift <= 7 or 8 * width + shift > 64:
            raise _fail(name, f"{what} shift {shift} outside 0..7, or with width {width} beyond 64 bits")
        if kind == GRID_OVER:
            if step != float(10**p):
                raise _fail(name, f"grid-over step {step!r} is not 10**{p}")
        # A step coarser than the stated precision would break the promised bound: refuse rather than accept it.
        elif not 0.0 < step <= 10.0**-p * (1 + 2.0**-40):
            raise _fail(name, f"step {step!r} is not within (0, 10**-{p}]")
    elif kind == EXACT:
        if width != 4 or step != 0.0 or shift != 0:
            raise _fail(name, f"exact layer with shift {shift}, width {width}, step {step!r} (needs 0, 4 and 0.0)")
    else:
        raise _fail(name, f"unknown delta kind {kind} (0 = quantised, 1 = exact, 2 = grid-times, 3 = grid-over)")
    if base_kind == BASE_MESSAGE and base is None:
        raise _fail(name, "sent against the message's base model, but no base was given to decode it")
    b = _check_base(base, dims, name) if base_kind == BASE_MESSAGE else None

    low = 1 if shift else 0
    planes = _inflate(bytes(raw[HEADER.size :]), n * (low + width), name).reshape(low + width, n)
    # Up to 3 bytes above a shift of at most 7 bits stay below 2**31: uint32, and the int32 zig-zag below.
    acc = np.uint32 if width <= 3 or (width == 4 and not shift) else np.uint64
    z = planes[low].astype(acc)
    for j in range(1, width):
        part = planes[low + j].astype(acc)
        part <<= 8 * j
        z |= part
    if shift:
        if int(planes[0].max(initial=0)) >> shift:
            raise _fail(name, f"the low plane holds values of more than {shift} bits")
        z <<= shift
        z |= planes[0].astype(acc)
    if kind == EXACT:
        bits = z if b is None else z ^ b.reshape(-1).view(np.uint32)
        out = bits.view(np.float32)
        if not np.isfinite(out).all():
            i = int(np.flatnonzero(~np.isfinite(out))[0])
            raise _fail(name, f"value {i} decodes to {out[i]}, not a finite float32")
        return out.reshape(dims)
    if 8 * width + shift > 62 and n and int(z.max()) >= 2 * MAX_Q:
        # Zig-zag values below 2**62 are |q| <= 2**61: the arithmetic shift below cannot be fooled by the sign bit.
        i = int(np.flatnonzero(z >= np.uint64(2 * MAX_Q))[0])
        raise _fail(name, f"value {i} exceeds the bound: zig-zag values must be below 2**62")
    # Undo zig-zag in int32 while it fits (up to 3 bytes), else in int64.
    zs = z.view(np.int32) if width <= 3 else z.astype(np.uint64, copy=False).view(np.int64)
    q = zs >> 1
    q ^= -(zs & 1)
    if kind in GRIDS:
        k = _grid_ints(b.reshape(-1), kind, step)
        k += q
        out = _on_grid(k, kind, step)
        if not np.isfinite(out).all():
            i = int(np.flatnonzero(~np.isfinite(out))[0])
            raise _fail(name, f"value {i} decodes to {out[i]}, not a finite float32")
        return out.reshape(dims)
    v = q.astype(np.float64)
    v *= step
    if b is not None:
        v += b.reshape(-1)
    # |q| < 2**61 and step <= 1 keep |v| far below float32's range: no value can overflow.
    return v.astype(np.float32).reshape(dims)
