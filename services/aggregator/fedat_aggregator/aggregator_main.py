"""`fedat-aggregator`: the global aggregator as a process, configured by FEDAT_* variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from fedat.fl.strategies import Strategy
from fedat.protocol.system import BY_NAME
from fedat.runtime import config
from fedat.runtime.bus import BrokerConfig
from fedat.runtime.serving import serve_forever, setup_logging
from fedat_aggregator.aggregator import Aggregator, AggregatorConfig
from fedat_aggregator.metrics import aggregator_metrics

ME = BY_NAME["aggregator"]  # this service's row of the system table


@dataclass(frozen=True)
class Settings:
    """Everything the aggregator process needs."""

    broker: BrokerConfig
    aggregator: AggregatorConfig
    strategy: Strategy  # built from FEDAT_STRATEGY and the strategies' hyper-parameter settings
    metrics_port: int


def settings(env: Mapping[str, str]) -> Settings:
    """Build the settings from the environment."""
    cfg = AggregatorConfig(
        num_tiers=config.get_int(env, "FEDAT_NUM_TIERS", 5),
        codec=config.get_str(env, "FEDAT_CODEC", "polyline"),
        precision=config.get_int(env, "FEDAT_PRECISION", 4),
    )
    strategy = config.strategy(env)
    return Settings(
        config.broker(env, ME.prefetch), cfg, strategy, config.get_int(env, "FEDAT_METRICS_PORT", ME.metrics_port)
    )


def main() -> None:
    """Run the aggregator until SIGTERM."""
    setup_logging("aggregator")
    s = settings(os.environ)
    metrics = aggregator_metrics()
    service = Aggregator(s.aggregator, s.strategy)
    serve_forever(service, s.broker, metrics.transport.registry, metrics.transport, s.metrics_port, metrics.observe)


if __name__ == "__main__":
    main()
