"""Record a run's message streams as small records (`fedat.ops.invariants`), live, from the broker itself.

`Capture.declare()` declares the topology and the capture's own durable quorum queues, bound next to the services'
queues, so that every message published from then on is copied to the capture; call it before any service starts.
`Capture.start()` consumes them in a background thread that reconnects when the broker goes away (a broker restart
keeps quorum queues and their messages). `Capture.finish()`, once the services are stopped, stops the thread and
drains what is left: the capture queues, `fedat.dead-letters`, and the work queues that still hold updates or tier
models (those were in flight when the run stopped). Only ids, rounds, clients, versions and digests are kept, never
the model bytes.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pika
import pika.exceptions as pe

from fedat.ops.invariants import DeadLetter, GlobalSeen, ReportSeen, TierModelSeen, UpdateSeen
from fedat.protocol import topology, wire

log = logging.getLogger(__name__)

PREFIX = "fedat.ops.capture"
# queue -> bindings (exchange, routing key)
CAPTURE_QUEUES: dict[str, tuple[tuple[str, str], ...]] = {
    f"{PREFIX}.global": ((topology.GLOBAL, ""),),
    f"{PREFIX}.tier-models": ((topology.TIER_MODELS, ""),),
    f"{PREFIX}.results": ((topology.RESULTS, "#"),),
    f"{PREFIX}.events": ((topology.EVENTS, topology.ROUND_REPORT_KEY), (topology.EVENTS, topology.EVALUATION_KEY)),
}
RECONNECT_BACKOFF = (0.2, 2.0)  # first wait, longest wait


def digest(layers: Iterable[wire.Layer]) -> str:
    """sha256 over the layers' encoded data, in order: equal models published twice have equal digests."""
    h = hashlib.sha256()
    for layer in layers:
        h.update(layer.data)
    return h.hexdigest()


@dataclass(frozen=True)
class EvaluationSeen:
    """An evaluation event: which version scored what, when (evaluator's clock)."""

    id: str
    version: int
    accuracy: float
    evaluated_at: float


@dataclass
class Records:
    """Everything captured; lists keep every copy (redeliveries included), in arrival order."""

    updates: list[UpdateSeen] = field(default_factory=list)
    tier_models: list[TierModelSeen] = field(default_factory=list)
    globals: list[GlobalSeen] = field(default_factory=list)
    reports: list[ReportSeen] = field(default_factory=list)
    evaluations: list[EvaluationSeen] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    queued: list[str] = field(default_factory=list)  # ids still waiting in a work queue at the end
    profile_answers: int = 0
    undecodable: int = 0
    reconnect_attempts: int = 0  # failed or lost connections (a broker restart causes several)

    def add(self, msg: wire.Message) -> None:
        """Keep the small record of one message."""
        if isinstance(msg, wire.Update):
            if msg.tier >= 1:
                self.updates.append(UpdateSeen(msg.id, msg.tier, msg.round, msg.client))
            else:
                self.profile_answers += 1
        elif isinstance(msg, wire.TierModel):
            self.tier_models.append(TierModelSeen(msg.id, msg.tier, msg.round, tuple(msg.clients), digest(msg.layers)))
        elif isinstance(msg, wire.GlobalModel):
            merged = tuple((int(t), int(r)) for t, r in msg.merged)
            self.globals.append(GlobalSeen(msg.id, msg.version, merged, digest(msg.layers), msg.created_at))
        elif isinstance(msg, wire.RoundReport):
            self.reports.append(
                ReportSeen(msg.id, msg.tier, msg.round, tuple(sorted(msg.latencies)), tuple(msg.missing))
            )
        elif isinstance(msg, wire.Evaluation):
            self.evaluations.append(EvaluationSeen(msg.id, msg.version, msg.accuracy, msg.evaluated_at))


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def dead_letter(props: Any, body: bytes) -> DeadLetter:
    """The record of one message from `fedat.dead-letters`: who refused it (service or broker) and why."""
    headers: Mapping[str, Any] = props.headers or {}
    message_id, kind = props.message_id or "", props.type or ""
    if not message_id or not kind:
        try:
            msg = wire.decode(body)
            message_id, kind = message_id or msg.id, kind or msg.kind
        except wire.WireError:
            pass
    if topology.HEADER_REASON in headers:
        return DeadLetter(
            message_id,
            kind,
            _text(headers[topology.HEADER_REASON]),
            _text(headers.get(topology.HEADER_SOURCE_QUEUE, "")),
            "service",
        )
    deaths = headers.get("x-death") or [{}]
    first = deaths[0] if isinstance(deaths, list | tuple) and deaths else {}
    return DeadLetter(message_id, kind, _text(first.get("reason", "unknown")), _text(first.get("queue", "")), "broker")


