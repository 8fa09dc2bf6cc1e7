"""Checkpoints on the broker: one zstd frame over the msgpack map, readable back, older plain ones too, bombs
refused, and the stored models a journalled one carries."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import zstandard

from fedat.errors import CheckpointError
from fedat.protocol import checkpoint
from fedat.protocol.checkpoint import Checkpoint, Sent


def outbox(tasks: int, model: bytes) -> tuple[Sent, ...]:
    """A barrier opening a round: the same global model in every task, as the barrier's outbox holds it."""
    return tuple(Sent("fedat.train", "tier-1", "train", f"t1-r1-c{k}-v3", model, (("x-h", "v"),)) for k in range(tasks))


def test_a_checkpoint_reads_back_exactly():
    c = Checkpoint("barrier", 7, 12.5, b"state-bytes", outbox(3, b"m" * 100), {"num_tiers": "5"})
    assert checkpoint.decode(checkpoint.encode(c), "barrier") == c


def test_a_model_repeated_in_every_task_is_stored_about_once():
    model = np.random.default_rng(0).normal(0, 0.05, 93_322).astype(np.float32).tobytes()  # incompressible alone
    c = Checkpoint("barrier", 1, 0.0, b"", outbox(50, model), {})
    data = checkpoint.encode(c)
    assert len(data) < 2 * len(model) < 50 * len(model)  # the window spans the outbox: 50 copies cost about one
    assert checkpoint.decode(data, "barrier") == c


def test_a_checkpoint_saved_before_frames_still_reads():
    body = {"f": 1, "service": "profiler", "seq": 3, "saved_at": 1.0, "state": b"s", "outbox": []}
    old = msgpack.packb(body, use_bin_type=True)
    assert checkpoint.decode(old, "profiler") == Checkpoint("profiler", 3, 1.0, b"s", ())


def test_a_frame_that_claims_too_much_is_refused_before_inflating(monkeypatch):
    data = checkpoint.encode(Checkpoint("aggregator", 1, 0.0, b"x" * 10_000, ()))
    monkeypatch.setattr(checkpoint, "MAX_BYTES", 1_000)  # the frame says 10+ kB: more than allowed
    with pytest.raises(CheckpointError, match="not one this code writes"):
        checkpoint.decode(data, "aggregator")
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(b"y" * 100)
    with pytest.raises(CheckpointError, match="not one this code writes"):
        checkpoint.decode(unsized, "aggregator")


@pytest.mark.parametrize("data", [b"", b"\x28\xb5\x2f\xfd garbage", b"not msgpack at all \xc1"])
def test_damaged_bytes_are_a_checkpoint_error(data):
    with pytest.raises(CheckpointError, match="aggregator"):
        checkpoint.decode(data, "aggregator")


def test_another_services_checkpoint_is_refused():
    data = checkpoint.encode(Checkpoint("barrier", 1, 0.0, b"", ()))
    with pytest.raises(CheckpointError, match="'barrier' found where 'profiler'"):
        checkpoint.decode(data, "profiler")


def test_a_journalled_checkpoint_carries_its_models_and_base_as_format_2():
    from fedat.protocol.modelstore import Stored, digest

    a = np.random.default_rng(1).normal(0, 0.05, (30, 20)).astype(np.float32)
    c = Checkpoint("aggregator", 8, 2.0, b"state", outbox(1, b"g"), {"k": "v"}, {digest(a): Stored.of(digest(a), a)}, 5)
    back = checkpoint.decode(checkpoint.encode(c), "aggregator")
    assert back == c and back.journalled and back.base == 5
    np.testing.assert_array_equal(back.models[digest(a)].array, a)
    assert msgpack.unpackb(zstandard.ZstdDecompressor().decompress(checkpoint.encode(c)))["f"] == 2


def test_a_format_this_code_does_not_write_is_refused_naming_the_formats_it_reads():
    body = {"f": 4, "service": "aggregator", "seq": 1, "saved_at": 0.0, "state": b"", "outbox": []}
    with pytest.raises(CheckpointError, match="checkpoint format 4, this code reads 1, 2 and 3"):
        checkpoint.decode(msgpack.packb(body, use_bin_type=True), "aggregator")


def test_stored_arrays_follow_the_frame_raw_and_a_cut_or_padded_checkpoint_is_refused():
    from fedat.protocol.modelstore import Stored, digest

    a = np.random.default_rng(2).normal(0, 0.05, 5_000).astype(np.float32)
    c = Checkpoint("aggregator", 2, 0.0, b"s", (), {}, {digest(a): Stored.of(digest(a), a)}, 1)
    data = checkpoint.encode(c)
    assert data.endswith(a.tobytes())  # not through the compressor: float noise does not compress
    with pytest.raises(CheckpointError, match="ends before the 20000 bytes of stored model"):
        checkpoint.decode(data[:-1], "aggregator")
    with pytest.raises(CheckpointError, match="1 bytes after the frame that no model claims"):
        checkpoint.decode(data + b"x", "aggregator")
