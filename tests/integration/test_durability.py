"""Restarts on the real broker: a new service object knows only what the broker kept, and carries on exactly."""

from __future__ import annotations

import time

import numpy as np
import pytest

from fedat.fl.strategies import build_strategy
from fedat.protocol import checkpoint, topology
from fedat.protocol.service import Inbound
from fedat.protocol.wire import GlobalModel, TierModel, decode_model, encode, encode_model, seed_model
from fedat.runtime.brokerstore import BrokerStore
from fedat_aggregator.aggregator import Aggregator, AggregatorConfig
from fedat_aggregator.barrier import Barrier, BarrierConfig, Phase
from fedat_profiler.profiler import Profiler, ProfilerConfig, Stage

from ..factories import answer
from .broker import channel, fetch, fetch_n, publish, running, tap
from .test_pipeline import start_tier

pytestmark = pytest.mark.broker


def barrier() -> Barrier:
    cfg = BarrierConfig(tiers=(1,), codec="raw", tier_codec="raw", clients_per_round=3, min_clients=3, min_deadline=60)
    return Barrier(cfg, build_strategy("fedat"))


def aggregator() -> Aggregator:
    return Aggregator(AggregatorConfig(num_tiers=1, codec="raw"), build_strategy("fedat"))


def versions_until(url: str, version: int) -> list[GlobalModel]:
    out: list[GlobalModel] = []
    while not out or out[-1].version < version:
        g = fetch(url, topology.RECORDER_GLOBAL, timeout=30)
        assert g is not None, f"no global model {version} (saw {[x.version for x in out]})"
        out.append(g)
    return out


def saved_state(url: str, service, num_tiers: int = 1):
    """The service's state as its latest checkpoint holds it (with the stored models it refers to)."""
    with channel(url, num_tiers) as ch:
        saved = BrokerStore(service.name).load(ch)
        return service.codec.decode(saved.state, saved.models)


def undisturbed(twin: Aggregator, g0: GlobalModel, tms: list[TierModel]) -> dict:
    """The layers of each version an aggregator makes from `g0` and `tms` in one process, by id."""
    state, _ = twin.on_global(twin.initial(), Inbound("q", g0, 0, False, 0, 0.0), 0.0, {})
    expected = {}
    for tm in tms:
        state, fx = twin.on_tier_model(state, Inbound("q", tm, 0, False, 0, 0.0), 0.0, {})
        expected.update({o.message.id: o.message.layers for o in fx.publish})
    return expected


def test_a_barrier_restarted_mid_round_keeps_the_round_and_merges_each_update_once(vhost_url):
    with running(aggregator(), vhost_url, 1):
        with running(barrier(), vhost_url, 1):
            start_tier(vhost_url, (0, 1, 2, 3))
            tasks = fetch_n(vhost_url, topology.train_queue(1), 3)
            for t in tasks[:2]:
                publish(vhost_url, topology.RESULTS, topology.tier_key(1), answer(t, float(t.client), 1), 1)
            time.sleep(1.0)  # held, unacked
        # The process is gone: what survives is the checkpoint and the two unacked updates.
        state = saved_state(vhost_url, barrier())
        assert state.rounds[(1, 1)].phase is Phase.COLLECTING and state.model.version == 0
        with channel(vhost_url, 1) as ch:  # back in the queue, ready for whoever consumes it next
            assert ch.queue_declare(topology.barrier_queue(1), passive=True).method.message_count == 2
        with running(barrier(), vhost_url, 1):  # a new object: everything it knows comes from the broker
            publish(vhost_url, topology.RESULTS, topology.tier_key(1), answer(tasks[2], float(tasks[2].client), 1), 1)
            publish(vhost_url, topology.RESULTS, topology.tier_key(1), answer(tasks[0], 99.0, 1), 1)  # a late copy
            g = versions_until(vhost_url, 1)[-1]
            assert g.updates == 3 and g.merged == ((1, 1),)
            np.testing.assert_allclose(decode_model(g.layers)[0], np.mean([t.client for t in tasks]), rtol=1e-6)
            # The restart re-sent the outputs of the last saved transition (round 1's tasks: same ids, so a worker's
            # second answer is dropped as a copy); round 1 was not re-opened with other clients, round 2 follows.
            again = fetch_n(vhost_url, topology.train_queue(1), 3)
            assert sorted(t.id for t in again) == sorted(t.id for t in tasks)
            nxt = fetch_n(vhost_url, topology.train_queue(1), 3)
            assert {t.round for t in nxt} == {2} and {t.version for t in nxt} == {1}
        assert fetch(vhost_url, topology.train_queue(1), timeout=1) is None


