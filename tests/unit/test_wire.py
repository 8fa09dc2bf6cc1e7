"""Tests for fedat.protocol.wire: round trips, every validation rule, and fuzzing that only WireError escapes."""

from __future__ import annotations

import math

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fedat.protocol.wire import (
    KINDS,
    SCHEMA_VERSION,
    ClientEvaluation,
    Evaluation,
    EvaluationRequest,
    GlobalModel,
    Join,
    Layer,
    Leave,
    RoundReport,
    TierAssignment,
    TierModel,
    TrainTask,
    Update,
    WireError,
    decode,
    decode_model,
    encode,
    encode_against,
    encode_model,
    model_bytes,
)

FUZZ = settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

# Values exactly representable at polyline precision 4, so the lossy codec round-trips them bit for bit.
ARRAYS = [np.array([[0.5, -1.25], [3.0, 0.0]], dtype=np.float32), np.array([1.5, 2.5, -0.75], dtype=np.float32)]
NAMES = ["dense/kernel", "dense/bias"]
POLY = encode_model(ARRAYS, NAMES, codec="polyline", precision=4)
RAW = encode_model(ARRAYS, NAMES, codec="raw", precision=0)


def _task(layers: tuple[Layer, ...] = POLY) -> TrainTask:
    return TrainTask(
        id="t-1",
        client=7,
        tier=2,
        round=3,
        version=11,
        epochs=1,
        batch_size=32,
        learning_rate=0.01,
        prox_lambda=0.0,
        codec="polyline",
        precision=4,
        sent_at=1700000000.5,
        layers=layers,
    )


def _update(layers: tuple[Layer, ...] = RAW) -> Update:
    return Update(
        id="u-1",
        task_id="t-1",
        client=7,
        tier=2,
        round=3,
        base_version=11,
        n_samples=600,
        loss=-0.25,
        dispatched_at=1.0,
        started_at=2.0,
        finished_at=3.5,
        train_seconds=1.5,
        not_before=4.0,
        late=True,
        layers=layers,
    )


def _tier_model(layers: tuple[Layer, ...] = POLY) -> TierModel:
    return TierModel(
        id="tm-1",
        tier=1,
        round=4,
        base_version=9,
        n_samples=1200,
        clients=(3, 1, 2),
        bytes_up=100,
        bytes_down=200,
        late=2,
        closed_at=9.0,
        layers=layers,
    )


def _global(layers: tuple[Layer, ...] = RAW) -> GlobalModel:
    return GlobalModel(
        id="g-1",
        version=12,
        tier=1,
        tier_round=4,
        merged=((2, 4),),
        tier_rounds=(4, 2, 0),
        tier_counts=(5, 3, 0),
        tier_weights=(0.375, 0.625, 0.0),
        bytes_up=10,
        bytes_down=20,
        late=0,
        updates=8,
        created_at=10.0,
        layers=layers,
    )


def _assignment() -> TierAssignment:
    return TierAssignment(
        id="a-1", epoch=2, tiers=((4, 0), (1,), ()), latencies={4: 0.5, 0: 1.0, 1: 7.25}, created_at=3.0
    )


def _evaluation() -> Evaluation:
    return Evaluation(
        id="e-1",
        version=12,
        accuracy=0.875,
        loss=0.4,
        variance=0.01,
        n_clients=3,
        evaluated_at=11.0,
        accuracies=(0.5, 1.0, 0.75),
    )


def _report() -> RoundReport:
    return RoundReport(
        id="rr1-r3", tier=1, round=3, latencies={4: 2.5, 7: 3.0}, missing=(9,), waited=6.0, closed_at=12.0
    )


MESSAGES = [
    _task(),
    _update(),
    _tier_model(),
    _global(),
    _assignment(),
    _report(),
    _evaluation(),
    EvaluationRequest(id="er12", version=12, created_at=10.0, layers=RAW, relative_to=11),
]
LAYERED = [_task(), _update(), _tier_model(), _global()]


def _body(msg) -> dict:
    return msgpack.unpackb(encode(msg), raw=False, strict_map_key=False)


def _pack(body) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


def _with(msg, **changes) -> bytes:
    body = _body(msg)
    body.update(changes)
    return _pack(body)


def _with_layer(msg, **changes) -> bytes:
    body = _body(msg)
    body["layers"][0].update(changes)
    return _pack(body)


def _raises(data: bytes, text: str, **kwargs) -> None:
    with pytest.raises(WireError) as info:
        decode(data, **kwargs)
    assert text in str(info.value)


