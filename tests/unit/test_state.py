"""State values, their codec and checkpoints; ids; crash and restore of the barrier at every step of a round."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedat.fl.strategies import ASOFed, FedBuff, build_strategy
from fedat.protocol import checkpoint, ids, topology
from fedat.protocol.statecodec import StateCodec, StateError
from fedat.protocol.wire import TierAssignment, TrainTask
from fedat_aggregator.aggregator import Aggregator, AggregatorConfig, Merged
from fedat_aggregator.barrier import Barrier, BarrierConfig, Phase

from ..driver import Driver
from ..factories import answer, seed

FEDAT = build_strategy("fedat")


class Colour(enum.Enum):
    RED = "red"


@dataclass(frozen=True)
class Inner:
    weights: tuple
    colour: Colour = Colour.RED


@dataclass(frozen=True)
class Outer:
    inner: Inner
    by_round: dict = field(default_factory=dict)
    clients: frozenset = frozenset()
    model: object = None


CODEC = StateCodec(3, (Outer, Inner, Colour))


def test_a_state_comes_back_equal_arrays_maps_with_tuple_keys_enums_sets_and_wire_messages():
    a = TierAssignment("a1", 1, ((0, 1), (2,)), {0: 1.5, 1: 2.0, 2: 9.0}, 3.0)
    value = Outer(
        Inner((np.arange(6, dtype=np.float32).reshape(2, 3), np.zeros(0, np.float64))),
        {(1, 2): "x", (3, 4): None},
        frozenset({3, 1}),
        a,
    )
    back = CODEC.decode(CODEC.encode(value))
    np.testing.assert_array_equal(back.inner.weights[0], value.inner.weights[0])
    assert back.inner.weights[0].dtype == np.float32 and back.inner.weights[1].dtype == np.float64
    assert back.inner.colour is Colour.RED and back.by_round == value.by_round and back.clients == {1, 3}
    assert back.model == a


def test_a_state_of_another_version_or_with_an_unknown_class_is_refused_by_name():
    with pytest.raises(StateError, match="version 3 is not the version this code reads \\(4\\)"):
        StateCodec(4, (Outer, Inner, Colour)).decode(CODEC.encode(Outer(Inner(()))))
    with pytest.raises(StateError, match="names class 'Inner', which this code does not know"):
        StateCodec(3, (Outer, Colour)).decode(CODEC.encode(Outer(Inner(()))))
    with pytest.raises(StateError, match="Inner is not registered"):
        StateCodec(3, (Outer,)).encode(Outer(Inner(())))
    with pytest.raises(StateError, match="not valid msgpack"):
        CODEC.decode(b"\xc1")
    with pytest.raises(StateError, match="cannot persist a object"):
        CODEC.encode(Outer(Inner(()), model=object()))


def test_a_checkpoint_round_trips_and_names_its_service():
    sent = checkpoint.Sent("fedat.global", "", "global-model", "g3", b"\x00body", (("x-fedat-signer", "aggregator"),))
    c = checkpoint.Checkpoint("aggregator", 7, 12.5, b"state", (sent,))
    assert checkpoint.decode(checkpoint.encode(c), "aggregator") == c
    with pytest.raises(checkpoint.CheckpointError, match="checkpoint of 'aggregator' found where 'barrier'"):
        checkpoint.decode(checkpoint.encode(c), "barrier")
    with pytest.raises(checkpoint.CheckpointError, match="unreadable checkpoint of barrier"):
        checkpoint.decode(b"garbage", "barrier")


def test_ids_and_timer_keys_are_built_and_parsed_in_one_place():
    assert ids.task(2, 7, 41, 130) == "t2-r7-c41-v130" and ids.update("t2-r7-c41-v130") == "u-t2-r7-c41-v130"
    assert ids.late_report(ids.update(ids.profile_task(3))) == "late-u-p-c3"
    key = ids.round_timer(ids.DEADLINE, 3, 12)
    assert ids.parse_round_timer(key) == ids.RoundTimer(ids.DEADLINE, 3, 12) and ids.timer_kind(key) == "deadline"
    with pytest.raises(ValueError, match="not a round timer key"):
        ids.parse_round_timer(ids.PROFILE_DEADLINE)


@given(st.lists(st.integers(1, 300), max_size=300))
def test_merged_rounds_are_remembered_exactly_whatever_the_order(rounds):
    merged = Merged()
    for r in rounds:
        merged = merged.add(r)
    assert all(r in merged for r in rounds)
    assert not any(r in merged for r in range(1, 302) if r not in rounds)


def test_the_merged_memory_gives_up_only_on_a_round_that_never_came():
    merged = Merged()
    for r in range(2, 2000):  # round 1 never merges
        merged = merged.add(r)
    assert len(merged.above) <= 1024 and 1999 in merged and 2000 not in merged


# --- the barrier, crashed at every step of a round ------------------------------------------------------------
SHAPES = [(2,)]


def barrier_at_round_1(k: int = 3):
    d = Driver(Barrier(BarrierConfig(tiers=(1,), clients_per_round=k, min_clients=k, codec="raw"), FEDAT))
    d.deliver(topology.BARRIER_ASSIGNMENTS, TierAssignment("a1", 1, ((0, 1, 2, 3),), {c: 1.0 for c in range(4)}, 0.0))
    tasks = [o.message for o in d.deliver(topology.BARRIER_GLOBAL, seed(1, SHAPES)).publish]
    return d, tasks


def test_a_crash_after_the_close_remembers_the_round_as_closed_and_acks_redelivered_copies():
    d, tasks = barrier_at_round_1()
    for t in tasks:
        fx = d.deliver(topology.barrier_queue(1), answer(t, 1.0))
    assert fx.publish[0].message.id == "tm1-r1"
    d.crash()
    d.start(1.0)
    assert d.state.rounds[(1, 1)].phase is Phase.CLOSED
    copy = d.deliver(topology.barrier_queue(1), answer(tasks[0], 1.0))  # e.g. the worker's retry of a killed task
    assert copy.publish == () and copy.ack == (d.tag,)


def test_a_crash_before_the_close_collects_the_redelivered_updates_again():
    d, tasks = barrier_at_round_1()
    d.deliver(topology.barrier_queue(1), answer(tasks[0], 2.0, n=1))
    d.deliver(topology.barrier_queue(1), answer(tasks[1], 4.0, n=3))
    lost = d.crash()
    assert len(lost) == 2 and d.state.rounds[(1, 1)].phase is Phase.COLLECTING
    d.start(1.0)
    for inbound in lost:
        d.deliver(inbound.queue, inbound.message, redelivered=True)
    fx = d.deliver(topology.barrier_queue(1), answer(tasks[2], 0.0, n=4))
    tm = fx.publish[0].message
    assert tm.clients == tuple(sorted(t.client for t in tasks)) and tm.n_samples == 8


def test_restored_draws_are_the_same_clients():
    a, tasks_a = barrier_at_round_1(2)
    b, tasks_b = barrier_at_round_1(2)
    assert [t.id for t in tasks_a] == [t.id for t in tasks_b]
    a.deliver(topology.barrier_queue(1), answer(tasks_a[0], 1.0))
    b.deliver(topology.barrier_queue(1), answer(tasks_b[0], 1.0))
    (lost,) = b.crash()
    b.start(0.0)
    b.deliver(lost.queue, lost.message, redelivered=True)
    ra, rb = (x.timer("deadline:1:1", 60.0).publish for x in (a, b))  # below the minimum: re-issue
    assert [o.message.id for o in ra] == [o.message.id for o in rb]


def test_a_global_model_moves_closed_rounds_to_merged_and_old_ones_are_forgotten():
    d = Driver(Barrier(BarrierConfig(tiers=(1,), clients_per_round=1, min_clients=1, codec="raw"), FEDAT))
    d.deliver(topology.BARRIER_ASSIGNMENTS, TierAssignment("a1", 1, ((0, 1),), {0: 1.0, 1: 1.0}, 0.0))
    fx = d.deliver(topology.BARRIER_GLOBAL, seed(1, SHAPES))
    for v in range(1, 70):
        (task,) = [o.message for o in fx.publish if isinstance(o.message, TrainTask)]
        d.deliver(topology.barrier_queue(1), answer(task, 1.0))
        g = replace(seed(1, SHAPES), id=f"g{v}", version=v, tier=1, tier_round=v, merged=((1, v),), tier_rounds=(v,))
        fx = d.deliver(topology.BARRIER_GLOBAL, g)
    merged = sorted(n for (_, n), r in d.state.rounds.items() if r.phase is Phase.MERGED)
    assert merged == list(range(6, 70)) and d.state.rounds[(1, 70)].phase is Phase.COLLECTING


@pytest.mark.parametrize("strategy", [FEDAT, FedBuff(buffer_size=2, history=2), ASOFed()])
def test_the_aggregator_state_survives_a_crash_with_its_strategy_state(strategy):
    from .test_aggregator_profiler import tier_model

    d = Driver(Aggregator(AggregatorConfig(num_tiers=2, codec="raw"), strategy))
    d.deliver(topology.AGGREGATOR_GLOBAL, seed(2, SHAPES))
    out = []
    for i, (tier, rnd) in enumerate([(1, 1), (2, 1), (1, 2), (1, 3)]):
        out += d.deliver(topology.AGGREGATOR_TIER_MODELS, tier_model(tier, rnd, float(i))).publish
        if i == 1:
            d.crash()
    twin = Driver(Aggregator(AggregatorConfig(num_tiers=2, codec="raw"), strategy))
    twin.deliver(topology.AGGREGATOR_GLOBAL, seed(2, SHAPES))
    expected = []
    for i, (tier, rnd) in enumerate([(1, 1), (2, 1), (1, 2), (1, 3)]):
        expected += twin.deliver(topology.AGGREGATOR_TIER_MODELS, tier_model(tier, rnd, float(i))).publish
    assert [o.message.version for o in out] == [o.message.version for o in expected]
    assert [o.message.layers for o in out] == [o.message.layers for o in expected]
