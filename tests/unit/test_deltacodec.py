"""The delta codec: round trips within polyline's bound, no accumulation over versions, malformed and bomb payloads."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fedat.protocol.codec import CodecError, decode_layer, encode_layer
from fedat.protocol.deltacodec import (
    EXACT,
    GRID_OVER,
    GRID_TIMES,
    HEADER,
    QUANTISED,
    decode_delta,
    encode_delta,
    encode_on_grid,
    header,
)

F32_MAX = float(np.finfo(np.float32).max)
FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def bound(precision: int) -> float:
    return 0.5 * 10.0**-precision


def error(decoded: np.ndarray, values: np.ndarray) -> np.ndarray:
    return np.abs(decoded.astype(np.float64) - values.astype(np.float64))


# Magnitudes from tiny to where float32 cannot resolve 10**-p any more (there the layer goes exact), plus huge ones
# that overflow 61 bits of quantisation.
ELEMENTS = st.one_of(
    st.floats(-0.125, 0.125, width=32),
    st.floats(-1.0, 1.0, width=32),
    st.floats(-3000.0, 3000.0, width=32),
    st.floats(-F32_MAX, F32_MAX, width=32),
    st.sampled_from([0.0, -0.0, 5e-5, -5e-5, 1.5e-4, 2.5e-4, np.float32(1e-45)]),
)


@st.composite
def layer_and_base(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray | None, int]:
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=8))
    values = draw(hnp.arrays(np.float32, shape, elements=ELEMENTS))
    kind = draw(st.sampled_from(["none", "near", "independent"]))
    if kind == "none":
        base = None
    elif kind == "near":  # what an update is: the base plus a small step
        steps = draw(hnp.arrays(np.float32, shape, elements=st.floats(-0.0625, 0.0625, width=32)))
        base = values
        with np.errstate(over="ignore"):
            values = np.asarray(values + steps, dtype=np.float32)
        values = np.where(np.isfinite(values), values, np.float32(0.0)).astype(np.float32)
    else:
        base = draw(hnp.arrays(np.float32, shape, elements=ELEMENTS))
    return values, base, draw(st.integers(0, 8))


@FAST
@given(layer_and_base())
def test_every_decoded_weight_is_within_half_a_unit_of_the_clients(case) -> None:
    values, base, p = case
    data = encode_delta(values, base, p, name="w")
    decoded = decode_delta(data, values.shape, base, p, name="w")
    assert decoded.dtype == np.float32 and decoded.shape == values.shape
    # The bound holds after the final float32 rounding, not only before it (unlike polyline's).
    assert np.all(error(decoded, values) <= bound(p))
    _, base_kind, kind, shift, width, step = header(data)
    assert base_kind == (0 if base is None else 1)
    if kind == EXACT:
        np.testing.assert_array_equal(decoded.view(np.uint32), values.view(np.uint32))
    else:
        assert 1 <= width <= 8 and 0 <= shift <= 7 and bound(p) <= step <= 10.0**-p


@pytest.mark.parametrize("precision", range(9))
def test_the_bound_holds_where_float32_rounding_is_a_large_part_of_it(precision: int) -> None:
    # |x| * 2**-24 from 1 % to over 100 % of the bound: the step's margin, then the exact fallback, take over.
    rng = np.random.default_rng(precision)
    for scale in (0.01, 0.1, 0.3, 0.6, 1.2):
        top = scale * bound(precision) * 2**24
        base = rng.uniform(-top, top, 4096).astype(np.float32)
        values = (base + rng.normal(0, 50 * bound(precision), base.size)).astype(np.float32)
        for b in (base, None):
            decoded = decode_delta(encode_delta(values, b, precision), values.shape, b, precision)
            assert np.all(error(decoded, values) <= bound(precision)), (scale, b is None)


def test_precision_finer_than_float32_sends_the_layer_exactly() -> None:
    values = np.array([1.0, -0.3, 0.7], np.float32)
    data = encode_delta(values, np.zeros(3, np.float32), 8)
    assert header(data)[2] == EXACT
    np.testing.assert_array_equal(decode_delta(data, (3,), np.zeros(3, np.float32), 8), values)


def test_a_value_too_far_from_its_base_for_61_bits_sends_the_layer_exactly() -> None:
    values = np.array([3e38, -1.0], np.float32)
    data = encode_delta(values, None, 8)
    assert header(data)[2] == EXACT
    np.testing.assert_array_equal(decode_delta(data, (2,), None, 8), values)


def test_an_update_costs_well_under_polyline() -> None:
    rng = np.random.default_rng(0)
    base = rng.normal(0, 0.05, 20_000).astype(np.float32)
    values = (base + rng.normal(0, 0.01, base.size)).astype(np.float32)
    delta = encode_delta(values, base, 4)
    assert header(delta)[2] == QUANTISED
    # N(0, 0.01) at step 1e-4 has an entropy of ~8.7 bits; polyline pays ~2.5 bytes for the weights themselves.
    assert len(delta) / values.size < 1.25 < 2.3 < len(encode_layer(values, 4)) / values.size


def test_values_wider_than_a_byte_split_off_their_low_bits() -> None:
    rng = np.random.default_rng(2)
    base = rng.normal(0, 0.05, 5000).astype(np.float32)
    values = (base + rng.normal(0, 0.01, base.size)).astype(np.float32)
    data = encode_delta(values, base, 4)
    _, _, kind, shift, width, _ = header(data)
    assert kind == QUANTISED and shift > 0 and width == 1  # z up to ~2**10: a low plane and one byte above it
    assert np.all(error(decode_delta(data, values.shape, base, 4), values) <= bound(4))
    # At p=3 the same values fit in a byte, and nothing is split off.
    assert header(encode_delta(values, base, 3))[3:5] == (0, 1)
    # A low plane holding more bits than the shift says is refused.
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(bytes([7, 0]) + bytes([1, 1]))
    with pytest.raises(CodecError, match="low plane holds values of more than 2 bits"):
        decode_delta(HEADER.pack(1, 0, 0, 2, 1, 1e-4) + frame, (2,), None, 4)


@pytest.mark.parametrize("shape", [(0,), (3, 0), ()])
def test_empty_and_scalar_layers(shape: tuple[int, ...]) -> None:
    values = np.full(shape, 0.1234, np.float32)
    data = encode_delta(values, None, 4)
    decoded = decode_delta(data, shape, None, 4)
    assert decoded.shape == shape and np.all(error(decoded, values) <= bound(4))


def test_non_finite_values_and_bases_are_refused_naming_the_layer() -> None:
    with pytest.raises(CodecError, match=r"'conv/kernel'.*nan at flat index 1"):
        encode_delta(np.array([0.0, np.nan], np.float32), None, 4, name="conv/kernel")
    with pytest.raises(CodecError, match=r"'conv/kernel'.*inf"):
        encode_delta(np.array([np.inf], np.float32), None, 4, name="conv/kernel")
    with pytest.raises(CodecError, match="base holds NaN"):
        encode_delta(np.zeros(2, np.float32), np.array([0.0, np.nan], np.float32), 4)
    with pytest.raises(CodecError, match=r"base has shape \(3,\), the layer \(2,\)"):
        encode_delta(np.zeros(2, np.float32), np.zeros(3, np.float32), 4)
    with pytest.raises(CodecError, match="overflows float32"):
        encode_delta(np.array([1e300]), None, 4)


def test_a_delta_needs_its_base_and_a_whole_layer_ignores_one() -> None:
    values = np.array([0.5, 0.25], np.float32)
    base = np.array([0.4, 0.3], np.float32)
    with pytest.raises(CodecError, match="'d'.*no base was given"):
        decode_delta(encode_delta(values, base, 4), (2,), None, 4, name="d")
    whole = encode_delta(values, None, 4)
    np.testing.assert_array_equal(decode_delta(whole, (2,), base, 4), decode_delta(whole, (2,), None, 4))


# --- errors do not accumulate -----------------------------------------------------------------------------------


def _versions(rng: np.random.Generator, n: int, count: int, drift: float) -> list[np.ndarray]:
    w = rng.normal(0, 0.05, n).astype(np.float32)
    out = [w]
    for _ in range(count):
        w = (w + rng.normal(0, drift, n)).astype(np.float32)
        out.append(w)
    return out


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([3, 4, 6]), st.integers(50, 150), st.sampled_from([1e-4, 1e-2]))
def test_errors_do_not_accumulate_over_many_versions(seed: int, precision: int, count: int, drift: float) -> None:
    # Each version goes out against the previous one as the receiver decoded it (what both ends hold), so the
    # receiver's copy of every version is within the bound of the sender's, however many versions came before.
    versions = _versions(np.random.default_rng(seed), 64, count, drift)
    held = decode_delta(encode_delta(versions[0], None, precision), (64,), None, precision)
    worst = float(error(held, versions[0]).max())
    for w in versions[1:]:
        data = encode_delta(w, held, precision)
        sender_copy = decode_delta(data, (64,), held, precision)  # what the sender's side decodes from its own bytes
        held = decode_delta(data, (64,), held, precision)
        np.testing.assert_array_equal(sender_copy, held)  # both ends hold the same base, bit for bit
        worst = max(worst, float(error(held, w).max()))
    assert worst <= bound(precision)


def test_a_base_that_only_the_sender_holds_would_accumulate_error() -> None:
    # The contrast that makes the property above mean something: deltas taken against the sender's exact previous
    # version, added to the receiver's rounded copy, drift away from the bound within a few hundred versions.
    precision = 4
    versions = _versions(np.random.default_rng(1), 64, 300, 1e-3)
    held = decode_delta(encode_delta(versions[0], None, precision), (64,), None, precision)
    for prev, w in zip(versions, versions[1:], strict=False):
        step = decode_delta(encode_delta(w - prev, None, precision), (64,), None, precision)
        held = (held + step).astype(np.float32)
    assert float(error(held, versions[-1]).max()) > 3 * bound(precision)


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([3, 4]))
def test_federated_rounds_keep_every_update_and_global_model_within_the_bound(seed: int, precision: int) -> None:
    # The pipeline in miniature: a global model goes out whole, clients train from it as decoded and answer with
    # deltas against it, the server decodes them against the same bytes and averages; for a hundred rounds.
    rng = np.random.default_rng(seed)
    exact = rng.normal(0, 0.05, 256).astype(np.float32)
    for _ in range(100):
        wire_model = encode_delta(exact, None, precision)
        base = decode_delta(wire_model, exact.shape, None, precision)
        assert np.all(error(base, exact) <= bound(precision))
        received = []
        for _client in range(3):
            trained = (base + rng.normal(0, 0.01, base.size)).astype(np.float32)
            restored = decode_delta(encode_delta(trained, base, precision), base.shape, base, precision)
            assert np.all(error(restored, trained) <= bound(precision))
            received.append(restored)
        exact = np.mean(received, axis=0, dtype=np.float64).astype(np.float32)


# --- malformed payloads -----------------------------------------------------------------------------------------


def _valid(seed: int = 0) -> tuple[bytes, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    base = rng.normal(0, 0.05, (6, 5)).astype(np.float32)
    values = (base + rng.normal(0, 0.01, base.shape)).astype(np.float32)
    return encode_delta(values, base, 4), values, base


def _decodes_or_refuses(data: bytes, base: np.ndarray) -> np.ndarray | None:
    try:
        out = decode_delta(data, base.shape, base, 4, name="fuzz")
    except CodecError as exc:
        assert "'fuzz'" in str(exc)
        return None
    assert out.shape == base.shape and out.dtype == np.float32 and np.isfinite(out).all()
    return out


@FAST
@given(st.data())
def test_a_damaged_frame_is_refused_never_decoded_into_another_model(data: st.DataObject) -> None:
    good, _, base = _valid()
    original = decode_delta(good, base.shape, base, 4)
    mutated = bytearray(good)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(HEADER.size, len(good) - 1))
        mutated[i] = data.draw(st.integers(0, 255).filter(lambda b, i=i: b != good[i]))
    out = _decodes_or_refuses(bytes(mutated), base)
    # zstd's checksum: a change inside the frame is an error, or changed nothing that decodes.
    assert out is None or np.array_equal(out, original)


@FAST
@given(st.data())
def test_any_damage_gives_a_codec_error_or_a_well_formed_layer(data: st.DataObject) -> None:
    good, _, base = _valid(1)
    how = data.draw(st.sampled_from(["truncate", "append", "header", "random"]))
    if how == "truncate":
        bad = good[: data.draw(st.integers(0, len(good) - 1))]
    elif how == "append":
        bad = good + data.draw(st.binary(min_size=1, max_size=16))
    elif how == "header":
        bad = data.draw(st.binary(min_size=HEADER.size, max_size=HEADER.size)) + good[HEADER.size :]
    else:
        bad = data.draw(st.binary(max_size=64))
    if bad != good:
        _decodes_or_refuses(bad, base)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ((2, 1, 0, 0, 2, 1e-4), "delta format 2, this code reads 1"),
        ((1, 2, 0, 0, 2, 1e-4), "unknown delta base 2"),
        ((1, 1, 4, 0, 2, 1e-4), "unknown delta kind 4"),
        ((1, 1, 0, 0, 0, 1e-4), "quantised width 0 outside 1..8"),
        ((1, 1, 0, 0, 9, 1e-4), "quantised width 9 outside 1..8"),
        ((1, 1, 0, 8, 1, 1e-4), "quantised shift 8 outside 0..7"),
        ((1, 1, 0, 1, 8, 1e-4), "shift 1 outside 0..7, or with width 8 beyond 64 bits"),
        ((1, 1, 0, 0, 2, 2e-4), r"step 0.0002 is not within \(0, 10\*\*-4\]"),
        ((1, 1, 0, 0, 2, 0.0), "step 0.0 is not within"),
        ((1, 1, 0, 0, 2, float("nan")), "step nan is not within"),
        ((1, 1, 0, 0, 2, -1e-4), "is not within"),
        ((1, 1, 1, 0, 2, 0.0), "exact layer with shift 0, width 2"),
        ((1, 1, 1, 0, 4, 1e-4), "exact layer with shift 0, width 4, step 0.0001"),
        ((1, 1, 1, 3, 4, 0.0), "exact layer with shift 3"),
    ],
)
def test_header_defects_are_named(fields: tuple, reason: str) -> None:
    good, _, base = _valid()
    with pytest.raises(CodecError, match=reason):
        decode_delta(HEADER.pack(*fields) + good[HEADER.size :], base.shape, base, 4)


def test_short_foreign_and_mismatched_data_are_named() -> None:
    good, _, base = _valid()
    with pytest.raises(CodecError, match="shorter than its 13-byte header"):
        decode_delta(good[:5], base.shape, base, 4)
    with pytest.raises(CodecError, match="does not hold a zstd frame"):
        decode_delta(good[: HEADER.size] + b"\x00" * 20, base.shape, base, 4)
    with pytest.raises(CodecError, match="data must be bytes"):
        decode_delta("text", base.shape, base, 4)  # type: ignore[arg-type]
    whole = encode_delta(np.full(30, 0.2, np.float32), None, 4)
    with pytest.raises(CodecError, match=r"declares 60 bytes, the layer's shape needs 62"):
        decode_delta(whole, (31,), None, 4)
    with pytest.raises(CodecError, match=r"base has shape \(6, 5\), the layer \(30,\)"):
        decode_delta(good, (30,), base, 4)
    with pytest.raises(CodecError, match="unused data|corrupt"):
        decode_delta(good + good[HEADER.size :], base.shape, base, 4)


def test_a_garbage_exact_layer_that_decodes_to_nan_is_refused() -> None:
    nan_bits = np.full(2, 0x7FC00000, np.uint32)
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(
        nan_bits.view(np.uint8).reshape(2, 4).T.tobytes()
    )
    with pytest.raises(CodecError, match="not a finite float32"):
        decode_delta(HEADER.pack(1, 0, 1, 0, 4, 0.0) + frame, (2,), None, 4)


# --- compression bombs ------------------------------------------------------------------------------------------


@pytest.fixture
def no_inflation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails the test if anything is decompressed."""

    class Refuse:
        def __init__(self, *args, **kwargs) -> None:
            raise AssertionError("the frame was inflated")

    monkeypatch.setattr(zstandard, "ZstdDecompressor", Refuse)


