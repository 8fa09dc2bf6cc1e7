"""Tests for fedat.protocol.codec, using the polyline 2.0.4 package as the byte-level oracle."""

from __future__ import annotations

import math
import re
from contextlib import AbstractContextManager

import numpy as np
import polyline
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fedat.protocol.codec import (
    CODECS,
    MAX_PRECISION,
    MAX_SCALED,
    MIN_PRECISION,
    Codec,
    CodecError,
    decode_layer,
    decode_raw,
    encode_layer,
    encode_raw,
)

PRECISIONS = range(MIN_PRECISION, MAX_PRECISION + 1)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _flat_pairs(values: np.ndarray) -> list[tuple[float, float]]:
    # Python floats (exact float64 copies of the float32 values): handing the package np.float32
    # scalars would make it multiply in float32 under NumPy 2's promotion rules.
    flat = np.asarray(values).reshape(-1).astype(np.float64).tolist()
    if len(flat) % 2:
        flat.append(0.0)
    return list(zip(flat[0::2], flat[1::2], strict=True))


def oracle_encode(values: np.ndarray, precision: int) -> bytes:
    pairs = _flat_pairs(values)
    # The package cannot encode an empty list (it indexes coordinates[0]); ours maps it to b"".
    return polyline.encode(pairs, precision).encode("ascii") if pairs else b""


def oracle_decode(data: bytes, size: int, precision: int) -> np.ndarray:
    pairs = polyline.decode(data.decode("ascii"), precision)
    return np.asarray(pairs, dtype=np.float64).reshape(-1)[:size].astype(np.float32)


def _fits(x: np.float32, precision: int) -> bool:
    return math.floor(abs(float(x) * 10**precision) + 0.5) < MAX_SCALED


def largest_encodable(precision: int) -> np.float32:
    """Largest float32 whose scaled, rounded magnitude stays below MAX_SCALED."""
    x = np.float32(MAX_SCALED / 10**precision)
    while _fits(np.nextafter(x, np.float32(np.inf)), precision):
        x = np.nextafter(x, np.float32(np.inf))
    while not _fits(x, precision):
        x = np.nextafter(x, np.float32(0))
    return x


def zigzag_chunks(values: list[int]) -> bytes:
    """Reference polyline varint writer for arbitrary ints, used to forge malformed streams."""
    out = bytearray()
    for v in values:
        z = ~(v << 1) if v < 0 else v << 1
        while z >= 0x20:
            out.append((0x20 | (z & 0x1F)) + 63)
            z >>= 5
        out.append(z + 63)
    return bytes(out)


@st.composite
def layers(draw: st.DrawFn, max_side: int = 7) -> tuple[np.ndarray, int]:
    precision = draw(st.integers(MIN_PRECISION, MAX_PRECISION))
    scale = 10.0**precision
    limit = float(largest_encodable(precision))
    ties = st.integers(-(2**20), 2**20).map(
        # (2k+1) / 2**(p+1) is a dyadic float32 whose product with 10**p is exactly (2k+1) * 5**p / 2.
        lambda k: (2 * k + 1) / 2 ** (precision + 1)
    )
    # Nearest float32 to (k + 0.5) / 10**p: scaled back up, these land within an ulp of a tie.
    near_ties = st.integers(-(10**6), 10**6).map(lambda k: float(np.float32((k + 0.5) / scale)))
    elements = st.one_of(
        st.floats(-1.0, 1.0, width=32),
        st.floats(-limit, limit, width=32),
        ties.filter(lambda v: abs(v) <= limit),
        near_ties.filter(lambda v: abs(v) <= limit),
        st.sampled_from([0.0, -0.0, limit, -limit, float(np.float32(0.5 / scale)), float(np.float32(-0.5 / scale))]),
    )
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=max_side))
    values = draw(hnp.arrays(np.float32, shape, elements=elements))
    return values, precision


@FAST
@given(layers())
def test_encode_matches_polyline_package(case: tuple[np.ndarray, int]) -> None:
    values, precision = case
    assert encode_layer(values, precision) == oracle_encode(values, precision)