# --- round trips ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: m.kind)
def test_round_trip_every_kind(msg):
    assert decode(encode(msg)) == msg


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: m.kind)
def test_round_trip_with_expect_kind(msg):
    assert decode(encode(msg), expect=type(msg)) == msg


def test_kinds_registry_names_every_message():
    assert KINDS == {
        "train": TrainTask,
        "update": Update,
        "tier-model": TierModel,
        "global-model": GlobalModel,
        "round-report": RoundReport,
        "tier-assignment": TierAssignment,
        "evaluation": Evaluation,
        "join": Join,
        "leave": Leave,
        "evaluate": EvaluationRequest,
        "client-evaluation": ClientEvaluation,
    }


def test_encoded_body_has_version_kind_and_id():
    body = _body(_evaluation())
    assert (body["v"], body["kind"], body["id"]) == (SCHEMA_VERSION, "evaluation", "e-1")


def test_round_trip_polyline_layers_values():
    msg = decode(encode(_task(POLY)))
    out = decode_model(msg.layers)
    assert [a.dtype for a in out] == [np.float32, np.float32]
    np.testing.assert_array_equal(out[0], ARRAYS[0])
    np.testing.assert_array_equal(out[1], ARRAYS[1])


def test_round_trip_raw_layers_values():
    msg = decode(encode(_update(RAW)))
    out = decode_model(msg.layers)
    np.testing.assert_array_equal(out[0], ARRAYS[0])
    np.testing.assert_array_equal(out[1], ARRAYS[1])


def test_raw_layers_are_four_bytes_per_value():
    assert [len(layer.data) for layer in RAW] == [16, 12]
    assert model_bytes(RAW) == 28


def test_polyline_is_lossy_at_low_precision():
    layers = encode_model([np.array([0.123456, -2.5], dtype=np.float32)], ["w"], precision=2)
    np.testing.assert_array_equal(decode_model(layers)[0], np.array([0.12, -2.5], dtype=np.float32))


def test_layer_metadata_survives_round_trip():
    layer = decode(encode(_tier_model(POLY))).layers[0]
    assert (layer.name, layer.shape, layer.codec, layer.precision, layer.dtype) == (
        "dense/kernel",
        (2, 2),
        "polyline",
        4,
        "float32",
    )


@pytest.mark.parametrize("make", [_task, _update, _tier_model, _global])
def test_round_trip_empty_layers(make):
    msg = make(())
    out = decode(encode(msg))
    assert out.layers == () and out == msg


def test_assignment_latencies_keys_are_ints_after_decode():
    out = decode(encode(_assignment()))
    assert out.latencies == {4: 0.5, 0: 1.0, 1: 7.25}
    assert out.tiers == ((4, 0), (1,), ())


def test_encode_model_name_count_mismatch():
    with pytest.raises(WireError, match="layers"):
        encode_model(ARRAYS, ["only-one"])


# --- kind checks ---------------------------------------------------------------------------------------------


def test_expect_rejects_other_kind():
    _raises(encode(_update()), "field 'kind'", expect=TrainTask)


def test_expect_message_names_both_kinds():
    with pytest.raises(WireError, match="expected 'train', got 'update'"):
        decode(encode(_update()), expect=TrainTask)


@pytest.mark.parametrize("kind", ["nope", "", 3, None, b"train"])
def test_unknown_kind(kind):
    _raises(_with(_evaluation(), kind=kind), "field 'kind'")


def test_missing_kind():
    body = _body(_evaluation())
    del body["kind"]
    _raises(_pack(body), "field 'kind'")


@pytest.mark.parametrize("v", [0, 1, 2, 4, "3", None, 3.5])
def test_wrong_schema_version(v):
    _raises(_with(_evaluation(), v=v), "field 'v'")


def test_missing_schema_version():
    body = _body(_evaluation())
    del body["v"]
    _raises(_pack(body), "field 'v'")


@pytest.mark.parametrize("v", [True, 1.0])
def test_non_int_schema_version_one_rejected(v):
    _raises(_with(_evaluation(), v=v), "field 'v'")


# --- field validation -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: m.kind)
def test_every_missing_field_is_named(msg):
    for name in _body(msg):
        if name in ("v", "kind"):
            continue
        body = _body(msg)
        del body[name]
        _raises(_pack(body), f"field '{name}': missing")


@pytest.mark.parametrize(
    ("msg", "name", "value"),
    [
        (_task(), "client", "7"),
        (_task(), "epochs", 1.0),
        (_task(), "learning_rate", "0.1"),
        (_task(), "codec", 1),
        (_task(), "id", 5),
        (_update(), "task_id", None),
        (_tier_model(), "clients", "1,2"),
        (_global(), "tier_weights", {"a": 1.0}),
        (_assignment(), "tiers", [[1], "2"]),
        (_assignment(), "latencies", [1.0]),
        (_task(), "layers", {"name": "x"}),
        (_evaluation(), "accuracy", None),
    ],
)
def test_wrong_type_names_field(msg, name, value):
    _raises(_with(msg, **{name: value}), f"field '{name}")


