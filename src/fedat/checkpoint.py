"""What a durable service writes before any of its outputs leave: its state, and the outputs of that transition.

A checkpoint is the write-ahead record of one transition: the new state and its outbox (the encoded, signed
messages the transition publishes). The transport saves it (confirmed) before publishing the outbox and before
acking the inputs, so anything another service ever saw, and any input ever acked, is in a saved checkpoint; on
start the transport loads the latest one and publishes its outbox again (same ids: receivers drop the copies).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack

FORMAT = 1


class CheckpointError(ValueError):
    """A stored checkpoint that cannot be read; the text says why."""


@dataclass(frozen=True)
class Sent:
    """One encoded message of an outbox, exactly as it goes to the broker."""

    exchange: str
    routing_key: str
    kind: str
    id: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Checkpoint:
    """The latest saved transition of one service: its sequence number, its state bytes and its outbox."""

    service: str
    seq: int
    saved_at: float
    state: bytes
    outbox: tuple[Sent, ...]


def encode(c: Checkpoint) -> bytes:
    """Checkpoint -> msgpack bytes."""
    outbox = [[s.exchange, s.routing_key, s.kind, s.id, s.body, [list(h) for h in s.headers]] for s in c.outbox]
    body = {"f": FORMAT, "service": c.service, "seq": c.seq, "saved_at": c.saved_at, "state": c.state, "outbox": outbox}
    return msgpack.packb(body, use_bin_type=True)


def decode(data: bytes, service: str) -> Checkpoint:
    """msgpack bytes -> Checkpoint of `service`; CheckpointError names what is wrong."""
    try:
        b = msgpack.unpackb(data, raw=False)
        if b["f"] != FORMAT:
            raise CheckpointError(f"checkpoint format {b['f']!r}, this code reads {FORMAT}")
        if b["service"] != service:
            raise CheckpointError(f"checkpoint of {b['service']!r} found where {service!r} keeps its state")
        outbox = tuple(
            Sent(e, k, kind, i, body, tuple((str(n), str(v)) for n, v in h)) for e, k, kind, i, body, h in b["outbox"]
        )
        return Checkpoint(b["service"], int(b["seq"]), float(b["saved_at"]), bytes(b["state"]), outbox)
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"unreadable checkpoint of {service}: {type(exc).__name__}: {exc}") from None
