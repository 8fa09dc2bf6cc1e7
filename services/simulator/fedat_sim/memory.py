"""An in-memory RabbitMQ with the semantics the topology relies on, and pika-shaped connections and channels onto it.

What it honours (as RabbitMQ 3.10 does, see docs/architecture.md §2 and the facts measured on the broker there):

- exchanges `direct`, `fanout` and `topic` (`*` one word, `#` zero or more), bindings as declared through
  `fedat.protocol.topology.declare` (the production code declares them here too, through `MemoryChannel`);
- per-queue FIFO; per-consumer prefetch (`basic.qos`, 0 = unlimited) with round-robin over a queue's consumers;
  deliveries reach a channel in order (a channel is one TCP stream);
- ack, nack with or without requeue, `basic.get`, `queue.purge` (the ready messages are dropped); an ack of an
  unknown delivery tag closes the channel (406);
- a closed channel or connection returns its unacked deliveries to the head of their queues, `redelivered=True`;
  every return counts in `x-delivery-count`, and a message returned more than `x-delivery-limit` times is
  dead-lettered (reason `delivery_limit`), as quorum queues do; nack without requeue dead-letters (`rejected`);
- `x-max-length` counts ready messages only and drops (or, with a dead-letter exchange, dead-letters: `maxlen`)
  from the head, so observer queues keep the newest 8 and state queues exactly the latest checkpoint;
- `mandatory` publishes that reach no queue raise pika's `UnroutableError`, as on a confirm channel.

Every copy of a message put in a queue gets a ledger entry, so that `audit()` can prove each was acked,
dead-lettered or dropped at most once and that none vanished. Nothing here reads the wall clock: deliveries and
timers are events of the virtual clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import pika
import pika.exceptions as pe
from pika.spec import Basic

from fedat.protocol import topology
from fedat_sim.clock import Clock, Event

READY, UNACKED, ACKED, DEAD, DROPPED = "ready", "unacked", "acked", "dead-lettered", "dropped"
FINAL = frozenset({ACKED, DEAD, DROPPED})

Visibility = Callable[[str, str, bytes, pika.BasicProperties], float | None]
# What a message is once it becomes visible (a simulated worker's update gets its trained model then: fedat_sim.pool).
Finish = Callable[[str, str, bytes, pika.BasicProperties], tuple[bytes, pika.BasicProperties]]


class Hooks(Protocol):
    """Where faults enter the broker: extra copies of a publish, extra delay of a delivery."""

    def copies(self, exchange: str, routing_key: str, properties: pika.BasicProperties) -> int:
        """How many times to route this publish (1 normally; 2 duplicates it)."""
        ...

    def delivery_delay(self, queue: str, connection: str) -> float:
        """Extra virtual seconds before a delivery reaches its channel."""
        ...


class NoFaults:
    """A healthy network: every publish routed once, every delivery at once."""

    def copies(self, exchange: str, routing_key: str, properties: pika.BasicProperties) -> int:
        """Once."""
        return 1

    def delivery_delay(self, queue: str, connection: str) -> float:
        """No delay."""
        return 0.0


@dataclass(eq=False)
class Envelope:
    """One copy of a message in one queue; `uid` names it in the ledger."""

    uid: int
    exchange: str
    routing_key: str
    body: bytes
    properties: pika.BasicProperties
    returns: int = 0  # x-delivery-count: times it came back to the queue
    redelivered: bool = False


@dataclass(eq=False)
class Consumer:
    """A `basic.consume` of one channel on one queue."""

    tag: str
    queue: str
    channel: MemoryChannel
    callback: Callable[..., None]
    unacked: int = 0


@dataclass(eq=False)
class MemoryQueue:
    """A queue with its arguments, its ready messages and its consumers."""

    name: str
    arguments: Mapping[str, Any]
    ready: deque[Envelope] = field(default_factory=deque)
    consumers: list[Consumer] = field(default_factory=list)
    turn: int = 0  # round-robin position among consumers
    kicked: bool = False  # a dispatch event is already scheduled

    @property
    def max_length(self) -> int | None:
        """`x-max-length`, if any."""
        return self.arguments.get("x-max-length")

    @property
    def dead_letter_exchange(self) -> str | None:
        """`x-dead-letter-exchange`, if any."""
        return self.arguments.get("x-dead-letter-exchange")

    @property
    def delivery_limit(self) -> int | None:
        """`x-delivery-limit` (quorum queues), if any."""
        return self.arguments.get("x-delivery-limit")


def topic_matches(pattern: str, key: str) -> bool:
    """AMQP topic matching: words split by '.', `*` matches exactly one word, `#` zero or more."""
    return _match(pattern.split("."), key.split(".") if key else [])


def _match(p: list[str], k: list[str]) -> bool:
    if not p:
        return not k
    if p[0] == "#":
        return any(_match(p[1:], k[i:]) for i in range(len(k) + 1))
    if not k:
        return False
    return (p[0] == "*" or p[0] == k[0]) and _match(p[1:], k[1:])


class MemoryBroker:
    """Exchanges, queues and bindings in memory, driven by a virtual clock; see the module docstring."""

    def __init__(self, clock: Clock, hooks: Hooks | None = None):
        self.clock = clock
        self.hooks: Hooks = hooks or NoFaults()
        self.exchanges: dict[str, str] = {}
        self.queues: dict[str, MemoryQueue] = {}
        self.bindings: dict[str, list[tuple[str, str]]] = {}  # exchange -> [(queue, key)]
        self.connections: list[MemoryConnection] = []  # the open ones
        self.ledger: dict[int, str] = {}  # envelope uid -> READY, UNACKED or a FINAL outcome
        self.violations: list[str] = []  # settle-once breaches and acks of unknown tags
        self.taps: list[Callable[[str, str, bytes, pika.BasicProperties], None]] = []  # see every routed publish
        self._uid = 0
        self._consumers = 0

    # --- declaration ----------------------------------------------------------------------------------------
    def declare_topology(self, num_tiers: int) -> None:
        """Declare the deployment's topology with the production code (`fedat.protocol.topology.declare`)."""
        conn = self.connect("admin")
        topology.declare(conn.channel(), num_tiers)
        conn.close()

    def declare_exchange(self, name: str, kind: str) -> None:
        """Declare an exchange; redeclaring with another type fails as on RabbitMQ (406)."""
        if name in self.exchanges and self.exchanges[name] != kind:
            raise pe.ChannelClosedByBroker(406, f"PRECONDITION_FAILED - inequivalent arg 'type' for exchange {name}")
        self.exchanges[name] = kind
        self.bindings.setdefault(name, [])

    def declare_queue(self, name: str, arguments: Mapping[str, Any] | None) -> None:
        """Declare a queue; redeclaring with other arguments fails as on RabbitMQ (406)."""
        arguments = dict(arguments or {})
        if name in self.queues and dict(self.queues[name].arguments) != arguments:
            raise pe.ChannelClosedByBroker(406, f"PRECONDITION_FAILED - inequivalent arguments for queue {name}")
        self.queues.setdefault(name, MemoryQueue(name, arguments))

    def bind(self, queue: str, exchange: str, routing_key: str) -> None:
        """Bind a queue to an exchange (idempotent)."""
        if queue not in self.queues or exchange not in self.exchanges:
            raise pe.ChannelClosedByBroker(404, f"NOT_FOUND - no queue {queue!r} or exchange {exchange!r}")
        if (queue, routing_key) not in self.bindings[exchange]:
            self.bindings[exchange].append((queue, routing_key))

    def connect(self, name: str) -> MemoryConnection:
        """A new connection, named after its service (fault decisions and messages use the name)."""
        conn = MemoryConnection(self, name)
        self.connections.append(conn)
        return conn

    # --- publishing -----------------------------------------------------------------------------------------
    def route(self, exchange: str, routing_key: str) -> list[str]:
        """The queues a publish reaches, in binding order (each at most once)."""
        if exchange not in self.exchanges:
            raise pe.ChannelClosedByBroker(404, f"NOT_FOUND - no exchange '{exchange}'")
        kind = self.exchanges[exchange]
        out: list[str] = []
        for queue, key in self.bindings[exchange]:
            hit = kind == "fanout" or (kind == "direct" and key == routing_key)
            hit = hit or (kind == "topic" and topic_matches(key, routing_key))
            if hit and queue not in out:
                out.append(queue)
        return out

    def publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: pika.BasicProperties,
        mandatory: bool = False,
        visible_at: float | None = None,
        finish: Finish | None = None,
    ) -> None:
        """Route a message now, or at `visible_at` (a simulated client's answer becomes visible at `not_before`);
        `finish` makes the message what it is when it becomes visible, once for every copy."""
        if mandatory and not self.route(exchange, routing_key):
            raise pe.UnroutableError([])
        finished: list[tuple[bytes, pika.BasicProperties]] = []

        def enqueue() -> None:
            if finish is None:
                self._enqueue_all(exchange, routing_key, body, properties)
                return
            if not finished:
                finished.append(finish(exchange, routing_key, body, properties))
            self._enqueue_all(exchange, routing_key, *finished[0])

        for _ in range(max(1, self.hooks.copies(exchange, routing_key, properties))):
            if visible_at is not None and visible_at > self.clock.now:
                self.clock.at(visible_at, enqueue, "visible")
            else:
                enqueue()

    def _enqueue_all(self, exchange: str, routing_key: str, body: bytes, properties: pika.BasicProperties) -> None:
        for tap in self.taps:
            tap(exchange, routing_key, body, properties)
        for queue in self.route(exchange, routing_key):
            self._uid += 1
            self.ledger[self._uid] = READY
            self._enqueue(self.queues[queue], Envelope(self._uid, exchange, routing_key, body, properties))

    def _enqueue(self, q: MemoryQueue, env: Envelope, at_head: bool = False) -> None:
        if at_head:
            q.ready.appendleft(env)
        else:
            q.ready.append(env)
        limit = q.max_length
        while limit is not None and len(q.ready) > limit:  # only ready messages count; the oldest go first
            self.dead_letter(q, q.ready.popleft(), "maxlen")
        self.kick(q)

    # --- dead letters and the ledger ------------------------------------------------------------------------
    def dead_letter(self, q: MemoryQueue, env: Envelope, reason: str) -> None:
        """The broker dead-letters: republish to the queue's DLX with an `x-death` entry, or drop without one."""
        dlx = q.dead_letter_exchange
        self.settle(env, DEAD if dlx else DROPPED)
        if not dlx:
            return
        p = env.properties
        headers = dict(p.headers or {})
        death = {"reason": reason, "queue": q.name, "count": 1, "exchange": env.exchange}
        headers["x-death"] = [{**death, "routing-keys": [env.routing_key]}, *headers.get("x-death", [])]
        props = pika.BasicProperties(
            delivery_mode=p.delivery_mode,
            content_type=p.content_type,
            message_id=p.message_id,
            type=p.type,
            headers=headers,
        )
        self._enqueue_all(dlx, env.routing_key, env.body, props)

    def settle(self, env: Envelope, outcome: str) -> None:
        """Record a copy's final outcome; a second one is a violation."""
        if self.ledger.get(env.uid) in FINAL:
            was = self.ledger[env.uid]
            self.violations.append(f"{env.properties.message_id} (copy {env.uid}) settled twice: {was}, then {outcome}")
        self.ledger[env.uid] = outcome

    def give_back(self, q: MemoryQueue, env: Envelope) -> None:
        """An unacked delivery comes back (nack with requeue, or its channel closed): count it, maybe dead-letter."""
        env.returns += 1
        env.redelivered = True
        limit = q.delivery_limit
        if limit is not None and env.returns > limit:
            self.dead_letter(q, env, "delivery_limit")
            return
        self.ledger[env.uid] = READY
        self._enqueue(q, env, at_head=True)

    def audit(self) -> list[str]:
        """Every breach of "each copy acked, dead-lettered or dropped at most once, and none vanished"."""
        where: dict[int, str] = {}
        for q in self.queues.values():
            for env in q.ready:
                where[env.uid] = READY
        for conn in self.connections:
            for ch in conn.channels:
                for env, _, _ in ch.unacked.values():
                    where[env.uid] = UNACKED
        lost = [uid for uid, status in self.ledger.items() if status not in FINAL and where.get(uid) != status]
        return [*self.violations, *(f"message copy {uid} vanished ({self.ledger[uid]})" for uid in lost)]

    # --- delivering -----------------------------------------------------------------------------------------
    def kick(self, q: MemoryQueue) -> None:
        """Schedule a dispatch of `q` now, unless one is pending or nothing can be delivered."""
        if not q.kicked and q.ready and q.consumers:
            q.kicked = True
            self.clock.at(self.clock.now, lambda: self._dispatch(q), "dispatch")

    def _dispatch(self, q: MemoryQueue) -> None:
        q.kicked = False
        while q.ready:
            consumer = self._next_consumer(q)
            if consumer is None:
                return
            consumer.channel.deliver(consumer, q.ready.popleft())

    def _next_consumer(self, q: MemoryQueue) -> Consumer | None:
        for i in range(len(q.consumers)):
            c = q.consumers[(q.turn + i) % len(q.consumers)]
            if c.channel.prefetch == 0 or c.unacked < c.channel.prefetch:
                q.turn = (q.turn + i + 1) % len(q.consumers)
                return c
        return None

    def new_consumer_tag(self, connection: str) -> str:
        """A unique consumer tag."""
        self._consumers += 1
        return f"ctag-{connection}-{self._consumers}"

    def ready_messages(self, queue: str) -> list[Envelope]:
        """The ready messages of a queue, oldest first (for the end-of-run accounting)."""
        return list(self.queues[queue].ready)

    def consumer_count(self, queue: str) -> int:
        """Consumers on a queue (the profiler waits for a worker on the profiling queue)."""
        return len(self.queues[queue].consumers)


