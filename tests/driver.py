"""Runs one service in memory the way the transport does: its state, its held deliveries, its checkpoints, crashes.

Every state change is encoded with the service's state codec and kept as the "saved" checkpoint, so each test also
proves the state persists; `crash()` throws away the held deliveries and the in-memory state and restores the
saved one, as a SIGKILLed process restarted by Kubernetes would.
"""

from __future__ import annotations

from fedat.protocol.service import Effects, Held, Inbound


class Driver:
    """A service with its state and held deliveries; feed it messages and timers, crash it, restart it."""

    def __init__(self, service):
        self.service = service
        self.codec = getattr(service, "codec", None)
        self.state = service.initial()
        self.saved = self.codec.encode(self.state) if self.codec else None
        self.held: dict[int, Held] = {}
        self.tag = 0

    def start(self, now: float = 0.0) -> Effects:
        """What a (re)connect does: on_start with nothing held."""
        state, fx = self.service.on_start(self.state, now)
        self._apply(state, fx)
        return fx

    def deliver(self, queue: str, msg, now: float = 0.0, redelivered: bool = False) -> Effects:
        """One delivery from `queue`; Reject propagates, as the transport would dead-letter it."""
        self.tag += 1
        inbound = Inbound(queue, msg, self.tag, redelivered, 0, now)
        handler = self.service.subscriptions()[queue].handler_for(msg)
        state, fx = handler(self.state, inbound, now, dict(self.held))
        self._apply(state, fx, inbound)
        return fx

    def timer(self, key: str, now: float) -> Effects:
        """A timer fires."""
        state, fx = self.service.on_timer(self.state, key, now, dict(self.held))
        self._apply(state, fx)
        return fx

    def crash(self) -> list[Inbound]:
        """Lose the process: the held deliveries go back to the broker (returned here), the saved state comes back."""
        lost = [h.inbound for h in self.held.values()]
        self.held = {}
        if self.codec:
            self.state = self.codec.decode(self.saved)
        return lost

    def _apply(self, state, fx: Effects, inbound: Inbound | None = None) -> None:
        if self.codec and state is not self.state:
            self.saved = self.codec.encode(state)
        self.state = state
        for tag in (*fx.ack, *(t for t, _ in fx.dead_letter)):
            self.held.pop(tag, None)
        settled = set(fx.ack) | {t for t, _ in fx.dead_letter}
        notes = dict(fx.hold)
        if inbound is not None and inbound.tag not in settled:
            self.held[inbound.tag] = Held(inbound, notes.get(inbound.tag))
