"""A calibrated run keeps to its latency model: when its workers fall behind it in the first part of the budget (other
work on the machine took their cores after the probe), the workers are restarted one at a time with a larger time
scale (`fedat.lab.plan.slower_time_scale`), and the change is reported.

The workers are stateless: a task a stopped worker held goes back to its queue and is trained by the other worker
or by the restarted one, which times it with the new scale. Every modelled latency grows alike, so the tiers keep
their order; the barrier's deadlines (a multiple of the slowest expected latency) and the profiler's averages follow
within a few rounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fedat.deploy.supervisor import Supervisor, reports_connected
from fedat.lab import plan
from fedat.lab.plan import clock
from fedat.lab.progress import late_share
from fedat.lab.utilisation import Sample

CHANGE_UNTIL = 0.6  # the workers run with a new scale by this share of the budget, or it is not changed: too little of
# the run would follow it (and the workers' utilisation, measured from the change on, would cover seconds)
MAX_CHANGES = 2
RECONNECT_SECONDS = 180.0  # a worker restarting (TensorFlow's start) on a busy machine


@dataclass
class Pace:
    """The run's time scale, and how far its workers kept up since it was last changed."""

    time_scale: float
    budget: float
    probe_share: float | None  # CPU seconds per wall second of training at the probe
    late: int = 0  # the run's late and total updates when the scale was last changed
    updates: int = 0
    since: Sample | None = None  # the workers' CPU and training seconds then (or at the first global version)
    restart_seconds: float = 0.0  # how long restarting the workers takes: their launch, then the last restart
    changes: list[dict] = field(default_factory=list)

    def due(self, elapsed: float, late: int, updates: int, now: Sample | None) -> tuple[float, str] | None:
        """(the new time scale, why) if the workers fell behind and the run may still change its scale."""
        if len(self.changes) >= MAX_CHANGES or not plan.EARLY_SHARE <= elapsed / self.budget:
            return None
        if elapsed + self.restart_seconds > CHANGE_UNTIL * self.budget:
            return None
        run_share = cpu_per_training_second(self.since, now)
        new = plan.slower_time_scale(
            self.time_scale, late - self.late, updates - self.updates, self.probe_share, run_share
        )
        if new is None:
            return None
        got = f"{run_share:.2f}" if run_share else "?"
        probed = f"{self.probe_share:.2f}" if self.probe_share else "?"
        why = (
            f"{late_share(late - self.late, updates - self.updates)} of the updates since "
            f"{clock(self.changes[-1]['at_seconds']) if self.changes else 'the start'} were late "
            f"(limit {plan.LATE_LIMIT:.0%}); a training got {got} of a core per second, {probed} at the probe"
        )
        return new, why


def cpu_per_training_second(start: Sample | None, end: Sample | None) -> float | None:
    """CPU seconds the workers got per second they spent training between two samples (None: unknown)."""
    if start is None or end is None:
        return None
    cpu = train = 0.0
    for name, c in end.cpu.items():
        c0, t0, t1 = start.cpu.get(name), start.train.get(name), end.train.get(name)
        if c is None or c0 is None or t0 is None or t1 is None:
            continue
        cpu, train = cpu + c - c0, train + t1 - t0
    return cpu / train if train > 1.0 else None  # a second of training at least, or the share is noise


def restart_workers(sup: Supervisor, ports: dict[str, int], names: list[str], time_scale: float) -> None:
    """Restart the workers one at a time with `time_scale`, each waiting until the one before has reconnected."""
    for name in names:
        sup.procs[name].env["FEDAT_TIME_SCALE"] = f"{time_scale:g}"
        sup.stop([name])
        sup.restart(name)
        sup.wait_until(lambda n=name: reports_connected(ports[n]), RECONNECT_SECONDS, f"{name} to reconnect")