def test_a_small_frame_claiming_a_huge_size_is_refused_before_inflating(no_inflation: None) -> None:
    # 64 MB of zeros compress to a few kB; the layer's shape wants 2 values of 1 byte.
    bomb = zstandard.ZstdCompressor(write_content_size=True).compress(bytes(64 << 20))
    assert len(bomb) < 10_000
    with pytest.raises(CodecError, match=r"declares 67108864 bytes, the layer's shape needs 2"):
        decode_delta(HEADER.pack(1, 0, 0, 0, 1, 1e-4) + bomb, (2,), None, 4)


def test_a_frame_that_hides_its_size_is_refused_before_inflating(no_inflation: None) -> None:
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(b"\x00\x02")
    assert zstandard.get_frame_parameters(frame).content_size == zstandard.CONTENTSIZE_UNKNOWN
    with pytest.raises(CodecError, match="does not declare its content size"):
        decode_delta(HEADER.pack(1, 0, 0, 0, 1, 1e-4) + frame, (2,), None, 4)


def test_a_frame_asking_for_a_huge_window_is_refused_before_inflating(no_inflation: None) -> None:
    # Frame header by hand: descriptor 0xC0 (8-byte content size, a window descriptor), window 2**28, size 2.
    frame = b"\x28\xb5\x2f\xfd" + bytes([0xC0, 18 << 3]) + struct.pack("<Q", 2) + b"\x01\x00\x00"
    with pytest.raises(CodecError, match="window of 268435456 bytes exceeds 134217728"):
        decode_delta(HEADER.pack(1, 0, 0, 0, 1, 1e-4) + frame, (2,), None, 4)


