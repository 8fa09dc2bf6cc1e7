"""The delta codec end to end in the services: the worker answers against its task's model, the barrier decodes
against the model that round started from (kept across newer global models, restarts and re-issues), and a
malformed or oversized delta is refused with its reason: by the handler, and dead-lettered by the real shell."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import msgpack
import numpy as np
import pika
import pytest
import zstandard

from fedat.fl.latency import ClientProfile
from fedat.fl.strategies import build_strategy
from fedat.lab.recorder import RunState
from fedat.protocol import signing, topology, wire
from fedat.protocol.service import Reject
from fedat.protocol.statecodec import StateCodec, StateError
from fedat.protocol.wire import GlobalModel, TierAssignment, TrainTask, Update, decode_model, encode_model
from fedat_aggregator.barrier import Barrier, BarrierConfig, BarrierState, Phase
from fedat_sim.clock import Clock
from fedat_sim.dst import experiment
from fedat_sim.fakes import fake_parts
from fedat_sim.memory import MemoryBroker
from fedat_sim.system import System, secret_for
from fedat_worker.worker import Worker, WorkerConfig

from ..driver import Driver

SHAPES = [(6, 5), (5,)]
NAMES = ["dense/kernel", "dense/bias"]
P = 4
BOUND = 0.5 * 10.0**-P


def model(version: int, seed: int, rounds: tuple[int, ...] = (0,), merged=()) -> GlobalModel:
    rng = np.random.default_rng(seed)
    weights = [rng.normal(0, 0.05, s).astype(np.float32) for s in SHAPES]
    return GlobalModel(
        id=f"g{version}",
        version=version,
        tier=1 if version else 0,
        tier_round=rounds[0],
        merged=merged,
        tier_rounds=rounds,
        tier_counts=rounds,
        tier_weights=(0.0,),
        bytes_up=0,
        bytes_down=0,
        late=0,
        updates=0,
        created_at=0.0,
        layers=encode_model(weights, NAMES, "delta", P),
    )


def trained(task: TrainTask, seed: int) -> list[np.ndarray]:
    """What a client computes from its task: the task's model as decoded, plus a training step."""
    rng = np.random.default_rng(seed)
    return [(w + rng.normal(0, 0.01, w.shape)).astype(np.float32) for w in decode_model(task.layers)]


def answer(task: TrainTask, weights: list[np.ndarray], layers=None) -> Update:
    base = decode_model(task.layers)
    return Update(
        id=f"u-{task.id}",
        task_id=task.id,
        client=task.client,
        tier=task.tier,
        round=task.round,
        base_version=task.version,
        n_samples=10,
        loss=0.5,
        dispatched_at=task.sent_at,
        started_at=task.sent_at,
        finished_at=task.sent_at,
        train_seconds=0.01,
        not_before=0.0,
        late=False,
        layers=layers
        if layers is not None
        else encode_model(weights, [layer.name for layer in task.layers], task.codec, task.precision, base),
    )


def barrier(k: int = 2, min_clients: int = 2) -> tuple[Driver, list[TrainTask]]:
    cfg = BarrierConfig(tiers=(1,), clients_per_round=k, min_clients=min_clients, codec="delta", min_deadline=5.0)
    d = Driver(Barrier(cfg, build_strategy("fedat")))
    clients = (0, 1, 2, 3)
    d.deliver(topology.BARRIER_ASSIGNMENTS, TierAssignment("a1", 1, (clients,), {c: 1.0 for c in clients}, 0.0))
    fx = d.deliver(topology.BARRIER_GLOBAL, model(0, seed=0))
    return d, [o.message for o in fx.publish]


def tier_model(fx) -> list[np.ndarray]:
    (tm,) = [o.message for o in fx.publish if o.message.kind == "tier-model"]
    return decode_model(tm.layers)


