"""The in-memory broker honours the topology's semantics, as RabbitMQ does (FACTS.md, docs/architecture.md §2)."""

from __future__ import annotations

import pika
import pika.exceptions as pe
import pytest

from fedat.ops.capture import dead_letter
from fedat.protocol import topology
from fedat_sim.clock import ORIGIN, Clock
from fedat_sim.memory import ACKED, DROPPED, MemoryBroker, topic_matches


def props(message_id: str, kind: str = "update") -> pika.BasicProperties:
    return pika.BasicProperties(message_id=message_id, type=kind)


@pytest.fixture
def broker() -> MemoryBroker:
    b = MemoryBroker(Clock())
    b.declare_topology(num_tiers=3)
    return b


class Inbox:
    """A consumer callback that keeps what it got."""

    def __init__(self) -> None:
        self.got: list[tuple] = []

    def __call__(self, channel, method, properties, body) -> None:
        self.got.append((method, properties, body))

    def ids(self) -> list[str]:
        return [p.message_id for _, p, _ in self.got]


def consume(broker: MemoryBroker, queue: str, prefetch: int = 0, name: str = "c"):
    ch = broker.connect(name).channel()
    ch.basic_qos(prefetch_count=prefetch)
    inbox = Inbox()
    ch.basic_consume(queue=queue, on_message_callback=inbox)
    return ch, inbox


def test_topic_patterns_match_words_like_amqp():
    assert topic_matches("#", "") and topic_matches("#", "tier-1") and topic_matches("#", "a.b.c")
    assert topic_matches("a.*", "a.b") and not topic_matches("a.*", "a.b.c") and not topic_matches("a.*", "a")
    assert topic_matches("a.#", "a") and topic_matches("a.#.c", "a.x.y.c") and not topic_matches("a.#.c", "a.x.d")
    assert topic_matches("tier-2", "tier-2") and not topic_matches("tier-2", "tier-3")


def test_the_topology_routes_every_kind_to_the_queues_of_the_architecture(broker):
    assert broker.route(topology.RESULTS, "tier-2") == [topology.barrier_queue(2)]
    assert broker.route(topology.RESULTS, topology.PROFILE_KEY) == [topology.PROFILER_RESULTS]
    assert broker.route(topology.TRAIN, "tier-1") == [topology.train_queue(1)]
    assert broker.route(topology.TRAIN, topology.PROFILE_KEY) == [topology.PROFILE_QUEUE]
    assert set(broker.route(topology.GLOBAL, "")) == {
        topology.AGGREGATOR_GLOBAL,
        topology.BARRIER_GLOBAL,
        topology.EVALUATOR_GLOBAL,
        topology.RECORDER_GLOBAL,
        topology.COLLECTOR_GLOBAL,
    }
    # A real client's keys name it; they reach the same queues as the pool's.
    assert broker.route(topology.RESULTS, "tier-2.client-7") == [topology.barrier_queue(2)]
    assert broker.route(topology.RESULTS, "profile.client-7") == [topology.PROFILER_RESULTS]
    assert broker.route(topology.RESULTS, "join.client-7") == [topology.PROFILER_MEMBERS]
    assert broker.route(topology.RESULTS, "leave.client-7") == [topology.PROFILER_MEMBERS]
    assert broker.route(topology.RESULTS, "evaluation.client-7") == [topology.COLLECTOR_EVALUATIONS]
    assert set(broker.route(topology.EVENTS, topology.EVALUATION_KEY)) == {
        topology.RECORDER_EVENTS,
        topology.BARRIER_EVALUATIONS,
    }
    assert broker.route(topology.EVENTS, topology.ROUND_REPORT_KEY) == [topology.PROFILER_REPORTS]
    assert broker.route(topology.STATE, "barrier") == [topology.state_queue("barrier")]


def test_a_mandatory_publish_that_reaches_no_queue_raises_like_a_confirm_channel(broker):
    ch = broker.connect("p").channel()
    with pytest.raises(pe.UnroutableError):
        ch.basic_publish(topology.TRAIN, "tier-9", b"x", props("t"), mandatory=True)
    with pytest.raises(pe.ChannelClosedByBroker):
        broker.declare_queue(topology.EVALUATOR_GLOBAL, {"x-queue-type": "classic"})  # inequivalent arguments


def test_prefetch_holds_back_deliveries_until_an_ack_and_consumers_take_turns(broker):
    pub = broker.connect("p").channel()
    for i in range(4):
        pub.basic_publish(topology.TRAIN, "tier-1", b"x", props(f"t{i}"))
    ch1, in1 = consume(broker, topology.train_queue(1), prefetch=1, name="w1")
    ch2, in2 = consume(broker, topology.train_queue(1), prefetch=1, name="w2")
    broker.clock.run(ORIGIN + 1)
    assert in1.ids() == ["t0"] and in2.ids() == ["t1"]  # one each, nothing more until an ack
    ch1.basic_ack(in1.got[0][0].delivery_tag)
    broker.clock.run(ORIGIN + 2)
    assert in1.ids() == ["t0", "t2"] and in2.ids() == ["t1"]


