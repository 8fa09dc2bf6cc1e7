"""The server side of real clients through the real transport and broker: the profiler takes joins and leaves from
one queue (two kinds, each to its handler), sends each profiling task to its client's own queue and tiers the
clients; the collector asks every enrolled client to score a model and publishes the merged evaluation. The clients
are played by the test, with their own keys."""

from __future__ import annotations

import secrets
from dataclasses import replace

import numpy as np
import pika
import pytest

from fedat.fl.evaluation import EvalSchedule
from fedat.protocol import ids, signing, topology, wire
from fedat_aggregator.collector import Collector, CollectorConfig
from fedat_profiler.profiler import Profiler, ProfilerConfig

from ..factories import seed
from .broker import fetch, publish, running

pytestmark = pytest.mark.broker

KEYRING = signing.Keyring.from_secret(secrets.token_bytes(32))
N = 2


def enrolled(url: str, *clients: int) -> None:
    """Declare the clients' own queues, as `fedat enroll` does."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    topology.declare(ch, N)
    for k in clients:
        for q in topology.client_queues(k):
            ch.queue_declare(q.name, durable=True, arguments=q.arguments)
            for exchange, key in q.bindings:
                ch.queue_bind(q.name, exchange, key)
    conn.close()


def as_client(url: str, key: str, msg, signer: int | None = None) -> None:
    """Publish `msg` as client `signer` (its own key by default) with routing key `<key>.client-<signer>`."""
    k = msg.client if signer is None else signer
    own = signing.Keyring.from_mapping({f"client-{k}": KEYRING.key(f"client-{k}").hex()})
    body = wire.encode(msg)
    headers = signing.sign(own, replace(msg, client=k), body)
    publish(url, topology.RESULTS, topology.from_client(key, k), body, N, headers=headers)


def profiling_answer(task: wire.TrainTask) -> wire.Update:
    return wire.Update(ids.update(task.id), task.id, task.client, 0, 0, 0, 100, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, False, ())


def test_clients_join_are_profiled_through_their_own_queues_and_tiered_a_forgery_and_a_leaver_are_not(vhost_url):
    enrolled(vhost_url, 1, 2, 3)
    cfg = ProfilerConfig(real_clients=True, num_clients=3, num_tiers=N, profile_deadline=60.0, regroup_delay=0.2)
    with running(Profiler(cfg), vhost_url, N, keyring=KEYRING):
        as_client(vhost_url, topology.JOIN_KEY, wire.Join("j-c3-1", 2, 100, 0.0), signer=3)  # 3 joins as 2
        dead = fetch(vhost_url, topology.DEAD_LETTERS, timeout=20, raw=True)
        assert (
            dead[0].headers[topology.HEADER_REASON]
            == "join j-c3-1 is signed by client-3, but must be signed by client-2"
        )
        for k in (1, 2, 3):
            as_client(vhost_url, topology.JOIN_KEY, wire.Join(ids.join(k, 1), k, 100, 0.0))
        for k in (1, 2, 3):
            task = fetch(vhost_url, topology.client_queue(k), timeout=20)
            assert (task.id, task.client, task.tier, task.layers) == (f"p-c{k}", k, 0, ())
            as_client(vhost_url, topology.PROFILE_KEY, profiling_answer(task))
        first = fetch(vhost_url, topology.BARRIER_ASSIGNMENTS, timeout=20)
        assert first.epoch == 1 and sorted(c for tier in first.tiers for c in tier) == [1, 2, 3]
        as_client(vhost_url, topology.LEAVE_KEY, wire.Leave(ids.leave(2, 9), 2, "stopped", 0.0))
        second = fetch(vhost_url, topology.BARRIER_ASSIGNMENTS, timeout=20)
        assert second.epoch == 2 and sorted(c for tier in second.tiers for c in tier) == [1, 3]
        assert fetch(vhost_url, topology.DEAD_LETTERS, timeout=1) is None


def test_every_enrolled_client_is_asked_to_score_a_model_and_their_scores_become_one_evaluation(vhost_url):
    enrolled(vhost_url, 4, 5)
    collector = Collector(CollectorConfig(EvalSchedule(every=1), window=60.0))
    with running(collector, vhost_url, N, keyring=KEYRING):
        assignment = wire.TierAssignment("a1", 1, ((4,), (5,)), {4: 1.0, 5: 2.0}, 0.0)
        publish(vhost_url, topology.CONTROL, "", assignment, N, keyring=KEYRING)
        g0 = seed(N)
        publish(vhost_url, topology.GLOBAL, "", g0, N, keyring=KEYRING)
        for k in (4, 5):
            props, body = fetch(vhost_url, topology.client_evaluate_queue(k), timeout=20, raw=True)
            request = wire.decode(body)
            assert (request.kind, request.version, request.layers) == ("evaluate", 0, g0.layers)
            signing.verify(KEYRING, request, body, props.headers)  # signed as the evaluator
        as_client(vhost_url, topology.CLIENT_EVALUATION_KEY, wire.ClientEvaluation("e0-c4", 4, 0, 1.0, 0.5, 30, 0.0))
        as_client(vhost_url, topology.CLIENT_EVALUATION_KEY, wire.ClientEvaluation("e0-c5", 5, 0, 2.0, 0.9, 10, 0.0))
        ev = fetch(vhost_url, topology.RECORDER_EVENTS, timeout=20)
        assert (ev.kind, ev.version, ev.n_clients) == ("evaluation", 0, 2)
        assert ev.accuracy == pytest.approx(0.6) and ev.loss == pytest.approx(1.25)
        assert ev.accuracies[4:] == pytest.approx((0.5, 0.9))


def test_once_every_client_scored_a_request_sent_whole_the_next_goes_against_it_and_decodes_exactly(vhost_url):
    enrolled(vhost_url, 6)
    rng = np.random.default_rng(0)
    w0 = [rng.normal(0, 0.05, (20, 10)).astype(np.float32), np.zeros(10, np.float32)]
    g0 = wire.seed_model(w0, ["d", "b"], N, "polyline", 4, 0.0)
    w1 = [(a + rng.normal(0, 0.002, a.shape)).astype(np.float32) for a in w0]
    g1 = replace(g0, id="g1", version=1, layers=wire.encode_model(w1, ["d", "b"], "polyline", 4))
    with running(Collector(CollectorConfig(EvalSchedule(every=1), whole_every=4)), vhost_url, N, keyring=KEYRING):
        assignment = wire.TierAssignment("a1", 1, ((6,), ()), {6: 1.0}, 0.0)
        publish(vhost_url, topology.CONTROL, "", assignment, N, keyring=KEYRING)
        publish(vhost_url, topology.GLOBAL, "", g0, N, keyring=KEYRING)
        whole = fetch(vhost_url, topology.client_evaluate_queue(6), timeout=20)
        # its score says it keeps version 0 (the evaluation follows once every assigned client has scored)
        as_client(vhost_url, topology.CLIENT_EVALUATION_KEY, wire.ClientEvaluation("e0-c6", 6, 0, 1.0, 0.5, 30, 0.0))
        assert fetch(vhost_url, topology.RECORDER_EVENTS, timeout=20).version == 0
        publish(vhost_url, topology.GLOBAL, "", g1, N, keyring=KEYRING)
        against = fetch(vhost_url, topology.client_evaluate_queue(6), timeout=20)
    assert (whole.relative_to, whole.layers) == (-1, g0.layers)
    assert against.relative_to == 0 and wire.model_bytes(against.layers) < wire.model_bytes(g1.layers)
    got = wire.decode_model(against.layers, wire.decode_model(whole.layers))
    assert [a.tobytes() for a in got] == [a.tobytes() for a in wire.decode_model(g1.layers)]
