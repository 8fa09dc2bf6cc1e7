"""The one port to RabbitMQ: runs a Service (decode -> handler -> save -> publish, confirmed -> ack) and reconnects.

Nothing outside `fedat.runtime` builds AMQP frames (`publishing` sends, `brokerstore` keeps checkpoints). Order of
a transition's effects, and why it is safe:

1. the outputs are encoded (and signed) first, so an output that cannot be sent rejects the input before anything
   happened;
2. a durable service's new state is saved with its outbox as one checkpoint (confirmed) — write-ahead; a state that
   holds models is saved with only the models no earlier checkpoint carries (`fedat.protocol.journal`);
3. the outbox is published, dead letters are sent, inputs are acked, last. Under `run_service` a durable service
   (`fedat.protocol.system`: the barrier, the aggregator, the profiler) publishes each outbox as one transaction on a
   connection of its own (`publishing.Publisher`), which the broker commits once every message is queued; elsewhere each
   message is confirmed.

A durable service under `run_service` commits in groups: the transitions of the deliveries (and timers) dispatched
together are taken in one after the other, each on the state the one before left, and then saved as one checkpoint
whose outbox holds all their outputs, before any of them is published or acked. Under load that is one confirmed
write for several transitions instead of one each; a lone delivery is committed as soon as it is handled.

A crash after 2 republishes the outbox on restart (same ids: receivers drop copies); a crash before 2 leaves the
inputs unacked, so the broker redelivers them to a service that restores the previous checkpoint. Either way no
input is acked whose effect is not saved, and no output is seen whose state is not saved. Malformed, forged or
refused messages are republished to the dead-letter exchange with the reason in a header, then acked.

A checkpoint is restored only into a process it fits (`fedat.protocol.fingerprint`): one written for another run,
other tiers, clients, strategy or state version stops the process with `CheckpointMismatch` naming the difference,
before anything is restored, re-sent or acked. While the broker is away the loop keeps turning (reconnecting), so
the liveness stamp says "stuck" only of a process that is.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from types import MappingProxyType
from typing import Any

import pika
import pika.exceptions as pe

from fedat.errors import BrokerRefused, CheckpointMismatch, CommitFailed  # noqa: F401 (re-exported)
from fedat.protocol import fingerprint as fingerprint_mod
from fedat.protocol import ids, journal, signing, system, topology, wire
from fedat.protocol.checkpoint import Checkpoint, Sent
from fedat.protocol.modelstore import Models
from fedat.protocol.service import NOTHING, Effects, Held, Inbound, Interrupted, Observation, Outgoing, Reject, Service
from fedat.runtime.brokerstore import BrokerStore, Store
from fedat.runtime.metrics import TransportMetrics
from fedat.runtime.publishing import Publisher, publish_sent
from fedat.runtime.tls import TlsConfig, ssl_options

log = logging.getLogger(__name__)

GROUP_MAX = 64  # transitions in one group commit at most; its outbox bytes are capped by the message size too

# Loss of the connection or the channel: rebuild and start over (unacked work is redelivered).
RECOVERABLE = (pe.AMQPConnectionError, pe.AMQPChannelError, pe.StreamLostError, ConnectionError, OSError)


@dataclass(frozen=True)
class BrokerConfig:
    """Where the broker is and how to talk to it."""

    url: str = "amqp://guest:guest@127.0.0.1:5672/%2F"
    num_tiers: int = 5
    prefetch: int = 1
    heartbeat: int = 60
    max_backoff: float = 3.0  # a restarted broker is found within 3 s of coming back; retries are cheap
    max_message_bytes: int = wire.MAX_MESSAGE_BYTES
    tls: TlsConfig | None = None  # amqps:// needs it: CA, and client certificate/key for mutual TLS
    declare: bool = True  # False where a provisioner declared the topology and the user may not configure
    keyring: signing.Keyring | None = None  # sign what is published, verify what is consumed; None = neither


def connect(cfg: BrokerConfig) -> pika.BlockingConnection:
    """Open a blocking connection with the configured heartbeat."""
    params = pika.URLParameters(cfg.url)
    params.heartbeat = cfg.heartbeat
    params.blocked_connection_timeout = 300
    if cfg.tls is not None:
        params.ssl_options = ssl_options(cfg.tls)
    return pika.BlockingConnection(params)


def encode_all(outgoing: Iterable[Outgoing], cfg: BrokerConfig) -> tuple[Sent, ...]:
    """Encode (and sign) every message; raises WireError for one over the size limit, before anything is sent."""
    sent = []
    for out in outgoing:
        body = wire.encode(out.message, cfg.max_message_bytes)  # never let the broker close us for an oversize
        headers: tuple[tuple[str, str], ...] = ()
        if cfg.keyring is not None:
            headers = tuple(signing.sign(cfg.keyring, out.message, body).items())
        sent.append(Sent(out.exchange, out.routing_key, out.message.kind, out.message.id, body, headers))
    return tuple(sent)


def publish_once(
    cfg: BrokerConfig,
    outgoing: Iterable[Outgoing],
    patience: float = 120.0,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Publish with confirms over a fresh connection (for one-shot jobs), retrying a lost broker for `patience` s."""
    sent = encode_all(outgoing, cfg)
    deadline = time.monotonic() + patience
    backoff = 0.5
    while True:
        conn = None
        try:
            conn = connect(cfg)
            publish_sent(confirm_channel(conn, cfg), sent)
            return
        except RECOVERABLE as exc:
            # A job that starts while the broker restarts must not die of it; a re-sent message keeps its id, and
            # every consumer drops a duplicate id. Refusals and unroutable or nacked messages are not retried.
            if refused(exc):
                raise BrokerRefused(f"the broker refused access while publishing: {exc}") from exc
            if time.monotonic() + backoff > deadline:
                raise
            log.warning("publish failed (%s: %s); retrying in %.1fs", type(exc).__name__, exc, backoff)
            sleep(backoff)
            backoff = min(backoff * 2, cfg.max_backoff)
        finally:
            close_quietly(conn)


