"""Transport metrics shared by every service's shell; each service adds its own to the same private registry."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


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
    restore_seconds: Histogram


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
        restore_seconds=Histogram(
            "fedat_state_restore_seconds",
            "Time to load the latest checkpoint and re-send its outbox",
            registry=registry,
            buckets=(0.01, 0.03, 0.1, 0.3, 1, 3, 10),
        ),
    )


def serve(registry: CollectorRegistry, port: int) -> None:
    """Expose `registry` on /metrics at `port` (0 disables)."""
    if port:
        start_http_server(port, registry=registry)
