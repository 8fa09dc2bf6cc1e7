"""Every metric of the worker and the evaluator, each in a private registry."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fedat.metrics import TransportMetrics, transport_metrics


@dataclass(frozen=True)
class WorkerMetrics:
    """Training throughput per tier."""

    transport: TransportMetrics
    trained: Counter
    epochs: Counter
    train_seconds: Histogram
    late: Counter
    dropped: Counter


def worker_metrics() -> WorkerMetrics:
    """A fresh registry with the worker's metrics."""
    r = CollectorRegistry()
    return WorkerMetrics(
        transport=transport_metrics(r, "worker"),
        trained=Counter(
            "fedat_client_trainings_total", "Local trainings completed, by tier (0 = profiling)", ["tier"], registry=r
        ),
        epochs=Counter("fedat_client_epochs_total", "Local epochs completed, by tier", ["tier"], registry=r),
        train_seconds=Histogram(
            "fedat_client_train_seconds",
            "Wall time of one local training",
            ["tier"],
            registry=r,
            buckets=(0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10),
        ),
        late=Counter(
            "fedat_client_updates_late_total",
            "Updates finished after their modelled response time",
            ["tier"],
            registry=r,
        ),
        dropped=Counter("fedat_client_dropouts_total", "Tasks for clients that dropped out", registry=r),
    )


@dataclass(frozen=True)
class EvaluatorMetrics:
    """Global model quality."""

    transport: TransportMetrics
    accuracy: Gauge
    variance: Gauge
    version: Gauge
    seconds: Histogram


def evaluator_metrics() -> EvaluatorMetrics:
    """A fresh registry with the evaluator's metrics."""
    r = CollectorRegistry()
    return EvaluatorMetrics(
        transport=transport_metrics(r, "evaluator"),
        accuracy=Gauge(
            "fedat_eval_accuracy_ratio", "Mean client test accuracy of the latest evaluated model", registry=r
        ),
        variance=Gauge("fedat_eval_accuracy_variance", "Variance of per-client test accuracy", registry=r),
        version=Gauge("fedat_eval_model_version", "Global version last evaluated", registry=r),
        seconds=Histogram("fedat_eval_seconds", "Time to evaluate one global model", registry=r),
    )
