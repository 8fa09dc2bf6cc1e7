"""An outbox goes to the real broker as one transaction: all of it is queued when the commit returns; a task for a real
client whose queue is gone is dropped; anything else that finds no queue raises, once the rest is committed."""

from __future__ import annotations

import time
from urllib.parse import unquote

import pika.exceptions as pe
import pytest
from prometheus_client import CollectorRegistry

from fedat.ops import broker_admin
from fedat.protocol import topology
from fedat.protocol.service import Outgoing
from fedat.protocol.wire import TrainTask
from fedat.runtime.bus import BrokerConfig, close_quietly, connect, encode_all
from fedat.runtime.metrics import transport_metrics
from fedat.runtime.publishing import Publisher
from fedat_aggregator.collector import Collector, CollectorConfig

from .broker import channel, running
from .test_durability import barrier

pytestmark = pytest.mark.broker


def task(client: int) -> TrainTask:
    return TrainTask(f"t1-r1-c{client}-v0", client, 1, 1, 0, 1, 10, 0.01, 0.0, "raw", 4, 0.0, ())


@pytest.fixture
def broker(vhost_url):
    """A declared topology with real client 1's queues, a publisher, and its metrics."""
    with channel(vhost_url, num_tiers=2) as ch:
        for q in topology.client_queues(1):
            ch.queue_declare(q.name, durable=True, arguments=q.arguments)
            for exchange, key in q.bindings:
                ch.queue_bind(q.name, exchange, key)
        conn = connect(BrokerConfig(url=vhost_url))
        try:
            yield ch, Publisher(conn), transport_metrics(CollectorRegistry(), "barrier")
        finally:
            close_quietly(conn)


def ready(ch, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def send(publisher: Publisher, metrics, *out: Outgoing) -> None:
    publisher.publish(encode_all(out, BrokerConfig(keyring=None)), metrics)


def published(metrics) -> float:
    return metrics.published.labels("train")._value.get()


def test_an_outbox_is_queued_in_full_when_its_commit_returns(broker):
    ch, publisher, metrics = broker
    send(publisher, metrics, *(Outgoing(topology.TRAIN, topology.tier_key(1), task(c)) for c in range(10)))
    assert ready(ch, topology.train_queue(1)) == 10
    assert published(metrics) == 10


def test_an_outbox_larger_than_a_transaction_may_hold_is_committed_in_several(broker, monkeypatch):
    ch, publisher, metrics = broker
    sent = encode_all([Outgoing(topology.TRAIN, topology.tier_key(1), task(c)) for c in range(10)], BrokerConfig())
    publisher.max_bytes = 3 * len(sent[0].body)  # three tasks a transaction: the broker holds them until the commit
    commits = []
    monkeypatch.setattr(
        publisher.channel, "tx_commit", lambda commit=publisher.channel.tx_commit: commits.append(commit())
    )
    publisher.publish(sent, metrics)
    assert len(commits) == 4 and ready(ch, topology.train_queue(1)) == 10 and published(metrics) == 10


def test_a_task_for_a_client_without_a_queue_is_dropped_and_the_rest_go(broker):
    ch, publisher, metrics = broker
    send(
        publisher, metrics, Outgoing(topology.TRAIN, "client-9", task(9)), Outgoing(topology.TRAIN, "client-1", task(1))
    )
    assert ready(ch, topology.client_queue(1)) == 1
    assert published(metrics) == 1  # the dropped one is not counted as published
    send(publisher, metrics, Outgoing(topology.TRAIN, "client-1", task(1)))  # a return is not held against the next
    assert published(metrics) == 2


def test_anything_else_that_finds_no_queue_raises_and_the_publisher_goes_on(broker):
    ch, publisher, metrics = broker
    with pytest.raises(pe.UnroutableError, match="1 unroutable"):
        send(
            publisher, metrics, Outgoing(topology.TRAIN, "tier-7", task(1)), Outgoing(topology.TRAIN, "tier-1", task(2))
        )
    assert ready(ch, topology.train_queue(1)) == 1  # committed with it: a restore re-sends it under the same id
    send(publisher, metrics, Outgoing(topology.TRAIN, topology.tier_key(2), task(3)))
    assert ready(ch, topology.train_queue(2)) == 1


def connections(url: str) -> int:
    """The connections open on the test's vhost, as the management API lists them."""
    return broker_admin.open_connections(unquote(url.rsplit("/", 1)[1]))


def settles_at(url: str, expected: int, patience: float = 10.0) -> int:
    """The vhost's connection count once it equals `expected`, or whatever it is after `patience` seconds."""
    deadline = time.monotonic() + patience
    while (n := connections(url)) != expected and time.monotonic() < deadline:
        time.sleep(0.2)
    return n


def test_a_durable_service_publishes_on_a_second_connection_and_others_keep_to_one(vhost_url):
    for persist in (True, False):  # with or without checkpoints: its outboxes are the same
        with running(barrier(), vhost_url, 1, persist=persist):
            assert settles_at(vhost_url, 2) == 2
        assert settles_at(vhost_url, 0) == 0  # both closed with it
    with running(Collector(CollectorConfig()), vhost_url, 1):  # answers one message at a time, as workers and clients
        assert settles_at(vhost_url, 1) == 1
        time.sleep(1.0)
        assert connections(vhost_url) == 1
