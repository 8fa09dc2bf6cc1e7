"""A service's checkpoints in a local folder, for a process that has no state queue of its own (a real client).

The same records as `BrokerStore` keeps on the broker (`fedat.protocol.journal`): the latest snapshot in
`<folder>/snapshot`, the journal entries since in `<folder>/journal/<seq>`. Each file is written whole to a temporary
name, flushed to disk and renamed over its place, so a process killed at any moment leaves the previous record or the
new one, never a torn one. The channel the runner passes is not used: the folder is this host's, not the broker's.
"""

from __future__ import annotations

import os
from pathlib import Path

from fedat.errors import ConfigError
from fedat.protocol import checkpoint, journal
from fedat.protocol.checkpoint import Checkpoint

SNAPSHOT = "snapshot"
JOURNAL = "journal"


class FileStore:
    """Checkpoints of `service` in `folder` (created on first use); ConfigError if it cannot be written."""

    def __init__(self, folder: str | os.PathLike, service: str):
        self.folder, self.service = Path(folder), service
        self.where = f"state folder {self.folder}"  # named in a refusal of its checkpoint
        self.groups = False  # a client answers each task as soon as it is trained and saved
        self.written = 0  # bytes of the checkpoints saved through this store
        try:
            (self.folder / JOURNAL).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"state folder {self.folder}: cannot create it ({exc.strerror})") from None
        if not all(os.access(d, os.W_OK) for d in (self.folder, self.folder / JOURNAL)):  # e.g. a read-only mount
            raise ConfigError(f"state folder {self.folder}: cannot write to it")

    def load(self, channel=None) -> Checkpoint | None:
        """The latest checkpoint with every stored array its state refers to; None if none was saved here."""
        restored = self._latest()
        return None if restored is None else restored.checkpoint

    def restore(self, channel=None) -> journal.Restored | None:
        """The latest checkpoint for the process that goes on from it; entries of an older snapshot are dropped."""
        restored = self._latest()
        if restored is not None and restored.stale:
            self.purge()
        return restored

    def save(self, channel, c: Checkpoint) -> None:
        """Write a snapshot (it replaces the last one, then the entries it supersedes go) or a journal entry,
        durably."""
        body = checkpoint.encode(c)
        target = self.folder / SNAPSHOT if c.base is None else self.folder / JOURNAL / f"{c.seq:012d}"
        write_durably(target, body)
        self.written += len(body)
        if c.base is None:
            self.purge()

    def purge(self, channel=None) -> None:
        """Drop the journal's entries (once a snapshot that supersedes them is on disk)."""
        for entry in self._entries():
            entry.unlink(missing_ok=True)

    def _entries(self) -> list[Path]:
        # in sequence order (zero-padded names); a temporary file of a write cut short is not an entry
        return sorted(p for p in (self.folder / JOURNAL).iterdir() if p.name.isdigit())

    def _latest(self) -> journal.Restored | None:
        snapshot = self.folder / SNAPSHOT
        body = snapshot.read_bytes() if snapshot.exists() else None
        return journal.latest(self.service, body, [[p.read_bytes() for p in self._entries()]])  # one journal: no limit


def write_durably(target: Path, body: bytes) -> None:
    """Replace `target` with `body` atomically: a crash leaves the old file or the new one."""
    tmp = target.with_name(f".{target.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself survives a power cut only once its folder is on disk
    finally:
        os.close(fd)
