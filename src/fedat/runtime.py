"""Process plumbing shared by every service's `main()`: logging, signals, metrics endpoint, the run loop."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from fedat.bus import BrokerConfig, run_service, wait_for_consumers
from fedat.metrics import TransportMetrics, serve
from fedat.service import Observation, Service


def setup_logging(service: str) -> None:
    """Plain, greppable log lines on stderr."""
    logging.basicConfig(
        level=os.environ.get("FEDAT_LOG_LEVEL", "INFO"),
        format=f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("pika").setLevel(logging.WARNING)


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT, so the loop closes its connection cleanly."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def serve_forever(
    service: Service,
    broker: BrokerConfig,
    registry: CollectorRegistry,
    transport: TransportMetrics,
    metrics_port: int,
    observe: Callable[[Observation], None] | None = None,
    wait_for: tuple[str, int] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Expose metrics, then run the service against the broker until signalled (restoring its saved state).

    `wait_for` = (queue, n): first wait until n consumers serve that queue (the profiler waits for a worker).
    `stop`: the event `stop_on_signals` gave, when the service's own parts must see it too (the worker's trainer).
    """
    serve(registry, metrics_port, transport)
    stop = stop if stop is not None else stop_on_signals()
    if wait_for is not None and not wait_for_consumers(broker, *wait_for, stop):
        return
    run_service(service, broker, transport, stop, observe=observe)
