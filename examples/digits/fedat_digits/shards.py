"""Cut scikit-learn's bundled digits (1,797 8x8 images) into per-client shards, split by class.

Client k holds four digits, 4k to 4k+3 (mod 10); each digit is shared evenly by the clients that hold it, and each
client keeps a quarter of its samples as its own test split. Every client sees only its own four digits: the global
model learns all ten only through federation.

    python -m fedat_digits.shards --clients 6 --out DIR    # writes DIR/client-<k>/digits.npz, one shard per client
    python -m fedat_digits.shards --clients 7 --only 6 --out DIR    # a shard for a seventh client that joins later
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import numpy as np

CLASSES = 10
CLASSES_PER_CLIENT = 4
TEST_FRACTION = 0.25


@functools.cache
def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits  # bundled with scikit-learn: no download

    d = load_digits()
    return (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)


def classes_of(client: int) -> tuple[int, ...]:
    """The digits client `client` holds."""
    return tuple((CLASSES_PER_CLIENT * client + j) % CLASSES for j in range(CLASSES_PER_CLIENT))


def shard(client: int, num_clients: int, seed: int = 0):
    """Client `client`'s ((x_train, y_train), (x_test, y_test)) of `num_clients`."""
    if not 0 <= client < num_clients:
        raise ValueError(f"client {client} is not one of {num_clients} clients (set FEDAT_NUM_CLIENTS)")
    x, y = _digits()
    rng = np.random.default_rng(seed)
    mine = []
    for c in range(CLASSES):
        idx = rng.permutation(np.flatnonzero(y == c))  # drawn for every class, so that all clients' shards agree
        holders = [k for k in range(num_clients) if c in classes_of(k)]
        if client in holders:
            mine.append(np.array_split(idx, len(holders))[holders.index(client)])
    idx = np.random.default_rng([seed, client]).permutation(np.concatenate(mine))
    cut = int(round(len(idx) * (1 - TEST_FRACTION)))
    return (x[idx[:cut]], y[idx[:cut]]), (x[idx[cut:]], y[idx[cut:]])


def write(num_clients: int, out: Path, seed: int = 0, only: int | None = None) -> list[Path]:
    """Write every client's shard (or client `only`'s) to out/client-<k>/digits.npz."""
    paths = []
    for k in range(num_clients) if only is None else [only]:
        (x_train, y_train), (x_test, y_test) = shard(k, num_clients, seed)
        folder = out / f"client-{k}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "digits.npz"
        np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> None:
    """The command line."""
    p = argparse.ArgumentParser(prog="python -m fedat_digits.shards", description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, required=True, help="number of clients")
    p.add_argument("--out", type=Path, required=True, help="folder that gets one client-<k>/ folder per client")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", type=int, default=None, help="write only this client's shard (one that joins later)")
    args = p.parse_args(argv)
    for path in write(args.clients, args.out, args.seed, args.only):
        k = int(path.parent.name.removeprefix("client-"))
        with np.load(path) as f:
            print(f"client {k}: digits {classes_of(k)}, {len(f['y_train'])} train / {len(f['y_test'])} test -> {path}")


if __name__ == "__main__":
    main()