def test_any_zstd_level_decodes_the_same() -> None:
    good, values, base = _valid()
    for level in (3, 19):
        other = encode_delta(values, base, 4, level=level)
        np.testing.assert_array_equal(decode_delta(other, base.shape, base, 4), decode_delta(good, base.shape, base, 4))


# A whole model on its grid: polyline's (k / 10**p) or the delta codec's against zero (k * step).
@st.composite
def grid_models(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, int, float, int]:
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=2, min_side=0, max_side=16))
    p = draw(st.integers(1, 6))
    small = st.floats(-2.0, 2.0, width=32)
    model = draw(hnp.arrays(np.float32, shape, elements=small))
    kept = draw(hnp.arrays(np.float32, shape, elements=small))
    if draw(st.booleans()):
        model = decode_layer(encode_layer(model, p), shape, p)
        kept = decode_layer(encode_layer(kept, p), shape, p)
        return model, kept, GRID_OVER, float(10**p), p
    data = encode_delta(model, None, p)
    kept = decode_delta(encode_delta(kept, None, p), shape, None, p)
    if header(data)[2] != QUANTISED:
        return model, kept, GRID_TIMES, 10.0**-p, p  # an exact layer lies on no grid: encode_on_grid says None
    return decode_delta(data, shape, None, p), kept, GRID_TIMES, header(data)[5], p


