"""The production shell (fedat.runtime.bus Runner and Session) on the memory broker: write-ahead holds wherever cut."""

from __future__ import annotations

import functools

import numpy as np
import pika
import pytest
from prometheus_client import CollectorRegistry

from fedat.deploy.experiment import Experiment
from fedat.errors import CommitFailed
from fedat.lab.recorder import RunState
from fedat.protocol import checkpoint, topology, wire
from fedat.protocol.service import NOTHING, Outgoing, Subscription, done
from fedat.protocol.statecodec import StateCodec
from fedat.runtime import bus
from fedat.runtime.metrics import transport_metrics
from fedat_sim.clock import ORIGIN, Clock
from fedat_sim.dst import experiment
from fedat_sim.fakes import fake_parts
from fedat_sim.memory import MemoryBroker
from fedat_sim.shell import Process, ProcessKilled, ServiceDied
from fedat_sim.system import System, secret_for


class Counter:
    """A durable service: every new round report (by id) bumps a count and publishes assignment `a<count>`."""

    name = "profiler"  # borrows the profiler's state queue
    codec = StateCodec(1, ())

    def initial(self) -> tuple[str, ...]:
        return ()

    def subscriptions(self):
        return {topology.PROFILER_REPORTS: Subscription(wire.RoundReport, self.on_report)}

    def on_start(self, state, now):
        return state, NOTHING

    def on_timer(self, state, key, now, held):
        return state, NOTHING

    def on_report(self, state, inbound, now, held):
        if inbound.message.id in state:
            return state, done(inbound)  # a redelivered input: its effect is already saved
        n = len(state) + 1
        out = wire.TierAssignment(id=f"a{n}", epoch=n, tiers=((0,),), latencies={}, created_at=now)
        return (*state, inbound.message.id), done(inbound, Outgoing(topology.CONTROL, "", out))


def report(i: int) -> bytes:
    return wire.encode(wire.RoundReport(f"rr{i}", 1, i, {}, (), 0.0, 0.0))


def send_reports(channel, numbers: range) -> None:
    for i in numbers:
        channel.basic_publish(
            topology.EVENTS, topology.ROUND_REPORT_KEY, report(i), pika.BasicProperties(type="round-report")
        )


@pytest.mark.parametrize("op", [1, 2, 3])
@pytest.mark.parametrize("after", [False, True])
def test_a_kill_anywhere_in_a_transition_loses_nothing_and_redoes_nothing(op, after):
    # A transition's operations: 1 save the checkpoint, 2 publish the output, 3 ack the input.
    clock = Clock()
    broker = MemoryBroker(clock)
    broker.declare_topology(1)
    cfg = bus.BrokerConfig(num_tiers=1, prefetch=1)
    p = Process("counter", Counter(), broker, clock, cfg)
    p.start()
    outputs: list[tuple[str, bytes]] = []
    broker.taps.append(lambda ex, key, body, props: ex == topology.CONTROL and outputs.append((props.message_id, body)))
    pub = broker.connect("barrier").channel()
    send_reports(pub, range(1, 4))
    clock.run(ORIGIN + 1)  # the first input is handled
    p.conn.sabotage(op, ProcessKilled(restart_after=2.0), after)
    send_reports(pub, range(4, 7))
    clock.run(ORIGIN + 30)
    assert p.crashes == 1 and p.runner.state == tuple(f"rr{i}" for i in range(1, 7))
    ids = [i for i, _ in outputs]
    assert sorted(set(ids), key=lambda s: int(s[1:])) == [f"a{n}" for n in range(1, 7)]
    assert all(len({b for i, b in outputs if i == x}) == 1 for x in ids)  # a copy is the same bytes (the outbox)
    assert broker.audit() == []  # every input acked exactly once


def test_a_forged_update_is_dead_lettered_with_its_reason_by_the_real_shell():
    clock = Clock()
    broker = MemoryBroker(clock)
    exp = experiment(seed=0, strategy="fedat")
    system = System(exp, fake_parts(10), clock, broker, RunState(clock.now), _Sink(), 1, secret_for(0))
    system.start()
    layers = wire.encode_model([np.zeros(s, np.float32) for s in ((6, 4), (4,))], ["layer0", "layer1"], "raw")
    forged = wire.Update("u-x", "t1-r1-c0-v0", 0, 1, 1, 0, 20, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0, False, layers)
    broker.connect("mallory").channel().basic_publish(
        topology.RESULTS, "tier-1", wire.encode(forged), pika.BasicProperties(message_id="u-x", type="update")
    )
    clock.run(clock.now + 1)
    (dead,) = [e for e in broker.ready_messages(topology.DEAD_LETTERS) if e.properties.message_id == "u-x"]
    assert "unsigned update" in dead.properties.headers[topology.HEADER_REASON]
    assert dead.properties.headers[topology.HEADER_SOURCE_QUEUE] == topology.barrier_queue(1)