def test_a_closed_connection_returns_its_unacked_deliveries_in_order_as_redelivered(broker):
    pub = broker.connect("p").channel()
    for i in range(3):
        pub.basic_publish(topology.RESULTS, "tier-1", b"x", props(f"u{i}"))
    ch, inbox = consume(broker, topology.barrier_queue(1), name="barrier")
    fired = []
    ch.connection.call_later(5.0, lambda: fired.append(True))
    broker.clock.run(ORIGIN + 1)
    ch.connection.close()
    _, again = consume(broker, topology.barrier_queue(1), name="barrier-2")
    broker.clock.run(ORIGIN + 10)
    assert again.ids() == ["u0", "u1", "u2"]
    assert all(m.redelivered for m, _, _ in again.got)
    assert [p.headers["x-delivery-count"] for _, p, _ in again.got] == [1, 1, 1]
    assert fired == []  # timers are lost with the connection


def test_a_message_returned_beyond_the_delivery_limit_is_dead_lettered_by_the_broker(broker):
    pub = broker.connect("p").channel()
    pub.basic_publish(topology.TIER_MODELS, "", b"x", props("tm1-r1", "tier-model"))
    for attempt in range(topology.DELIVERY_LIMIT + 1):
        ch, inbox = consume(broker, topology.AGGREGATOR_TIER_MODELS, name=f"agg-{attempt}")
        broker.clock.run(broker.clock.now + 1)
        assert len(inbox.got) == 1
        ch.basic_nack(inbox.got[0][0].delivery_tag, requeue=True)
        ch.connection.close()
    (dead,) = broker.ready_messages(topology.DEAD_LETTERS)
    record = dead_letter(dead.properties, dead.body)
    assert (record.message_id, record.reason, record.queue, record.source) == (
        "tm1-r1",
        "delivery_limit",
        topology.AGGREGATOR_TIER_MODELS,
        "broker",
    )
    assert broker.audit() == []


def test_nack_without_requeue_is_rejected_to_the_dead_letters(broker):
    pub = broker.connect("p").channel()
    pub.basic_publish(topology.CONTROL, "", b"x", props("a1", "tier-assignment"))
    ch, inbox = consume(broker, topology.BARRIER_ASSIGNMENTS)
    broker.clock.run(ORIGIN + 1)
    ch.basic_nack(inbox.got[0][0].delivery_tag, requeue=False)
    (dead,) = broker.ready_messages(topology.DEAD_LETTERS)
    assert dead.properties.headers["x-death"][0]["reason"] == "rejected"


def test_observer_queues_keep_the_newest_and_state_queues_only_the_latest(broker):
    pub = broker.connect("p").channel()
    for v in range(topology.OBSERVER_MAX_LENGTH + 3):
        pub.basic_publish(topology.GLOBAL, "", b"g", props(f"g{v}", "global-model"))
    kept = [e.properties.message_id for e in broker.ready_messages(topology.EVALUATOR_GLOBAL)]
    assert kept == [f"g{v}" for v in range(3, topology.OBSERVER_MAX_LENGTH + 3)]
    assert sum(1 for s in broker.ledger.values() if s == DROPPED) == 3 * 3  # the evaluator's, recorder's, collector's
    for seq in range(3):
        pub.basic_publish(topology.STATE, "barrier", b"c", props(f"barrier-{seq}", "checkpoint"))
    assert [e.properties.message_id for e in broker.ready_messages(topology.state_queue("barrier"))] == ["barrier-2"]


def test_a_checkpoint_read_with_get_and_nack_stays_in_its_queue(broker):
    pub = broker.connect("p").channel()
    pub.basic_publish(topology.STATE, "profiler", b"c", props("profiler-1", "checkpoint"))
    ch = broker.connect("profiler").channel()
    method, _, body = ch.basic_get(topology.state_queue("profiler"), auto_ack=False)
    assert body == b"c" and broker.ready_messages(topology.state_queue("profiler")) == []
    ch.basic_nack(method.delivery_tag, requeue=True)
    assert len(broker.ready_messages(topology.state_queue("profiler"))) == 1


def test_acking_an_unknown_tag_closes_the_channel_and_is_recorded(broker):
    ch = broker.connect("x").channel()
    with pytest.raises(pe.ChannelClosedByBroker) as err:
        ch.basic_ack(42)
    assert err.value.reply_code == 406 and ch.is_closed
    assert broker.audit() == ["x: ack of unknown delivery tag 42"]


def test_sabotage_cuts_a_transition_before_or_after_the_chosen_operation(broker):
    conn = broker.connect("svc")
    ch = conn.channel()
    conn.sabotage(2, RuntimeError("cut"), after=False)
    ch.basic_publish(topology.TRAIN, "tier-1", b"1", props("t1"))
    with pytest.raises(RuntimeError):
        ch.basic_publish(topology.TRAIN, "tier-1", b"2", props("t2"))
    conn.sabotage(1, RuntimeError("cut"), after=True)
    with pytest.raises(RuntimeError):
        ch.basic_publish(topology.TRAIN, "tier-1", b"3", props("t3"))
    assert [e.properties.message_id for e in broker.ready_messages(topology.train_queue(1))] == ["t1", "t3"]


def test_a_publish_can_become_visible_later_and_acks_settle_exactly_once(broker):
    pub = broker.connect("worker").channel()
    pub.connection.visible_at = lambda exchange, key, body, p: ORIGIN + 7.5
    pub.basic_publish(topology.RESULTS, "tier-1", b"u", props("u-t1-r1-c0-v0"))
    ch, inbox = consume(broker, topology.barrier_queue(1))
    broker.clock.run(ORIGIN + 7)
    assert inbox.got == []
    broker.clock.run(ORIGIN + 8)
    assert inbox.ids() == ["u-t1-r1-c0-v0"]
    ch.basic_ack(inbox.got[0][0].delivery_tag)
    assert list(broker.ledger.values()) == [ACKED] and broker.audit() == []
