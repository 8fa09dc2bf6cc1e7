"""The barrier, aggregator and profiler on the real broker, with the test playing the clients."""

from __future__ import annotations

import time

import numpy as np
import pytest

from fedat.fl.strategies import build_strategy
from fedat.fl.tiering import tier_of
from fedat.protocol import topology
from fedat.protocol.wire import RoundReport, TierAssignment, Update, decode_model, encode_model
from fedat_aggregator.aggregator import Aggregator, AggregatorConfig
from fedat_aggregator.barrier import Barrier, BarrierConfig
from fedat_profiler.profiler import Profiler, ProfilerConfig

from ..factories import SHAPES, answer, seed
from .broker import close_connections, fetch, fetch_n, publish, queue_types, running

pytestmark = pytest.mark.broker


def start_tier(url: str, clients: tuple[int, ...], shapes=SHAPES, keyring=None) -> None:
    assignment = TierAssignment(
        id="a1", epoch=1, tiers=(clients,), latencies={c: 0.1 for c in clients}, created_at=time.time()
    )
    publish(url, topology.CONTROL, "", assignment, num_tiers=1, keyring=keyring)
    publish(url, topology.GLOBAL, "", seed(1, shapes, time.time()), num_tiers=1, keyring=keyring)


def barrier(**kw) -> Barrier:
    kw.setdefault("min_deadline", 30.0)
    cfg = BarrierConfig(tiers=(1,), codec="raw", tier_codec="raw", **kw)
    return Barrier(cfg, build_strategy("fedat"))


def aggregator() -> Aggregator:
    return Aggregator(AggregatorConfig(num_tiers=1, codec="raw"), build_strategy("fedat"))


def test_topology_is_declared_as_documented(vhost_url):
    publish(vhost_url, topology.GLOBAL, "", seed(3), num_tiers=3)
    types = queue_types(vhost_url)
    expected = {q.name for q in topology.queues(3)}
    assert expected <= set(types)
    assert {"fedat.train.tier-1", "fedat.train.tier-3", "fedat.barrier.tier-2", "fedat.dead-letters"} <= expected
    assert all(types[name] == "quorum" for name in expected)


def test_tier_round_merges_exactly_and_counts_a_duplicate_once(vhost_url):
    with running(barrier(clients_per_round=3, min_clients=3), vhost_url, 1), running(aggregator(), vhost_url, 1):
        start_tier(vhost_url, (0, 1, 2, 3))
        tasks = fetch_n(vhost_url, topology.train_queue(1), 3)
        assert {t.round for t in tasks} == {1} and {t.version for t in tasks} == {0}
        assert len({t.client for t in tasks}) == 3
        for t in tasks:
            publish(vhost_url, topology.RESULTS, topology.tier_key(1), answer(t, float(t.client), t.client + 1), 1)
        publish(vhost_url, topology.RESULTS, topology.tier_key(1), answer(tasks[0], 99.0, 1000), 1)  # redelivered copy
        g = fetch(vhost_url, topology.RECORDER_GLOBAL)
        while g is not None and g.version == 0:
            g = fetch(vhost_url, topology.RECORDER_GLOBAL)
        assert g is not None and g.version == 1 and g.updates == 3 and g.tier_counts == (1,)
        n = np.array([t.client + 1 for t in tasks], float)
        expected = float((n * np.array([t.client for t in tasks])).sum() / n.sum())
        for layer in decode_model(g.layers):
            np.testing.assert_allclose(layer, expected, rtol=1e-6)
        nxt = fetch_n(vhost_url, topology.train_queue(1), 3)  # the tier loops on from the new global model
        assert {t.round for t in nxt} == {2} and {t.version for t in nxt} == {1}


