"""Every metric of the barrier, the aggregator and the collector, each service in its own private registry."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fedat.protocol.service import Observation
from fedat.runtime.metrics import TransportMetrics, transport_metrics
from fedat_aggregator import aggregator as agg
from fedat_aggregator import barrier as bar
from fedat_aggregator import collector as col


@dataclass(frozen=True)
class BarrierMetrics:
    """Per-tier round throughput."""

    transport: TransportMetrics
    rounds_opened: Counter
    rounds_closed: Counter
    round_seconds: Histogram
    updates_merged: Counter
    duplicates: Counter
    reissues: Counter
    late_answers: Counter

    def observe(self, o: Observation) -> None:
        """Count what a barrier transition observed."""
        tier = str(o.tier)
        counters = {
            bar.OPENED: self.rounds_opened,
            bar.CLOSED_OBS: self.rounds_closed,
            bar.MERGED_UPDATES: self.updates_merged,
            bar.DUPLICATES: self.duplicates,
            bar.REISSUES: self.reissues,
            bar.LATE: self.late_answers,
        }
        if o.name == bar.ROUND_SECONDS:
            self.round_seconds.labels(tier).observe(o.value)
        elif o.name in counters:
            counters[o.name].labels(tier).inc(o.value)


def barrier_metrics() -> BarrierMetrics:
    """A fresh registry with the barrier's metrics."""
    r = CollectorRegistry()
    return BarrierMetrics(
        transport=transport_metrics(r, "barrier"),
        rounds_opened=Counter("fedat_tier_rounds_opened_total", "Tier rounds opened", ["tier"], registry=r),
        rounds_closed=Counter("fedat_tier_rounds_closed_total", "Tier rounds closed and merged", ["tier"], registry=r),
        round_seconds=Histogram(
            "fedat_tier_round_seconds",
            "Wall time from opening to closing a tier round",
            ["tier"],
            registry=r,
            buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300),
        ),
        updates_merged=Counter(
            "fedat_tier_updates_merged_total", "Client updates merged into tier models", ["tier"], registry=r
        ),
        duplicates=Counter(
            "fedat_barrier_duplicate_updates_total", "Redelivered updates counted once", ["tier"], registry=r
        ),
        reissues=Counter(
            "fedat_tier_round_reissues_total", "Rounds below the minimum at their deadline", ["tier"], registry=r
        ),
        late_answers=Counter(
            "fedat_tier_late_answers_total", "Answers that came after their round closed", ["tier"], registry=r
        ),
    )


@dataclass(frozen=True)
class AggregatorMetrics:
    """Cross-tier merge activity."""

    transport: TransportMetrics
    merges: Counter
    duplicates: Counter
    version: Gauge
    tier_weight: Gauge
    created: Gauge
    staleness: Histogram
    model_bytes: Counter

    def observe(self, o: Observation) -> None:
        """Count what an aggregator transition observed."""
        if o.name == agg.MERGES:
            self.merges.labels(str(o.tier)).inc()
        elif o.name == agg.DUPLICATES:
            self.duplicates.inc()
        elif o.name == agg.WEIGHT:
            self.tier_weight.labels(str(o.tier)).set(o.value)
        elif o.name == agg.VERSION:
            self.version.set(o.value)
        elif o.name == agg.CREATED:
            self.created.set(o.value)
        elif o.name == agg.STALENESS:
            self.staleness.labels(str(o.tier)).observe(o.value)
        elif o.name in (agg.BYTES_UP, agg.BYTES_DOWN):
            self.model_bytes.labels(str(o.tier), "up" if o.name == agg.BYTES_UP else "down").inc(o.value)