def test_the_worker_answers_with_the_difference_from_its_tasks_model():
    class Trainer:
        def train(self, weights, x, y, **kw):
            from fedat_worker.training import TrainResult

            return TrainResult([w + np.float32(0.0123) for w in weights], len(x), 0.5, 0.01)

    clients = [SimpleNamespace(x_train=np.zeros((4, 2)), y_train=np.zeros(4))]
    profiles = (ClientProfile(client=0, group=0, delay=(0.0, 0.0), device_factor=1.0, drops_at=None),)
    init = [np.zeros(s, np.float32) for s in SHAPES]
    w = Driver(Worker(WorkerConfig(tiers=(1,)), clients, Trainer(), NAMES, init, profiles, lambda: 0.0))
    g = model(0, seed=3)
    task = TrainTask("t1-r1-c0-v0", 0, 1, 1, 0, 1, 10, 1e-3, 0.0, "delta", P, 1.0, g.layers)
    (out,) = w.deliver(topology.train_queue(1), task).publish
    update = out.message
    base = decode_model(g.layers)
    assert all(wire.CODECS[layer.codec].relative for layer in update.layers)
    for got, b in zip(decode_model(update.layers, base), base, strict=True):
        assert np.all(np.abs(got.astype(np.float64) - (b + np.float32(0.0123))) <= BOUND)
    with pytest.raises(wire.WireError, match="no base was given"):
        decode_model(update.layers)  # it is a delta: meaningless without the task's model
    # 6x5 steps of one size cost a few bytes; polyline would pay ~2.5 bytes a weight for the model itself.
    assert wire.model_bytes(update.layers) < 80


def test_the_barrier_decodes_each_answer_against_the_model_its_round_started_from():
    d, tasks = barrier()
    mine = [trained(t, seed=i) for i, t in enumerate(tasks)]
    d.deliver(topology.barrier_queue(1), answer(tasks[0], mine[0]))
    # A newer global model arrives while the round collects: the round's answers are still deltas against g0.
    d.deliver(topology.BARRIER_GLOBAL, model(1, seed=1, rounds=(0,)))
    assert set(d.state.bases) == {0} and d.state.model.version == 1
    d.crash()  # the kept base survives a restart, from the checkpoint
    assert set(d.state.bases) == {0}
    d.deliver(topology.barrier_queue(1), answer(tasks[0], mine[0]))  # the held answer comes back
    fx = d.deliver(topology.barrier_queue(1), answer(tasks[1], mine[1]))
    expected = [(a.astype(np.float64) + b) / 2 for a, b in zip(*mine, strict=True)]
    for got, want in zip(tier_model(fx), expected, strict=True):
        assert np.all(np.abs(got - want) <= BOUND + 1e-7)
    assert d.state.rounds[(1, 1)].phase is Phase.CLOSED and d.state.bases == {}  # nothing collects from g0 now


def test_a_reissue_carries_the_rounds_model_not_the_newest():
    d, tasks = barrier(k=3, min_clients=3)
    d.deliver(topology.BARRIER_GLOBAL, model(1, seed=1, rounds=(0,)))
    fx = d.timer("deadline:1:1", now=10.0)
    reissued = [o.message for o in fx.publish]
    assert reissued and all(t.version == 0 and t.layers == tasks[0].layers for t in reissued)
    fx = d.deliver(topology.barrier_queue(1), answer(reissued[0], trained(reissued[0], seed=9)))
    assert not fx.dead_letter


def test_with_polyline_the_barrier_keeps_no_older_model():
    cfg = BarrierConfig(tiers=(1,), clients_per_round=2, min_clients=2, codec="polyline", min_deadline=5.0)
    d = Driver(Barrier(cfg, build_strategy("fedat")))
    d.deliver(topology.BARRIER_ASSIGNMENTS, TierAssignment("a1", 1, ((0, 1, 2),), {0: 1.0, 1: 1.0, 2: 1.0}, 0.0))
    d.deliver(topology.BARRIER_GLOBAL, model(0, seed=0))
    d.deliver(topology.BARRIER_GLOBAL, model(1, seed=1, rounds=(0,)))
    assert d.state.bases == {}


def _corrupt(layer: wire.Layer) -> wire.Layer:
    data = bytearray(layer.data)
    data[-6] ^= 0xFF  # inside the zstd frame: its checksum catches it
    return replace(layer, data=bytes(data))


def test_a_damaged_delta_is_refused_with_a_reason_naming_the_layer():
    d, tasks = barrier()
    good = answer(tasks[0], trained(tasks[0], seed=0))
    bad = replace(good, layers=(_corrupt(good.layers[0]), good.layers[1]))
    with pytest.raises(Reject, match=r"update u-t1-r1-c\d-v0: layers\[0\] \(dense/kernel\).*'dense/kernel'.*zstd"):
        d.deliver(topology.barrier_queue(1), bad)
    assert d.deliver(topology.barrier_queue(1), good).dead_letter == ()  # the real answer still counts


