"""The tiering module: profiles every client's response latency, assigns tiers, re-tiers on drift.

Latency is measured the same way for the profiling pass and for every completed task: from the task's dispatch
to the update's arrival, where an update counts as arriving at max(received, not_before). Profiling answers come
as (model-less) updates; round latencies come from the barrier's small round reports, including the reports the
barrier sends for answers that came after their round closed. A client missing from a round only counts a miss:
its real latency arrives with its late answer, and a client that never answers is dropped after `max_misses`.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedat import topology
from fedat.service import Effects, Inbound, Outgoing, Reject, done
from fedat.tiering import Tiers, assign_tiers, ewma, moved_clients
from fedat.wire import RoundReport, TierAssignment, TrainTask, Update


@dataclass(frozen=True)
class ProfilerConfig:
    """Profiling pass and re-tiering settings."""

    num_clients: int = 100
    num_tiers: int = 5
    tier_sizes: tuple[float, ...] = ()  # relative tier sizes, fastest first (e.g. 50,50,100,100,200); () = equal
    profile_epochs: int = 1
    batch_size: int = 10
    learning_rate: float = 1e-3
    concurrency: int = 32
    profile_deadline: float = 300.0
    retier_every: int = 50
    drift_fraction: float = 0.1
    ewma_alpha: float = 0.3
    max_misses: int = 3  # consecutive unanswered rounds before a client is dropped from the tiers (0: never)
    codec: str = "polyline"
    precision: int = 4


class Profiler:
    """Latency bookkeeping and tier assignment."""

    name = "profiler"

    def __init__(self, cfg: ProfilerConfig, metrics=None):
        self.cfg, self.metrics = cfg, metrics
        self.latency: dict[int, float] = {}
        self.queue = list(range(cfg.num_clients))  # clients still to profile
        self.outstanding: set[int] = set()
        self.started = False
        self.deadline = 0.0
        self.epoch = 0
        self.tiers: Tiers | None = None
        self.samples_since = 0
        self.misses: dict[int, int] = {}  # consecutive rounds each client was asked and did not answer

    def subscriptions(self) -> dict[str, type]:
        """Every client update (profiling answers and round answers)."""
        return {topology.PROFILER_RESULTS: Update, topology.PROFILER_REPORTS: RoundReport}

    def on_start(self, now: float) -> Effects:
        """Start the profiling pass once; after a reconnect only re-arm its deadline (published tasks are durable)."""
        if not self.started:
            self.started, self.deadline = True, now + self.cfg.profile_deadline
            return self._dispatch(now) + Effects(timers=((self.cfg.profile_deadline, "profile-deadline"),))
        if self.tiers is None:
            return Effects(timers=((max(0.0, self.deadline - now), "profile-deadline"),))
        return Effects()

    def on_timer(self, key: str, now: float) -> Effects:
        """The profiling deadline: assign tiers among the clients that answered."""
        if key == "profile-deadline" and self.tiers is None:
            return self._assign(now)
        return Effects()

    def handle(self, inbound: Inbound, now: float) -> Effects:
        """A profiling answer, or a round report with many latency samples."""
        msg = inbound.message
        if isinstance(msg, RoundReport):
            return done(inbound) + self._on_report(msg, now)
        if msg.tier != 0:
            raise Reject(f"update {msg.id}: the profiler only takes profiling answers (tier 0), got tier {msg.tier}")
        self.latency[msg.client] = max(now, msg.not_before) - msg.dispatched_at
        self.outstanding.discard(msg.client)
        effects = done(inbound) + self._dispatch(now)
        if self.tiers is None and not self.queue and not self.outstanding:
            effects = effects + self._assign(now)
        return effects

    def _on_report(self, report: RoundReport, now: float) -> Effects:
        samples = dict(report.latencies)
        for c in report.latencies:
            self.misses.pop(c, None)
        evicted = []
        for c in report.missing:  # no answer yet: its latency comes with the late answer, if one ever comes
            self.misses[c] = self.misses.get(c, 0) + 1
            if self.cfg.max_misses and self.misses[c] >= self.cfg.max_misses and c in self.latency:
                evicted.append(c)  # gone for good (the paper's unstable clients): stop asking it
        for c in evicted:
            del self.latency[c]
            if self.metrics:
                self.metrics.evicted.inc()
        for client, sample in samples.items():
            self.latency[client] = ewma(self.latency.get(client), sample, self.cfg.ewma_alpha)
            if self.metrics:
                self.metrics.latency.labels(str(report.tier)).observe(sample)
        self.samples_since += len(samples)
        if self.tiers is not None and evicted and len(self.latency) >= self.cfg.num_tiers:
            self.samples_since = 0
            return self._publish(self._tiers(), now)
        if self.tiers is not None and self.samples_since >= self.cfg.retier_every:
            self.samples_since = 0
            return self._retier(now)
        return Effects()

    def _dispatch(self, now: float) -> Effects:
        tasks = []
        while self.queue and len(self.outstanding) < self.cfg.concurrency:
            client = self.queue.pop(0)
            self.outstanding.add(client)
            task = TrainTask(
                id=f"p-c{client}",
                client=client,
                tier=0,
                round=0,
                version=0,
                epochs=self.cfg.profile_epochs,
                batch_size=self.cfg.batch_size,
                learning_rate=self.cfg.learning_rate,
                prox_lambda=0.0,
                codec=self.cfg.codec,
                precision=self.cfg.precision,
                sent_at=now,
                layers=(),
            )
            tasks.append(Outgoing(topology.TRAIN, topology.PROFILE_KEY, task))
        return Effects(publish=tuple(tasks))

    def _assign(self, now: float) -> Effects:
        if len(self.latency) < self.cfg.num_tiers:
            self.deadline = now + self.cfg.profile_deadline
            return Effects(timers=((self.cfg.profile_deadline, "profile-deadline"),))
        self.queue.clear()
        self.outstanding.clear()
        return self._publish(self._tiers(), now)

    def _retier(self, now: float) -> Effects:
        new = self._tiers()
        moved = moved_clients(self.tiers, new)
        if len(moved) < self.cfg.drift_fraction * len(self.latency):
            return Effects()
        return self._publish(new, now)

    def _tiers(self) -> Tiers:
        return assign_tiers(self.latency, self.cfg.num_tiers, self.cfg.tier_sizes)

    def _publish(self, tiers: Tiers, now: float) -> Effects:
        self.epoch += 1
        self.tiers = tiers
        if self.metrics:
            self.metrics.assignments.inc()
            for m, group in enumerate(tiers, start=1):
                self.metrics.tier_size.labels(str(m)).set(len(group))
        msg = TierAssignment(
            id=f"a{self.epoch}", epoch=self.epoch, tiers=tiers, latencies=dict(self.latency), created_at=now
        )
        return Effects(publish=(Outgoing(topology.CONTROL, "", msg),))