class Capture:
    """Copies of a run's messages, recorded as they are published; see the module docstring."""

    def __init__(
        self,
        url: str,
        num_tiers: int,
        connect: Callable[[str], pika.BlockingConnection] | None = None,
    ):
        self.url, self.num_tiers = url, num_tiers
        self._connect = connect or (lambda u: pika.BlockingConnection(pika.URLParameters(u)))
        self.records = Records()
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.connected = threading.Event()

    # --- set-up ----------------------------------------------------------------------------------------------
    def declare(self) -> None:
        """Declare the topology and the capture queues (idempotent). Call before any service publishes."""
        conn = self._connect(self.url)
        try:
            ch = conn.channel()
            topology.declare(ch, self.num_tiers)
            for queue, bindings in CAPTURE_QUEUES.items():
                ch.queue_declare(queue=queue, durable=True, arguments={"x-queue-type": "quorum"})
                for exchange, key in bindings:
                    ch.queue_bind(queue=queue, exchange=exchange, routing_key=key)
        finally:
            conn.close()

    def start(self) -> None:
        """Consume the capture queues in a background thread until finish()."""
        self._thread = threading.Thread(target=self._run, name="fedat-capture", daemon=True)
        self._thread.start()

    # --- the background consumer -----------------------------------------------------------------------------
    def _record(self, body: bytes) -> None:
        try:
            msg = wire.decode(body)
        except wire.WireError as exc:
            log.warning("capture: undecodable message: %s", exc)
            with self.lock:
                self.records.undecodable += 1
            return
        with self.lock:
            self.records.add(msg)

    def _run(self) -> None:
        backoff = RECONNECT_BACKOFF[0]
        while not self._stop.is_set():
            conn = None
            try:
                conn = self._connect(self.url)
                ch = conn.channel()
                ch.basic_qos(prefetch_count=256)

                def on_message(channel, method, props, body):
                    self._record(body)
                    channel.basic_ack(delivery_tag=method.delivery_tag)

                for queue in CAPTURE_QUEUES:
                    ch.basic_consume(queue=queue, on_message_callback=on_message)
                self.connected.set()
                backoff = RECONNECT_BACKOFF[0]
                while not self._stop.is_set():
                    conn.process_data_events(time_limit=0.2)
                    if ch.is_closed or not ch.consumer_tags:
                        raise pe.ChannelClosed(-1, "capture channel closed by the broker")
            except (pe.AMQPError, ConnectionError, OSError) as exc:
                self.connected.clear()
                with self.lock:
                    self.records.reconnect_attempts += 1
                log.info("capture: lost the broker (%s); reconnecting in %.1fs", type(exc).__name__, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, RECONNECT_BACKOFF[1])
            finally:
                if conn is not None and conn.is_open:
                    try:
                        conn.close()
                    except (pe.AMQPError, ConnectionError, OSError):
                        pass
        self.connected.clear()

    # --- the end ---------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop the consumer without draining (when a run is abandoned)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def snapshot(self) -> Records:
        """A copy of what was recorded so far (safe while the thread runs)."""
        with self.lock:
            r = self.records
            return Records(
                list(r.updates),
                list(r.tier_models),
                list(r.globals),
                list(r.reports),
                list(r.evaluations),
                list(r.dead_letters),
                list(r.queued),
                r.profile_answers,
                r.undecodable,
                r.reconnect_attempts,
            )

    def finish(self, timeout: float = 60.0) -> Records:
        """Stop the consumer, then drain the capture queues, the dead letters and the work queues; all records."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        deadline = time.time() + timeout
        last: Exception | None = None
        while time.time() < deadline:  # the broker may be coming back from a restart: retry until the deadline
            try:
                self._drain(deadline)
                return self.records
            except (pe.AMQPError, ConnectionError, OSError) as exc:
                last = exc
                time.sleep(1)
        raise RuntimeError(f"capture: could not drain the broker within {timeout:.0f}s: {last}")

    def _drain(self, deadline: float) -> None:
        conn = self._connect(self.url)
        try:
            ch = conn.channel()
            for queue in CAPTURE_QUEUES:
                for _, body in _get_all(ch, queue, deadline):
                    self._record(body)
            for props, body in _get_all(ch, topology.DEAD_LETTERS, deadline):
                record = dead_letter(props, body)
                with self.lock:
                    self.records.dead_letters.append(record)
            work = [topology.barrier_queue(m) for m in range(1, self.num_tiers + 1)]
            work.append(topology.AGGREGATOR_TIER_MODELS)
            for queue in work:
                for props, body in _get_all(ch, queue, deadline):
                    with self.lock:
                        self.records.queued.append(props.message_id or _id(body))
        finally:
            if conn.is_open:
                conn.close()


def _id(body: bytes) -> str:
    try:
        return wire.decode(body).id
    except wire.WireError:
        return ""


def _get_all(ch, queue: str, deadline: float) -> Iterable[tuple[Any, bytes]]:
    """Every message of `queue` (basic.get with ack), until it is empty or the deadline passes."""
    while time.time() < deadline:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return
        yield props, body
