"""`fedat-collector`: federated evaluation for real clients as a process, configured by FEDAT_* variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from fedat.protocol.system import BY_NAME
from fedat.runtime import config
from fedat.runtime.bus import BrokerConfig
from fedat.runtime.serving import serve_forever, setup_logging
from fedat_aggregator.collector import Collector, CollectorConfig
from fedat_aggregator.metrics import collector_metrics

ME = BY_NAME["collector"]  # this service's row of the system table


@dataclass(frozen=True)
class Settings:
    """Everything the collector process needs."""

    broker: BrokerConfig
    collector: CollectorConfig
    metrics_port: int


def settings(env: Mapping[str, str]) -> Settings:
    """Build the settings from the environment: the evaluator's schedule, FEDAT_EVAL_WINDOW and
    FEDAT_EVAL_WHOLE_EVERY."""
    window = config.get_float(env, "FEDAT_EVAL_WINDOW", CollectorConfig.window)
    if window <= 0:
        raise config.ConfigError(f"FEDAT_EVAL_WINDOW={window} must be > 0 seconds")
    whole_every = config.get_int(env, "FEDAT_EVAL_WHOLE_EVERY", CollectorConfig.whole_every)
    if whole_every < 1:
        raise config.ConfigError(f"FEDAT_EVAL_WHOLE_EVERY={whole_every} must be >= 1 (1: every request whole)")
    cfg = CollectorConfig(schedule=config.eval_schedule(env), window=window, whole_every=whole_every)
    return Settings(config.broker(env, ME.prefetch), cfg, config.get_int(env, "FEDAT_METRICS_PORT", ME.metrics_port))


def main() -> None:
    """Run the collector until SIGTERM."""
    setup_logging("collector")
    s = settings(os.environ)
    metrics = collector_metrics()
    service = Collector(s.collector)
    serve_forever(service, s.broker, metrics.transport.registry, metrics.transport, s.metrics_port, metrics.observe)


if __name__ == "__main__":
    main()