@FAST
@given(grid_models())
def test_a_model_on_its_grid_is_sent_against_any_kept_model_losslessly(case) -> None:
    model, kept, kind, step, p = case
    data = encode_on_grid(model, kept, kind, step)
    if data is None:  # only where the model is not exactly on the grid named
        k = np.rint(model.astype(np.float64) * step if kind == GRID_OVER else model.astype(np.float64) / step)
        again = (k / step if kind == GRID_OVER else k * step).astype(np.float32)
        assert again.tobytes() != model.tobytes()
        return
    assert header(data)[:3] == (1, 1, kind)
    assert decode_delta(data, model.shape, kept, p).tobytes() == model.tobytes()


def test_versions_sent_against_each_other_never_drift_from_the_models_sent_whole() -> None:
    rng = np.random.default_rng(11)
    w = rng.normal(0, 0.1, 2000).astype(np.float32)
    held = decode_layer(encode_layer(w, 4), w.shape, 4)
    for _ in range(200):  # each version decoded against the one decoded before, as a client keeps them
        w = (w + rng.normal(0, 0.003, w.shape)).astype(np.float32)
        whole = decode_layer(encode_layer(w, 4), w.shape, 4)
        data = encode_on_grid(whole, held, GRID_OVER, 1e4)
        held = decode_delta(data, w.shape, held, 4)
        assert held.tobytes() == whole.tobytes()
    assert len(data) < len(encode_layer(w, 4)) / 2