@pytest.mark.parametrize(
    ("msg", "name"),
    [
        (_task(), "client"),
        (_task(), "epochs"),
        (_update(), "n_samples"),
        (_tier_model(), "late"),
        (_global(), "updates"),
        (_evaluation(), "version"),
    ],
)
def test_bool_where_int_expected(msg, name):
    _raises(_with(msg, **{name: True}), f"field '{name}': expected int, got bool")


def test_bool_where_float_expected():
    _raises(_with(_evaluation(), loss=False), "field 'loss': expected number, got bool")


def test_int_accepted_where_float_expected():
    out = decode(_with(_evaluation(), loss=2))
    assert out.loss == 2.0 and isinstance(out.loss, float)


@pytest.mark.parametrize(
    ("msg", "name"),
    [
        (_task(), "client"),
        (_task(), "round"),
        (_update(), "n_samples"),
        (_tier_model(), "bytes_up"),
        (_global(), "version"),
        (_assignment(), "epoch"),
        (_evaluation(), "n_clients"),
    ],
)
def test_negative_count(msg, name):
    _raises(_with(msg, **{name: -1}), f"field '{name}': must be >= 0")


@pytest.mark.parametrize("name", ["epochs", "batch_size"])
def test_zero_where_positive_expected(name):
    _raises(_with(_task(), **{name: 0}), f"field '{name}': must be >= 1")


def test_tier_zero_is_allowed_for_profiling():
    assert decode(_with(_task(), tier=0)).tier == 0


@pytest.mark.parametrize(
    ("msg", "name"), [(_task(), "sent_at"), (_update(), "train_seconds"), (_evaluation(), "accuracy")]
)
def test_negative_float(msg, name):
    _raises(_with(msg, **{name: -0.5}), f"field '{name}': must be >= 0")


@pytest.mark.parametrize("rate", [0.0, -0.5])
def test_learning_rate_must_be_positive(rate):
    # The trainer rejects it, so a task with it would only bounce until the delivery limit.
    _raises(_with(_task(), learning_rate=rate), "field 'learning_rate': must be > 0")


def test_negative_loss_allowed():
    assert decode(_with(_evaluation(), loss=-3.0)).loss == -3.0


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize(
    ("msg", "name"), [(_update(), "loss"), (_task(), "learning_rate"), (_evaluation(), "variance")]
)
def test_non_finite_float(msg, name, bad):
    _raises(_with(msg, **{name: bad}), f"field '{name}': must be finite")


def test_non_finite_tier_weight_names_index():
    _raises(_with(_global(), tier_weights=[0.5, math.nan, 0.5]), "field 'tier_weights[1]': must be finite")


def test_negative_tier_count_names_index():
    _raises(_with(_global(), tier_counts=[1, -2, 0]), "field 'tier_counts[1]': must be >= 0")


def test_client_list_bool_names_index():
    _raises(_with(_tier_model(), clients=[1, True]), "field 'clients[1]': expected int, got bool")


def test_nested_tier_negative_names_index():
    _raises(_with(_assignment(), tiers=[[1, 2], [3, -4]]), "field 'tiers[1][1]': must be >= 0")


def test_latency_negative_value():
    _raises(_with(_assignment(), latencies={1: -1.0}), "field 'latencies[1]': must be >= 0")


def test_latency_nan_value():
    _raises(_with(_assignment(), latencies={1: math.nan}), "field 'latencies[1]': must be finite")


@pytest.mark.parametrize("key", ["1", -1, True, 1.5])
def test_latency_bad_key(key):
    _raises(_with(_assignment(), latencies={key: 1.0}), "field 'latencies key'")


@pytest.mark.parametrize("value", ["", "x" * 257])
def test_id_length(value):
    _raises(_with(_evaluation(), id=value), "field 'id': must be 1..256")


def test_id_of_256_characters_accepted():
    assert decode(_with(_evaluation(), id="x" * 256)).id == "x" * 256


def test_update_late_must_be_bool():
    _raises(_with(_update(), late=1), "field 'late': expected bool, got int")


def test_update_late_false_round_trips():
    msg = _update()
    body = _body(msg)
    body["late"] = False
    assert decode(_pack(body)).late is False


def test_tier_model_late_is_int_not_bool():
    _raises(_with(_tier_model(), late=True), "field 'late': expected int, got bool")


