"""A durable service's checkpoints as a snapshot and a journal: which record the next save writes, and which one is
the latest on restore.

The state queue `fedat.state.<service>` holds the latest *snapshot*: a checkpoint that carries every stored array its
state refers to (`fedat.protocol.modelstore`). The journal queue `fedat.state.<service>.journal` holds the *entries*
written since: each a whole checkpoint (state, outbox) that carries only the arrays no record since the snapshot
carried, and names that snapshot as its `base`. So a transition writes its state once and each model once, when it
first appears, however many models the state holds; the state queue's message is replaced only by a new snapshot,
and the journal is emptied (purged) once the snapshot that supersedes it is confirmed.

A new snapshot is written instead of an entry when there is none yet (a fresh service, or a checkpoint from before
journals), when an entry would not be much smaller than a snapshot (a state that holds no stored array, such as the
barrier's or the profiler's, is always a snapshot, as before), or when the journal would exceed RATIO snapshots'
worth of bytes. Hence a restart reads at most about RATIO + 1 snapshots' worth (restore time stays bounded), and
snapshots add at most about 1/RATIO to the bytes a service writes.

On restore the latest checkpoint is the newest entry that extends the snapshot, or the snapshot itself. Entries of
an older snapshot are what a crash between a snapshot and the purge leaves: they are ignored, and dropped. Each save
is confirmed before the next is written, so the entries of a snapshot run without a gap; a copy of an entry (a
duplicated publish) is the same entry; a gap, two different entries of one number or entries without a snapshot is
a CheckpointError naming it.

A record larger than a message may be (a state that holds many models: ASO-Fed keeps one per client) is written as
*parts* that carry its arrays, then the record itself naming them (`split`). There are two journal queues: a
snapshot's parts go to the one its predecessor's records are not in, and only then does the snapshot replace the
state queue's message. So a crash while the parts are written leaves the old snapshot and its journal whole, and
the new parts are stale records of a snapshot that does not exist. The journal of a snapshot that fits a message
is the first queue, where a release that knows only one finds it. An entry's parts go before it into the
journal it extends; parts whose record was never written only carry arrays (every array is named by its digest, so
a copy is the same array) and are dropped with their journal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from fedat.errors import CheckpointError
from fedat.protocol import checkpoint
from fedat.protocol.checkpoint import Checkpoint
from fedat.protocol.modelstore import Stored

RATIO = 4  # the journal holds at most this many snapshots' worth of bytes
ENTRY_SHARE = 0.75  # a journal entry is worth writing only when it is at most this share of a snapshot
# Bytes a message spends beyond what `size` and `_named` count: a frame's and a map's fixed fields, and msgpack's
# framing of each array's description (digest, dtype, shape, length) or of each outbox message's fields.
FIXED_BYTES = 1024
ITEM_BYTES = 160


def size(c: Checkpoint) -> int:
    """The bytes a checkpoint carries before compression: state, outbox and models."""
    return len(c.state) + sum(len(s.body) for s in c.outbox) + sum(m.nbytes for m in c.models.values())


@dataclass
class Journal:
    """What the broker holds of one service's checkpoints, as its process knows it from its restore and its saves."""

    base: int | None = None  # the snapshot in the state queue (None: none this process can extend)
    held: set[bytes] = field(default_factory=set)  # digests the snapshot and its entries carry
    journal_bytes: int = 0  # bytes of the entries in the journal queue
    snapshot_bytes: int = 0  # bytes of the snapshot (with its parts)

    def record(self, c: Checkpoint, live: Mapping[bytes, np.ndarray]) -> Checkpoint:
        """`c` as the record to save: an entry carrying the arrays new since the snapshot, or a snapshot carrying
        every array the state refers to (`live`)."""
        skeleton = len(c.state) + sum(len(s.body) for s in c.outbox)
        whole = skeleton + sum(a.nbytes for a in live.values())
        new = {d: a for d, a in live.items() if d not in self.held}
        entry = skeleton + sum(a.nbytes for a in new.values())
        if self.base is None or not live or entry > ENTRY_SHARE * whole or self.journal_bytes + entry > RATIO * whole:
            return replace(c, models={d: Stored.of(d, a) for d, a in live.items()}, base=None)
        return replace(c, models={d: Stored.of(d, a) for d, a in new.items()}, base=self.base)

    def saved(self, c: Checkpoint) -> None:
        """Note a record the store confirmed (a snapshot: the store has dropped the entries it supersedes)."""
        if c.base is None:
            self.base, self.held, self.journal_bytes, self.snapshot_bytes = c.seq, set(c.models), 0, size(c)
            return
        self.held.update(c.models)
        self.journal_bytes += size(c)


def _named(c: Checkpoint) -> int:
    # the strings of a checkpoint's map that `size` leaves out: its fingerprint, and each outbox message's addressing
    fingerprint = sum(len(k) + len(v) for k, v in c.fingerprint.items())
    return fingerprint + sum(
        len(s.exchange) + len(s.routing_key) + len(s.kind) + len(s.id) + sum(len(k) + len(v) for k, v in s.headers)
        for s in c.outbox
    )


