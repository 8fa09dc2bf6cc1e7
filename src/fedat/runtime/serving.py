"""Process plumbing shared by every service's `main()`: logging, signals, metrics endpoint, the run loop."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from fedat.errors import CheckpointMismatch
from fedat.fl import strategies
from fedat.protocol import fingerprint
from fedat.protocol.service import Observation, Service
from fedat.runtime import config
from fedat.runtime.brokerstore import Store
from fedat.runtime.bus import BrokerConfig, run_service, wait_for_consumers
from fedat.runtime.metrics import LIVENESS_SECONDS, TransportMetrics, serve

log = logging.getLogger(__name__)


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


def strategy_defaults(name: str) -> dict[str, Any]:
    """Each setting the strategy `name` reads, with its default ({} for a name no strategy has)."""
    entry = strategies.REGISTRY.get(name)
    if entry is None:
        return {}
    bounds = strategies.setting_bounds()
    return {key: bounds[key][1] for key in entry.settings()}


def fingerprint_of(state_version: int, env: Mapping[str, str]) -> dict[str, str]:
    """What a durable service's checkpoints are valid for, from its FEDAT_* settings (`fedat.protocol.fingerprint`)."""
    name = env.get("FEDAT_STRATEGY", "").strip() or fingerprint.BOUND[fingerprint.STRATEGY]
    return fingerprint.of_settings(state_version, env, strategy_defaults(name))


def serve_forever(
    service: Service,
    broker: BrokerConfig,
    registry: CollectorRegistry,
    transport: TransportMetrics,
    metrics_port: int,
    observe: Callable[[Observation], None] | None = None,
    wait_for: tuple[str, int] | None = None,
    stop: threading.Event | None = None,
    persist: bool = True,
    store: Store | None = None,
    fingerprint: Mapping[str, str] | None = None,
) -> None:
    """Expose metrics, then run the service against the broker until signalled (restoring its saved state, from
    the broker or from `store`, a `FileStore`, if given; none without `persist`).

    `wait_for` = (queue, n): first wait until n consumers serve that queue (the profiler waits for a worker).
    `stop`: the event `stop_on_signals` gave, when the service's own parts must see it too (the worker's trainer).
    `fingerprint`: what its checkpoints are valid for, if not the run its FEDAT_* settings name (a client's own).
    """
    env = os.environ
    codec = getattr(service, "codec", None)
    fp = fingerprint if fingerprint is not None else fingerprint_of(codec.version, env) if codec is not None else None
    liveness = config.get_float(env, "FEDAT_LIVENESS_SECONDS", LIVENESS_SECONDS)
    serve(registry, metrics_port, transport, liveness, fp)
    stop = stop if stop is not None else stop_on_signals()
    if wait_for is not None and not wait_for_consumers(broker, *wait_for, stop):
        return
    try:
        run_service(service, broker, transport, stop, persist=persist, observe=observe, fingerprint=fp, store=store)
    except CheckpointMismatch as exc:
        # Not a crash to retry: the same checkpoint will not fit the next start either. Say why, once, and stop.
        log.critical("%s", exc)
        raise SystemExit(3) from None