@settings(max_examples=12, deadline=None)
@given(
    st.integers(MIN_PRECISION, MAX_PRECISION),
    st.integers(9_000, 11_001),
    st.sampled_from([1e-3, 0.05, 1.0, 300.0]),
    st.integers(0, 2**32 - 1),
)
def test_large_layers_match_polyline_package(precision: int, size: int, sigma: float, seed: int) -> None:
    values = np.random.default_rng(seed).normal(0.0, sigma, size).astype(np.float32)
    data = encode_layer(values, precision)
    assert data == oracle_encode(values, precision)
    np.testing.assert_array_equal(decode_layer(data, values.shape, precision), oracle_decode(data, size, precision))


@pytest.mark.parametrize("precision", PRECISIONS)
def test_exact_ties_round_half_away_from_zero(precision: int) -> None:
    k = np.arange(-50, 51)
    values = ((2 * k + 1) / 2 ** (precision + 1)).astype(np.float32)
    scaled = values.astype(np.float64) * 10**precision
    assert np.all(scaled % 1 == 0.5)  # genuinely exact ties
    data = encode_layer(values, precision)
    assert data == oracle_encode(values, precision)
    expected = np.copysign(np.floor(np.abs(scaled) + 0.5), scaled) / 10**precision
    np.testing.assert_array_equal(decode_layer(data, values.shape, precision), expected.astype(np.float32))


@pytest.mark.parametrize("precision", PRECISIONS)
def test_magnitudes_at_the_bound(precision: int) -> None:
    top = largest_encodable(precision)
    # Alternating extremes make every delta ~2**62, the widest zig-zag value the format allows.
    values = np.array([top, -top, -top, top, top, -top, 0.0], dtype=np.float32)
    data = encode_layer(values, precision, name="edge")
    assert data == oracle_encode(values, precision)
    np.testing.assert_array_equal(
        decode_layer(data, values.shape, precision), oracle_decode(data, values.size, precision)
    )
    over = np.nextafter(top, np.float32(np.inf))
    with pytest.raises(CodecError, match="edge"):
        encode_layer(np.array([0.0, over], dtype=np.float32), precision, name="edge")


def test_float64_rounding_quirks_match_package() -> None:
    # fabs(y) + 0.5 rounds in float64: just below a half rounds up, odd ints in [2**52, 2**53) go even.
    values = np.array([0.49999999999999994, -0.49999999999999994, 2.0**52 + 1, -(2.0**52 + 3)])
    rounded = [1, -1, 2**52 + 2, -(2**52 + 4)]
    deltas = [rounded[0], rounded[1], rounded[2] - rounded[0], rounded[3] - rounded[1]]
    assert encode_layer(values, 0) == oracle_encode(values, 0) == zigzag_chunks(deltas)


def test_negative_zero_encodes_as_zero() -> None:
    values = np.array([-0.0, -0.0, 0.0], dtype=np.float32)
    assert encode_layer(values) == oracle_encode(values, 4) == b"????"


@FAST
@given(layers())
def test_round_trip_within_half_a_unit(case: tuple[np.ndarray, int]) -> None:
    values, precision = case
    decoded = decode_layer(encode_layer(values, precision, name="w"), values.shape, precision, name="w")
    assert decoded.dtype == np.float32
    assert decoded.shape == values.shape
    x = values.astype(np.float64)
    # Half a unit of the last kept digit, plus float32 rounding of the decoded value.
    tol = 0.5 * 10.0**-precision * (1 + 1e-9) + np.abs(x) * 2.0**-23
    assert np.all(np.abs(decoded.astype(np.float64) - x) <= tol)


@FAST
@given(
    st.integers(MIN_PRECISION, MAX_PRECISION),
    st.lists(st.tuples(st.floats(-1e6, 1e6), st.floats(-1e6, 1e6)), min_size=1, max_size=60),
    st.booleans(),
)
def test_decodes_package_output_like_package(precision: int, pairs: list[tuple[float, float]], drop_pad: bool) -> None:
    # Pairs of arbitrary float64s, encoded by the package itself rather than by us.
    if drop_pad:
        pairs[-1] = (pairs[-1][0], 0.0)
    size = 2 * len(pairs) - int(drop_pad)
    text = polyline.encode(pairs, precision)
    decoded = decode_layer(text.encode("ascii"), (size,), precision)
    np.testing.assert_array_equal(decoded, oracle_decode(text.encode("ascii"), size, precision))


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 4, 2)])
def test_empty_layers(shape: tuple[int, ...]) -> None:
    values = np.zeros(shape, dtype=np.float32)
    assert encode_layer(values) == b""
    decoded = decode_layer(b"", shape)
    assert decoded.shape == shape and decoded.dtype == np.float32


