"""Checkpoints in a local folder (a real client's state): the same snapshot and journal as on the broker, each file
replaced whole, and a process restored from the folder goes on from the state it saved."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from fedat.errors import CheckpointError, ConfigError
from fedat.fl.strategies import build_strategy
from fedat.protocol import checkpoint, wire
from fedat.protocol.service import Inbound
from fedat.runtime import bus
from fedat.runtime.filestore import JOURNAL, SNAPSHOT, FileStore
from fedat.runtime.metrics import transport_metrics
from fedat_aggregator.aggregator import Aggregator, AggregatorConfig

from .test_journal import NAMES, SHAPES, _same


def runner(service, folder, fp=None) -> bus.Runner:
    """A process of `service` whose checkpoints (valid for `fp`) live in `folder`, restored from it."""
    metrics = transport_metrics(CollectorRegistry(), service.name)
    store = FileStore(folder, service.name)
    r = bus.Runner(service, bus.BrokerConfig(), metrics, lambda: 0.0, True, fingerprint=fp, store=store)
    r.restore(None)  # the outboxes below are empty: a restore has nothing to publish again
    return r


def fedbuff() -> Aggregator:
    return Aggregator(AggregatorConfig(num_tiers=1, codec="raw"), build_strategy("fedbuff", buffer_size=2, history=8))


def arrivals(r: bus.Runner, n: int, seed: int = 0) -> list[int]:
    """`n` tier models through the runner's save (outputs left out); the journal's entry count after each."""
    rng = np.random.default_rng(seed)
    w0 = [rng.normal(0, 0.05, s).astype(np.float32) for s in SHAPES]
    counts = []
    for k in range(n):
        if r.state.version == 0 and not r.state.history:
            msg, handler = wire.seed_model(w0, NAMES, 1, "raw", 4, 0.0), r.service.on_global
        else:
            weights = [(w + rng.normal(0, 0.01, w.shape)).astype(np.float32) for w in w0]
            layers = wire.encode_model(weights, NAMES, "raw")
            msg = wire.TierModel(f"tm1-r{k}", 1, k, max(0, r.state.version - 1), 10, (k,), 0, 0, 0, 0.0, layers)
            handler = r.service.on_tier_model
        state, _ = handler(r.state, Inbound("q", msg, 0, False, 0, 0.0), 0.0, {})
        r.save(None, state, ())
        r.state = state
        counts.append(len(list((r.store.folder / JOURNAL).iterdir())))
    return counts


def test_a_process_restored_from_its_folder_goes_on_from_the_state_it_saved(tmp_path):
    first = runner(fedbuff(), tmp_path)
    assert first.seq == 0  # an empty folder: a fresh start
    counts = arrivals(first, 80)
    assert max(counts) > 1 and 0 in counts[1:]  # journalled, and purged by the snapshots between
    again = runner(fedbuff(), tmp_path)
    assert again.seq == first.seq and _same(again.state, first.state)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_a_write_cut_short_and_entries_of_an_older_snapshot_are_ignored(tmp_path):
    first = runner(fedbuff(), tmp_path)
    arrivals(first, 30)
    while not list((tmp_path / JOURNAL).iterdir()):
        arrivals(first, 1, seed=1)
    # killed mid-write: the temporary files of a snapshot and an entry, never renamed into place
    (tmp_path / f".{SNAPSHOT}.tmp").write_bytes(b"\x00half a snapshot")
    (tmp_path / JOURNAL / f".{first.seq + 1:012d}.tmp").write_bytes(b"half an entry")
    again = runner(fedbuff(), tmp_path)
    assert again.seq == first.seq and _same(again.state, first.state)
    # a snapshot lands and the process dies before the purge: the older entries are dropped on restore
    latest = FileStore(tmp_path, "aggregator").load()
    FileStore(tmp_path, "aggregator").save(None, checkpoint.Checkpoint(
        "aggregator", latest.seq + 1, 0.0, latest.state, (), latest.fingerprint, models=latest.models
    ))  # fmt: skip
    restored = runner(fedbuff(), tmp_path)
    assert restored.seq == latest.seq + 1 and _same(restored.state, first.state)
    assert [p for p in (tmp_path / JOURNAL).iterdir() if p.name.isdigit()] == []


def test_a_torn_or_foreign_record_is_refused_by_name_and_an_unwritable_folder_too(tmp_path):
    arrivals(runner(fedbuff(), tmp_path), 3)
    (tmp_path / SNAPSHOT).write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError):
        runner(fedbuff(), tmp_path)
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"state folder .*file.*: cannot create it"):
        FileStore(tmp_path / "file" / "state", "client")
