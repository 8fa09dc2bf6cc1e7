"""`fedat-profiler`: the tiering module as a process, configured by FEDAT_* variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from fedat.protocol import topology
from fedat.protocol.system import BY_NAME, Mode
from fedat.runtime import config
from fedat.runtime.bus import BrokerConfig
from fedat.runtime.serving import serve_forever, setup_logging
from fedat_profiler.metrics import profiler_metrics
from fedat_profiler.profiler import Profiler, ProfilerConfig

ME = BY_NAME["profiler"]  # this service's row of the system table


@dataclass(frozen=True)
class Settings:
    """Everything the profiler process needs."""

    broker: BrokerConfig
    profiler: ProfilerConfig
    metrics_port: int


def settings(env: Mapping[str, str]) -> Settings:
    """Build the settings from the environment."""
    d = ProfilerConfig()
    real = config.clients(env) is Mode.REAL
    cfg = ProfilerConfig(
        # Real clients: no list; a count > 0 only ends the first pass once that many answered.
        num_clients=config.get_int(env, "FEDAT_NUM_CLIENTS", 0 if real else d.num_clients),
        num_tiers=config.get_int(env, "FEDAT_NUM_TIERS", d.num_tiers),
        tier_sizes=config.get_floats(env, "FEDAT_TIER_SIZES", d.tier_sizes),
        profile_epochs=config.get_int(env, "FEDAT_PROFILE_EPOCHS", d.profile_epochs),
        batch_size=config.get_int(env, "FEDAT_BATCH_SIZE", d.batch_size),
        learning_rate=config.get_float(env, "FEDAT_LEARNING_RATE", d.learning_rate),
        concurrency=config.get_int(env, "FEDAT_PROFILE_CONCURRENCY", d.concurrency),
        profile_deadline=config.get_float(env, "FEDAT_PROFILE_DEADLINE", d.profile_deadline),
        retier_every=config.get_int(env, "FEDAT_RETIER_EVERY", d.retier_every),
        drift_fraction=config.get_float(env, "FEDAT_DRIFT_FRACTION", d.drift_fraction),
        ewma_alpha=config.get_float(env, "FEDAT_EWMA_ALPHA", d.ewma_alpha),
        max_misses=config.get_int(env, "FEDAT_MAX_MISSES", d.max_misses),
        codec=config.get_str(env, "FEDAT_CODEC", d.codec),
        precision=config.get_int(env, "FEDAT_PRECISION", d.precision),
        real_clients=real,
    )
    if cfg.tier_sizes and (len(cfg.tier_sizes) != cfg.num_tiers or min(cfg.tier_sizes) <= 0):
        raise config.ConfigError(f"FEDAT_TIER_SIZES needs {cfg.num_tiers} positive numbers, one per tier")
    return Settings(config.broker(env, ME.prefetch), cfg, config.get_int(env, "FEDAT_METRICS_PORT", ME.metrics_port))


def main() -> None:
    """Run the profiler until SIGTERM."""
    setup_logging("profiler")
    s = settings(os.environ)
    metrics = profiler_metrics()
    # Profiling measures how long workers take: it starts once a worker consumes the profiling queue, whatever
    # started first (a launcher, Kubernetes, a human). Real clients are profiled as they join: nothing to wait for.
    serve_forever(
        Profiler(s.profiler),
        s.broker,
        metrics.transport.registry,
        metrics.transport,
        s.metrics_port,
        metrics.observe,
        wait_for=None if s.profiler.real_clients else (topology.PROFILE_QUEUE, 1),
    )


if __name__ == "__main__":
    main()
