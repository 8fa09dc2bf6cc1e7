"""A discrete-event virtual clock: a heap of (time, tie, seq, event), run in order; the wall clock is never read.

Everything that happens in a simulation is an event at a virtual time: a delivery, a timer a service armed through
`Effects.timers`, a client's update becoming visible at its `not_before`, a fault. Events at the same time run in an
order fixed by the seed (`tie`, drawn from a seeded generator when one is given, else 0) and then by scheduling order
(`seq`), so a run is a pure function of its inputs and its seed.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

# Virtual time starts here rather than at 0: `run_started_at == 0` means "unknown" on the wire (no drop-outs), and
# a start far from 0 keeps every modelled time positive, as Unix times are.
ORIGIN = 1_000_000.0
# Events at one virtual instant before the clock calls it a livelock: a model in which something answers in zero
# time (time_scale 0, a zero-delay group with no training time) would otherwise loop forever without time passing.
MAX_EVENTS_AT_ONE_INSTANT = 1_000_000


class Livelock(RuntimeError):
    """Too many events at one virtual instant: time no longer advances."""


@dataclass(eq=False)
class Event:
    """One scheduled action; `cancel()` makes it a no-op (a timer lost with its connection)."""

    time: float
    label: str
    action: Callable[[], None] = field(repr=False)
    cancelled: bool = False

    def cancel(self) -> None:
        """Do not run this event."""
        self.cancelled = True


class Clock:
    """Virtual time and the events still to come; calling the clock returns the current virtual time."""

    def __init__(self, start: float = ORIGIN, rng: random.Random | None = None):
        self._now = float(start)
        self._rng = rng
        self._heap: list[tuple[float, float, int, Event]] = []
        self._seq = 0
        self.events_run = 0
        self._same_instant = 0

    def __call__(self) -> float:
        """The current virtual time (a drop-in for `time.time` wherever a service takes a clock)."""
        return self._now

    @property
    def now(self) -> float:
        """The current virtual time."""
        return self._now

    def at(self, when: float, action: Callable[[], None], label: str = "") -> Event:
        """Run `action` at virtual time `when` (never earlier than now: time does not go back)."""
        event = Event(max(float(when), self._now), label, action)
        tie = self._rng.random() if self._rng is not None else 0.0
        self._seq += 1
        heapq.heappush(self._heap, (event.time, tie, self._seq, event))
        return event

    def after(self, delay: float, action: Callable[[], None], label: str = "") -> Event:
        """Run `action` `delay` virtual seconds from now."""
        return self.at(self._now + max(0.0, delay), action, label)

    def next_time(self) -> float | None:
        """When the next live event is due, or None if nothing is scheduled."""
        while self._heap and self._heap[0][3].cancelled:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def step(self) -> Event | None:
        """Advance to the next live event and run it; None when nothing is scheduled."""
        if self.next_time() is None:
            return None
        when, _, _, event = heapq.heappop(self._heap)
        self._same_instant = self._same_instant + 1 if when == self._now else 0
        if self._same_instant > MAX_EVENTS_AT_ONE_INSTANT:
            raise Livelock(
                f"more than {MAX_EVENTS_AT_ONE_INSTANT:,} events at virtual time {when:.3f} (last: {event.label!r}): "
                "something answers in zero modelled time (a time_scale of 0, or no training time and no delay)"
            )
        self._now = when
        self.events_run += 1
        event.action()
        return event

    def run(self, until: float, after_each: Callable[[Event], None] | None = None) -> int:
        """Run every event due up to `until`, then stand at `until`; returns how many ran."""
        ran = 0
        while True:
            due = self.next_time()
            if due is None or due > until:
                break
            event = self.step()
            ran += 1
            if after_each is not None and event is not None:
                after_each(event)
        self._now = max(self._now, until)
        return ran
