"""Transport metrics shared by every service's shell; each service adds its own to the same private registry."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# /healthz fails when the service's event loop has not turned for this long (a wedged process: restart it). The loop
# turns while reconnecting too, so a broker outage never fails it; FEDAT_LIVENESS_SECONDS overrides it.
LIVENESS_SECONDS = 60.0


@dataclass(frozen=True)
class TransportMetrics:
    """Counters the broker shell updates for any service."""

    registry: CollectorRegistry
    consumed: Counter
    published: Counter
    published_bytes: Counter
    dead_lettered: Counter
    handle_seconds: Histogram
    reconnects: Counter
    connected: Gauge
    state_saves: Counter
    state_save_seconds: Histogram
    state_bytes: Gauge
    group_transitions: Histogram
    restore_seconds: Histogram
    loop: Gauge


def transport_metrics(registry: CollectorRegistry, service: str) -> TransportMetrics:
    """Define the shell's metrics in `registry`, labelled by queue or message kind, never by client."""
    return TransportMetrics(
        registry=registry,
        consumed=Counter(
            "fedat_messages_consumed_total",
            "Messages consumed, by queue and outcome",
            ["queue", "outcome"],
            registry=registry,
        ),
        published=Counter(
            "fedat_messages_published_total", "Messages published with confirms, by kind", ["kind"], registry=registry
        ),
        published_bytes=Counter(
            "fedat_published_bytes_total", "Bytes published, by message kind", ["kind"], registry=registry
        ),
        dead_lettered=Counter(
            "fedat_dead_lettered_total",
            "Messages sent to the dead-letter exchange, by source queue",
            ["queue"],
            registry=registry,
        ),
        handle_seconds=Histogram(
            "fedat_handle_seconds",
            "Handler time per message, by queue",
            ["queue"],
            registry=registry,
            buckets=(0.001, 0.005, 0.02, 0.1, 0.5, 1, 2, 5, 10, 30),
        ),
        reconnects=Counter("fedat_broker_reconnects_total", "Broker connection losses", registry=registry),
        connected=Gauge("fedat_broker_connected", f"1 while {service} holds a broker connection", registry=registry),
        state_saves=Counter("fedat_state_saves_total", "Checkpoints saved (write-ahead of outputs)", registry=registry),
        state_save_seconds=Histogram(
            "fedat_state_save_seconds",
            "Time to save one checkpoint, confirmed",
            registry=registry,
            buckets=(0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1, 3),
        ),
        state_bytes=Gauge(
            "fedat_state_bytes",
            "Bytes of the service's state the broker holds, before compression: the latest snapshot, the journal since",
            ["record"],
            registry=registry,
        ),
        group_transitions=Histogram(
            "fedat_commit_group_transitions",
            "Transitions committed together, behind one checkpoint (1 when each is committed alone)",
            registry=registry,
            buckets=(1, 2, 4, 8, 16, 32, 64),
        ),
        loop=Gauge(
            "fedat_event_loop_timestamp_seconds", "Unix time the service's event loop last turned", registry=registry
        ),
        restore_seconds=Histogram(
            "fedat_state_restore_seconds",
            "Time to load the latest checkpoint and re-send its outbox",
            registry=registry,
            buckets=(0.01, 0.03, 0.1, 0.3, 1, 3, 10),
        ),
    )


def alive(last_turn: float, now: float, window: float = LIVENESS_SECONDS) -> bool:
    """Liveness: the loop turned within `window` seconds, or has not started yet (0: still starting up)."""
    return last_turn == 0 or now - last_turn < window


def serve(
    registry: CollectorRegistry,
    port: int,
    transport: TransportMetrics | None = None,
    liveness_seconds: float = LIVENESS_SECONDS,
    fingerprint: Mapping[str, str] | None = None,
) -> None:
    """Serve /metrics, /healthz (the event loop turned lately) and /readyz (connected to the broker) on `port`.

    Kubernetes probes use the last two: liveness means "this process is stuck" (restart it), readiness "it holds a
    broker connection". A durable service also serves /fingerprint: what the checkpoints it writes are valid for
    (JSON), which the pre-upgrade check reads instead of taking the checkpoint out of its queue while it runs.
    `port` 0 disables the endpoint.
    """
    if not port:
        return

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 — the name http.server calls
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                last = transport.loop._value.get() if transport else time.time()
                ok = alive(last, time.time(), liveness_seconds)
                self._send(200 if ok else 503, b"ok\n" if ok else b"event loop stalled\n")
            elif path == "/readyz":
                ok = transport is None or transport.connected._value.get() == 1
                self._send(200 if ok else 503, b"ok\n" if ok else b"not connected to the broker\n")
            elif path == "/fingerprint" and fingerprint is not None:
                self._send(200, json.dumps(dict(fingerprint), sort_keys=True).encode() + b"\n", "application/json")
            else:
                self._send(404, b"not found: /metrics, /healthz, /readyz, /fingerprint (durable services)\n")

        def _send(self, code: int, body: bytes, kind: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:  # probes every few seconds would flood the log
            pass

    server = ThreadingHTTPServer(("", port), Handler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