class MemoryConnection:
    """A pika-shaped connection: channels, `call_later` timers, and the faults that may cut it mid-transition."""

    def __init__(self, broker: MemoryBroker, name: str):
        self.broker, self.name = broker, name
        self.channels: list[MemoryChannel] = []
        self.is_open = True
        self.timers: list[Event] = []
        # Where exceptions from callbacks go (the shell's reconnect/crash logic); None: raise them.
        self.on_error: Callable[[BaseException], None] | None = None
        # Publishes from this connection become visible at this time (simulated clients answer at `not_before`).
        self.visible_at: Visibility | None = None
        # What its publishes are once visible (None: as published).
        self.finish: Finish | None = None
        self._sabotage: tuple[int, BaseException, bool] | None = None

    def channel(self) -> MemoryChannel:
        """Open a channel."""
        ch = MemoryChannel(self)
        self.channels.append(ch)
        return ch

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        """A timer in virtual time; lost when the connection closes (as pika's are)."""
        self.timers = [t for t in self.timers if not t.cancelled and t.time >= self.broker.clock.now]
        self.timers.append(self.broker.clock.after(delay, lambda: self.guard(callback), f"timer {self.name}"))

    def guard(self, callback: Callable[[], None]) -> None:
        """Run a callback of this connection; what it raises goes to `on_error`, as out of pika's event loop."""
        if not self.is_open:
            return
        try:
            callback()
        except BaseException as exc:
            if self.on_error is None:
                raise
            self.on_error(exc)

    def sabotage(self, after_ops: int, exc: BaseException, after: bool) -> None:
        """Make the `after_ops`-th next publish/ack/nack raise `exc`, before it acts or (`after`) once it has."""
        self._sabotage = (max(1, after_ops), exc, after)

    def disarm(self) -> None:
        """Forget a pending sabotage."""
        self._sabotage = None

    def tick(self, when: str) -> None:
        """Called by channel operations "before" and "after" they act: fires a pending sabotage."""
        if self._sabotage is None:
            return
        left, exc, after = self._sabotage
        if when == "before" and left > 1:
            self._sabotage = (left - 1, exc, after)
        elif left == 1 and (when == "after") == after:
            self._sabotage = None
            raise exc

    def close(self) -> None:
        """Close: channels return their unacked deliveries, timers are lost."""
        if not self.is_open:
            return
        self.is_open = False
        self._sabotage = None
        for event in self.timers:
            event.cancel()
        self.timers = []
        for ch in self.channels:
            ch.close()
        if self in self.broker.connections:
            self.broker.connections.remove(self)