def confirm_channel(conn: pika.BlockingConnection, cfg: BrokerConfig):
    """A channel with publisher confirms, on which the topology is declared unless a provisioner owns it."""
    channel = conn.channel()
    channel.confirm_delivery()
    if cfg.declare:
        topology.declare(channel, cfg.num_tiers)
    return channel


def close_quietly(conn: pika.BlockingConnection | None) -> None:
    """Close a connection that may already be lost; its loss is what the caller is handling."""
    if conn is not None and conn.is_open:
        try:
            conn.close()
        except RECOVERABLE:
            pass


class Runner:
    """Runs one service across connections: its state, its checkpoint sequence, and the current session."""

    def __init__(
        self,
        service: Service,
        cfg: BrokerConfig,
        metrics: TransportMetrics,
        clock: Callable[[], float],
        persist: bool,
        observe: Callable[[Observation], None] | None = None,
        fingerprint: Mapping[str, str] | None = None,
        store: Store | None = None,
    ):
        self.service, self.cfg, self.metrics, self.clock = service, cfg, metrics, clock
        self.observe = observe
        self.codec = getattr(service, "codec", None)
        # the broker's state queues unless the process keeps its checkpoints elsewhere (a client's own folder)
        self.store = (
            None if self.codec is None or not persist else store or BrokerStore(service.name, cfg.max_message_bytes)
        )
        self.state: Any = service.initial()
        self.saved: Any = self.state  # the state of the latest checkpoint (the state may run ahead of it in a group)
        self.seq = 0
        self.models = Models()  # the arrays the state holds, each hashed once
        self.journal = journal.Journal()  # what the broker holds of the checkpoints, as of the last restore and save
        # What this process's checkpoints are valid for; at least the state version its codec reads.
        own = {fingerprint_mod.STATE_VERSION: str(self.codec.version)} if self.codec is not None else {}
        self.fingerprint: dict[str, str] = {**own, **(fingerprint or {})}

    @property
    def groups(self) -> bool:
        """Whether the service commits the transitions of one dispatch together (it checkpoints on the broker)."""
        return self.store is not None and self.store.groups

    def restore(self, channel, publish: Callable[[tuple[Sent, ...], TransportMetrics], None] | None = None) -> None:
        """Take the state from the latest checkpoint and publish its outbox again (a crash may have cut it off), with
        `publish` or else one confirm at a time on `channel`."""
        if self.store is None:
            return  # not durable: the in-memory state survives a reconnect, not a restart
        started = time.perf_counter()
        restored = self.store.restore(channel)
        if restored is None:
            self.state, self.seq, self.journal = self.service.initial(), 0, journal.Journal()
            self.saved = self.state
            log.info("%s: no checkpoint yet, starting fresh", self.service.name)
            return
        saved = restored.checkpoint
        self.check(saved)
        self.state, self.seq = self.codec.decode(saved.state, saved.models), saved.seq
        self.saved = self.state
        self.journal = restored.journal
        self._held()
        (publish or partial(publish_sent, channel))(saved.outbox, self.metrics)
        self.metrics.restore_seconds.observe(time.perf_counter() - started)
        log.info(
            "%s: restored checkpoint %d, %d journal entries after snapshot %d (%d outputs re-sent)",
            self.service.name,
            saved.seq,
            saved.seq - restored.journal.base,
            restored.journal.base,
            len(saved.outbox),
        )

    def check(self, saved: Checkpoint) -> None:
        """Refuse a checkpoint written for another run or settings (CheckpointMismatch names each difference)."""
        written = dict(saved.fingerprint)
        if fingerprint_mod.STATE_VERSION not in written:  # saved before fingerprints: its state still says its version
            version = fingerprint_mod.state_version(saved.state)
            if version is not None:
                written[fingerprint_mod.STATE_VERSION] = str(version)
        diffs = fingerprint_mod.differences(written, self.fingerprint)
        if diffs:
            where = f"{self.store.where} (checkpoint {saved.seq})"
            raise CheckpointMismatch(fingerprint_mod.refusal(self.service.name, where, diffs))

    def save(self, channel, state: Any, sent: tuple[Sent, ...]) -> None:
        """Write the new state and its outbox ahead of publishing and acking (durable services only).

        Also when only outputs exist: what leaves must be in a checkpoint, whether or not the state moved.
        """
        if self.store is None or (state is self.saved and not sent):
            return
        started = time.perf_counter()
        self.models.begin()
        encoded = self.codec.encode(state, self.models.reference)
        c = Checkpoint(self.service.name, self.seq + 1, self.clock(), encoded, sent, self.fingerprint)
        c = self.journal.record(c, self.models.end())
        self.store.save(channel, c)
        self.journal.saved(c)
        self.seq, self.saved = c.seq, state
        self.metrics.state_saves.inc()
        self.metrics.state_save_seconds.observe(time.perf_counter() - started)
        self._held()

    def _held(self) -> None:
        # what the broker holds of the state: restore time and broker disk grow with it
        self.metrics.state_bytes.labels("snapshot").set(self.journal.snapshot_bytes)
        self.metrics.state_bytes.labels("journal").set(self.journal.journal_bytes)