def test_a_model_off_its_grid_is_not_sent_against_a_kept_one() -> None:
    w = np.array([0.12345678, -0.5], np.float32)
    assert encode_on_grid(w, np.zeros(2, np.float32), GRID_OVER, 1e4) is None
    with pytest.raises(CodecError, match="grid kind 0"):
        encode_on_grid(w, np.zeros(2, np.float32), QUANTISED, 1e4)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ((1, 0, GRID_OVER, 0, 1, 1e4), "grid kind 3 is sent against the message's base model"),
        ((1, 1, GRID_OVER, 0, 1, 1e3), "grid-over step 1000.0 is not 10\\*\\*4"),
        ((1, 1, GRID_TIMES, 0, 1, 1e-3), "step 0.001 is not within"),
        ((1, 1, GRID_TIMES, 0, 9, 1e-4), "grid width 9 outside 1..8"),
    ],
)
def test_grid_header_defects_are_named(fields: tuple, reason: str) -> None:
    data = HEADER.pack(*fields) + zstandard.ZstdCompressor().compress(b"\0" * 2)
    with pytest.raises(CodecError, match=reason):
        decode_delta(data, (2,), np.zeros(2, np.float32), 4)


def test_a_grid_layer_needs_the_kept_model() -> None:
    kept = decode_layer(encode_layer(np.ones(3, np.float32), 4), (3,), 4)
    data = encode_on_grid(kept, kept, GRID_OVER, 1e4)
    with pytest.raises(CodecError, match="no base was given"):
        decode_delta(data, (3,), None, 4)