def test_zero_dimensional_layer() -> None:
    value = np.array(0.1234, dtype=np.float32)
    data = encode_layer(value)
    assert data == oracle_encode(value, 4)
    decoded = decode_layer(data, ())
    assert decoded.shape == () and decoded == np.float32(0.1234)


def test_layout_is_c_order_for_non_contiguous_input() -> None:
    values = np.arange(12, dtype=np.float32).reshape(3, 4).T / 7
    assert not values.flags.c_contiguous
    assert encode_layer(values) == oracle_encode(np.ascontiguousarray(values), 4)
    np.testing.assert_allclose(decode_layer(encode_layer(values), values.shape), values, atol=5e-5)


def test_integer_and_float16_inputs_are_accepted() -> None:
    ints = np.arange(-5, 6, dtype=np.int32)
    assert encode_layer(ints, 2) == oracle_encode(ints.astype(np.float64), 2)
    halves = np.linspace(-2, 2, 9, dtype=np.float16)
    assert encode_layer(halves, 3) == oracle_encode(halves, 3)


# --- errors -------------------------------------------------------------------------------------


def _raises(name: str) -> AbstractContextManager[pytest.ExceptionInfo[CodecError]]:
    return pytest.raises(CodecError, match=re.escape(name))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 1e30, -3e19])
def test_unencodable_values(bad: float) -> None:
    values = np.array([0.1, 0.2, bad], dtype=np.float32)
    with _raises("conv1/kernel"):
        encode_layer(values, 4, name="conv1/kernel")


@pytest.mark.parametrize("precision", [-1, 9, 4.0, "4", None, True])
def test_bad_precision(precision: object) -> None:
    with _raises("dense"):
        encode_layer(np.zeros(2, np.float32), precision, name="dense")  # type: ignore[arg-type]
    with _raises("dense"):
        decode_layer(b"????", (2,), precision, name="dense")  # type: ignore[arg-type]


@pytest.mark.parametrize("values", [np.array(["a"]), np.array([1 + 2j]), [[1.0], [1.0, 2.0]]])
def test_bad_dtype(values: object) -> None:
    with _raises("emb"):
        encode_layer(values, name="emb")  # type: ignore[arg-type]
    with _raises("emb"):
        encode_raw(values, name="emb")  # type: ignore[arg-type]


@pytest.mark.parametrize("data", [b"\x80?", b"?>", b"?\x7f", "????".encode("utf-16"), b"?\n"])
def test_invalid_bytes(data: bytes) -> None:
    with _raises("bias"):
        decode_layer(data, (2,), name="bias")


def test_non_bytes_data() -> None:
    with _raises("bias"):
        decode_layer("????", (2,), name="bias")  # type: ignore[arg-type]


def test_truncated_data() -> None:
    data = encode_layer(np.array([12.345, -6.789], dtype=np.float32), 4)
    assert data[-2] >= 95  # multi-chunk value, so dropping its tail leaves a continuation byte last
    with _raises("head"):
        decode_layer(data[:-1], (2,), name="head")
    with _raises("head"):
        decode_layer(b"_", (1,), name="head")


@pytest.mark.parametrize(("shape", "reason"), [((3,), "needs 4"), ((5,), "needs 6"), ((2, 3), "needs 6")])
def test_value_count_mismatch(shape: tuple[int, ...], reason: str) -> None:
    data = encode_layer(np.ones(2, dtype=np.float32))
    with pytest.raises(CodecError, match=rf"out.*{reason}"):
        decode_layer(data, shape, name="out")