def test_a_restarted_aggregator_continues_the_version_sequence(vhost_url):
    with running(barrier(), vhost_url, 1):
        with running(aggregator(), vhost_url, 1):
            start_tier(vhost_url, (0, 1, 2))
            for t in fetch_n(vhost_url, topology.train_queue(1), 3):
                publish(vhost_url, topology.RESULTS, topology.tier_key(1), answer(t, 1.0, 1), 1)
            first = versions_until(vhost_url, 1)
        assert saved_state(vhost_url, aggregator()).version == 1
        with running(aggregator(), vhost_url, 1):
            for t in fetch_n(vhost_url, topology.train_queue(1), 3):
                publish(vhost_url, topology.RESULTS, topology.tier_key(1), answer(t, 3.0, 1), 1)
            second = versions_until(vhost_url, 2)
    by_version: dict[int, set] = {}
    for g in first + second:  # a restart re-sends the last version it saved: a copy, same id and same content
        by_version.setdefault(g.version, set()).add((g.id, g.merged, tuple(layer.data for layer in g.layers)))
    assert sorted(by_version) == [0, 1, 2] and all(len(v) == 1 for v in by_version.values())
    assert second[-1].tier_counts == (2,) and second[-1].updates == 6


def test_a_checkpoints_outbox_is_sent_again_on_start(vhost_url):
    """A crash between saving and publishing: the restarted service re-sends what the transition decided."""
    a = aggregator()
    g = GlobalModel("g7", 7, 1, 7, ((1, 7),), (7,), (7,), (1.0,), 0, 0, 0, 7, 0.0, ())
    sent = checkpoint.Sent(topology.GLOBAL, "", g.kind, g.id, encode(g))
    with channel(vhost_url, 1) as ch:
        state = a.codec.encode(a.initial())
        BrokerStore(a.name).save(ch, checkpoint.Checkpoint(a.name, 5, 0.0, state, (sent,)))
    with running(a, vhost_url, 1):
        assert fetch(vhost_url, topology.RECORDER_GLOBAL).id == "g7"
    with channel(vhost_url, 1) as ch:
        assert BrokerStore(a.name).load(ch).seq == 5  # restoring does not consume the checkpoint


def test_a_profiler_restarted_mid_profiling_does_not_start_over(vhost_url):
    cfg = ProfilerConfig(num_clients=4, num_tiers=2, concurrency=2)
    with running(Profiler(cfg), vhost_url, 2):
        first = fetch_n(vhost_url, topology.PROFILE_QUEUE, 2)
        publish(vhost_url, topology.RESULTS, topology.PROFILE_KEY, answer(first[0], 0.0, 1, first[0].sent_at + 1), 2)
        third = fetch(vhost_url, topology.PROFILE_QUEUE)
        assert third is not None
    state = saved_state(vhost_url, Profiler(cfg))
    assert state.stage is Stage.PROFILING and set(state.latency) == {first[0].client}
    with running(Profiler(cfg), vhost_url, 2):
        (copy,) = fetch_n(vhost_url, topology.PROFILE_QUEUE, 1)
        assert copy.id == third.id  # the last saved transition's output, re-sent on restart
        for t in (first[1], third):
            publish(vhost_url, topology.RESULTS, topology.PROFILE_KEY, answer(t, 0.0, 1, t.sent_at + 2), 2)
        (last,) = fetch_n(vhost_url, topology.PROFILE_QUEUE, 1)
        assert last.client not in {first[0].client, first[1].client, third.client}  # nobody profiled twice
        publish(vhost_url, topology.RESULTS, topology.PROFILE_KEY, answer(last, 0.0, 1, last.sent_at + 3), 2)
        a = fetch(vhost_url, topology.BARRIER_ASSIGNMENTS)
        assert a is not None and a.epoch == 1 and sorted(c for t in a.tiers for c in t) == [0, 1, 2, 3]
    assert fetch(vhost_url, topology.BARRIER_ASSIGNMENTS, timeout=1) is None  # one epoch, not two