def test_malformed_and_oversize_messages_are_dead_lettered_and_the_round_goes_on(vhost_url):
    with (
        running(barrier(clients_per_round=2, min_clients=2), vhost_url, 1, max_message_bytes=100_000),
        running(aggregator(), vhost_url, 1),
    ):
        start_tier(vhost_url, (0, 1))
        tasks = fetch_n(vhost_url, topology.train_queue(1), 2)
        publish(vhost_url, topology.RESULTS, topology.tier_key(1), b"\xc1 not msgpack", 1)
        big = answer(tasks[0], 1.0, 1)
        big = Update(
            **{
                **{f: getattr(big, f) for f in big.__dataclass_fields__ if f != "kind"},
                "layers": encode_model([np.zeros(200_000, np.float32)], ["huge"], "raw"),
            }
        )
        publish(vhost_url, topology.RESULTS, topology.tier_key(1), big, 1)
        nan = answer(tasks[1], float("nan"), 1)
        publish(vhost_url, topology.RESULTS, topology.tier_key(1), nan, 1)
        reasons = []
        for _ in range(3):
            props, body = fetch(vhost_url, topology.DEAD_LETTERS, raw=True)
            assert props.headers[topology.HEADER_SOURCE_QUEUE] == topology.barrier_queue(1)
            reasons.append(props.headers[topology.HEADER_REASON])
        assert any("msgpack" in r for r in reasons), reasons
        assert any("oversize" in r for r in reasons), reasons
        assert any("NaN" in r or "nan" in r.lower() for r in reasons), reasons
        for t in tasks:
            publish(vhost_url, topology.RESULTS, topology.tier_key(1), answer(t, 1.0, 10), 1)
        versions = [fetch(vhost_url, topology.RECORDER_GLOBAL).version for _ in range(2)]
        assert versions == [0, 1]


def test_a_dropout_closes_the_round_at_its_deadline(vhost_url):
    b = Barrier(
        BarrierConfig(tiers=(1,), codec="raw", tier_codec="raw", clients_per_round=3, min_clients=2, min_deadline=2.0),
        build_strategy("fedat"),
    )
    with running(b, vhost_url, 1), running(aggregator(), vhost_url, 1):
        start_tier(vhost_url, (0, 1, 2))
        tasks = fetch_n(vhost_url, topology.train_queue(1), 3)
        opened = time.time()
        for t in tasks[:2]:  # the third client never answers
            publish(vhost_url, topology.RESULTS, topology.tier_key(1), answer(t, 2.0, 5), 1)
        fetch(vhost_url, topology.RECORDER_GLOBAL)  # the seed
        g = fetch(vhost_url, topology.RECORDER_GLOBAL, timeout=20)
        assert g is not None and g.version == 1 and g.updates == 2
        assert time.time() - opened >= 1.5  # it waited for the deadline, not for the dropout


def test_below_the_minimum_the_round_is_reissued_to_fresh_clients(vhost_url):
    b = Barrier(
        BarrierConfig(tiers=(1,), codec="raw", tier_codec="raw", clients_per_round=2, min_clients=2, min_deadline=1.5),
        build_strategy("fedat"),
    )
    with running(b, vhost_url, 1), running(aggregator(), vhost_url, 1):
        start_tier(vhost_url, (0, 1, 2, 3))
        first = fetch_n(vhost_url, topology.train_queue(1), 2)
        publish(vhost_url, topology.RESULTS, topology.tier_key(1), answer(first[0], 1.0, 1), 1)
        again = fetch(vhost_url, topology.train_queue(1), timeout=10)
        assert again is not None and again.round == 1
        assert again.client not in {t.client for t in first}
        publish(vhost_url, topology.RESULTS, topology.tier_key(1), answer(again, 3.0, 1), 1)
        fetch(vhost_url, topology.RECORDER_GLOBAL)
        g = fetch(vhost_url, topology.RECORDER_GLOBAL, timeout=10)
        assert g.version == 1 and g.updates == 2
        np.testing.assert_allclose(decode_model(g.layers)[1], 2.0)


def test_an_update_waits_for_its_modelled_response_time(vhost_url):
    with running(barrier(clients_per_round=1, min_clients=1), vhost_url, 1), running(aggregator(), vhost_url, 1):
        start_tier(vhost_url, (0,))
        (task,) = fetch_n(vhost_url, topology.train_queue(1), 1)
        sent = time.time()
        publish(vhost_url, topology.RESULTS, topology.tier_key(1), answer(task, 1.0, 1, not_before=sent + 2.0), 1)
        fetch(vhost_url, topology.RECORDER_GLOBAL)
        g = fetch(vhost_url, topology.RECORDER_GLOBAL, timeout=10)
        assert g.version == 1 and g.created_at >= sent + 1.9


