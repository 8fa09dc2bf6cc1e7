"""A durable service's checkpoints on the broker: its snapshot queue and two journal queues
(`fedat.protocol.journal`), behind the `Store` protocol a client's folder (`fedat.runtime.filestore`) also meets."""

from __future__ import annotations

from typing import Protocol

from fedat.protocol import checkpoint, journal, topology, wire
from fedat.protocol.checkpoint import Checkpoint
from fedat.runtime.publishing import properties

PART_ID = "-part"  # a checkpoint part's message id: `<service>-<seq>-part<i>`


class Store(Protocol):
    """Where a durable service's checkpoints live: the broker (`BrokerStore`) or a folder (`filestore.FileStore`)."""

    where: str  # named in a refusal of its checkpoint
    groups: bool  # whether transitions are worth committing together behind one write
    written: int  # bytes of the checkpoints saved through it

    def restore(self, channel) -> journal.Restored | None: ...

    def save(self, channel, c: Checkpoint) -> None:
        """Write `c` durably; a snapshot then drops the records it supersedes."""


class BrokerStore:
    """A service's checkpoints on the broker: the latest snapshot in its single-message quorum queue
    `fedat.state.<service>`, the records since in one of its two journal queues `fedat.state.<service>.journal[-2]`
    (`fedat.protocol.journal`). A record larger than `limit` bytes goes as parts; a snapshot's parts go to the journal
    queue its predecessor's records are not in, which then holds the new snapshot's records; the records of a
    snapshot that fits a message go to the first."""

    def __init__(self, service: str, limit: int = wire.MAX_MESSAGE_BYTES):
        self.service = service
        self.limit = limit
        self.queue = topology.state_queue(service)
        self.journals = tuple(topology.journal_queue(service, side) for side in topology.JOURNAL_SIDES)
        self.where = self.queue  # named in a refusal of its checkpoint
        self.groups = True  # a confirmed write is worth sharing among the transitions of one dispatch
        self.written = 0  # bytes of the checkpoints saved through this store
        self.side = 0  # the journal queue of the latest snapshot's records
        self.superseded = 0  # the journal queue of the records the latest snapshot supersedes
        self.holding = [False] * len(self.journals)  # which journal queues hold records, as of the last read

    def load(self, channel) -> Checkpoint | None:
        """The latest checkpoint, with every stored array its state refers to; None if the service never saved one.
        Every queue keeps everything it holds."""
        restored = self._latest(channel)
        return None if restored is None else restored.checkpoint

    def restore(self, channel) -> journal.Restored | None:
        """The latest checkpoint and what the broker holds of the service's checkpoints, for the process that goes on
        from it: records of an older snapshot (a crash between a snapshot and the purge) are dropped."""
        restored = self._latest(channel)
        if restored is not None:
            self.side = self.superseded = restored.side
            for side in restored.stale:
                self._purge(channel, side)
        return restored

    def _latest(self, channel) -> journal.Restored | None:
        snapshot = self._read(channel, self.queue)
        journals = [self._read(channel, q) for q in self.journals]
        self.holding = [bool(records) for records in journals]
        return journal.latest(self.service, snapshot[0] if snapshot else None, journals)

    @staticmethod
    def _read(channel, queue: str) -> list[bytes]:
        """Every message of `queue`, left in it: got one by one, held, then all given back."""
        got = []
        while True:
            method, _, body = channel.basic_get(queue, auto_ack=False)
            if method is None:
                break
            got.append((method.delivery_tag, body))
        for tag, _ in reversed(got):  # it is the state, not a task; in reverse, so a queue that requeues at its
            channel.basic_nack(delivery_tag=tag, requeue=True)  # head keeps its order
        return [body for _, body in got]

    def save(self, channel, c: Checkpoint) -> None:
        """Write a snapshot (it replaces the state queue's message) or a journal entry, confirmed, its parts first;
        a snapshot then drops the records it supersedes."""
        parts, record = journal.split(c, self.limit)
        if c.base is None:
            # A snapshot in parts moves to the other journal queue, so that the old snapshot's records stay whole
            # until it is replaced; one that fits a message keeps its journal in the first, where a release that
            # knows one journal queue finds it.
            self.superseded, self.side = self.side, (1 - self.side) if parts else 0
            if self.side != self.superseded:
                self._purge(channel, self.side)  # it holds only records of older snapshots
        for i, part in enumerate(parts):
            self._publish(channel, part, topology.journal_key(self.service, self.side), f"{PART_ID}{i}")
        self.holding[self.side] |= bool(parts) or c.base is not None
        key = self.service if c.base is None else topology.journal_key(self.service, self.side)
        self._publish(channel, record, key)
        if c.base is None:
            self._purge(channel, self.superseded)

    def _publish(self, channel, c: Checkpoint, key: str, suffix: str = "") -> None:
        body = checkpoint.encode(c)
        channel.basic_publish(
            exchange=topology.STATE,
            routing_key=key,
            body=body,
            properties=properties("checkpoint", f"{self.service}-{c.seq}{suffix}"),
            mandatory=True,
        )
        self.written += len(body)

    def _purge(self, channel, side: int) -> None:
        if self.holding[side]:
            channel.queue_purge(self.journals[side])
            self.holding[side] = False