def test_waiting_for_consumers_returns_once_a_worker_consumes_the_profiling_queue(vhost_url):
    import threading

    from fedat.runtime.bus import BrokerConfig, wait_for_consumers

    cfg = BrokerConfig(url=vhost_url, num_tiers=1)
    with channel(vhost_url, 1):
        pass  # the topology exists
    stop = threading.Event()
    done = []
    t = threading.Thread(target=lambda: done.append(wait_for_consumers(cfg, topology.PROFILE_QUEUE, 1, stop, 0.2)))
    t.start()
    time.sleep(1.0)
    assert not done  # nobody consumes yet
    with channel(vhost_url, 1) as ch:
        ch.basic_consume(topology.PROFILE_QUEUE, lambda *a: None)
        t.join(timeout=10)
    assert done == [True]
    stop.set()
    assert wait_for_consumers(cfg, topology.PROFILE_QUEUE, 1, stop) is False  # a stop ends the wait


def test_a_one_shot_publish_outlasts_a_broker_that_is_not_back_yet(vhost_url, monkeypatch):
    # The seed job can start while the broker restarts (make chaos hit this): it must retry, not exit and leave
    # the pipeline without w0.
    import pika.exceptions as pe

    from fedat.protocol.service import Outgoing
    from fedat.protocol.wire import seed_model
    from fedat.runtime import bus

    real, attempts, sleeps = bus.connect, [], []

    def connect(cfg):
        attempts.append(time.monotonic())
        if len(attempts) <= 2:
            raise pe.AMQPConnectionError("connection refused")
        return real(cfg)

    monkeypatch.setattr(bus, "connect", connect)
    with channel(vhost_url, 1):
        pass  # the recorder's queue exists, so w0 is kept for us to read
    cfg = bus.BrokerConfig(url=vhost_url, num_tiers=1)
    w0 = seed_model([np.ones((2, 2), np.float32)], ["dense/kernel"], 1, "raw", 4, time.time())
    bus.publish_once(cfg, [Outgoing(topology.GLOBAL, "", w0)], sleep=sleeps.append)
    assert len(attempts) == 3 and sleeps == [0.5, 1.0]
    got = fetch(vhost_url, topology.RECORDER_GLOBAL, timeout=10)
    assert got is not None and got.id == w0.id and got.version == 0
    assert fetch(vhost_url, topology.RECORDER_GLOBAL, timeout=1) is None  # published once


def test_a_one_shot_publish_gives_up_after_its_patience_and_never_retries_a_refusal(vhost_url):
    import pika.exceptions as pe

    from fedat.protocol.service import Outgoing
    from fedat.protocol.wire import seed_model
    from fedat.runtime import bus

    w0 = [Outgoing(topology.GLOBAL, "", seed_model([np.ones(2, np.float32)], ["b"], 1, "raw", 4, 0.0))]
    sleeps: list[float] = []
    nobody = bus.BrokerConfig(url="amqp://guest:guest@127.0.0.1:1/%2F", num_tiers=1)
    with pytest.raises(pe.AMQPConnectionError):
        bus.publish_once(nobody, w0, patience=0.0, sleep=sleeps.append)
    assert sleeps == []  # no patience, no retry
    wrong = bus.BrokerConfig(url=vhost_url.replace("guest:guest", "guest:wrong"), num_tiers=1)
    with pytest.raises(bus.BrokerRefused, match="refused access"):
        bus.publish_once(wrong, w0, sleep=sleeps.append)
    assert sleeps == []


