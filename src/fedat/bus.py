"""The one port to RabbitMQ: runs a Service (decode -> handle -> publish with confirms -> ack) and reconnects.

Nothing else in the project builds AMQP frames. Failure model: a connection or channel loss drops every
unacked delivery back to the broker, so the shell rebuilds the connection with capped backoff and calls
`service.on_start()` so the service forgets what it held. Malformed or rejected messages are republished to the
dead-letter exchange with the reason in a header, then acked: nothing is lost and nothing loops.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import pika
import pika.exceptions as pe

from fedat import topology, wire
from fedat.metrics import TransportMetrics
from fedat.service import Effects, Inbound, Outgoing, Reject, Service
from fedat.tls import TlsConfig, ssl_options

log = logging.getLogger(__name__)

# Loss of the connection or the channel: rebuild and start over (unacked work is redelivered).
RECOVERABLE = (pe.AMQPConnectionError, pe.AMQPChannelError, pe.StreamLostError, ConnectionError, OSError)


@dataclass(frozen=True)
class BrokerConfig:
    """Where the broker is and how to talk to it."""

    url: str = "amqp://guest:guest@127.0.0.1:5672/%2F"
    num_tiers: int = 5
    prefetch: int = 1
    heartbeat: int = 60
    max_backoff: float = 10.0
    max_message_bytes: int = wire.MAX_MESSAGE_BYTES
    tls: TlsConfig | None = None  # amqps:// needs it: CA, and client certificate/key for mutual TLS
    declare: bool = True  # False where a provisioner declared the topology and the user may not configure


def connect(cfg: BrokerConfig) -> pika.BlockingConnection:
    """Open a blocking connection with the configured heartbeat."""
    params = pika.URLParameters(cfg.url)
    params.heartbeat = cfg.heartbeat
    params.blocked_connection_timeout = 300
    if cfg.tls is not None:
        params.ssl_options = ssl_options(cfg.tls)
    return pika.BlockingConnection(params)


def properties(msg: wire.Message, headers: dict | None = None) -> pika.BasicProperties:
    """Persistent, typed, identified AMQP properties for a message."""
    return pika.BasicProperties(
        delivery_mode=pika.DeliveryMode.Persistent,
        content_type="application/msgpack",
        message_id=msg.id,
        type=msg.kind,
        timestamp=int(time.time()),
        headers=headers,
    )


def publish_all(
    channel,
    outgoing: Iterable[Outgoing],
    metrics: TransportMetrics | None = None,
    max_bytes: int = wire.MAX_MESSAGE_BYTES,
) -> None:
    """Publish each message mandatory and persistent on a confirm channel; raises if any is unroutable or nacked."""
    for out in outgoing:
        body = wire.encode(out.message, max_bytes)  # over the limit raises here: never let the broker close us
        channel.basic_publish(
            exchange=out.exchange,
            routing_key=out.routing_key,
            body=body,
            properties=properties(out.message),
            mandatory=True,
        )
        if metrics:
            metrics.published.labels(out.message.kind).inc()
            metrics.published_bytes.labels(out.message.kind).inc(len(body))


def publish_once(cfg: BrokerConfig, outgoing: Iterable[Outgoing]) -> None:
    """Open a connection, declare the topology, publish with confirms, close (for one-shot jobs)."""
    conn = connect(cfg)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        topology.declare(ch, cfg.num_tiers)
        publish_all(ch, outgoing, max_bytes=cfg.max_message_bytes)
    finally:
        conn.close()


class _Session:
    """One connection's worth of running a service."""

    def __init__(
        self, conn, channel, service: Service, metrics: TransportMetrics, clock: Callable[[], float], max_bytes: int
    ):
        self.conn, self.channel, self.service, self.metrics, self.clock = conn, channel, service, metrics, clock
        self.max_bytes = max_bytes
        self.expected = service.subscriptions()
        # Unacked deliveries by tag, kept raw so that a held one can still be dead-lettered byte for byte.
        self.held: dict[int, tuple] = {}

    def apply(self, effects: Effects) -> None:
        publish_all(self.channel, effects.publish, self.metrics, self.max_bytes)
        for tag, reason in effects.dead_letter:
            if tag in self.held:
                self.dead_letter(*self.held.pop(tag), reason)
        for tag in effects.ack:
            if self.held.pop(tag, None) is not None:
                self.channel.basic_ack(delivery_tag=tag)
        for delay, key in effects.timers:
            self.conn.call_later(max(0.0, delay), lambda key=key: self.on_timer(key))

    def dead_letter(self, queue: str, method, props, body: bytes, reason: str) -> None:
        log.warning("dead-lettering a message from %s: %s", queue, reason)
        headers = dict(props.headers or {})
        headers.update({topology.HEADER_REASON: reason[:1000], topology.HEADER_SOURCE_QUEUE: queue})
        self.channel.basic_publish(
            exchange=topology.DLX,
            routing_key=queue,
            body=body,
            properties=pika.BasicProperties(
                delivery_mode=pika.DeliveryMode.Persistent,
                content_type=props.content_type,
                message_id=props.message_id,
                type=props.type,
                headers=headers,
            ),
            mandatory=True,
        )
        self.channel.basic_ack(delivery_tag=method.delivery_tag)
        self.held.pop(method.delivery_tag, None)
        self.metrics.dead_lettered.labels(queue).inc()

    def on_message(self, channel, method, props, body: bytes) -> None:
        queue = self.queue_of[method.consumer_tag]
        self.held[method.delivery_tag] = (queue, method, props, body)
        started = time.perf_counter()
        try:
            msg = wire.decode(body, expect=self.expected[queue], max_bytes=self.max_bytes)
            inbound = Inbound(queue, msg, method.delivery_tag, bool(method.redelivered), len(body))
            # Publishing comes before any ack, so an output that cannot be sent (e.g. oversize) rejects the input.
            self.apply(self.service.handle(inbound, self.clock()))
        except (wire.WireError, Reject) as exc:
            if method.delivery_tag in self.held:
                self.dead_letter(queue, method, props, body, getattr(exc, "reason", str(exc)))
            self.metrics.consumed.labels(queue, "dead-lettered").inc()
            return
        except RECOVERABLE:
            raise
        except Exception:
            # A bug or a transient fault: requeue; the quorum delivery limit dead-letters a message that keeps failing.
            log.exception("%s failed on a message from %s; requeueing it", self.service.name, queue)
            self.held.pop(method.delivery_tag, None)
            channel.basic_nack(delivery_tag=method.delivery_tag, requeue=True)
            self.metrics.consumed.labels(queue, "error").inc()
            return
        self.metrics.consumed.labels(queue, "ok").inc()
        self.metrics.handle_seconds.labels(queue).observe(time.perf_counter() - started)

    def on_timer(self, key: str) -> None:
        try:
            self.apply(self.service.on_timer(key, self.clock()))
        except RECOVERABLE:
            raise
        except Exception:
            # A timer has no message to requeue: log it and keep serving (the service re-arms what it needs).
            log.exception("%s failed on timer %s", self.service.name, key)
            self.metrics.consumed.labels(f"timer:{key.split(':')[0]}", "error").inc()

    def start(self) -> None:
        self.queue_of = {}
        for queue in self.expected:
            tag = self.channel.basic_consume(queue=queue, on_message_callback=self.on_message)
            self.queue_of[tag] = queue
        self.apply(self.service.on_start(self.clock()))