def aggregator_metrics() -> AggregatorMetrics:
    """A fresh registry with the aggregator's metrics."""
    r = CollectorRegistry()
    return AggregatorMetrics(
        transport=transport_metrics(r, "aggregator"),
        merges=Counter("fedat_global_merges_total", "Tier models merged into the global model", ["tier"], registry=r),
        duplicates=Counter(
            "fedat_aggregator_duplicate_tier_models_total", "Redelivered tier models ignored", registry=r
        ),
        version=Gauge("fedat_global_model_version", "Version of the latest global model", registry=r),
        tier_weight=Gauge("fedat_tier_weight_ratio", "Current cross-tier weight of each tier", ["tier"], registry=r),
        created=Gauge(
            "fedat_global_model_created_timestamp_seconds",
            "Unix time the latest global model was published (its age: time() minus this)",
            registry=r,
        ),
        staleness=Histogram(
            "fedat_tier_model_staleness_versions",
            "Global versions published between a tier round's start and its merge",
            ["tier"],
            registry=r,
            buckets=(0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89),
        ),
        model_bytes=Counter(
            "fedat_model_bytes_total",
            "Model payload bytes of merged tier rounds: up (client updates) and down (tasks)",
            ["tier", "direction"],
            registry=r,
        ),
    )


@dataclass(frozen=True)
class CollectorMetrics:
    """Federated evaluation; the evaluator's metric names where they mean the same, so dashboards read either."""

    transport: TransportMetrics
    accuracy: Gauge
    variance: Gauge
    version: Gauge
    seconds: Histogram
    requests: Counter
    request_bytes: Counter
    reports: Counter
    ignored: Counter
    tier_accuracy: Gauge

    def observe(self, o: Observation) -> None:
        """Count what a collector transition observed."""
        if o.name == col.REQUESTED:
            self.requests.inc()
        elif o.name in (col.SENT_WHOLE, col.SENT_AGAINST):
            self.request_bytes.labels("whole" if o.name == col.SENT_WHOLE else "against_kept").inc(o.value)
        elif o.name == col.REPORTED:
            self.reports.labels(str(o.tier)).inc()
        elif o.name == col.EVALUATED:
            self.accuracy.set(o.value)
        elif o.name == col.VARIANCE:
            self.variance.set(o.value)
        elif o.name == col.VERSION:
            self.version.set(o.value)
        elif o.name == col.WAITED:
            self.seconds.observe(o.value)
        elif o.name == col.TIER_ACCURACY:
            self.tier_accuracy.labels(str(o.tier)).set(o.value)
        elif o.name in col.IGNORED:
            self.ignored.labels(o.name).inc()


def collector_metrics() -> CollectorMetrics:
    """A fresh registry with the collector's metrics."""
    r = CollectorRegistry()
    return CollectorMetrics(
        transport=transport_metrics(r, "collector"),
        accuracy=Gauge(
            "fedat_eval_accuracy_ratio",
            "Sample-weighted client test accuracy of the latest evaluated model",
            registry=r,
        ),
        variance=Gauge("fedat_eval_accuracy_variance", "Variance of per-client test accuracy", registry=r),
        version=Gauge("fedat_eval_model_version", "Global version last evaluated", registry=r),
        seconds=Histogram(
            "fedat_eval_seconds",
            "Time from asking the clients to score a global model to publishing its evaluation",
            registry=r,
            buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120),
        ),
        requests=Counter("fedat_eval_requests_total", "Global models sent to the clients to score", registry=r),
        request_bytes=Counter(
            "fedat_eval_request_model_bytes_total",
            "Model bytes of the evaluation requests, one copy each (every client downloads one), by how the model "
            "went: whole, or against the newest model sent whole, which clients keep",
            ["sent"],
            registry=r,
        ),
        reports=Counter(
            "fedat_eval_client_reports_total",
            "Client scores folded into evaluations, by the client's tier",
            ["tier"],
            registry=r,
        ),
        ignored=Counter(
            "fedat_collector_reports_ignored_total",
            "Client scores acked and ignored: unrequested, late, unassigned or duplicate",
            ["reason"],
            registry=r,
        ),
        tier_accuracy=Gauge(
            "fedat_eval_tier_accuracy_ratio",
            "Mean test accuracy of each tier's clients that scored the latest model",
            ["tier"],
            registry=r,
        ),
    )