class MemoryChannel:
    """The subset of pika's BlockingChannel that `fedat.runtime.bus` and `fedat.protocol.topology` use, in memory."""

    def __init__(self, connection: MemoryConnection):
        self.connection, self.broker = connection, connection.broker
        self.prefetch = 0
        self.is_closed = False
        self.consumers: dict[str, Consumer] = {}
        self.unacked: dict[int, tuple[Envelope, MemoryQueue, Consumer | None]] = {}
        self._tag = 0
        self._inbox: deque[tuple[Consumer, Basic.Deliver, pika.BasicProperties, bytes]] = deque()
        self._last_arrival = 0.0  # deliveries reach a channel in order: one TCP stream

    @property
    def consumer_tags(self) -> list[str]:
        """Tags of the active consumers."""
        return list(self.consumers)

    def _check_open(self) -> None:
        if self.is_closed or not self.connection.is_open:
            raise pe.ChannelWrongStateError("Channel is closed.")

    # --- declaration (fedat.protocol.topology.declare) ----------------------------------------------------------------
    def confirm_delivery(self) -> None:
        """Publisher confirms: a publish here is confirmed when it returns (or raised)."""

    def exchange_declare(self, exchange: str, exchange_type: str = "direct", durable: bool = False) -> None:
        """Declare an exchange."""
        self.broker.declare_exchange(exchange, exchange_type)

    def queue_declare(self, queue: str, durable: bool = False, arguments=None, passive: bool = False) -> _DeclareOk:
        """Declare a queue (passive: only check that it exists)."""
        if passive:
            if queue not in self.broker.queues:
                raise pe.ChannelClosedByBroker(404, f"NOT_FOUND - no queue '{queue}'")
        else:
            self.broker.declare_queue(queue, arguments)
        q = self.broker.queues[queue]
        return _DeclareOk(queue, len(q.ready), len(q.consumers))

    def queue_bind(self, queue: str, exchange: str, routing_key: str = "") -> None:
        """Bind a queue."""
        self.broker.bind(queue, exchange, routing_key)

    def basic_qos(self, prefetch_count: int = 0) -> None:
        """Per-consumer prefetch (0 = unlimited)."""
        self.prefetch = int(prefetch_count)

    def queue_purge(self, queue: str) -> _PurgeOk:
        """Drop the queue's ready messages (unacked ones stay with their consumers), as RabbitMQ does."""
        self._check_open()
        if queue not in self.broker.queues:
            raise pe.ChannelClosedByBroker(404, f"NOT_FOUND - no queue '{queue}'")
        q = self.broker.queues[queue]
        dropped = len(q.ready)
        while q.ready:
            self.broker.settle(q.ready.popleft(), DROPPED)
        return _PurgeOk(dropped)

    # --- publishing and consuming ----------------------------------------------------------------------------
    def basic_publish(
        self, exchange: str, routing_key: str, body: bytes, properties=None, mandatory: bool = False
    ) -> None:
        """Publish (confirmed when it returns); `mandatory` and no queue raises UnroutableError."""
        self._check_open()
        self.connection.tick("before")
        properties = properties or pika.BasicProperties()
        hook = self.connection.visible_at
        visible = hook(exchange, routing_key, body, properties) if hook is not None else None
        self.broker.publish(exchange, routing_key, bytes(body), properties, mandatory, visible, self.connection.finish)
        self.connection.tick("after")

    def basic_consume(self, queue: str, on_message_callback: Callable[..., None]) -> str:
        """Start consuming; deliveries come later, as clock events (never inside this call)."""
        self._check_open()
        if queue not in self.broker.queues:
            raise pe.ChannelClosedByBroker(404, f"NOT_FOUND - no queue '{queue}'")
        consumer = Consumer(self.broker.new_consumer_tag(self.connection.name), queue, self, on_message_callback)
        self.consumers[consumer.tag] = consumer
        q = self.broker.queues[queue]
        q.consumers.append(consumer)
        self.broker.kick(q)
        return consumer.tag

    def deliver(self, consumer: Consumer, env: Envelope) -> None:
        """The broker hands `env` to `consumer`: unacked from now on, handled when it reaches the channel."""
        self._tag += 1
        consumer.unacked += 1
        self.broker.ledger[env.uid] = UNACKED
        self.unacked[self._tag] = (env, self.broker.queues[consumer.queue], consumer)
        method = Basic.Deliver(consumer.tag, self._tag, env.redelivered, env.exchange, env.routing_key)
        self._inbox.append((consumer, method, _with_delivery_count(env), env.body))
        clock = self.broker.clock
        delay = self.broker.hooks.delivery_delay(consumer.queue, self.connection.name)
        arrival = max(clock.now + delay, self._last_arrival)
        self._last_arrival = arrival
        clock.at(arrival, self._handle_next, "deliver")

    def _handle_next(self) -> None:
        if self.is_closed or not self._inbox:
            return  # closed meanwhile: the delivery went back to its queue
        consumer, method, props, body = self._inbox.popleft()
        self.connection.guard(lambda: consumer.callback(self, method, props, body))

    def basic_get(self, queue: str, auto_ack: bool = False):
        """One message as (method, properties, body), or (None, None, None)."""
        self._check_open()
        q = self.broker.queues[queue]
        if not q.ready:
            return None, None, None
        env = q.ready.popleft()
        tag = 0
        if auto_ack:
            self.broker.settle(env, ACKED)
        else:
            self._tag += 1
            tag = self._tag
            self.broker.ledger[env.uid] = UNACKED
            self.unacked[tag] = (env, q, None)
        method = Basic.GetOk(tag, env.redelivered, env.exchange, env.routing_key, len(q.ready))
        return method, _with_delivery_count(env), env.body

    def basic_ack(self, delivery_tag: int) -> None:
        """Ack a delivery; an unknown tag closes the channel with 406, as RabbitMQ does."""
        self._check_open()
        self.connection.tick("before")
        env, q, consumer = self._take(delivery_tag, "ack")
        self.broker.settle(env, ACKED)
        self._freed(q, consumer)
        self.connection.tick("after")

    def basic_nack(self, delivery_tag: int, requeue: bool = True) -> None:
        """Nack: back to the queue (counted), or dead-lettered (`rejected`)."""
        self._check_open()
        self.connection.tick("before")
        env, q, consumer = self._take(delivery_tag, "nack")
        if requeue:
            self.broker.give_back(q, env)
        else:
            self.broker.dead_letter(q, env, "rejected")
        self._freed(q, consumer)
        self.connection.tick("after")

    def _take(self, tag: int, what: str) -> tuple[Envelope, MemoryQueue, Consumer | None]:
        if tag not in self.unacked:
            self.broker.violations.append(f"{self.connection.name}: {what} of unknown delivery tag {tag}")
            self.close()
            raise pe.ChannelClosedByBroker(406, f"PRECONDITION_FAILED - unknown delivery tag {tag}")
        return self.unacked.pop(tag)

    def _freed(self, q: MemoryQueue, consumer: Consumer | None) -> None:
        if consumer is not None:
            consumer.unacked -= 1
        self.broker.kick(q)

    def close(self) -> None:
        """Cancel consumers and return every unacked delivery to the head of its queue, in delivery order."""
        if self.is_closed:
            return
        self.is_closed = True
        self._inbox.clear()
        for consumer in self.consumers.values():
            q = self.broker.queues[consumer.queue]
            q.consumers.remove(consumer)
            q.turn = 0
        self.consumers = {}
        for tag in sorted(self.unacked, reverse=True):  # head insertion in reverse keeps the original order
            env, q, _ = self.unacked.pop(tag)
            self.broker.give_back(q, env)


@dataclass(frozen=True)
class _DeclareOk:
    """What `queue_declare` answers: `.method.message_count` and `.method.consumer_count`, as pika's frame."""

    queue: str
    message_count: int
    consumer_count: int

    @property
    def method(self) -> _DeclareOk:
        """pika puts the counts under `.method`."""
        return self


@dataclass(frozen=True)
class _PurgeOk:
    """What `queue_purge` answers: `.method.message_count`, as pika's frame."""

    message_count: int

    @property
    def method(self) -> _PurgeOk:
        """pika puts the count under `.method`."""
        return self


def _with_delivery_count(env: Envelope) -> pika.BasicProperties:
    """The properties a consumer sees: quorum queues add `x-delivery-count` once a message came back."""
    if not env.returns:
        return env.properties
    p = env.properties
    headers = {**(p.headers or {}), "x-delivery-count": env.returns}
    return pika.BasicProperties(
        delivery_mode=p.delivery_mode,
        content_type=p.content_type,
        message_id=p.message_id,
        type=p.type,
        timestamp=p.timestamp,
        headers=headers,
    )