def run_service(
    service: Service,
    cfg: BrokerConfig,
    metrics: TransportMetrics,
    stop: threading.Event,
    clock: Callable[[], float] = time.time,
) -> None:
    """Run `service` until `stop` is set, rebuilding the connection on any loss with capped exponential backoff."""
    backoff = 0.5
    while not stop.is_set():
        conn = None
        try:
            conn = connect(cfg)
            channel = conn.channel()
            channel.confirm_delivery()
            topology.declare(channel, cfg.num_tiers)
            channel.basic_qos(prefetch_count=cfg.prefetch)
            session = _Session(conn, channel, service, metrics, clock, cfg.max_message_bytes)
            session.start()
            metrics.connected.set(1)
            log.info("%s connected to the broker", service.name)
            backoff = 0.5
            while not stop.is_set():
                conn.process_data_events(time_limit=0.5)
                # A channel closed by the broker (e.g. consumer_timeout) does not raise here: check it.
                if channel.is_closed or not channel.consumer_tags:
                    raise pe.ChannelClosed(-1, "channel closed or consumer cancelled by the broker")
        except RECOVERABLE as exc:
            metrics.connected.set(0)
            metrics.reconnects.inc()
            log.warning(
                "%s lost the broker (%s: %s); reconnecting in %.1fs", service.name, type(exc).__name__, exc, backoff
            )
            stop.wait(backoff)
            backoff = min(backoff * 2, cfg.max_backoff)
        finally:
            if conn is not None and conn.is_open:
                try:
                    conn.close()
                except RECOVERABLE:
                    pass
    metrics.connected.set(0)
