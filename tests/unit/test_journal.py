"""Checkpoints as a snapshot and a journal: each model written once, the latest checkpoint found again, and a
checkpoint's size independent of how many models the state holds."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from fedat.errors import CheckpointError
from fedat.fl.strategies import build_strategy
from fedat.protocol import checkpoint, journal, topology, wire
from fedat.protocol.checkpoint import Checkpoint
from fedat.protocol.modelstore import Models, Stored
from fedat.protocol.service import Inbound
from fedat.runtime import brokerstore, bus
from fedat.runtime.metrics import transport_metrics
from fedat_aggregator.aggregator import Aggregator, AggregatorConfig
from fedat_sim.clock import Clock
from fedat_sim.memory import MemoryBroker

SHAPES = [(40, 25), (25,), (25, 4), (4,)]
NAMES = [f"l{i}" for i in range(len(SHAPES))]
MODEL_BYTES = 4 * sum(int(np.prod(s)) for s in SHAPES)


class Saver:
    """The aggregator behind the production Runner on a memory broker: its checkpoints as the broker holds them."""

    def __init__(self, strategy, tiers: int = 1, limit: int = wire.MAX_MESSAGE_BYTES):
        self.broker = MemoryBroker(Clock())
        self.broker.declare_topology(tiers)
        self.cfg = bus.BrokerConfig(num_tiers=tiers, max_message_bytes=limit)
        self.service = Aggregator(AggregatorConfig(num_tiers=tiers, codec="raw"), strategy)
        self.runner = self.fresh()
        self.rng = np.random.default_rng(0)
        self.w0 = [self.rng.normal(0, 0.05, s).astype(np.float32) for s in SHAPES]
        self.arrivals = 0
        self.transition(self.service.on_global, wire.seed_model(self.w0, NAMES, tiers, "raw", 4, 0.0))

    def fresh(self) -> bus.Runner:
        """A new process: its Runner, restored from the broker."""
        runner = bus.Runner(self.service, self.cfg, transport_metrics(CollectorRegistry(), "a"), lambda: 0.0, True)
        runner.restore(self.broker.connect("aggregator").channel())
        return runner

    def transition(self, handler, message) -> int:
        """Run one handler through the Runner's save; the bytes it wrote."""
        r = self.runner
        state, fx = handler(r.state, Inbound("q", message, 0, False, 0, 0.0), 0.0, {})
        before = r.store.written
        r.save(self.broker.connect("aggregator").channel(), state, bus.encode_all(fx.publish, self.cfg))
        r.state = state
        return r.store.written - before

    def arrive(self, clients: tuple[int, ...], tier: int = 1) -> int:
        """A tier model of `clients`, trained from the version before the newest; the bytes its checkpoint wrote."""
        self.arrivals += 1
        weights = [(w + self.rng.normal(0, 0.01, w.shape)).astype(np.float32) for w in self.w0]
        base = max(0, self.runner.state.version - 1)
        layers = wire.encode_model(weights, NAMES, "raw")
        tm = wire.TierModel(f"tm{tier}-r{self.arrivals}", tier, self.arrivals, base, 10, clients, 0, 0, 0, 0.0, layers)
        return self.transition(self.service.on_tier_model, tm)

    def queued(self, queue: str) -> list[bytes]:
        return [e.body for e in self.broker.ready_messages(queue)]


def _same(a, b) -> bool:
    from .test_statecodec import _same as same

    return same(a, b)