def test_a_checkpoint_the_service_cannot_read_kills_the_process_like_a_crash_loop():
    clock = Clock()
    broker = MemoryBroker(clock)
    broker.declare_topology(1)
    c = checkpoint.Checkpoint("profiler", 1, 0.0, b"not msgpack state", ())
    pub = broker.connect("x").channel()
    pub.basic_publish(topology.STATE, "profiler", checkpoint.encode(c), pika.BasicProperties(type="checkpoint"))
    p = Process("counter", Counter(), broker, clock, bus.BrokerConfig(num_tiers=1))
    with pytest.raises(ServiceDied, match="counter died"):
        p.start()


def test_system_settings_come_from_the_production_settings_functions():
    exp = Experiment("x", 1, 1, {"num_tiers": 2, "clients_per_round": 4, "min_clients": 2, "num_clients": 8})
    clock = Clock()
    system = System(exp, fake_parts(8), clock, MemoryBroker(clock), RunState(clock.now), _Sink())
    assert system.processes["barrier"].cfg.prefetch == 64  # max(64, 4 * k * tiers + 8)
    assert system.processes["aggregator"].cfg.prefetch == 16
    assert system.processes["profiler"].cfg.prefetch == 64
    assert system.processes["worker-0"].cfg.prefetch == 0  # every client on its own virtual core
    assert system.processes["barrier"].cfg.keyring is None  # unsigned unless a secret is given


class _Sink:
    def write(self, text: str) -> None:
        pass

    def flush(self) -> None:
        pass


def tier_model_body(k: int) -> bytes:
    rng = np.random.default_rng(k)
    shapes = [(30, 20), (20,)]
    layers = wire.encode_model([rng.normal(0, 0.05, s).astype(np.float32) for s in shapes], ["w", "b"], "raw")
    return wire.encode(wire.TierModel(f"tm1-r{k}", 1, k, max(0, k - 2), 10, (k % 4,), 0, 0, 0, 0.0, layers))


@functools.cache
def journalled_run(kill: tuple[int, bool] | None) -> tuple[dict[str, list[bytes]], list[str], int]:
    """FedBuff's aggregator on the memory broker, fed 40 tier models; with `kill` = (op, after), SIGKILLed at that
    publish/ack/nack of the 25th arrival's transition (well into a journal). Its global versions by id (the layers
    of each copy), the ids in order, and its crashes."""
    from fedat.fl.strategies import build_strategy
    from fedat_aggregator.aggregator import Aggregator, AggregatorConfig

    clock = Clock()
    broker = MemoryBroker(clock)
    broker.declare_topology(1)
    service = Aggregator(AggregatorConfig(num_tiers=1, codec="raw"), build_strategy("fedbuff", buffer_size=2))
    p = Process("aggregator", service, broker, clock, bus.BrokerConfig(num_tiers=1, prefetch=1))
    p.start()
    versions: dict[str, list[bytes]] = {}
    order: list[str] = []

    def tap(exchange, key, body, props):
        if exchange == topology.GLOBAL and props.message_id != "g0":
            g = wire.decode(body)
            versions.setdefault(g.id, []).append(b"".join(layer.data for layer in g.layers))
            order.append(g.id)

    broker.taps.append(tap)
    pub = broker.connect("barrier").channel()
    seed = wire.seed_model([np.zeros((30, 20), np.float32), np.zeros(20, np.float32)], ["w", "b"], 1, "raw", 4, 0.0)
    pub.basic_publish(topology.GLOBAL, "", wire.encode(seed), pika.BasicProperties(message_id="g0"))
    for k in range(1, 25):
        pub.basic_publish(topology.TIER_MODELS, "", tier_model_body(k), pika.BasicProperties(type="tier-model"))
    clock.run(ORIGIN + 1)
    assert broker.ready_messages(topology.journal_queue("aggregator"))  # the state is journalled by now
    if kill is not None:
        p.conn.sabotage(kill[0], ProcessKilled(restart_after=2.0), kill[1])
    for k in range(25, 41):
        pub.basic_publish(topology.TIER_MODELS, "", tier_model_body(k), pika.BasicProperties(type="tier-model"))
    clock.run(ORIGIN + 30)
    assert broker.audit() == []  # every input acked exactly once
    return versions, order, p.crashes


