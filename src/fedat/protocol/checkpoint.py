"""What a durable service writes before any of its outputs leave: its state, and the outputs of that transition.

A checkpoint is the write-ahead record of one transition: the new state and its outbox (the encoded, signed
messages the transition publishes). The transport saves it (confirmed) before publishing the outbox and before
acking the inputs, so anything another service ever saw, and any input ever acked, is in a saved checkpoint; on
start the transport loads the latest one and publishes its outbox again (same ids: receivers drop the copies).

Each checkpoint also carries the fingerprint of the process that wrote it (`fedat.protocol.fingerprint`): what the
state is only valid for.

A state that holds models refers to their arrays by digest (`fedat.protocol.modelstore`), and a checkpoint carries the
arrays it is the first to hold (`models`): a *snapshot* carries every array its state refers to, a *journal entry*
(`base` = the sequence number of the snapshot it extends) only those that appeared since that snapshot
(`fedat.protocol.journal`). Such a checkpoint is format 2; one that carries no array and extends no snapshot (the
barrier's, the profiler's) is written as format 1, exactly as before models were stored apart.

A record too large for one message is written as *parts* that carry its arrays, then the record itself naming the
arrays its parts carry (`elsewhere`): both are format 3, so code that cannot put them together refuses them by their
format rather than restoring a state whose arrays it lacks.

On the broker a checkpoint is one zstd frame over its msgpack map, with a window that spans the whole of it: a
barrier's outbox holds the same global model once per task, so the frame finds each repeat however far apart (a
barrier's 11.7 MB checkpoint becomes 0.16 MB). The stored arrays of a format-2 checkpoint follow the frame, raw, in
the order the map lists them (digest, dtype, shape, length): trained float weights are noise to a compressor
(zstd saves 5-15 % on them, at several milliseconds per megabyte), and every stored array is distinct. Code that
reads only format 1 inflates the frame alone and refuses the checkpoint by its format. A checkpoint saved
uncompressed, by a release that did not compress, still reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import msgpack
import zstandard

from fedat.errors import CheckpointError  # noqa: F401 (re-exported)
from fedat.protocol.modelstore import Stored

FORMAT = 1  # of the msgpack map inside the frame, for a checkpoint that carries no model and extends no snapshot
JOURNALLED = 2  # a snapshot that carries models, or a journal entry
SPLIT = 3  # a part of a record written as several messages, or such a record
READS = (FORMAT, JOURNALLED, SPLIT)
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
LEVEL = 1  # as small as higher levels on model bytes (the repeats do the work), and the fastest
MAX_WINDOW_LOG = 30  # 1 GiB: beyond any checkpoint a message can carry (the broker's own limit is below)
MAX_BYTES = 1 << 31  # a frame that claims more than this is refused before it is inflated


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
    fingerprint: Mapping[str, str] = field(default_factory=dict)  # empty: written before fingerprints existed
    models: Mapping[bytes, Stored] = field(default_factory=dict)  # the arrays this record carries, by digest
    base: int | None = None  # a journal entry: the snapshot it extends; None: a snapshot
    part: bool = False  # a part: it carries arrays of record `seq` (of snapshot `base`'s journal), nothing else
    elsewhere: tuple[bytes, ...] = ()  # the digests of the arrays this record's parts carry

    @property
    def journalled(self) -> bool:
        """Whether this is written as format 2 or 3 (it carries models or extends a snapshot)."""
        return bool(self.models) or self.base is not None or self.part or bool(self.elsewhere)

    @property
    def split(self) -> bool:
        """Whether this is a part, or a record whose parts carry some of its arrays (format 3)."""
        return self.part or bool(self.elsewhere)


def encode(c: Checkpoint) -> bytes:
    """Checkpoint -> one zstd frame over its msgpack map, then the raw bytes of the arrays it carries."""
    outbox = [[s.exchange, s.routing_key, s.kind, s.id, s.body, [list(h) for h in s.headers]] for s in c.outbox]
    body = {"f": FORMAT, "service": c.service, "seq": c.seq, "saved_at": c.saved_at, "state": c.state, "outbox": outbox}
    if c.fingerprint:
        body["fp"] = dict(c.fingerprint)
    if not c.journalled:
        return frame(msgpack.packb(body, use_bin_type=True))
    body["f"] = SPLIT if c.split else JOURNALLED
    body["base"] = c.base
    if c.split:
        body["part"] = c.part
        body["elsewhere"] = list(c.elsewhere)
    body["models"] = [[m.digest, m.dtype, list(m.shape), m.nbytes] for m in c.models.values()]
    return b"".join([frame(msgpack.packb(body, use_bin_type=True)), *(m.data for m in c.models.values())])


def frame(raw: bytes) -> bytes:
    """One zstd frame over `raw` whose window spans it, with its size in the header."""
    window = min(MAX_WINDOW_LOG, max(zstandard.WINDOWLOG_MIN, (len(raw) - 1).bit_length()))
    params = zstandard.ZstdCompressionParameters.from_level(
        LEVEL, source_size=len(raw), window_log=window, write_content_size=1
    )
    return zstandard.ZstdCompressor(compression_params=params).compress(raw)


def _inflate(data: bytes, service: str) -> tuple[bytes, bytes]:
    """The msgpack bytes inside a checkpoint's frame (or the bytes themselves, saved before frames), and what follows
    the frame (the stored arrays)."""
    if bytes(data[:4]) != ZSTD_MAGIC:
        return data, b""
    size = zstandard.get_frame_parameters(data).content_size
    if size == zstandard.CONTENTSIZE_UNKNOWN or size > MAX_BYTES:
        raise CheckpointError(f"checkpoint of {service}: a frame of {size} bytes is not one this code writes")
    inflater = zstandard.ZstdDecompressor(max_window_size=1 << MAX_WINDOW_LOG).decompressobj()
    raw = inflater.decompress(data)
    if len(raw) != size:
        raise CheckpointError(f"checkpoint of {service}: its frame ends early ({len(raw)} of {size} bytes)")
    return raw, inflater.unused_data


def _models(described, tail: bytes, service: str) -> dict[bytes, Stored]:
    """The stored arrays a map describes, cut from the bytes after the frame (copied once, out of the message)."""
    view, at, out = memoryview(tail), 0, {}
    for d, t, shape, n in described:
        if at + n > len(view):
            raise CheckpointError(f"checkpoint of {service} ends before the {n} bytes of stored model {d.hex()}")
        out[d] = Stored(d, str(t), tuple(int(k) for k in shape), bytes(view[at : at + n]))
        at += n
    if at != len(view):
        raise CheckpointError(f"checkpoint of {service}: {len(view) - at} bytes after the frame that no model claims")
    return out


def decode(data: bytes, service: str) -> Checkpoint:
    """A saved checkpoint (a frame, or plain msgpack from before frames) -> Checkpoint of `service`; CheckpointError
    names what is wrong."""
    try:
        raw, tail = _inflate(data, service)
        b = msgpack.unpackb(raw, raw=False)
        if b["f"] not in READS:
            reads = f"{', '.join(map(str, READS[:-1]))} and {READS[-1]}"
            raise CheckpointError(f"checkpoint format {b['f']!r}, this code reads {reads}")
        if b["service"] != service:
            raise CheckpointError(f"checkpoint of {b['service']!r} found where {service!r} keeps its state")
        outbox = tuple(
            Sent(e, k, kind, i, body, tuple((str(n), str(v)) for n, v in h)) for e, k, kind, i, body, h in b["outbox"]
        )
        fp = {str(k): str(v) for k, v in (b.get("fp") or {}).items()}
        models = _models(b.get("models", ()), tail, service)
        base = None if b.get("base") is None else int(b["base"])
        state = bytes(b["state"])
        part, elsewhere = bool(b.get("part", False)), tuple(bytes(d) for d in b.get("elsewhere", ()))
        seq, saved_at = int(b["seq"]), float(b["saved_at"])
        return Checkpoint(b["service"], seq, saved_at, state, outbox, fp, models, base, part, elsewhere)
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"unreadable checkpoint of {service}: {type(exc).__name__}: {exc}") from None