@dataclass(frozen=True)
class Staged:
    """A transition taken in but not yet committed: what waits for its checkpoint."""

    sent: tuple[Sent, ...]
    effects: Effects


class Session:
    """One connection's worth of running a service: its unacked deliveries and timers belong to the connection.

    With `group`, transitions are committed together at `flush` (the caller's loop flushes after each dispatch of
    events); without, each is committed as it is handled. Only a service that saves checkpoints in the broker
    groups: that is what a group saves, one confirmed write for many transitions, and a worker's or a client's first
    answer must not wait for its next.
    """

    def __init__(self, conn, channel, runner: Runner, group: bool = False, publisher: Publisher | None = None):
        self.conn, self.channel, self.runner = conn, channel, runner
        # outboxes go in transactions through `publisher`, or else one confirm at a time on `channel`
        self.publish = publisher.publish if publisher is not None else partial(publish_sent, channel)
        self.service, self.metrics, self.cfg = runner.service, runner.metrics, runner.cfg
        self.subscriptions = self.service.subscriptions()
        self.unacked: dict[int, tuple] = {}  # raw deliveries by tag, so a held one can be dead-lettered byte for byte
        self.held: dict[int, Held] = {}  # what handlers see of the deliveries they hold
        self.held_view = MappingProxyType(self.held)  # read-only and live: no copy per message
        self.group = group and runner.groups
        self.staged: list[Staged] = []
        self.staged_bytes = 0

    def commit(self, state: Any, effects: Effects, inbound: Inbound | None = None) -> None:
        """Carry out a transition: now, or with the rest of its group at `flush`."""
        self.stage(state, effects, inbound)
        if not self.group or len(self.staged) >= GROUP_MAX or self.staged_bytes > self.cfg.max_message_bytes // 4:
            self.flush()

    def stage(self, state: Any, effects: Effects, inbound: Inbound | None = None) -> None:
        """Take a transition in: encode its outputs (one that cannot be sent raises before anything changed), move
        the state on and hold what it holds; its outputs, dead letters, acks and timers wait for `flush`."""
        sent = encode_all(effects.publish, self.cfg)
        if state is not self.runner.state or effects != NOTHING:  # a transition that changed nothing has no commit
            self.runner.state = state
            self.staged.append(Staged(sent, effects))
            self.staged_bytes += sum(len(s.body) for s in sent)
        settled = {tag for tag in (*effects.ack, *(t for t, _ in effects.dead_letter)) if tag in self.unacked}
        for tag in settled:
            self.held.pop(tag, None)  # the next handler of the group must not see it as held
        notes = dict(effects.hold)
        if inbound is not None and inbound.tag in self.unacked and inbound.tag not in settled:
            self.held[inbound.tag] = Held(inbound, notes.pop(inbound.tag, None))
        for tag, note in notes.items():
            if tag in self.held:
                self.held[tag] = Held(self.held[tag].inbound, note)

    def flush(self) -> None:
        """Commit the staged transitions: one checkpoint of the latest state with all their outputs, then publish,
        dead-letter, ack and arm timers in the order they were staged; observations last."""
        if not self.staged:
            return
        group, self.staged, self.staged_bytes = self.staged, [], 0
        sent = tuple(s for g in group for s in g.sent)
        try:
            self.runner.save(self.channel, self.runner.state, sent)
            # counted once saved (a group is committed then), so whoever sees its outputs sees it counted
            self.metrics.group_transitions.observe(len(group))
            self.publish(sent, self.metrics)
        except RECOVERABLE:
            raise
        except Exception as exc:
            # The state has moved past the checkpoint: requeueing one input would apply it twice. Start over from
            # the checkpoint instead, as after a lost connection.
            raise CommitFailed(f"{self.service.name}: {len(group)} transition(s) not committed: {exc!r}") from exc
        for g in group:
            for tag, reason in g.effects.dead_letter:
                if tag in self.unacked:
                    self.dead_letter(*self.unacked[tag], reason)
            for tag in g.effects.ack:
                if self.unacked.pop(tag, None) is not None:
                    self.channel.basic_ack(delivery_tag=tag)
        for g in group:
            for delay, key in g.effects.timers:
                self.conn.call_later(max(0.0, delay), lambda key=key: self.on_timer(key))
        if self.runner.observe is not None:
            for g in group:
                for o in g.effects.observe:
                    self.runner.observe(o)

    def dead_letter(self, queue: str, method, props, body: bytes, reason: str) -> None:
        """Republish a delivery unchanged to the dead-letter exchange with the reason, then ack it."""
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
        self.unacked.pop(method.delivery_tag, None)
        self.held.pop(method.delivery_tag, None)
        self.metrics.dead_lettered.labels(queue).inc()

    def decode(self, queue: str, props, body: bytes) -> wire.Message:
        """Decode, validate and (with a keyring) verify the signature; raises WireError or SignatureError."""
        msg = wire.decode(body, expect=self.subscriptions[queue].kinds, max_bytes=self.cfg.max_message_bytes)
        signing.check(self.cfg.keyring, msg, body, props.headers)  # the signer depends on the body (its client)
        return msg

    def on_message(self, channel, method, props, body: bytes) -> None:
        queue = self.queue_of[method.consumer_tag]
        self.unacked[method.delivery_tag] = (queue, method, props, body)
        started = time.perf_counter()
        try:
            now = self.runner.clock()
            inbound = Inbound(
                queue, self.decode(queue, props, body), method.delivery_tag, bool(method.redelivered), len(body), now
            )
            handler = self.subscriptions[queue].handler_for(inbound.message)
            state, effects = handler(self.runner.state, inbound, now, self.held_view)
            self.commit(state, effects, inbound)
        except (wire.WireError, Reject) as exc:  # malformed, forged (SignatureError is a WireError) or refused
            if method.delivery_tag in self.unacked:
                self.dead_letter(queue, method, props, body, getattr(exc, "reason", str(exc)))
            self.metrics.consumed.labels(queue, "dead-lettered").inc()
            return
        except Interrupted:
            # Stopping mid-task (SIGTERM): give the delivery back at once so another consumer takes it.
            log.info("%s stopping: requeueing the message from %s it was handling", self.service.name, queue)
            self.requeue(queue, method.delivery_tag, "interrupted")
            return
        except RECOVERABLE:
            raise
        except Exception:
            # A bug or a transient fault: requeue; the quorum delivery limit dead-letters a message that keeps failing.
            log.exception("%s failed on a message from %s; requeueing it", self.service.name, queue)
            self.requeue(queue, method.delivery_tag, "error")
            return
        self.metrics.consumed.labels(queue, "ok").inc()
        self.metrics.handle_seconds.labels(queue).observe(time.perf_counter() - started)

    def requeue(self, queue: str, tag: int, outcome: str) -> None:
        """Give a delivery back to its queue (nack with requeue) and count why."""
        self.unacked.pop(tag, None)
        self.channel.basic_nack(delivery_tag=tag, requeue=True)
        self.metrics.consumed.labels(queue, outcome).inc()

    def on_timer(self, key: str) -> None:
        try:
            now = self.runner.clock()
            state, effects = self.service.on_timer(self.runner.state, key, now, self.held_view)
            self.commit(state, effects)
        except RECOVERABLE:
            raise
        except Exception:
            # A timer has no message to requeue: log it and keep serving (the service re-arms what it needs).
            log.exception("%s failed on timer %s", self.service.name, key)
            self.metrics.consumed.labels(f"timer:{ids.timer_kind(key)}", "error").inc()

    def start(self) -> None:
        """Restore, let the service re-arm its timers, then consume every subscribed queue."""
        self.runner.restore(self.channel, self.publish)
        state, effects = self.service.on_start(self.runner.state, self.runner.clock())
        self.commit(state, effects)
        self.flush()
        self.queue_of = {}
        for queue in self.subscriptions:
            tag = self.channel.basic_consume(queue=queue, on_message_callback=self.on_message)
            self.queue_of[tag] = queue