@pytest.mark.parametrize("op", [1, 2, 3, 4])
@pytest.mark.parametrize("after", [False, True])
def test_a_kill_anywhere_in_a_journalled_transition_makes_the_same_versions(op, after):
    # A transition's operations: 1 the checkpoint (a journal entry, or a snapshot), 2 the global model when the
    # buffer steps (else the ack), and so on into the next transitions.
    expected, _, _ = journalled_run(None)
    versions, order, crashes = journalled_run((op, after))
    assert crashes == 1
    assert sorted(versions) == sorted(expected)  # no version lost, none made twice with other contents
    assert all(set(versions[v]) == set(expected[v]) and len(set(versions[v])) == 1 for v in versions)
    assert list(dict.fromkeys(order)) == [f"g{v}" for v in range(1, len(expected) + 1)]  # in order, no gap


def grouped_session(broker: MemoryBroker, clock: Clock) -> tuple[bus.Session, bus.Runner]:
    """The Counter behind the production Runner and a grouping Session, as `run_service` runs a durable service."""
    cfg = bus.BrokerConfig(num_tiers=1, prefetch=8)
    runner = bus.Runner(Counter(), cfg, transport_metrics(CollectorRegistry(), "counter"), clock, True)
    conn = broker.connect("counter")
    channel = conn.channel()
    channel.confirm_delivery()
    channel.basic_qos(prefetch_count=cfg.prefetch)
    session = bus.Session(conn, channel, runner, group=True)
    session.start()
    return session, runner


def watched_broker() -> tuple[Clock, MemoryBroker, list[str]]:
    """A memory broker and the ids of the Counter's outputs as they leave, in order."""
    clock = Clock()
    broker = MemoryBroker(clock)
    broker.declare_topology(1)
    outputs: list[str] = []
    broker.taps.append(lambda ex, key, body, props: ex == topology.CONTROL and outputs.append(props.message_id))
    return clock, broker, outputs


def test_a_group_commit_saves_once_for_its_transitions_and_releases_nothing_before():
    clock, broker, outputs = watched_broker()
    session, runner = grouped_session(broker, clock)
    saved = runner.seq
    send_reports(broker.connect("barrier").channel(), range(1, 4))
    clock.run(ORIGIN + 1)  # three deliveries dispatched together: handled, staged, nothing released
    assert runner.state == ("rr1", "rr2", "rr3") and runner.seq == saved
    assert outputs == [] and len(session.unacked) == 3
    session.flush()
    assert runner.seq == saved + 1  # one checkpoint for the three
    assert outputs == ["a1", "a2", "a3"] and session.unacked == {}
    assert broker.audit() == []
    samples = {x.name: x.value for x in runner.metrics.group_transitions.collect()[0].samples}
    assert samples["fedat_commit_group_transitions_sum"] == 3  # the start's empty group was not counted


def test_a_group_lost_before_its_checkpoint_is_redone_from_the_one_before():
    clock, broker, outputs = watched_broker()
    session, runner = grouped_session(broker, clock)
    pub = broker.connect("barrier").channel()
    send_reports(pub, range(1, 3))
    clock.run(ORIGIN + 1)
    session.flush()
    send_reports(pub, range(3, 6))
    clock.run(ORIGIN + 2)
    assert runner.state == tuple(f"rr{i}" for i in range(1, 6))
    session.conn.close()  # killed with three transitions staged: their inputs go back to the queue
    session, runner = grouped_session(broker, clock)
    assert runner.state == ("rr1", "rr2")  # the checkpoint before the group
    clock.run(ORIGIN + 3)
    session.flush()
    assert runner.state == tuple(f"rr{i}" for i in range(1, 6))
    # the restart re-sent the outbox of the checkpoint it restored (a1, a2: receivers drop copies by id); the lost
    # group had released nothing, so a3..a5 left once, from the group that redid it
    assert outputs == ["a1", "a2", "a1", "a2", "a3", "a4", "a5"]
    assert broker.audit() == []


def test_a_group_that_cannot_be_saved_drops_the_connection_rather_than_apply_an_input_twice(monkeypatch):
    clock = Clock()
    broker = MemoryBroker(clock)
    broker.declare_topology(1)
    session, runner = grouped_session(broker, clock)
    send_reports(broker.connect("barrier").channel(), range(1, 3))
    clock.run(ORIGIN + 1)

    def broken(channel, c):
        raise ValueError("no room")

    monkeypatch.setattr(runner.store, "save", broken)
    with pytest.raises(CommitFailed, match="2 transition"):
        session.flush()
    assert isinstance(CommitFailed("x"), bus.RECOVERABLE)  # run_service reconnects and restores
    monkeypatch.undo()
    session.conn.close()
    session, runner = grouped_session(broker, clock)
    clock.run(ORIGIN + 2)
    session.flush()
    assert runner.state == ("rr1", "rr2") and broker.audit() == []