def test_a_killed_aggregator_restores_its_journalled_state_and_makes_the_same_versions(vhost_url):
    """FedBuff's state (history, buffer) lives in a snapshot and a journal of entries; a process that dies mid-journal
    is restored from both and makes exactly the versions an undisturbed one makes."""
    rng = np.random.default_rng(0)
    shapes, names = [(40, 30), (30,)], ["w", "b"]
    w0 = [rng.normal(0, 0.05, s).astype(np.float32) for s in shapes]
    models = [[(w + rng.normal(0, 0.01, w.shape)).astype(np.float32) for w in w0] for _ in range(24)]
    tms = [
        TierModel(f"tm1-r{k}", 1, k, max(0, (k - 1) // 2 - 1), 10, (k,), 0, 0, 0, 0.0, encode_model(m, names, "raw"))
        for k, m in enumerate(models, start=1)
    ]

    def fedbuff() -> Aggregator:
        return Aggregator(AggregatorConfig(num_tiers=1, codec="raw"), build_strategy("fedbuff", buffer_size=2))

    g0 = seed_model(w0, names, 1, "raw", 4, 0.0)
    expected = undisturbed(fedbuff(), g0, tms)

    publish(vhost_url, topology.GLOBAL, "", g0, 1)
    with running(fedbuff(), vhost_url, 1, prefetch=1):
        for tm in tms[:15]:
            publish(vhost_url, topology.TIER_MODELS, "", tm, 1)
        got = versions_until(vhost_url, 7)
    with channel(vhost_url, 1) as ch:  # the process is gone: a snapshot and the entries since are what is left
        journalled = ch.queue_declare(topology.journal_queue("aggregator"), passive=True).method.message_count
    assert journalled > 0
    with running(fedbuff(), vhost_url, 1, prefetch=1):
        for tm in tms[15:]:
            publish(vhost_url, topology.TIER_MODELS, "", tm, 1)
        got += versions_until(vhost_url, 12)
    got = [g for g in got if g.version > 0]  # the seed's
    assert {g.id for g in got} == set(expected)
    assert all(g.layers == expected[g.id] for g in got)  # a re-sent version is the same version


def test_an_aso_fed_state_larger_than_a_message_is_kept_in_parts_and_a_new_process_goes_on_from_it(vhost_url):
    """ASO-Fed keeps a model per client heard from: past the message limit its checkpoints go as parts, in the two
    journal queues in turn, every message within the limit, and a new process restores the state and makes exactly
    the versions an undisturbed one makes."""
    rng = np.random.default_rng(2)
    shapes, names = [(40, 30), (30,)], ["w", "b"]
    limit = 40_000  # about eight models of 4.9 kB
    w0 = [rng.normal(0, 0.05, s).astype(np.float32) for s in shapes]
    models = [[(w + rng.normal(0, 0.01, w.shape)).astype(np.float32) for w in w0] for _ in range(40)]
    tms = [  # forty clients, one at a time: forty copies
        TierModel(f"tm1-r{k}", 1, k, k - 1, 10, (k,), 0, 0, 0, 0.0, encode_model(m, names, "raw"))
        for k, m in enumerate(models, start=1)
    ]

    def aso_fed() -> Aggregator:
        return Aggregator(AggregatorConfig(num_tiers=1, codec="raw"), build_strategy("aso-fed"))

    g0 = seed_model(w0, names, 1, "raw", 4, 0.0)
    expected = undisturbed(aso_fed(), g0, tms)

    publish(vhost_url, topology.GLOBAL, "", g0, 1)
    queues = [topology.state_queue("aggregator"), *(topology.journal_queue("aggregator", s) for s in (0, 1))]
    sizes, parts, used, got = [], 0, set(), []
    with running(aso_fed(), vhost_url, 1, prefetch=1, max_message_bytes=limit):
        for k, tm in enumerate(tms[:30]):
            publish(vhost_url, topology.TIER_MODELS, "", tm, 1)
            got += versions_until(vhost_url, k + 1)
            with channel(vhost_url, 1) as ch:
                held = {q: BrokerStore._read(ch, q) for q in queues}
            sizes += [len(b) for bodies in held.values() for b in bodies]
            parts = max(parts, sum(checkpoint.decode(b, "aggregator").part for bs in held.values() for b in bs))
            used |= {q for q, bodies in held.items() if bodies}
    assert max(sizes) <= limit and parts >= 3 and used == set(queues)
    with running(aso_fed(), vhost_url, 1, prefetch=1, max_message_bytes=limit):
        for k, tm in enumerate(tms[30:], start=30):  # one at a time: the recorder's queue keeps only the newest few
            publish(vhost_url, topology.TIER_MODELS, "", tm, 1)
            got += versions_until(vhost_url, k + 1)
    assert len(saved_state(vhost_url, aso_fed()).strategy_state.models) == 40
    got = [g for g in got if g.version > 0]
    assert {g.id for g in got} == set(expected)
    assert all(g.layers == expected[g.id] for g in got)  # a re-sent version is the same version


def test_the_chaos_tool_counts_tier_models_in_fedbuff_s_buffer_as_in_flight(vhost_url):
    """Absorbed tier models are acked and kept in the aggregator's (journalled) state until the buffer steps: the
    chaos tool reads them from the aggregator's latest checkpoint, as the deterministic sweep does."""
    from fedat.ops.chaos.disturb import absorbed

    rng = np.random.default_rng(1)
    w0 = [rng.normal(0, 0.05, (40, 30)).astype(np.float32)]
    a = Aggregator(AggregatorConfig(num_tiers=1, codec="raw"), build_strategy("fedbuff", buffer_size=10))
    publish(vhost_url, topology.GLOBAL, "", seed_model(w0, ["w"], 1, "raw", 4, 0.0), 1)  # declares the topology
    assert absorbed(vhost_url) == []  # no checkpoint yet
    with running(a, vhost_url, 1, prefetch=1) as metrics:
        for k in range(1, 14):
            m = [(w0[0] + rng.normal(0, 0.01, w0[0].shape)).astype(np.float32)]
            tm = TierModel(f"tm1-r{k}", 1, k, 0, 10, (k,), 0, 0, 0, 0.0, encode_model(m, ["w"], "raw"))
            publish(vhost_url, topology.TIER_MODELS, "", tm, 1)
        consumed = metrics.consumed.labels(topology.AGGREGATOR_TIER_MODELS, "ok")
        deadline = time.time() + 30
        while consumed._value.get() < 13 and time.time() < deadline:
            time.sleep(0.1)
    assert absorbed(vhost_url) == [f"tm1-r{k}" for k in range(11, 14)]  # ten stepped into g1, three wait


def test_a_backlog_of_arrivals_is_committed_in_groups_each_version_once(vhost_url):
    """Queued ahead, arrivals reach the aggregator several per dispatch: fewer checkpoints than versions, and
    every version published once, in order, as the last checkpoint says."""
    rng = np.random.default_rng(0)
    for k in range(1, 13):
        layers = encode_model([rng.normal(0, 0.1, (4, 3)).astype(np.float32)], ["w"], "raw")
        tm = TierModel(f"tm1-r{k}", 1, k, 0, 10, (k,), 0, 0, 0, 0.0, layers)
        publish(vhost_url, topology.TIER_MODELS, "", tm, 1)
    with tap(vhost_url, topology.GLOBAL) as get, running(aggregator(), vhost_url, 1, prefetch=16) as metrics:
        published = [get() for _ in range(12)]
        groups = {s.name: s.value for s in metrics.group_transitions.collect()[0].samples}
        saves = metrics.state_saves._value.get()
    assert [g.version for g in published] == list(range(1, 13))
    assert saves < 12  # 12 versions behind fewer checkpoints: arrivals were grouped
    # (the groups also hold the acks of its own versions coming back, which need no checkpoint)
    assert groups["fedat_commit_group_transitions_count"] < groups["fedat_commit_group_transitions_sum"]
    assert saved_state(vhost_url, aggregator()).version == 12
