"""A broker store that writes every checkpoint in as many parts as its head allows.

The simulator's stand-in models are a hundred bytes, so no real message limit splits their checkpoints; this store
sets its limit per checkpoint to the least that still carries the checkpoint's head and its largest array, so a
checkpoint whose arrays do not fit beside its head goes in parts (`fedat.protocol.journal.split`), exactly as a
large model's would in production, with the production `BrokerStore` writing and restoring them.
"""

from __future__ import annotations

from dataclasses import replace

from fedat.protocol import checkpoint, journal
from fedat.protocol.checkpoint import Checkpoint
from fedat.runtime.brokerstore import BrokerStore


def tightest_limit(c: Checkpoint) -> int:
    """The smallest message limit under which `c` can still be written: its head, or one part with its largest array."""
    head = replace(c, models={}, elsewhere=tuple(c.models))
    largest = max((m.nbytes for m in c.models.values()), default=0)
    return max(len(checkpoint.encode(head)), journal.FIXED_BYTES + journal.ITEM_BYTES + largest)


class PartedStore(BrokerStore):
    """`BrokerStore` at the tightest limit for each checkpoint it saves."""

    def save(self, channel, c: Checkpoint) -> None:
        """Save `c` in parts wherever its arrays do not fit beside its head."""
        self.limit = tightest_limit(c)
        super().save(channel, c)
