"""What a service is, seen from the transport: a state value and pure transitions that return effects.

A service never talks to the broker. For each kind of input it names a handler
`(state, input, now, held) -> (state', effects)`; the transport (`fedat.runtime.bus`, or a test's list) delivers the
input,
persists `state'` when it changed, then carries out the effects. Deliveries a service holds unacked (the barrier's
round updates) are connection-scoped: the transport keeps them, and hands them to every handler as `held`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from fedat.protocol.wire import Message

S = TypeVar("S")


class Reject(Exception):
    """Raised by a handler for a message that decodes but must not be processed; it is dead-lettered."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Interrupted(Exception):
    """Raised by a handler when the process is stopping mid-message: the delivery is requeued, not dead-lettered."""


@dataclass(frozen=True)
class Outgoing:
    """A message to publish (persistent, mandatory, confirmed)."""

    exchange: str
    routing_key: str
    message: Message


@dataclass(frozen=True)
class Inbound:
    """A decoded delivery; `tag` identifies it on its connection only, so it never enters a service's state."""

    queue: str
    message: Message
    tag: int
    redelivered: bool
    size: int
    received: float = 0.0  # the service's clock when the delivery came in


@dataclass(frozen=True)
class Held:
    """A delivery held unacked, with what the service noted about it (e.g. decoded weights): connection-scoped."""

    inbound: Inbound
    note: Any = None


@dataclass(frozen=True)
class Observation:
    """Something a transition wants counted (`name` is the service's own vocabulary), per tier where it has one."""

    name: str
    tier: int = 0
    value: float = 1.0


@dataclass(frozen=True)
class Effects:
    """What a transition wants done, in order: publish (confirmed), dead-letter, ack, hold, arm timers, observe.

    Acks and dead letters name delivery tags. A handler that neither acks nor dead-letters the delivery it handles
    holds it (unacked, so the broker keeps it); `hold` attaches a note to it for later handlers. Observations go to
    the process's metrics once the rest is done: pure transitions never touch a metric themselves.
    """

    publish: tuple[Outgoing, ...] = ()
    ack: tuple[int, ...] = ()
    timers: tuple[tuple[float, str], ...] = ()
    dead_letter: tuple[tuple[int, str], ...] = ()
    hold: tuple[tuple[int, Any], ...] = ()
    observe: tuple[Observation, ...] = ()

    def __add__(self, other: Effects) -> Effects:
        """Both effects, this one's first."""
        return Effects(
            self.publish + other.publish,
            self.ack + other.ack,
            self.timers + other.timers,
            self.dead_letter + other.dead_letter,
            self.hold + other.hold,
            self.observe + other.observe,
        )


NOTHING = Effects()


def done(inbound: Inbound, *publish: Outgoing) -> Effects:
    """Publish these, then ack the delivery being handled."""
    return Effects(publish=publish, ack=(inbound.tag,))


Handler = Callable[[S, Inbound, float, Mapping[int, Held]], tuple[S, Effects]]


@dataclass(frozen=True)
class Subscription(Generic[S]):
    """A queue's expected message class and the handler of its deliveries; `more`: the other kinds the same queue
    carries, each with its own handler (a real client's joins and leaves share one queue, so they stay in order)."""

    expects: type
    handler: Handler
    more: tuple[tuple[type, Handler], ...] = ()

    @property
    def kinds(self) -> tuple[type, ...]:
        """Every message class the queue may carry."""
        return (self.expects, *(cls for cls, _ in self.more))

    def handler_for(self, message: Message) -> Handler:
        """The handler of `message`'s kind (one of `kinds`: decoding refused any other)."""
        if type(message) is self.expects:
            return self.handler
        return dict(self.more)[type(message)]


class Service(Protocol[S]):
    """A message-driven service: a state value, one handler per kind of input, timers, and its state's codec."""

    name: str

    def initial(self) -> S:
        """The state of a service that has never run."""
        ...

    def subscriptions(self) -> Mapping[str, Subscription[S]]:
        """Queue name -> what comes on it and which handler takes it."""
        ...

    def on_start(self, state: S, now: float) -> tuple[S, Effects]:
        """Called after every (re)connect, with nothing held: re-arm timers from the state."""
        ...

    def on_timer(self, state: S, key: str, now: float, held: Mapping[int, Held]) -> tuple[S, Effects]:
        """A timer armed through Effects.timers fired."""
        ...


class Reactive(Generic[S]):
    """For services that only react to messages: nothing to re-arm after a reconnect, no timers."""

    def on_start(self, state: S, now: float) -> tuple[S, Effects]:
        """Nothing held, nothing to re-arm."""
        return state, NOTHING

    def on_timer(self, state: S, key: str, now: float, held: Mapping[int, Held]) -> tuple[S, Effects]:
        """No timers."""
        return state, NOTHING