def wait_for_consumers(cfg: BrokerConfig, queue: str, minimum: int, stop: threading.Event, poll: float = 1.0) -> bool:
    """Block until `queue` has `minimum` consumers (passive declare: no permission needed); False if stopped first."""
    announced = False
    while not stop.is_set():
        try:
            conn = connect(cfg)
            try:
                while not stop.is_set():
                    n = conn.channel().queue_declare(queue, passive=True).method.consumer_count
                    if n >= minimum:
                        return True
                    if not announced:
                        log.info("waiting for %d consumer(s) on %s (has %d)", minimum, queue, n)
                        announced = True
                    stop.wait(poll)
            finally:
                if conn.is_open:
                    conn.close()
        except RECOVERABLE as exc:  # no broker yet, or the queue is not provisioned yet
            if refused(exc):
                raise BrokerRefused(f"the broker refused access while waiting for {queue}: {exc}") from exc
            stop.wait(poll)
    return False


def refused(exc: Exception) -> bool:
    if isinstance(exc, pe.ProbableAuthenticationError | pe.ProbableAccessDeniedError | pe.AuthenticationError):
        return True
    return isinstance(exc, pe.ChannelClosedByBroker) and exc.reply_code == 403


def pause(stop: threading.Event, seconds: float, metrics: TransportMetrics, tick: float = 0.5) -> None:
    """Wait `seconds` (or until stopped), stamping the liveness gauge every `tick`: waiting to reconnect is alive."""
    end = time.monotonic() + seconds
    while not stop.is_set():
        metrics.loop.set(time.time())
        left = end - time.monotonic()
        if left <= 0:
            return
        stop.wait(min(tick, left))


