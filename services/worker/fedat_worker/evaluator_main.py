"""`fedat-evaluator`: scores global models, configured by FEDAT_* variables."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from fedat.protocol.system import BY_NAME
from fedat.runtime import config
from fedat.runtime.serving import serve_forever, setup_logging
from fedat_worker.evaluator import Evaluator, EvaluatorConfig
from fedat_worker.metrics import evaluator_metrics
from fedat_worker.workload import build, workload_from_env

ME = BY_NAME["evaluator"]  # this service's row of the system table

ANCHORS = ("last", "grid")  # FEDAT_EVAL_ANCHOR: time slots counted from the last scored version, or a fixed grid


def settings(env: Mapping[str, str]) -> EvaluatorConfig:
    """The evaluator's schedule from FEDAT_EVAL_EVERY, FEDAT_EVAL_INTERVAL and FEDAT_EVAL_ANCHOR."""
    anchor = config.get_str(env, "FEDAT_EVAL_ANCHOR", "last")
    if anchor not in ANCHORS:
        raise config.ConfigError(f"FEDAT_EVAL_ANCHOR={anchor!r} is not one of {list(ANCHORS)}")
    return EvaluatorConfig(
        every=config.get_int(env, "FEDAT_EVAL_EVERY", 5),
        interval=config.get_float(env, "FEDAT_EVAL_INTERVAL", 0.0),
        grid=anchor == "grid",
    )


def main() -> None:
    """Run the evaluator until SIGTERM."""
    setup_logging("evaluator")
    env = os.environ
    workload = workload_from_env(env)
    cfg = settings(env)
    broker = config.broker(env, ME.prefetch)
    clients, _, trainer = build(workload, config.get_int(env, "FEDAT_TF_THREADS", 1))
    metrics = evaluator_metrics()
    service = Evaluator(cfg, clients, trainer, time.time, metrics)
    serve_forever(
        service,
        broker,
        metrics.transport.registry,
        metrics.transport,
        config.get_int(env, "FEDAT_METRICS_PORT", ME.metrics_port),
    )


if __name__ == "__main__":
    main()
