"""Publishing encoded messages, mandatory and persistent: one confirm each on a confirm channel, or in transactions
through a `Publisher` on a connection of its own (one round trip per outbox)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping

import pika
import pika.exceptions as pe

from fedat.protocol import topology
from fedat.protocol.checkpoint import Sent
from fedat.runtime.metrics import TransportMetrics

log = logging.getLogger(__name__)

TX_MAX_BYTES = 16 * 1024 * 1024  # message bytes in one transaction at most: the broker holds them until the commit


def properties(kind: str, message_id: str, headers: Mapping[str, str] | None = None) -> pika.BasicProperties:
    """Persistent, typed, identified AMQP properties for a message."""
    return pika.BasicProperties(
        delivery_mode=pika.DeliveryMode.Persistent,
        content_type="application/msgpack",
        message_id=message_id,
        type=kind,
        timestamp=int(time.time()),
        headers=dict(headers) if headers else None,
    )


def publish_sent(channel, sent: Iterable[Sent], metrics: TransportMetrics | None = None) -> None:
    """Publish encoded messages mandatory and persistent on a confirm channel, one confirm each; raises if nacked, or
    unroutable where a queue must exist (`topology.may_be_unroutable`)."""
    for s in sent:
        try:
            _send(channel, s)
        except pe.UnroutableError:
            if not _droppable(s):
                raise
            continue
        _count(metrics, s)


def _send(channel, s: Sent) -> None:
    """basic.publish one encoded message, mandatory and persistent."""
    channel.basic_publish(
        exchange=s.exchange,
        routing_key=s.routing_key,
        body=s.body,
        properties=properties(s.kind, s.id, dict(s.headers)),
        mandatory=True,
    )


def _droppable(s: Sent) -> bool:
    """Whether an unroutable message is dropped (logged) rather than an error."""
    # A real client's queue may be gone (revoked, purged): its task is lost like an unanswered one, and the round's
    # deadline covers it. Anything else unroutable is a broken topology: fail loudly.
    if not topology.may_be_unroutable(s.exchange, s.routing_key):
        return False
    log.info("%s %s found no queue on %s (key %s); dropped", s.kind, s.id, s.exchange, s.routing_key)
    return True


def _count(metrics: TransportMetrics | None, s: Sent) -> None:
    if metrics:
        metrics.published.labels(s.kind).inc()
        metrics.published_bytes.labels(s.kind).inc(len(s.body))


class Publisher:
    """Publishes each outbox as AMQP transactions, on a connection of its own: one round trip to the broker per
    outbox instead of one confirm per message. RabbitMQ answers a commit once every message is in its queues (as
    durable as a confirm), and sends the returns of unroutable messages before it. The broker holds a transaction's
    messages in memory until its commit, so an outbox larger than `max_bytes` is committed in several.

    Its own connection, because a channel in transaction mode cannot take confirms, and its returns are dispatched
    by polling the connection, which on the consuming connection would also dispatch deliveries."""

    def __init__(self, conn: pika.BlockingConnection, max_bytes: int = TX_MAX_BYTES):
        self.conn, self.max_bytes = conn, max_bytes
        self.channel = conn.channel()
        self.channel.tx_select()
        self.returned: list[str] = []  # message ids returned unroutable since the last commit
        self.channel.add_on_return_callback(lambda _ch, _method, props, _body: self.returned.append(props.message_id))

    def publish(self, sent: tuple[Sent, ...], metrics: TransportMetrics | None = None) -> None:
        """Publish `sent` mandatory and persistent in transactions of at most `max_bytes` (or one message); raises
        UnroutableError, once all is committed, for a message that found no queue where one must exist."""
        lost: list[str] = []
        batch: list[Sent] = []
        held = 0  # bytes of `batch`
        for s in sent:
            if batch and held + len(s.body) > self.max_bytes:
                lost += self._commit(batch, metrics)
                batch, held = [], 0
            _send(self.channel, s)
            batch.append(s)
            held += len(s.body)
        if batch:
            lost += self._commit(batch, metrics)
        if lost:
            log.error("found no queue, where one must exist: %s", "; ".join(lost))
            raise pe.UnroutableError(lost)

    def _commit(self, batch: list[Sent], metrics: TransportMetrics | None) -> list[str]:
        """Commit what was published since the last commit; the messages that found no queue where one must exist."""
        self.channel.tx_commit()
        self.poll()  # the returns arrived before the commit-ok; this dispatches them
        returned, self.returned = set(self.returned), []
        for s in batch:
            if s.id not in returned:
                _count(metrics, s)
        return [
            f"{s.kind} {s.id} to {s.exchange} (key {s.routing_key})"
            for s in batch
            if s.id in returned and not _droppable(s)
        ]

    def poll(self) -> None:
        """Serve the connection (heartbeats, returns) without waiting."""
        self.conn.process_data_events(time_limit=0)
