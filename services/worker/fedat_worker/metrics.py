"""Every metric of the worker, the evaluator and a real client, each in a private registry."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fedat.protocol.service import Observation
from fedat.runtime.metrics import TransportMetrics, transport_metrics
from fedat_worker import client


def _training(r: CollectorRegistry) -> dict[str, Counter | Histogram]:
    """Local training by tier (0 = profiling): the same names in a pool worker and in a real client."""
    return {
        "trained": Counter(
            "fedat_client_trainings_total", "Local trainings completed, by tier (0 = profiling)", ["tier"], registry=r
        ),
        "epochs": Counter("fedat_client_epochs_total", "Local epochs completed, by tier", ["tier"], registry=r),
        "train_seconds": Histogram(
            "fedat_client_train_seconds",
            "Wall time of one local training",
            ["tier"],
            registry=r,
            buckets=(0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10),
        ),
    }


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
        **_training(r),
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


@dataclass(frozen=True)
class ClientMetrics:
    """A real client's trainings and evaluations, by tier (0 = profiling), never by client: one process is one."""

    transport: TransportMetrics
    joins: Counter
    trained: Counter
    epochs: Counter
    train_seconds: Histogram
    evaluations: Counter
    accuracy: Gauge
    task_bytes: Counter
    evaluation_bytes: Counter
    unscorable: Counter

    def observe(self, o: Observation) -> None:
        """Count what a client transition observed."""
        tier = str(o.tier)
        if o.name == client.JOINED:
            self.joins.inc()
        elif o.name == client.TRAINED:
            self.trained.labels(tier).inc()
            self.train_seconds.labels(tier).observe(o.value)
        elif o.name == client.EPOCHS:
            self.epochs.labels(tier).inc(o.value)
        elif o.name == client.EVALUATED:
            self.evaluations.inc()
            self.accuracy.set(o.value)
        elif o.name in (client.RECEIVED_WHOLE, client.RECEIVED_AGAINST):
            self.task_bytes.labels(tier, "whole" if o.name == client.RECEIVED_WHOLE else "against_kept").inc(o.value)
        elif o.name in (client.ASKED_WHOLE, client.ASKED_AGAINST):
            self.evaluation_bytes.labels("whole" if o.name == client.ASKED_WHOLE else "against_kept").inc(o.value)
        elif o.name == client.UNSCORABLE:
            self.unscorable.inc()


def client_metrics() -> ClientMetrics:
    """A fresh registry with a real client's metrics (the worker's names where they mean the same)."""
    r = CollectorRegistry()
    return ClientMetrics(
        transport=transport_metrics(r, "client"),
        joins=Counter("fedat_client_joins_total", "Joins sent (one per broker connection)", registry=r),
        **_training(r),
        evaluations=Counter(
            "fedat_client_evaluations_total", "Global models scored on this client's own test split", registry=r
        ),
        accuracy=Gauge(
            "fedat_client_eval_accuracy_ratio", "Test accuracy of the last global model this client scored", registry=r
        ),
        task_bytes=Counter(
            "fedat_client_task_model_bytes_total",
            "Model bytes of the round tasks received, by tier and how the model came: whole, or against a version "
            "this client keeps",
            ["tier", "sent"],
            registry=r,
        ),
        evaluation_bytes=Counter(
            "fedat_client_evaluation_model_bytes_total",
            "Model bytes of the evaluation requests received, by how the model came: whole, or against the newest "
            "model a request brought whole",
            ["sent"],
            registry=r,
        ),
        unscorable=Counter(
            "fedat_client_evaluations_unscorable_total",
            "Evaluation requests skipped: sent against a model this client does not keep (it lost its state folder, "
            "or missed the request sent whole)",
            registry=r,
        ),
    )