def test_tier_model_late_count_round_trips():
    assert decode(_with(_tier_model(), late=5)).late == 5


def test_unknown_codec_field():
    _raises(_with(_task(), codec="gzip"), "field 'codec': unknown codec 'gzip'")


@pytest.mark.parametrize("p", [-1, 9, 100])
def test_precision_out_of_range(p):
    _raises(_with(_task(), precision=p), "field 'precision': precision")


@pytest.mark.parametrize("p", [0, 8])
def test_precision_bounds_accepted(p):
    assert decode(_with(_task(), precision=p)).precision == p


# --- layer validation -------------------------------------------------------------------------------------------


def test_layer_unknown_codec():
    _raises(_with_layer(_task(), codec="zstd"), "field 'layers[0].codec': unknown codec")


@pytest.mark.parametrize("p", [-1, 9])
def test_layer_precision_out_of_range(p):
    _raises(_with_layer(_task(), precision=p), "field 'layers[0].precision'")


def test_layer_precision_bool():
    _raises(_with_layer(_task(), precision=True), "field 'layers[0].precision': expected int, got bool")


@pytest.mark.parametrize("delta", [-1, 1, -16])
def test_raw_data_length_must_match_shape(delta):
    body = _body(_update(RAW))
    data = body["layers"][0]["data"]
    body["layers"][0]["data"] = data[:delta] if delta < 0 else data + b"\0" * delta
    _raises(_pack(body), "field 'layers[0].data': raw layer of shape [2, 2] needs 16 bytes")


def test_raw_shape_change_breaks_length():
    _raises(_with_layer(_update(RAW), shape=[2, 3]), "field 'layers[0].data'")


def test_second_layer_is_named():
    body = _body(_update(RAW))
    body["layers"][1]["data"] = b"\0" * 4
    _raises(_pack(body), "field 'layers[1].data'")


@pytest.mark.parametrize("key", ["name", "shape", "dtype", "codec", "precision", "data"])
def test_layer_missing_key(key):
    body = _body(_task())
    del body["layers"][0][key]
    _raises(_pack(body), f"field 'layers[0]': missing ['{key}']")


@pytest.mark.parametrize("dtype", ["float64", "float16", "int32", None])
def test_layer_dtype_must_be_float32(dtype):
    _raises(_with_layer(_task(), dtype=dtype), "field 'layers[0].dtype': only 'float32'")


def test_layer_not_a_map():
    _raises(_with(_task(), layers=[[1, 2]]), "field 'layers[0]': expected map")


def test_layer_data_not_bytes():
    _raises(_with_layer(_task(), data="abc"), "field 'layers[0].data': expected bytes, got str")


def test_layer_empty_name():
    _raises(_with_layer(_task(), name=""), "field 'layers[0].name'")


def test_layer_negative_dimension():
    _raises(_with_layer(_task(), shape=[2, -2]), "field 'layers[0].shape[1]': must be >= 0")


@pytest.mark.parametrize("shape", [[1] * 9, [50_000_001], [10_000, 10_000]])
def test_layer_shape_too_large(shape):
    _raises(_with_layer(_task(), shape=shape), "field 'layers[0].shape'")


def test_decode_model_names_bad_layer():
    body = _body(_task(POLY))
    body["layers"][1]["data"] = b"?"  # decodes to one value but shape (3,) needs four
    msg = decode(_pack(body))
    with pytest.raises(WireError, match=r"layers\[1\] \(dense/bias\)"):
        decode_model(msg.layers)


def test_huge_dimension_of_empty_layer_is_rejected_by_decode():
    # Product 0, but numpy cannot allocate a (0, 2**63) array: every dimension is capped, not just the product.
    _raises(_with_layer(_task(), shape=[0, 2**63], data=b""), "field 'layers[0].shape'")


# --- message level ------------------------------------------------------------------------------------------------


def test_encode_oversize():
    data = encode(_task())
    with pytest.raises(WireError, match="oversize"):
        encode(_task(), max_bytes=len(data) - 1)


def test_encode_exact_limit_accepted():
    data = encode(_task())
    assert encode(_task(), max_bytes=len(data)) == data


def test_decode_oversize():
    data = encode(_task())
    _raises(data, "oversize", max_bytes=len(data) - 1)


@pytest.mark.parametrize("top", [[1, 2], 5, "train", None, b"x"])
def test_non_map_top_level(top):
    _raises(_pack(top), "message: expected a map at the top level")


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x92\x01", b"\x81\xa1v", b"\x01\x02", b"\xff" * 10])
def test_garbage_bytes(data):
    _raises(data, "message: not valid msgpack")