def split(c: Checkpoint, limit: int) -> tuple[tuple[Checkpoint, ...], Checkpoint]:
    """`c` as messages of at most `limit` bytes: parts that carry its arrays, then `c` naming them (no parts when it
    fits one message); CheckpointError when even its state and outbox, or one array, exceed `limit`."""
    raw = size(c) + _named(c) + ITEM_BYTES * (len(c.models) + len(c.outbox))
    if raw + raw // 256 + FIXED_BYTES <= limit:  # zstd's bound: a frame is at most 1/256 larger than what it holds
        return (), c
    if len(checkpoint.encode(c)) <= limit:
        return (), c
    head = replace(c, models={}, elsewhere=tuple(c.models))
    if (n := len(checkpoint.encode(head))) > limit:
        raise CheckpointError(
            f"{c.service}: checkpoint {c.seq} is {n} bytes without its models, over the {limit}-byte message limit"
        )
    groups: list[dict[bytes, Stored]] = [{}]
    used = FIXED_BYTES
    for d, m in c.models.items():
        cost = m.nbytes + ITEM_BYTES
        if FIXED_BYTES + cost > limit:
            raise CheckpointError(
                f"{c.service}: stored array {d.hex()[:12]} is {m.nbytes} bytes, "
                f"more than one message of at most {limit} bytes may carry"
            )
        if groups[-1] and used + cost > limit:
            groups.append({})
            used = FIXED_BYTES
        groups[-1][d] = m
        used += cost
    generation = c.seq if c.base is None else c.base
    parts = tuple(Checkpoint(c.service, c.seq, c.saved_at, b"", (), {}, g, generation, part=True) for g in groups)
    return parts, head


@dataclass(frozen=True)
class Restored:
    """The latest checkpoint (its `models`: every stored array its state may refer to) and what the broker holds."""

    checkpoint: Checkpoint
    journal: Journal
    side: int  # the journal queue that holds the snapshot's records (the next entries go there)
    stale: tuple[int, ...]  # journal queues that hold only records of older snapshots: drop them


def latest(service: str, snapshot: bytes | None, journals: Sequence[Sequence[bytes]]) -> Restored | None:
    """The latest checkpoint of `service` from its state queue's message and its journal queues'; None if it has
    none."""
    sides = [[(bytes(e), checkpoint.decode(e, service)) for e in side] for side in journals]
    if snapshot is None:
        if n := sum(map(len, sides)):
            raise CheckpointError(f"{service}: journals of {n} records but no snapshot they extend")
        return None
    snap = checkpoint.decode(snapshot, service)
    if snap.base is not None or snap.part:
        raise CheckpointError(f"{service}: the state queue holds a journal record ({snap.seq}), not a snapshot")
    holding = [i for i, records in enumerate(sides) if any(r.base == snap.seq for _, r in records)]
    if len(holding) > 1:
        raise CheckpointError(f"{service}: both journal queues hold records of snapshot {snap.seq}")
    side = holding[0] if holding else 0
    records = sides[side] if holding else []
    by_seq: dict[int, tuple[bytes, Checkpoint]] = {}
    models = dict(snap.models)
    snapshot_bytes = size(snap)
    for data, r in records:
        if r.base != snap.seq:
            continue
        if r.part:  # arrays of a record of this snapshot (or of one a crash cut off: the same arrays by digest)
            models.update(r.models)
            snapshot_bytes += size(r) if r.seq == snap.seq else 0
            continue
        if r.seq in by_seq and by_seq[r.seq][0] != data:
            raise CheckpointError(f"{service}: two different journal entries {r.seq} of snapshot {snap.seq}")
        by_seq[r.seq] = (data, r)  # a second copy of one publish (the network may duplicate it) is the same entry
    mine = [r for _, (_, r) in sorted(by_seq.items())]
    for expected, r in enumerate(mine, start=snap.seq + 1):
        if r.seq != expected:
            raise CheckpointError(
                f"{service}: the journal of snapshot {snap.seq} has entry {r.seq} where {expected} should be"
            )
    for r in mine:
        models.update(r.models)
    for r in (snap, *mine):
        if missing := [d for d in r.elsewhere if d not in models]:
            raise CheckpointError(
                f"{service}: checkpoint {r.seq} keeps {len(r.elsewhere)} arrays in parts, and the journal lacks "
                f"{len(missing)} of them (first {missing[0].hex()[:12]})"
            )
    last = mine[-1] if mine else snap
    # What a live process counts after its saves: its entries (with their parts), and the records of older snapshots
    # on this side, which stay until the next snapshot drops them; not the snapshot's own parts.
    held = sum(size(r) for _, r in records if not (r.part and r.seq == snap.seq)) if mine else 0
    stale = tuple(i for i, records in enumerate(sides) if records and i not in holding)
    book = Journal(snap.seq, set(models), held, snapshot_bytes)
    return Restored(replace(last, models=models, elsewhere=()), book, side, stale)