@pytest.mark.parametrize("history", [4, 32])
def test_fedbuff_writes_per_arrival_what_arrived_however_long_its_history(history):
    s = Saver(build_strategy("fedbuff", buffer_size=2, history=history))
    sizes, journalled = [], 0
    for k in range(60):
        sizes.append(s.arrive((k,)))
        journalled = max(journalled, len(s.queued(topology.journal_queue("aggregator"))))
    # an arrival's entry carries the buffer (float64), or with a step the global model and its version (FedBuff reads
    # only the arrival: no tier model is kept); the history's versions were written when each was new. A snapshot now
    # and then holds them all, and purges the journal.
    entries = sorted(sizes)[: len(sizes) // 2]
    assert max(entries) < 2.5 * MODEL_BYTES  # the float64 buffer is two models' worth; a tier model would be a third
    assert journalled > 1  # journalled, not rewritten


def test_aso_fed_writes_per_arrival_what_arrived_however_many_clients_it_heard_from():
    s = Saver(build_strategy("aso-fed"))
    few = [s.arrive((k % 5,)) for k in range(20)]
    many = [s.arrive((100 + k,)) for k in range(80)]  # 80 more clients, each a copy of its own
    assert len(s.runner.state.strategy_state.models) == 85
    # the median arrival is an entry: its tier model, the running sums (float64), the global model and the outbox,
    # and the state's references, about 230 bytes a client; the 85 copies themselves are not written again
    assert sorted(few)[10] < 8 * MODEL_BYTES
    assert sorted(many)[40] < sorted(few)[10] + 300 * 85 < 85 * MODEL_BYTES


@pytest.mark.parametrize("strategy", ["fedat", "fedbuff", "aso-fed", "fedat-delta", "tifl"])
def test_a_restarted_process_restores_the_state_it_saved(strategy):
    s = Saver(build_strategy(strategy), tiers=3)
    for k in range(40):
        s.arrive((k % 7, 7 + k % 5), tier=1 + k % 3)
    held = [s.queued(q) for q in (topology.state_queue("aggregator"), topology.journal_queue("aggregator"))]
    again = s.fresh()
    assert again.seq == s.runner.seq and _same(again.state, s.runner.state)
    # a restart takes nothing from the queues it reads
    assert [s.queued(q) for q in (topology.state_queue("aggregator"), topology.journal_queue("aggregator"))] == held
    assert s.broker.audit() == []


def test_the_journal_is_dropped_once_a_snapshot_supersedes_it_and_restore_reads_boundedly():
    s = Saver(build_strategy("fedbuff", buffer_size=3, history=8))
    held = []
    for k in range(120):
        s.arrive((k,))
        held.append(sum(map(len, s.queued(topology.journal_queue("aggregator")))))
    snapshot = len(s.queued(topology.state_queue("aggregator"))[0])
    assert held.count(0) >= 2  # purged after each snapshot
    whole = journal.size(checkpoint.decode(s.queued(topology.state_queue("aggregator"))[0], "aggregator"))
    assert max(held) <= (journal.RATIO + 1) * whole and snapshot > 0


def test_a_crash_between_a_snapshot_and_the_purge_leaves_entries_that_are_ignored_then_dropped():
    s = Saver(build_strategy("fedbuff", buffer_size=2, history=8))
    for k in range(30):
        s.arrive((k,))
    while not s.queued(topology.journal_queue("aggregator")):
        s.arrive((0,))
    snap = checkpoint.decode(s.queued(topology.state_queue("aggregator"))[0], "aggregator")
    entries = s.queued(topology.journal_queue("aggregator"))
    # the next snapshot lands, the process dies before it purges: the journal holds entries of the older snapshot
    newer = replace(journal.latest("aggregator", checkpoint.encode(snap), [entries]).checkpoint, base=None)
    newer = replace(newer, seq=s.runner.seq + 1)
    ch = s.broker.connect("x").channel()
    brokerstore.BrokerStore("aggregator").save(ch, newer)
    again = s.fresh()
    assert again.seq == newer.seq and s.queued(topology.journal_queue("aggregator")) == []
    assert _same(again.state, s.runner.state)


def test_the_latest_checkpoint_is_refused_when_the_journal_has_a_gap_or_no_snapshot():
    s = Saver(build_strategy("fedbuff", buffer_size=2, history=8))
    for k in range(12):
        s.arrive((k,))
    snapshot = s.queued(topology.state_queue("aggregator"))[0]
    entries = s.queued(topology.journal_queue("aggregator"))
    assert len(entries) >= 3
    last = journal.latest("aggregator", snapshot, [entries]).checkpoint
    assert last.seq == s.runner.seq
    with pytest.raises(CheckpointError, match="has entry .* where .* should be"):
        journal.latest("aggregator", snapshot, [entries[:1] + entries[2:]])
    with pytest.raises(CheckpointError, match="no snapshot they extend"):
        journal.latest("aggregator", None, [entries])
    # a duplicated publish is the same entry; two different entries of one number are not
    assert journal.latest("aggregator", snapshot, [[*entries, entries[1]]]).checkpoint.seq == last.seq
    other = checkpoint.encode(replace(checkpoint.decode(entries[1], "aggregator"), saved_at=99.0))
    with pytest.raises(CheckpointError, match="two different journal entries"):
        journal.latest("aggregator", snapshot, [[*entries, other]])
    # a state that refers to a model no record carries is refused by the state codec, naming the model
    lost = replace(last, models={})
    with pytest.raises(ValueError, match="stored model [0-9a-f]+"):
        s.service.codec.decode(lost.state, lost.models)


def test_a_checkpoint_written_before_journals_restores_and_the_next_save_is_a_snapshot():
    s = Saver(build_strategy("fedbuff", buffer_size=2, history=8))
    for k in range(5):
        s.arrive((k,))
    state = s.runner.state
    broker = MemoryBroker(Clock())
    broker.declare_topology(1)
    old = Checkpoint("aggregator", 9, 0.0, s.service.codec.encode(state), ())  # arrays inline, format 1
    ch = broker.connect("x").channel()
    brokerstore.BrokerStore("aggregator").save(ch, old)
    s.broker, s.runner = broker, None
    s.runner = s.fresh()
    assert s.runner.seq == 9 and _same(s.runner.state, state)
    s.arrive((99,))
    saved = checkpoint.decode(s.queued(topology.state_queue("aggregator"))[0], "aggregator")
    assert saved.seq == 10 and saved.base is None and saved.models  # a snapshot, format 2: older code refuses it


def test_a_state_without_stored_arrays_is_saved_as_before():
    models = Models()
    models.begin()
    c = Checkpoint("profiler", 3, 0.0, b"state", ())
    record = journal.Journal().record(c, models.end())
    assert record == c and not record.journalled
    assert checkpoint.encode(record) == checkpoint.encode(Checkpoint("profiler", 3, 0.0, b"state", ()))


JOURNALS = [topology.journal_queue("aggregator", side) for side in topology.JOURNAL_SIDES]


def _records(s: Saver) -> list[tuple[str, bytes]]:
    """Every message the broker holds of the aggregator's checkpoints, with its queue."""
    return [(q, body) for q in (topology.state_queue("aggregator"), *JOURNALS) for body in s.queued(q)]


def test_checkpoints_larger_than_a_message_go_as_parts_in_both_journals_in_turn_and_restore_whole():
    # ASO-Fed keeps a copy of each client's model: with room for about eight models a message, its snapshots soon
    # need parts, and so do entries that carry several arrays
    limit = 8 * MODEL_BYTES
    s = Saver(build_strategy("aso-fed"), limit=limit)
    sides_used, parts, largest = set(), 0, 0
    for k in range(60):
        s.arrive((k,))
        held = _records(s)
        largest = max([largest, *(len(body) for _, body in held)])
        parts = max(parts, sum(checkpoint.decode(body, "aggregator").part for _, body in held))
        sides_used |= {q for q, _ in held if q in JOURNALS}
        again = s.fresh() if k % 10 == 9 else None
        if again is not None:
            assert again.seq == s.runner.seq and _same(again.state, s.runner.state)
    assert largest <= limit
    assert parts >= 3  # a snapshot of tens of copies, in messages of 8 models
    assert sides_used == set(JOURNALS)  # each snapshot in parts went to the journal its predecessor's were not in
    assert s.broker.audit() == []


class _CutBeforeTheState:
    """A channel whose connection breaks as the snapshot itself (to the state queue) is published."""

    def __init__(self, channel):
        self.channel = channel

    def basic_publish(self, exchange, routing_key, **kwargs):
        if routing_key == "aggregator":
            raise ConnectionError("the connection broke")
        return self.channel.basic_publish(exchange, routing_key, **kwargs)

    def __getattr__(self, name):
        return getattr(self.channel, name)


def test_a_crash_while_a_snapshot_s_parts_are_written_leaves_the_old_snapshot_and_journal_whole():
    s = Saver(build_strategy("aso-fed"), limit=8 * MODEL_BYTES)
    for k in range(30):
        s.arrive((k,))
    before = _records(s)
    ch = s.broker.connect("x").channel()
    store = brokerstore.BrokerStore("aggregator", 8 * MODEL_BYTES)
    latest = store.restore(ch).checkpoint
    newer = replace(latest, seq=s.runner.seq + 1, base=None)
    with pytest.raises(ConnectionError):
        store.save(_CutBeforeTheState(ch), newer)
    cut = [body for q, body in _records(s) if (q, body) not in before]
    assert cut and all(checkpoint.decode(b, "aggregator").part for b in cut)  # its parts went; the snapshot did not
    again = s.fresh()
    assert again.seq == s.runner.seq and _same(again.state, s.runner.state)
    assert _records(s) == before  # the restore dropped the parts of the snapshot that never was
    s.runner = again
    for k in range(30, 40):  # and the service goes on
        s.arrive((k,))
    assert _same(s.fresh().state, s.runner.state)


def test_split_cuts_a_record_into_parts_within_the_limit_and_a_missing_part_is_named():
    rng = np.random.default_rng(3)
    arrays = [rng.normal(0, 0.05, 2_000).astype(np.float32) for _ in range(10)]  # 8 kB each
    models = Models()
    models.begin()
    for a in arrays:
        models.reference(a)
    live = models.end()
    c = journal.Journal().record(Checkpoint("aggregator", 4, 0.0, b"state", ()), live)
    assert journal.split(c, 1 << 20) == ((), c)  # it fits one message
    parts, head = journal.split(c, 20_000)
    assert len(parts) == 5 and all(len(checkpoint.encode(p)) <= 20_000 for p in parts)
    assert head.models == {} and set(head.elsewhere) == set(live) and head.state == b"state"
    bodies = [checkpoint.encode(p) for p in parts]
    restored = journal.latest("aggregator", checkpoint.encode(head), [bodies, []])
    assert restored.checkpoint.seq == 4 and set(restored.checkpoint.models) == set(live) and restored.side == 0
    with pytest.raises(CheckpointError, match="keeps 10 arrays in parts, and the journal lacks 2 of them"):
        journal.latest("aggregator", checkpoint.encode(head), [bodies[1:], []])
    with pytest.raises(CheckpointError, match="more than one message of at most 5000 bytes may carry"):
        journal.split(c, 5_000)


class _BreaksAt:
    """A channel whose connection breaks at its `n`-th write (a publish or a purge); before it, all goes through."""

    def __init__(self, channel, n: int):
        self.channel, self.left = channel, n

    def _write(self, name: str, *args, **kwargs):
        self.left -= 1
        if self.left == 0:
            raise ConnectionError(f"the connection broke at {name}")
        return getattr(self.channel, name)(*args, **kwargs)

    def basic_publish(self, *args, **kwargs):
        return self._write("basic_publish", *args, **kwargs)

    def queue_purge(self, *args, **kwargs):
        return self._write("queue_purge", *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.channel, name)


def test_a_crash_at_any_write_of_a_save_in_parts_restores_the_checkpoint_before_or_the_one_it_wrote():
    crashes, later = 0, 0  # saves cut off, and those cut off after their first write (between parts, or at a purge)
    for seed in range(10):
        rng = np.random.default_rng(seed)
        s = Saver(build_strategy("aso-fed"), limit=int(rng.integers(3, 9)) * MODEL_BYTES)
        for k in range(45):
            if rng.random() > 0.3:
                s.arrive((k,))
                continue
            # this arrival's save breaks at one of its writes
            before, seq = s.runner.state, s.runner.seq
            weights = [(w + s.rng.normal(0, 0.01, w.shape)).astype(np.float32) for w in s.w0]
            layers = wire.encode_model(weights, NAMES, "raw")
            base = max(0, s.runner.state.version - 1)
            tm = wire.TierModel(f"tm1-x{k}", 1, 1000 + k, base, 10, (k,), 0, 0, 0, 0.0, layers)
            state, fx = s.service.on_tier_model(before, Inbound("q", tm, 0, False, 0, 0.0), 0.0, {})
            at = 1 if rng.random() < 0.3 else int(rng.integers(2, 8))
            try:
                s.runner.save(
                    _BreaksAt(s.broker.connect("aggregator").channel(), at), state, bus.encode_all(fx.publish, s.cfg)
                )
            except ConnectionError:
                crashes += 1
                later += at > 1
            s.runner = s.fresh()  # the process starts again from what the broker holds
            if s.runner.seq == seq:
                assert _same(s.runner.state, before)
            else:  # the record landed before the break (only a purge after it was cut off, or nothing was)
                assert s.runner.seq == seq + 1 and _same(s.runner.state, state)
        assert _same(s.fresh().state, s.runner.state)
        assert s.broker.audit() == []
    assert crashes >= 30 and later >= 6, (crashes, later)


def test_the_journal_of_a_snapshot_that_fits_a_message_is_the_first_queue_where_older_releases_read_it():
    rng = np.random.default_rng(4)
    models = Models()
    models.begin()
    for _ in range(6):
        models.reference(rng.normal(0, 0.05, 2_000).astype(np.float32))  # 8 kB each
    arrays = models.end()
    broker = MemoryBroker(Clock())
    broker.declare_topology(1)
    ch = broker.connect("aggregator").channel()
    store = brokerstore.BrokerStore("aggregator", 20_000)

    def save(seq: int, digests: list[bytes], base: int | None = None) -> None:
        carried = {d: Stored.of(d, arrays[d]) for d in digests}
        store.save(ch, Checkpoint("aggregator", seq, 0.0, b"s%d" % seq, (), {}, carried, base))

    def held(side: int) -> list[Checkpoint]:
        return [checkpoint.decode(e.body, "aggregator") for e in broker.ready_messages(JOURNALS[side])]

    d = list(arrays)
    save(1, d)  # in parts: to the second queue, which then holds its journal
    assert [c.part for c in held(1)] == [True] * 3 and held(0) == []
    save(2, d[:1])  # fits: its journal is the first queue again, and the parts it supersedes are gone
    assert held(0) == held(1) == []
    save(3, d[1:2], base=2)
    assert [c.seq for c in held(0)] == [3] and held(1) == []
    save(4, d)  # in parts again: the second queue, and the first's entry is gone
    assert {c.part for c in held(1)} == {True} and held(0) == []
    restored = brokerstore.BrokerStore("aggregator").restore(ch)
    assert restored.checkpoint.seq == 4 and set(restored.checkpoint.models) == set(arrays) and restored.side == 1


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.integers(1, 3_000), max_size=12),  # arrays, in float32 values
    st.lists(st.tuples(st.integers(0, 2_000), st.integers(0, 4)), max_size=40),  # outbox: body bytes, headers
    st.integers(0, 4_000),  # state bytes
    st.integers(-3_000, 20_000),  # the message limit, against what the record holds
    st.booleans(),  # an entry rather than a snapshot
)
def test_every_message_a_record_is_written_as_fits_the_limit(sizes, outbox, state, margin, entry):
    rng = np.random.default_rng([len(sizes), state, margin + 3_000])
    noise = lambda n: rng.bytes(n)  # noqa: E731 (incompressible, as trained weights are)
    models = Models()
    models.begin()
    for n in sizes:
        models.reference(rng.normal(0, 1, n).astype(np.float32))
    carried = {d: Stored.of(d, a) for d, a in models.end().items()}
    sent = tuple(
        checkpoint.Sent(
            "fedat.train", "tier-1", "train", f"t{i}", noise(n), tuple((f"h{k}", noise(45).hex()) for k in range(h))
        )
        for i, (n, h) in enumerate(outbox)
    )
    c = Checkpoint("aggregator", 9, 0.0, noise(state), sent, {"run": "r" * 40}, carried, 3 if entry else None)
    limit = max(2_000, journal.size(c) + margin)
    try:
        parts, head = journal.split(c, limit)
    except CheckpointError as exc:  # only a state and outbox, or an array, larger than a message
        assert "over the" in str(exc) or "may carry" in str(exc)
        return
    assert all(len(checkpoint.encode(m)) <= limit for m in (*parts, head))
    assert {d for p in parts for d in p.models} | set(head.models) == set(carried)
    assert not parts or (head.models == {} and set(head.elsewhere) == set(carried))


@pytest.mark.parametrize("limit", [wire.MAX_MESSAGE_BYTES, 4 * MODEL_BYTES])
def test_the_state_the_broker_holds_is_exported_and_reads_the_same_after_a_restart(limit):
    s = Saver(build_strategy("aso-fed"), limit=limit)

    def held(runner: bus.Runner) -> dict[str, float]:
        gauge = runner.metrics.state_bytes
        return {r: gauge.labels(r)._value.get() for r in ("snapshot", "journal")}

    sizes = []
    for k in range(30):
        s.arrive((k,))
        sizes.append(held(s.runner))
        assert held(s.fresh()) == sizes[-1]
    snapshots = [h["snapshot"] for h in sizes]
    assert snapshots == sorted(snapshots) and snapshots[-1] > 10 * MODEL_BYTES  # a copy per client, and growing
    assert any(h["journal"] == 0 for h in sizes[5:]) and max(h["journal"] for h in sizes) > 0