def test_an_update_claiming_a_huge_layer_is_refused_before_anything_is_inflated(monkeypatch):
    d, tasks = barrier()
    n = 10_000_000  # 10 MB of zeros in a frame of a few hundred bytes
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(bytes(n))
    huge = wire.Layer("dense/kernel", (n,), "delta", P, wire_header(1) + frame)
    bomb = answer(tasks[0], [], layers=(huge, answer(tasks[0], trained(tasks[0], 0)).layers[1]))

    class Refuse:
        def __init__(self, *a, **k):
            raise AssertionError("inflated")

    monkeypatch.setattr(zstandard, "ZstdDecompressor", Refuse)
    with pytest.raises(Reject, match=r"layer shapes \[\(10000000,\), \(5,\)\] do not match"):
        d.deliver(topology.barrier_queue(1), bomb)


def wire_header(width: int) -> bytes:
    from fedat.protocol.deltacodec import HEADER

    return HEADER.pack(1, 1, 0, 0, width, 1e-4)


@dataclass(frozen=True)
class OldBarrierState:
    """BarrierState as saved before it kept any base model."""

    assignment: TierAssignment | None = None
    model: GlobalModel | None = None
    rounds: dict = field(default_factory=dict)
    next_round: dict = field(default_factory=dict)
    closed: dict = field(default_factory=dict)
    tier_loss: dict = field(default_factory=dict)
    tier_accuracy: dict = field(default_factory=dict)


def test_a_state_saved_before_the_kept_bases_still_reads_and_a_newer_one_is_refused():
    OldBarrierState.__name__ = "BarrierState"  # how the saved state names its class
    try:
        old = StateCodec(1, (OldBarrierState,)).encode(OldBarrierState(model=model(0, seed=0), closed={1: 3}))
    finally:
        OldBarrierState.__name__ = "OldBarrierState"
    state = Barrier.codec.decode(old)
    assert isinstance(state, BarrierState) and state.closed == {1: 3}
    assert state.bases == {} and state.keeps == state.kept == {}

    # A state saved by newer code, whose BarrierState has one field more than this code knows.
    fields = [None, None, {}, {}, {}, {}, {}, {}, {}, {}, "extra"]
    body = msgpack.packb(["BarrierState", fields], use_bin_type=True)
    newer = msgpack.packb({"v": 1, "state": msgpack.ExtType(1, body)}, use_bin_type=True)
    with pytest.raises(StateError, match="persisted BarrierState has 11 fields, this code knows 10"):
        Barrier.codec.decode(newer)


class _Sink:
    def append(self, *a):
        pass


def test_a_damaged_delta_update_is_dead_lettered_with_its_reason_by_the_real_shell():
    clock = Clock()
    broker = MemoryBroker(clock)
    exp = experiment(seed=0, strategy="fedat")
    exp = replace(exp, settings={**exp.settings, "codec": "delta"})
    system = System(exp, fake_parts(10), clock, broker, RunState(clock.now), _Sink(), 1, secret_for(0))
    tasks: list[TrainTask] = []
    broker.taps.append(
        lambda ex, key, body, props: ex == topology.TRAIN and key != "profile" and tasks.append(wire.decode(body))
    )
    system.start()
    while not tasks:
        clock.run(clock.now + 1)
    task = tasks[0]
    good = answer(task, trained(task, seed=0))
    bad = replace(good, layers=(_corrupt(good.layers[0]), *good.layers[1:]))
    body = wire.encode(bad)
    headers = signing.sign(signing.Keyring.from_secret(secret_for(0)), bad, body)
    broker.connect("client").channel().basic_publish(
        topology.RESULTS,
        topology.tier_key(task.tier),
        body,
        pika.BasicProperties(message_id=bad.id, type="update", headers=headers),
    )
    clock.run(clock.now + 0.5)
    (dead,) = [e for e in broker.ready_messages(topology.DEAD_LETTERS) if e.properties.message_id == bad.id]
    reason = dead.properties.headers[topology.HEADER_REASON]
    assert f"update {bad.id}: layers[0]" in reason and "corrupt zstd frame" in reason
    assert dead.properties.headers[topology.HEADER_SOURCE_QUEUE] == topology.barrier_queue(task.tier)
