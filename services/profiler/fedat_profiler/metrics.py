"""Every metric of the profiler, in its private registry."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fedat.protocol.service import Observation
from fedat.runtime.metrics import TransportMetrics, transport_metrics
from fedat_profiler import profiler as obs

MEMBERSHIP = {obs.JOINED: "joined", obs.LEFT: "left", obs.REVOKED: "revoked", obs.REFUSED: "refused"}


@dataclass(frozen=True)
class ProfilerMetrics:
    """Latency and tiering."""

    transport: TransportMetrics
    latency: Histogram
    assignments: Counter
    tier_size: Gauge
    evicted: Counter
    members: Counter  # real clients: joins, leaves, revocations, refused joins

    def observe(self, o: Observation) -> None:
        """Count what a profiler transition observed."""
        if o.name == obs.LATENCY:
            self.latency.labels(str(o.tier)).observe(o.value)
        elif o.name == obs.ASSIGNED_OBS:
            self.assignments.inc()
        elif o.name == obs.EVICTED:
            self.evicted.inc()
        elif o.name in MEMBERSHIP:
            self.members.labels(MEMBERSHIP[o.name]).inc()
        elif o.name == "tier_size":
            self.tier_size.labels(str(o.tier)).set(o.value)


def profiler_metrics() -> ProfilerMetrics:
    """A fresh registry with the profiler's metrics."""
    r = CollectorRegistry()
    return ProfilerMetrics(
        transport=transport_metrics(r, "profiler"),
        latency=Histogram(
            "fedat_client_response_seconds",
            "Client response latency, dispatch to arrival",
            ["tier"],
            registry=r,
            buckets=(0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120),
        ),
        assignments=Counter("fedat_tier_assignments_total", "Tier assignments published", registry=r),
        tier_size=Gauge("fedat_tier_clients", "Clients in each tier", ["tier"], registry=r),
        evicted=Counter("fedat_clients_evicted_total", "Clients dropped after too many unanswered rounds", registry=r),
        members=Counter(
            "fedat_client_membership_total",
            "Real clients' joins, leaves, revocations and refused joins (of revoked clients)",
            ["event"],
            registry=r,
        ),
    )