def test_not_bytes_input():
    with pytest.raises(WireError, match="message: expected bytes"):
        decode("not bytes")  # type: ignore[arg-type]


def test_bytearray_and_memoryview_accepted():
    data = encode(_evaluation())
    assert decode(bytearray(data)) == decode(memoryview(data)) == _evaluation()


# --- fuzzing --------------------------------------------------------------------------------------------------------


def _check(data: bytes) -> None:
    try:
        msg = decode(data)
    except WireError:
        return
    assert type(msg) in KINDS.values()
    for layer in getattr(msg, "layers", ()):
        try:
            decode_model([layer])
        except WireError:
            pass


@FUZZ
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(data):
    _check(data)


@FUZZ
@given(st.sampled_from(MESSAGES), st.data())
def test_fuzz_mutated_bytes(msg, data):
    raw = bytearray(encode(msg))
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "truncate", "insert", "delete"]))
        i = data.draw(st.integers(0, max(len(raw) - 1, 0)))
        if op == "flip" and raw:
            raw[i] ^= data.draw(st.integers(1, 255))
        elif op == "truncate":
            del raw[i:]
        elif op == "insert":
            raw[i:i] = data.draw(st.binary(min_size=1, max_size=9))
        elif raw:
            del raw[i]
    _check(bytes(raw))


MSGPACK_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=12)
    | st.binary(max_size=24),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8) | st.integers(-5, 5), inner, max_size=4)
    ),
    max_leaves=8,
)
LAYER_KEYS = ["name", "shape", "dtype", "codec", "precision", "data"]
DELETE = "<delete>"
# (where: -1 = top-level map, i >= 0 = layers[i]; which key, by index modulo the key count; new value or DELETE)
MUTATIONS = st.lists(
    st.tuples(st.integers(-1, 1), st.integers(0, 40), st.just(DELETE) | MSGPACK_VALUES), min_size=1, max_size=3
)
HUGE_EMPTY_LAYER = [(0, LAYER_KEYS.index("shape"), [0, 2**63]), (0, LAYER_KEYS.index("data"), b"")]


def _mutate(msg, mutations) -> bytes:
    body = _body(msg)
    for where, key_index, value in mutations:
        layers = body.get("layers")
        if where >= 0 and isinstance(layers, list) and where < len(layers) and isinstance(layers[where], dict):
            target, key = layers[where], LAYER_KEYS[key_index % len(LAYER_KEYS)]
        else:
            keys = sorted(body)
            target, key = body, keys[key_index % len(keys)]
        if value == DELETE:
            target.pop(key, None)
        else:
            target[key] = value
    return _pack(body)


@FUZZ
@given(st.sampled_from(MESSAGES), MUTATIONS)
@example(_task(), HUGE_EMPTY_LAYER)
def test_fuzz_replaced_fields_decode_raises_only_wire_error(msg, mutations):
    try:
        decode(_mutate(msg, mutations))
    except WireError:
        pass


@FUZZ
@given(st.sampled_from(LAYERED), MUTATIONS)
@example(_task(), HUGE_EMPTY_LAYER)
def test_fuzz_replaced_fields_decode_model_raises_only_wire_error(msg, mutations):
    _check(_mutate(msg, mutations))


@pytest.mark.parametrize("codec", ["polyline", "delta"])
def test_a_whole_model_sent_against_a_kept_one_decodes_to_the_same_bits(codec):
    rng = np.random.default_rng(2)
    w = [rng.normal(0, 0.1, (30, 20)).astype(np.float32), rng.normal(0, 0.1, 20).astype(np.float32)]
    names = ["kernel", "bias"]
    kept = decode_model(encode_model(w, names, codec))
    layers = encode_model([(a + 0.002).astype(np.float32) for a in w], names, codec)
    whole = decode_model(layers)
    against = encode_against(layers, whole, kept)
    assert [layer.codec for layer in against] == ["delta", "delta"]
    assert [a.tobytes() for a in decode_model(against, kept)] == [a.tobytes() for a in whole]
    assert model_bytes(against) < model_bytes(layers)


def test_a_model_on_no_grid_is_not_sent_against_a_kept_one():
    w = [np.linspace(-1, 1, 50, dtype=np.float32)]
    raw = encode_model(w, ["w"], "raw")
    assert encode_against(raw, decode_model(raw), w) is None
    exact = encode_model([w[0] * 1000], ["w"], "delta", precision=8)  # finer than float32 resolves: sent exact
    assert exact[0].data[2] == 1 and encode_against(exact, decode_model(exact), w) is None  # kind 1: exact