def test_nonzero_pad_value_rejected() -> None:
    data = encode_layer(np.ones(2, dtype=np.float32))
    with _raises("out"):
        decode_layer(data, (1,), name="out")


def test_empty_data_for_nonempty_shape_and_vice_versa() -> None:
    with _raises("out"):
        decode_layer(b"", (1,), name="out")
    with _raises("out"):
        decode_layer(b"????", (0,), name="out")


@pytest.mark.parametrize("shape", [(-1, 2), 4, (1.5,), None])
def test_bad_shape(shape: object) -> None:
    with _raises("s"):
        decode_layer(b"????", shape, name="s")  # type: ignore[arg-type]
    with _raises("s"):
        decode_raw(b"\0" * 8, shape, name="s")  # type: ignore[arg-type]


def test_values_wider_than_the_format() -> None:
    with _raises("big"):
        decode_layer(b"_" * 13 + b"?" + b"?", (2,), name="big")  # 14 chunks
    with _raises("big"):
        decode_layer(b"_" * 12 + bytes([63 + 8]) + b"?", (2,), name="big")  # 13th chunk > 3 bits
    # Each delta is legal on its own, but their running sum leaves the +-2**61 bound.
    step = MAX_SCALED - 1
    with _raises("big"):
        decode_layer(zigzag_chunks([step, 0, step, 0]), (4,), name="big")
    with _raises("big"):
        decode_layer(zigzag_chunks([-step, 0, -(2**62), 0]), (4,), name="big")
    # Package output beyond our bound is refused rather than wrapped.
    with _raises("big"):
        decode_layer(polyline.encode([(1e30, 0.0)], 4).encode(), (2,), name="big")


def test_raw_length_mismatch() -> None:
    with _raises("raw_layer"):
        decode_raw(b"\0" * 7, (2,), name="raw_layer")
    with _raises("raw_layer"):
        decode_raw(b"\0" * 12, (2,), name="raw_layer")


def test_raw_rejects_float32_overflow() -> None:
    with _raises("r"):
        encode_raw(np.array([1e300]), name="r")


def test_codec_error_is_value_error() -> None:
    assert issubclass(CodecError, ValueError)


# --- raw and registry ---------------------------------------------------------------------------


@FAST
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6)))
def test_raw_round_trips_bit_exactly(values: np.ndarray) -> None:
    data = encode_raw(values)
    assert len(data) == 4 * values.size
    decoded = decode_raw(data, values.shape)
    assert decoded.dtype == np.float32 and decoded.shape == values.shape
    np.testing.assert_array_equal(decoded.view(np.uint32), values.view(np.uint32))


def test_raw_is_little_endian_float32() -> None:
    assert encode_raw(np.array([1.0, -2.0], dtype=">f8")) == np.array([1.0, -2.0], dtype="<f4").tobytes()


def test_registry() -> None:
    assert set(CODECS) == {"polyline", "raw", "delta"}
    assert [key for key, codec in CODECS.items() if codec.relative] == ["delta"]
    values = np.random.default_rng(1).normal(0, 0.05, (4, 5)).astype(np.float32)
    base = np.full((4, 5), 0.25, np.float32)
    for key, codec in CODECS.items():
        assert isinstance(codec, Codec) and codec.name == key
        data = codec.encode(values, 5, "reg")
        decoded = codec.decode(data, values.shape, 5, "reg")
        assert decoded.shape == values.shape and decoded.dtype == np.float32
        # Only a relative codec's bytes depend on the base; the others send every layer whole.
        assert (codec.encode(values, 5, "reg", base) != data) == codec.relative
        np.testing.assert_allclose(
            codec.decode(codec.encode(values, 5, "reg", base), (4, 5), 5, "reg", base), values, atol=5e-6
        )
    assert CODECS["polyline"].encode(values, 5, "reg") == encode_layer(values, 5)
    # raw ignores precision entirely, including out-of-range values.
    assert CODECS["raw"].encode(values, 99, "reg") == encode_raw(values)
    np.testing.assert_array_equal(CODECS["raw"].decode(encode_raw(values), (4, 5), 99, "reg"), values)
    with pytest.raises(AttributeError):
        codec.name = "other"  # type: ignore[misc]
