"""A task for a real client whose queue is gone, or an evaluation request nobody is enrolled for, is dropped; any
other publish that finds no queue is still an error (a broken topology must not go unnoticed)."""

from __future__ import annotations

import pika.exceptions as pe
import pytest

from fedat.protocol import topology
from fedat.protocol.service import Outgoing
from fedat.protocol.wire import EvaluationRequest, TrainTask
from fedat.runtime.bus import BrokerConfig, encode_all
from fedat.runtime.publishing import publish_sent
from fedat_sim.clock import Clock
from fedat_sim.memory import MemoryBroker


def task(client: int) -> TrainTask:
    return TrainTask(f"t1-r1-c{client}-v0", client, 1, 1, 0, 1, 10, 0.01, 0.0, "raw", 4, 0.0, ())


@pytest.fixture
def channel():
    broker = MemoryBroker(Clock())
    broker.declare_topology(num_tiers=2)
    for q in topology.client_queues(1):
        broker.declare_queue(q.name, q.arguments)
        for exchange, key in q.bindings:
            broker.bind(q.name, exchange, key)
    ch = broker.connect("barrier").channel()
    ch.confirm_delivery()
    return broker, ch


def send(ch, *out: Outgoing) -> None:
    publish_sent(ch, encode_all(out, BrokerConfig(keyring=None)))


def test_a_task_for_a_client_without_a_queue_is_dropped_and_the_others_still_go(channel):
    broker, ch = channel
    send(ch, Outgoing(topology.TRAIN, "client-9", task(9)), Outgoing(topology.TRAIN, "client-1", task(1)))
    assert [e.properties.message_id for e in broker.ready_messages(topology.client_queue(1))] == ["t1-r1-c1-v0"]


def test_an_evaluation_request_with_nobody_enrolled_is_dropped(channel):
    broker, ch = channel
    broker.bindings[topology.EVALUATE].clear()  # no client enrolled
    send(ch, Outgoing(topology.EVALUATE, "", EvaluationRequest("er3", 3, 0.0, ())))


def test_anything_else_that_finds_no_queue_is_an_error(channel):
    _, ch = channel
    with pytest.raises(pe.UnroutableError):
        send(ch, Outgoing(topology.TRAIN, "tier-7", task(1)))
    with pytest.raises(pe.UnroutableError):
        send(ch, Outgoing(topology.TRAIN, "client-x", task(1)))