def run_service(
    service: Service,
    cfg: BrokerConfig,
    metrics: TransportMetrics,
    stop: threading.Event,
    clock: Callable[[], float] = time.time,
    persist: bool = True,
    observe: Callable[[Observation], None] | None = None,
    fingerprint: Mapping[str, str] | None = None,
    store: Store | None = None,
) -> None:
    """Run `service` until `stop` is set, rebuilding the connection on any loss with capped exponential backoff.

    With `persist` (and a service that has a state codec), every state change is checkpointed, in the broker or in
    `store` (a `FileStore`) if given, and every (re)connect restores the latest checkpoint, so a killed process
    resumes where it stopped; a checkpoint whose fingerprint differs from `fingerprint` (what this process's state
    is valid for) raises CheckpointMismatch instead. `observe` receives the transitions' observations (the
    process's metrics).

    The liveness stamp (`metrics.loop`) turns while connected and while reconnecting: a broker outage of any
    length leaves /healthz passing and only /readyz failing.
    """
    runner = Runner(service, cfg, metrics, clock, persist, observe, fingerprint, store)
    backoff = 0.5
    while not stop.is_set():
        conn = out = None
        try:
            metrics.loop.set(time.time())
            conn = connect(cfg)
            channel = confirm_channel(conn, cfg)
            channel.basic_qos(prefetch_count=cfg.prefetch)
            # The server's durable services publish outboxes worth a transaction (a round's tasks); a worker or a
            # client answers one message at a time, and keeps to one connection.
            out = connect(cfg) if service.name in system.DURABLE else None
            publisher = Publisher(out) if out is not None else None
            session = Session(conn, channel, runner, group=True, publisher=publisher)
            session.start()
            metrics.connected.set(1)
            log.info("%s connected to the broker", service.name)
            backoff = 0.5
            while not stop.is_set():
                metrics.loop.set(time.time())
                conn.process_data_events(time_limit=0.5)  # returns once it has dispatched what arrived
                session.flush()
                if publisher is not None:
                    publisher.poll()  # its heartbeats
                # A channel closed by the broker (e.g. consumer_timeout) does not raise here: check it.
                if channel.is_closed or not channel.consumer_tags:
                    raise pe.ChannelClosed(-1, "channel closed or consumer cancelled by the broker")
        except RECOVERABLE as exc:
            metrics.connected.set(0)
            if refused(exc):  # a wrong password or a missing permission does not heal by reconnecting
                raise BrokerRefused(f"{service.name}: the broker refused access ({exc}); check its user") from exc
            metrics.reconnects.inc()
            log.warning(
                "%s lost the broker (%s: %s); reconnecting in %.1fs", service.name, type(exc).__name__, exc, backoff
            )
            pause(stop, backoff, metrics)
            backoff = min(backoff * 2, cfg.max_backoff)
        finally:
            close_quietly(out)
            close_quietly(conn)
    metrics.connected.set(0)
