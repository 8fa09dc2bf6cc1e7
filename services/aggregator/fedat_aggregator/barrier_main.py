"""`fedat-barrier`: the tier barrier as a process, configured by FEDAT_* variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from fedat.fl.strategies import Strategy
from fedat.protocol.system import BY_NAME, Mode
from fedat.runtime import config
from fedat.runtime.bus import BrokerConfig
from fedat.runtime.serving import serve_forever, setup_logging
from fedat_aggregator.barrier import Barrier, BarrierConfig
from fedat_aggregator.metrics import barrier_metrics

ME = BY_NAME["barrier"]  # this service's row of the system table


@dataclass(frozen=True)
class Settings:
    """Everything the barrier process needs."""

    broker: BrokerConfig
    barrier: BarrierConfig
    strategy: Strategy  # built from FEDAT_STRATEGY and the strategies' hyper-parameter settings
    metrics_port: int


def settings(env: Mapping[str, str]) -> Settings:
    """Build the settings from the environment."""
    d = BarrierConfig()
    num_tiers = config.get_int(env, "FEDAT_NUM_TIERS", 5)
    cfg = BarrierConfig(
        tiers=config.get_ints(env, "FEDAT_TIERS", tuple(range(1, num_tiers + 1))),
        clients_per_round=config.get_int(env, "FEDAT_CLIENTS_PER_ROUND", d.clients_per_round),
        min_clients=config.get_int(env, "FEDAT_MIN_CLIENTS", d.min_clients),
        deadline_factor=config.get_float(env, "FEDAT_DEADLINE_FACTOR", d.deadline_factor),
        min_deadline=config.get_float(env, "FEDAT_MIN_DEADLINE", d.min_deadline),
        epochs=config.get_int(env, "FEDAT_EPOCHS", d.epochs),
        batch_size=config.get_int(env, "FEDAT_BATCH_SIZE", d.batch_size),
        learning_rate=config.get_float(env, "FEDAT_LEARNING_RATE", d.learning_rate),
        prox_lambda=config.get_float(env, "FEDAT_PROX_LAMBDA", d.prox_lambda),
        straggler_fraction=config.get_float(env, "FEDAT_STRAGGLER_FRACTION", d.straggler_fraction),
        codec=config.get_str(env, "FEDAT_CODEC", d.codec),
        precision=config.get_int(env, "FEDAT_PRECISION", d.precision),
        seed=config.get_int(env, "FEDAT_SEED", d.seed),
        real_clients=config.clients(env) is Mode.REAL,
        relative_downloads=config.get_int(env, "FEDAT_RELATIVE_DOWNLOADS", int(d.relative_downloads)) != 0,
    )
    if cfg.min_clients < 1 or cfg.clients_per_round < cfg.min_clients:
        raise config.ConfigError("need 1 <= FEDAT_MIN_CLIENTS <= FEDAT_CLIENTS_PER_ROUND")
    if config.get_int(env, "FEDAT_RELATIVE_DOWNLOADS", 1) not in (0, 1):
        raise config.ConfigError("FEDAT_RELATIVE_DOWNLOADS must be 0 or 1")
    if not 0.0 <= cfg.straggler_fraction <= 1.0:
        raise config.ConfigError(f"FEDAT_STRAGGLER_FRACTION={cfg.straggler_fraction} must be within 0..1")
    strategy = config.strategy(env)
    # The barrier holds a round's updates unacked until it closes: prefetch must cover every open round.
    prefetch = max(ME.prefetch, 4 * cfg.clients_per_round * len(cfg.tiers) + 8)
    return Settings(
        config.broker(env, prefetch), cfg, strategy, config.get_int(env, "FEDAT_METRICS_PORT", ME.metrics_port)
    )


def main() -> None:
    """Run the barrier until SIGTERM."""
    setup_logging("barrier")
    s = settings(os.environ)
    metrics = barrier_metrics()
    service = Barrier(s.barrier, s.strategy)
    serve_forever(service, s.broker, metrics.transport.registry, metrics.transport, s.metrics_port, metrics.observe)


if __name__ == "__main__":
    main()
