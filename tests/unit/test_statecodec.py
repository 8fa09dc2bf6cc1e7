"""The state codec writes an array held in several places once, and reads it back as one object again."""

from __future__ import annotations

from dataclasses import dataclass

import msgpack
import numpy as np
import pytest

from fedat.fl.strategies import build_strategy
from fedat.protocol.service import Inbound
from fedat.protocol.statecodec import StateCodec, StateError
from fedat.protocol.wire import TierModel, encode_model, seed_model
from fedat_aggregator.aggregator import Aggregator, AggregatorConfig


@dataclass(frozen=True)
class Holder:
    first: list
    second: dict
    third: tuple = ()


CODEC = StateCodec(1, (Holder,))


def test_an_array_held_twice_is_written_once_and_read_back_as_one_object():
    big = np.arange(10_000, dtype=np.float32)
    other = np.ones(3, np.float32)
    state = Holder([big, other], {7: (big, 1.0)}, (big,))
    data = CODEC.encode(state)
    assert len(data) < big.nbytes + 200  # not three copies
    back = CODEC.decode(data)
    assert back.first[0] is back.second[7][0] is back.third[0]
    assert back.first[1] is not back.first[0]
    np.testing.assert_array_equal(back.first[0], big)
    np.testing.assert_array_equal(back.first[1], other)


def test_equal_arrays_that_are_different_objects_stay_different_objects():
    a, b = np.zeros(4, np.float32), np.zeros(4, np.float32)
    back = CODEC.decode(CODEC.encode(Holder([a, b], {})))
    assert back.first[0] is not back.first[1]


def test_a_reference_to_an_array_not_yet_read_is_refused():
    ref = msgpack.ExtType(7, msgpack.packb(3))
    body = msgpack.packb(["Holder", [[ref], {}, ()]], use_bin_type=True)
    data = msgpack.packb({"v": 1, "state": msgpack.ExtType(1, body)}, use_bin_type=True)
    with pytest.raises(StateError, match="refers to array 3, but only 0 came before it"):
        CODEC.decode(data)


def test_aso_fed_keeps_one_copy_of_a_tier_model_for_all_its_clients():
    # ASO-Fed holds the latest model of every client heard from: a tier model of ten clients is ten references.
    rng = np.random.default_rng(0)
    shapes, names = [(200, 50), (50,)], ["w", "b"]
    agg = Aggregator(AggregatorConfig(num_tiers=1), build_strategy("aso-fed"))
    state = agg.initial()
    w0 = [rng.normal(0, 0.05, s).astype(np.float32) for s in shapes]
    state, _ = agg.on_global(state, Inbound("q", seed_model(w0, names, 1, "raw", 4, 0.0), 0, False, 0, 0.0), 0.0, {})
    for k in range(1, 4):
        model = [(w + rng.normal(0, 0.01, w.shape)).astype(np.float32) for w in w0]
        clients = tuple(range(10 * k, 10 * k + 10))
        tm = TierModel(f"tm1-r{k}", 1, k, state.version, 100, clients, 0, 0, 0, 0.0, encode_model(model, names, "raw"))
        state, _ = agg.on_tier_model(state, Inbound("q", tm, k, False, 0, 0.0), 0.0, {})
    data = agg.codec.encode(state)
    model_bytes = sum(4 * int(np.prod(s)) for s in shapes)
    # 30 clients' copies, three distinct models, plus the tier model, the global model and the running sums.
    assert len(data) < 10 * model_bytes
    back = agg.codec.decode(data)
    assert _same(back, state)


def _same(a, b) -> bool:
    """Deep equality with numpy arrays compared by value."""
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, list | tuple):
        # lists come back as tuples
        return isinstance(b, list | tuple) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if hasattr(a, "__dataclass_fields__"):
        return type(a) is type(b) and all(_same(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)
    return a == b


def test_with_a_store_an_array_is_written_as_its_digest_and_read_back_from_the_stored_models():
    from fedat.protocol.modelstore import Models, Stored, digest

    big, small = np.arange(10_000, dtype=np.float32), np.ones(3, np.float32)
    models = Models()
    models.begin()
    data = CODEC.encode(Holder([big, small], {7: (big, 1.0)}), models.reference)
    live = models.end()
    assert list(live) == [digest(big)] and len(data) < 200  # the digest, once; the small array inline
    assert not big.flags.writeable  # named by identity from now on: it must not change
    stored = {d: Stored.of(d, a) for d, a in live.items()}
    back = CODEC.decode(data, stored)
    assert back.first[0] is back.second[7][0] and not back.first[0].flags.writeable
    np.testing.assert_array_equal(back.first[0], big)
    np.testing.assert_array_equal(back.first[1], small)
    with pytest.raises(StateError, match=f"stored model {digest(big).hex()}"):
        CODEC.decode(data, {})


def test_a_stored_model_whose_bytes_are_not_what_its_digest_names_is_refused():
    from fedat.errors import CheckpointError
    from fedat.protocol.modelstore import Models, Stored

    big = np.arange(1_000, dtype=np.float32)
    models = Models()
    models.begin()
    data = CODEC.encode(Holder([big], {}), models.reference)
    (key,) = models.end()
    damaged = bytearray(memoryview(big).cast("B"))
    damaged[10] ^= 1
    with pytest.raises(CheckpointError, match="do not match its digest"):
        CODEC.decode(data, {key: Stored(key, big.dtype.str, big.shape, bytes(damaged))})


@dataclass(frozen=True)
class Part:
    name: str
    clients: dict


def test_a_part_shared_with_the_last_state_is_written_as_it_was_and_reads_back_alike():
    codec = StateCodec(1, (Holder, Part))
    kept, with_array = Part("kept", {1: 2.0}), Holder([np.ones(2, np.float32)], {})
    first = Holder([kept, with_array], {"a": kept})
    codec.encode(first)
    assert id(kept) in codec._parts and id(with_array) not in codec._parts  # array references are per encode
    second = Holder([kept, with_array, Part("new", {})], {"a": kept, "b": with_array.first[0]})
    data = codec.encode(second)
    assert data == StateCodec(1, (Holder, Part)).encode(second)  # the same bytes as a codec that reused nothing
    back = codec.decode(data)
    assert back.first[0] == kept and back.second["b"] is back.first[1].first[0]
    assert id(kept) in codec._parts and set(codec._parts) <= {id(p) for p in (kept, *second.first[1:])}


def test_with_verify_a_part_changed_in_place_after_it_was_saved_is_refused(monkeypatch):
    codec = StateCodec(1, (Holder, Part))
    kept = Part("kept", {1: 2.0})
    codec.encode(Holder([kept], {}))
    kept.clients[1] = 3.0  # what a transition must never do
    assert codec.decode(codec.encode(Holder([kept], {}))).first[0].clients == {1: 2.0}  # the bytes of the last save
    codec.encode(Holder([Part("other", {})], {}))
    codec.encode(Holder([kept], {}))  # written afresh: it was not in the last state
    kept.clients[1] = 4.0
    monkeypatch.setattr(StateCodec, "verify", True)
    with pytest.raises(StateError, match="a Part of the state changed in place after it was saved"):
        codec.encode(Holder([kept], {}))