def test_profiling_assigns_tiers_and_a_slowed_client_is_moved(vhost_url):
    cfg = ProfilerConfig(num_clients=4, num_tiers=2, concurrency=4, retier_every=2, drift_fraction=0.2, ewma_alpha=1.0)
    with running(Profiler(cfg), vhost_url, 2):
        tasks = fetch_n(vhost_url, topology.PROFILE_QUEUE, 4)
        assert all(t.tier == 0 and t.layers == () for t in tasks)
        # Answered at once, modelled to answer later: the pass ends at the slowest modelled answer, not on receipt.
        latency = {0: 0.5, 1: 0.6, 2: 1.5, 3: 2.0}
        for t in tasks:
            publish(
                vhost_url, topology.RESULTS, topology.PROFILE_KEY, answer(t, 0.0, 1, t.sent_at + latency[t.client]), 2
            )
        a1 = fetch(vhost_url, topology.BARRIER_ASSIGNMENTS)
        assert a1.epoch == 1 and a1.tiers == ((0, 1), (2, 3))
        assert a1.created_at >= max(t.sent_at + latency[t.client] for t in tasks) - 0.05
        # The barrier reports that client 0 took 100 s in two rounds: it becomes the slowest of all.
        for r in (1, 2):
            rr = RoundReport(
                id=f"rr1-r{r}", tier=1, round=r, latencies={0: 100.0}, missing=(), waited=100.0, closed_at=time.time()
            )
            publish(vhost_url, topology.EVENTS, topology.ROUND_REPORT_KEY, rr, 2)
        a2 = fetch(vhost_url, topology.BARRIER_ASSIGNMENTS)
        assert a2 is not None and a2.epoch == 2
        assert tier_of(a2.tiers)[0] == 2 and tier_of(a1.tiers)[0] == 1


def test_services_reconnect_after_the_broker_drops_them_and_the_round_completes(vhost_url):
    with (
        running(barrier(clients_per_round=3, min_clients=3), vhost_url, 1) as barrier_metrics,
        running(aggregator(), vhost_url, 1),
    ):
        start_tier(vhost_url, (0, 1, 2))
        tasks = fetch_n(vhost_url, topology.train_queue(1), 3)
        publish(vhost_url, topology.RESULTS, topology.tier_key(1), answer(tasks[0], 1.0, 1), 1)
        time.sleep(1.0)  # the barrier now holds that update unacked
        close_connections(vhost_url)
        deadline = time.time() + 30
        while barrier_metrics.reconnects._value.get() < 1 or barrier_metrics.connected._value.get() != 1:
            assert time.time() < deadline, "the barrier did not reconnect"
            time.sleep(0.2)
        for t in tasks[1:]:
            publish(vhost_url, topology.RESULTS, topology.tier_key(1), answer(t, 1.0, 1), 1)
        versions = []
        while not versions or versions[-1] < 1:
            g = fetch(vhost_url, topology.RECORDER_GLOBAL, timeout=30)
            assert g is not None, f"no global model after the reconnect (saw {versions})"
            versions.append(g.version)
        assert g.updates == 3  # the held update was redelivered and counted once


def test_a_refused_login_stops_the_service_with_a_clear_error_instead_of_retrying(vhost_url):
    import threading

    from prometheus_client import CollectorRegistry

    from fedat.runtime.bus import BrokerConfig, BrokerRefused, run_service
    from fedat.runtime.metrics import transport_metrics

    wrong = vhost_url.replace("guest:guest@", "guest:not-the-password@")
    cfg = BrokerConfig(url=wrong, num_tiers=1)
    started = time.time()
    with pytest.raises(BrokerRefused, match="refused access"):
        run_service(aggregator(), cfg, transport_metrics(CollectorRegistry(), "aggregator"), threading.Event())
    assert time.time() - started < 10
