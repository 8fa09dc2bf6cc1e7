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


def size(c: Checkpoint) -> int:
    """The bytes a checkpoint carries before compression: state, outbox and models."""
    return len(c.state) + sum(len(s.body) for s in c.outbox) + sum(m.nbytes for m in c.models.values())


@dataclass
class Journal:
    """What the broker holds of one service's checkpoints, as its process knows it from its restore and its saves."""

    base: int | None = None  # the snapshot in the state queue (None: none this process can extend)
    held: set[bytes] = field(default_factory=set)  # digests the snapshot and its entries carry
    journal_bytes: int = 0  # bytes of the entries in the journal queue

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

    def saved(self, c: Checkpoint) -> bool:
        """Note a record the broker confirmed; True when it is a snapshot and the journal has entries to drop."""
        if c.base is None:
            drop = self.journal_bytes > 0
            self.base, self.held, self.journal_bytes = c.seq, set(c.models), 0
            return drop
        self.held.update(c.models)
        self.journal_bytes += size(c)
        return False


@dataclass(frozen=True)
class Restored:
    """The latest checkpoint (its `models`: every stored array its state may refer to) and what the broker holds."""

    checkpoint: Checkpoint
    journal: Journal
    stale: bool  # the journal holds only entries of an older snapshot: drop them


def latest(service: str, snapshot: bytes | None, entries: Sequence[bytes]) -> Restored | None:
    """The latest checkpoint of `service` from its state queue's message and its journal's; None if it has none."""
    records = [checkpoint.decode(e, service) for e in entries]
    if snapshot is None:
        if records:
            raise CheckpointError(f"{service}: a journal of {len(records)} entries but no snapshot they extend")
        return None
    snap = checkpoint.decode(snapshot, service)
    if snap.base is not None:
        raise CheckpointError(f"{service}: the state queue holds a journal entry ({snap.seq}), not a snapshot")
    by_seq: dict[int, tuple[bytes, Checkpoint]] = {}
    for data, r in zip(entries, records, strict=True):
        if r.base != snap.seq:
            continue
        if r.seq in by_seq and bytes(by_seq[r.seq][0]) != bytes(data):
            raise CheckpointError(f"{service}: two different journal entries {r.seq} of snapshot {snap.seq}")
        by_seq[r.seq] = (data, r)  # a second copy of one publish (the network may duplicate it) is the same entry
    mine = [r for _, (_, r) in sorted(by_seq.items())]
    for expected, r in enumerate(mine, start=snap.seq + 1):
        if r.seq != expected:
            raise CheckpointError(
                f"{service}: the journal of snapshot {snap.seq} has entry {r.seq} where {expected} should be"
            )
    models = dict(snap.models)
    for r in mine:
        models.update(r.models)
    last = mine[-1] if mine else snap
    stale = sum(1 for r in records if r.base != snap.seq)
    held = sum(size(r) for r in records) if mine else 0  # stale entries stay until the next snapshot drops them
    return Restored(replace(last, models=models), Journal(snap.seq, set(models), held), stale > 0 and not mine)
