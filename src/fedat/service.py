"""What a service is, seen from the transport: it consumes messages and timer ticks, and returns effects.

Services are plain objects with no broker code; `fedat.bus` runs them against RabbitMQ and the tests can run
them against lists. Held deliveries (acked later, e.g. the barrier's round) are referred to by delivery tag.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from fedat.wire import Message


class Reject(Exception):
    """Raised by a handler for a message that decodes but must not be processed; it is dead-lettered."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Outgoing:
    """A message to publish (persistent, mandatory, confirmed)."""

    exchange: str
    routing_key: str
    message: Message


@dataclass(frozen=True)
class Inbound:
    """A decoded delivery."""

    queue: str
    message: Message
    tag: int
    redelivered: bool
    size: int


@dataclass(frozen=True)
class Effects:
    """What a handler wants done, in order: publish (confirmed), dead-letter, ack, then arm timers.

    Acks are explicit delivery tags: a handler that returns without the current tag holds that delivery
    (unacked, so the broker keeps it) until a later effect acks or dead-letters it.
    """

    publish: tuple[Outgoing, ...] = ()
    ack: tuple[int, ...] = ()
    timers: tuple[tuple[float, str], ...] = ()
    dead_letter: tuple[tuple[int, str], ...] = ()

    def __add__(self, other: Effects) -> Effects:
        """Both effects, this one's first."""
        return Effects(
            self.publish + other.publish,
            self.ack + other.ack,
            self.timers + other.timers,
            self.dead_letter + other.dead_letter,
        )


def done(inbound: Inbound, *publish: Outgoing) -> Effects:
    """Publish these, then ack the delivery being handled."""
    return Effects(publish=publish, ack=(inbound.tag,))


NOTHING = Effects()


class Service(Protocol):
    """A message-driven service: one verb per kind of input."""

    name: str

    def subscriptions(self) -> dict[str, type]:
        """Queue name -> the message class expected on it."""
        ...

    def on_start(self, now: float) -> Effects:
        """Called after every (re)connect: forget held deliveries (the broker redelivers them), re-arm timers."""
        ...

    def handle(self, inbound: Inbound, now: float) -> Effects:
        """Process one decoded message."""
        ...

    def on_timer(self, key: str, now: float) -> Effects:
        """A timer armed through Effects.timers fired."""
        ...


class Reactive:
    """For services that only react to messages: nothing to re-arm after a reconnect, no timers."""

    def on_start(self, now: float) -> Effects:
        """Nothing held, nothing to re-arm."""
        return NOTHING

    def on_timer(self, key: str, now: float) -> Effects:
        """No timers."""
        return NOTHING
