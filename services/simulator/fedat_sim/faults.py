"""Faults drawn from one seed: duplicated, delayed and reordered messages, dropped connections, crashes.

Every decision comes from one `random.Random(seed)` consulted in event order, so a seed replays exactly. The
network faults enter through the broker's hooks: a publish may be routed twice (what a re-sent outbox or a
publisher retry does), and a delivery may reach its channel late (deliveries of one channel stay in order, as on
one TCP stream; across queues and publishers they interleave differently, and same-time events are shuffled by the
clock's seeded tie-breaking). Process faults are scheduled as clock events: a connection drop (held deliveries go
back with `redelivered`, timers are lost, the shell reconnects and restores) or a crash (the in-memory state is lost
too; the process restarts from its checkpoint). Most of them land *inside* a transition — at the k-th next publish,
ack or nack, before or after it acts — which is where write-ahead checkpointing earns its keep.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pika
import pika.exceptions as pe

from fedat_sim.clock import Clock
from fedat_sim.shell import Process, ProcessKilled


@dataclass(frozen=True)
class FaultPlan:
    """How often each fault happens."""

    duplicate: float = 0.03  # probability that a publish is routed twice
    delay: float = 0.2  # probability that a delivery is held back ...
    max_delay: float = 2.0  # ... by up to this many virtual seconds
    drops_per_minute: float = 0.3  # connection drops per process and virtual minute
    crashes_per_minute: float = 0.2  # crashes per process and virtual minute
    in_transition: float = 0.7  # share of drops and crashes that land inside a transition
    restart: tuple[float, float] = (0.5, 5.0)  # virtual seconds until a crashed process is back


QUIET = FaultPlan(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


class Injector:
    """The broker's hooks (network faults) and the schedule of process faults, all from one seeded generator."""

    def __init__(self, plan: FaultPlan, rng: random.Random, clock: Clock):
        self.plan, self.rng, self.clock = plan, rng, clock
        self.active = True
        self.log: list[str] = []

    # --- network (fedat_sim.memory.Hooks) ---------------------------------------------------------------------
    def copies(self, exchange: str, routing_key: str, properties: pika.BasicProperties) -> int:
        """Route twice with probability `duplicate`."""
        if self.active and self.plan.duplicate and self.rng.random() < self.plan.duplicate:
            self.log.append(f"{self.clock.now:.3f} duplicate {properties.message_id}")
            return 2
        return 1

    def delivery_delay(self, queue: str, connection: str) -> float:
        """Hold a delivery back with probability `delay`."""
        if self.active and self.plan.delay and self.rng.random() < self.plan.delay:
            return self.rng.uniform(0.0, self.plan.max_delay)
        return 0.0

    # --- processes ----------------------------------------------------------------------------------------------
    def arm(self, processes: dict[str, Process], start: float, until: float) -> None:
        """Schedule drops and crashes of these processes between `start` and `until` (Poisson arrivals)."""
        for name, p in processes.items():
            for kind, per_minute in (("drop", self.plan.drops_per_minute), ("crash", self.plan.crashes_per_minute)):
                if per_minute <= 0:
                    continue
                t = start
                while True:
                    t += self.rng.expovariate(per_minute / 60.0)
                    if t >= until:
                        break
                    self.clock.at(t, lambda p=p, kind=kind: self._strike(p, kind), f"{kind} {name}")

    def _strike(self, p: Process, kind: str) -> None:
        if not self.active or p.conn is None or not p.conn.is_open:
            return
        restart = self.rng.uniform(*self.plan.restart)
        exc: BaseException = (
            ProcessKilled(restart) if kind == "crash" else pe.StreamLostError("connection reset (injected)")
        )
        if self.rng.random() < self.plan.in_transition:
            ops, after = self.rng.randint(1, 4), self.rng.random() < 0.5
            p.conn.sabotage(ops, exc, after)
            self.log.append(f"{self.clock.now:.3f} {kind} {p.name} at its op {ops} ({'after' if after else 'before'})")
        elif kind == "crash":
            self.log.append(f"{self.clock.now:.3f} crash {p.name} between transitions")
            p.kill(restart)
        else:
            self.log.append(f"{self.clock.now:.3f} drop {p.name} between transitions")
            p.drop()

    def stop(self, processes: dict[str, Process]) -> None:
        """No more faults; a sabotage still pending on an open connection is disarmed."""
        self.active = False
        for p in processes.values():
            if p.conn is not None:
                p.conn.disarm()
