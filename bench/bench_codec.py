"""Benchmark the layer codecs; prints Markdown tables.

1. The vectorised polyline codec against the pure-Python polyline package (throughput, and size on N(0, 0.05)).
2. Bytes per weight of float32, polyline p=4 and the delta codec at p=3/4/6, on client updates captured from a real
   training run (the paper's CNN on Fashion-MNIST, 2 classes per client, FedAvg rounds of 5 clients with E=3)
   early, in the middle and late in training, and on whole models.
3. Encode and decode throughput of each, measured side by side in one run, and as ratios to polyline p=4.
4. Entropy coders for the delta codec's byte planes: zstd's levels against zlib, bz2 and lzma.
5. Downloads: a global model sent against an earlier version the receiver keeps, against sending it whole.

The captured run is cached in results/bench-cache (delete it to capture again; `--no-capture` skips 2-5).
"""

from __future__ import annotations

import argparse
import bz2
import lzma
import time
import zlib
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import numpy as np
import polyline
import zstandard

from fedat.protocol.codec import decode_layer, encode_layer, encode_raw
from fedat.protocol.deltacodec import HEADER, decode_delta, encode_delta, header
from fedat.protocol.wire import decode_model, encode_against, encode_model, model_bytes

N_VALUES = 1_000_000
PACKAGE_SUBSET = 100_000  # the package runs ~1 M values/s, so it is timed on a subset
SIGMA = 0.05
PRECISION = 4
SIZE_PRECISIONS = (3, 4, 5, 6)
REPEATS = 7
PACKAGE_REPEATS = 3
SEED = 0

# The captured run: the main experiment's model, data split and local training, FedAvg over 5 random clients.
CAPTURE_ROUNDS = 80
CAPTURE_AT = {"early": 1, "middle": 20, "late": 80}
CLIENTS_PER_ROUND = 5
UPDATES_PER_PHASE = 3
# Global versions scored (mean test accuracy of 20 clients): the ones the updates above start from, and the whole
# models of the tables.
EVALUATE = {0, 19, 20, 40, 79, 80}
CACHE = Path(__file__).resolve().parents[1] / "results" / "bench-cache" / "codec-run-v2.npz"
DELTA_PRECISIONS = (3, 4, 6)
TIMING_REPEATS = 15


def best_of(fn: Callable[[], object], repeats: int) -> float:
    """Fastest wall-clock time of `repeats` calls, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def polyline_tables() -> None:
    """The vectorised polyline codec against the package, and its size by precision."""
    values = np.random.default_rng(SEED).normal(0.0, SIGMA, N_VALUES).astype(np.float32)
    data = encode_layer(values, PRECISION)

    subset = values[:PACKAGE_SUBSET]
    flat = subset.astype(np.float64).tolist()
    # Pairs and the string are prepared outside the timed region: the package is timed on its own work.
    pairs = list(zip(flat[0::2], flat[1::2], strict=True))
    text = polyline.encode(pairs, PRECISION)
    if text.encode("ascii") != encode_layer(subset, PRECISION):
        raise SystemExit("fedat.protocol.codec output differs from the polyline package")

    ours_enc = N_VALUES / best_of(lambda: encode_layer(values, PRECISION), REPEATS) / 1e6
    ours_dec = N_VALUES / best_of(lambda: decode_layer(data, values.shape, PRECISION), REPEATS) / 1e6
    pkg_enc = PACKAGE_SUBSET / best_of(lambda: polyline.encode(pairs, PRECISION), PACKAGE_REPEATS) / 1e6
    pkg_dec = PACKAGE_SUBSET / best_of(lambda: polyline.decode(text, PRECISION), PACKAGE_REPEATS) / 1e6

    print(
        f"## Polyline codec throughput: {N_VALUES:,} N(0, {SIGMA}) float32 values, p={PRECISION}\n\n"
        f"fedat.protocol.codec timed on all {N_VALUES:,} values (numpy in, numpy out); the polyline "
        f"{version('polyline')} package on the first {PACKAGE_SUBSET:,} (pairs in, str out and back). "
        f"Best of {REPEATS} / {PACKAGE_REPEATS} runs.\n"
    )
    print("| direction | fedat.protocol.codec (M values/s) | polyline package (M values/s) | speed-up |")
    print("|---|---:|---:|---:|")
    print(f"| encode | {ours_enc:.1f} | {pkg_enc:.2f} | {ours_enc / pkg_enc:.1f}x |")
    print(f"| decode | {ours_dec:.1f} | {pkg_dec:.2f} | {ours_dec / pkg_dec:.1f}x |")

    raw_bytes = len(encode_raw(values))
    print(f"\n## Polyline size vs raw float32 ({raw_bytes / N_VALUES:.0f} bytes/value)\n")
    print("| precision | bytes/value | compression vs raw | max abs error |")
    print("|---:|---:|---:|---:|")
    for p in SIZE_PRECISIONS:
        encoded = encode_layer(values, p)
        err = float(np.max(np.abs(decode_layer(encoded, values.shape, p) - values)))
        print(f"| {p} | {len(encoded) / N_VALUES:.3f} | {raw_bytes / len(encoded):.2f}x | {err:.2e} |")


# --- the captured run ---------------------------------------------------------------------------------------------


def capture() -> dict[str, np.ndarray]:
    """Train FedAvg rounds with the worker's real trainer and keep updates and global models (flattened per layer)."""
    from fedat_worker.workload import Workload, build

    clients, model, trainer = build(Workload(), threads=1)
    exact = [np.asarray(w, np.float32) for w in model.get_weights()]
    shapes = [w.shape for w in exact]
    rng = np.random.default_rng(SEED)
    out: dict[str, np.ndarray] = {"shapes": np.array([str(s) for s in shapes])}
    started = time.perf_counter()

    def accuracy(weights: list[np.ndarray]) -> np.ndarray:
        scores = [trainer.evaluate(weights, clients[c].x_test, clients[c].y_test)[1] for c in range(0, 100, 5)]
        return np.array(float(np.mean(scores)))

    for r in range(1, CAPTURE_ROUNDS + 1):
        out[f"global{r - 1}"] = np.concatenate([w.ravel() for w in exact])
        # What a worker trains from: the global model as the default codec (polyline p=4) delivers it.
        base = [decode_layer(encode_layer(w, 4), w.shape, 4) for w in exact]
        chosen = rng.choice(len(clients), CLIENTS_PER_ROUND, replace=False)
        results = []
        for c in chosen:
            d = clients[int(c)]
            res = trainer.train(
                base, d.x_train, d.y_train, epochs=3, prox_lambda=0.0, seed=r * 1000 + int(c), batch_size=10
            )
            results.append(res)
        for phase, at in CAPTURE_AT.items():
            if r == at:
                out[f"{phase}-base"] = np.concatenate([w.ravel() for w in base])
                for i, res in enumerate(results[:UPDATES_PER_PHASE]):
                    out[f"{phase}-update{i}"] = np.concatenate([w.ravel() for w in res.weights])
        if r - 1 in EVALUATE:
            out[f"accuracy{r - 1}"] = accuracy(exact)
        total = sum(res.n_samples for res in results)
        exact = [
            (sum(res.n_samples * res.weights[i].astype(np.float64) for res in results) / total).astype(np.float32)
            for i in range(len(exact))
        ]
        print(f"<!-- captured round {r}/{CAPTURE_ROUNDS}, {time.perf_counter() - started:.0f} s -->", flush=True)
    out[f"global{CAPTURE_ROUNDS}"] = np.concatenate([w.ravel() for w in exact])
    out[f"accuracy{CAPTURE_ROUNDS}"] = accuracy(exact)
    return out


def captured() -> dict[str, np.ndarray]:
    """The cached capture, or a fresh one (cached)."""
    if CACHE.exists():
        with np.load(CACHE) as f:
            return dict(f)
    run = capture()
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    tmp = CACHE.with_suffix(".tmp.npz")
    np.savez(tmp, **run)
    tmp.rename(CACHE)
    return run


def split(flat: np.ndarray, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    """A flat model back into its layers."""
    out, at = [], 0
    for s in shapes:
        n = int(np.prod(s))
        out.append(flat[at : at + n].reshape(s))
        at += n
    return out


class Model:
    """A model's layers, with the byte size and timing of each codec on them."""

    def __init__(self, layers: list[np.ndarray], base: list[np.ndarray] | None):
        self.layers, self.base = layers, base
        self.n = sum(w.size for w in layers)

    def _bases(self) -> list[np.ndarray | None]:
        return [None] * len(self.layers) if self.base is None else list(self.base)

    def encode(self, codec: str, p: int) -> list[bytes]:
        """The model's layers in a codec."""
        if codec == "raw":
            return [encode_raw(w) for w in self.layers]
        if codec == "polyline":
            return [encode_layer(w, p) for w in self.layers]
        return [encode_delta(w, b, p) for w, b in zip(self.layers, self._bases(), strict=True)]

    def decode(self, codec: str, p: int, data: list[bytes]) -> list[np.ndarray]:
        """The model back from a codec's layers."""
        shapes = [w.shape for w in self.layers]
        if codec == "raw":
            return [np.frombuffer(d, "<f4").reshape(s) for d, s in zip(data, shapes, strict=True)]
        if codec == "polyline":
            return [decode_layer(d, s, p) for d, s in zip(data, shapes, strict=True)]
        return [decode_delta(d, s, b, p) for d, s, b in zip(data, shapes, self._bases(), strict=True)]

    def bytes_per_weight(self, codec: str, p: int) -> tuple[float, float]:
        """Bytes per weight and the largest decoded error."""
        data = self.encode(codec, p)
        decoded = self.decode(codec, p, data)
        err = max(
            float(np.abs(d.astype(np.float64) - w).max(initial=0)) for d, w in zip(decoded, self.layers, strict=True)
        )
        return sum(len(d) for d in data) / self.n, err


CODECS = [("raw", 0, "float32")] + [("polyline", 4, "polyline p=4")] + [("delta", p, f"delta p={p}") for p in (3, 4, 6)]


def size_table(models: dict[str, Model], accuracy: dict[str, float]) -> None:
    """Bytes per weight of every codec on every captured model."""
    print("\n## Bytes per weight on a real run\n")
    print(
        f"The paper's CNN ({next(iter(models.values())).n:,} weights) on Fashion-MNIST, 2 classes per client, FedAvg "
        f"rounds of {CLIENTS_PER_ROUND} clients, E=3, Adam 1e-3, batch 10; each client trains from the global model "
        "as polyline p=4 delivers it. An update is a client's trained model: polyline sends it whole, the delta codec "
        "as its difference from the model the client started from. A whole model is sent by both against nothing "
        "(the delta codec against zero). In brackets: the mean test accuracy of the global model the update started "
        "from, or of the whole model. Max error is "
        "the largest |decoded - sent| over the model (bound 0.5·10^-p).\n"
    )
    print("| model | " + " | ".join(label for _, _, label in CODECS) + " | delta p=4 vs float32 | vs polyline p=4 |")
    print("|---|" + "---:|" * (len(CODECS) + 2))
    for name, m in models.items():
        cells, sizes = [], {}
        for codec, p, label in CODECS:
            b, err = m.bytes_per_weight(codec, p)
            sizes[label] = b
            cells.append(f"{b:.3f} ({err:.1e})" if codec != "raw" else f"{b:.0f}")
        ratio = sizes["float32"] / sizes["delta p=4"]
        vs_poly = sizes["polyline p=4"] / sizes["delta p=4"]
        print(
            f"| {name} ({accuracy.get(name, float('nan')):.2f}) | "
            + " | ".join(cells)
            + f" | {ratio:.2f}x | {vs_poly:.2f}x |"
        )


def speed_table(m: Model) -> None:
    """Encode and decode throughput of each codec, side by side, and as ratios to polyline p=4."""
    data = {label: m.encode(codec, p) for codec, p, label in CODECS}
    enc = {label: float("inf") for _, _, label in CODECS}
    dec = dict(enc)
    # Interleaved, so that other load on the machine hits every codec alike; best of TIMING_REPEATS each.
    for _ in range(TIMING_REPEATS):
        for codec, p, label in CODECS:
            enc[label] = min(enc[label], best_of(lambda c=codec, q=p: m.encode(c, q), 1))
            dec[label] = min(dec[label], best_of(lambda c=codec, q=p, d=data[label]: m.decode(c, q, d), 1))
    print(f"\n## Throughput on one update ({m.n:,} weights, the middle phase), measured side by side\n")
    print(
        f"Million weights per second, best of {TIMING_REPEATS} interleaved runs; a model is all its layers, numpy in "
        "and out (float32 decodes as a zero-copy view). Ratio: polyline p=4's time divided by the codec's (above 1 is "
        "faster than polyline).\n"
    )
    print("| codec | encode (M/s) | decode (M/s) | encode + decode (M/s) | vs polyline p=4 (encode + decode) |")
    print("|---|---:|---:|---:|---:|")
    ref = enc["polyline p=4"] + dec["polyline p=4"]
    for _, _, label in CODECS:
        both = enc[label] + dec[label]
        print(
            f"| {label} | {m.n / enc[label] / 1e6:.1f} | {m.n / dec[label] / 1e6:.1f} | {m.n / both / 1e6:.1f} "
            f"| {ref / both:.2f}x |"
        )


def _planes_of(m: Model, p: int) -> list[bytes]:
    """Every plane the delta codec hands zstd, of every layer, taken back out of its own frames."""
    out = []
    for d, w in zip(m.encode("delta", p), m.layers, strict=True):
        content = zstandard.ZstdDecompressor().decompress(d[HEADER.size :])
        out += [content[i : i + w.size] for i in range(0, len(content), w.size)] if w.size else []
    return out


def _entropy_bits(m: Model, p: int) -> float:
    """Order-0 empirical entropy of the quantised values, per layer (optimistic: it ignores the code tables)."""
    bits = 0.0
    for d, w in zip(m.encode("delta", p), m.layers, strict=True):
        _, _, _, shift, width, _ = header(d)
        low = 1 if shift else 0
        content = zstandard.ZstdDecompressor().decompress(d[HEADER.size :])
        planes = np.frombuffer(content, np.uint8).reshape(low + width, -1).astype(np.uint64)
        z = sum(planes[low + j] << np.uint64(8 * j) for j in range(width)) << np.uint64(shift)
        if shift:
            z |= planes[0]
        _, counts = np.unique(z, return_counts=True)
        freq = counts / counts.sum()
        bits += float(-(freq * np.log2(freq)).sum()) * w.size
    return bits / m.n


def coder_table(m: Model) -> None:
    """The delta codec's byte planes under other entropy coders (p=4, the middle update)."""
    planes = _planes_of(m, 4)
    coders: list[tuple[str, Callable[[bytes], bytes]]] = [
        (f"zstd {lv}", lambda b, lv=lv: zstandard.ZstdCompressor(level=lv).compress(b)) for lv in (1, 3, 9, 19)
    ]
    coders += [
        ("zlib 6", lambda b: zlib.compress(b, 6)),
        ("zlib 9", lambda b: zlib.compress(b, 9)),
        ("bz2 9", lambda b: bz2.compress(b, 9)),
        ("lzma 6", lambda b: lzma.compress(b, preset=6)),
    ]
    print("\n## Entropy coders for the delta codec's byte planes (p=4, the middle update)\n")
    print(
        "The codec's planes, each compressed on its own by each coder (the codec puts a layer's planes in one zstd "
        f"frame, a block each, plus a {HEADER.size}-byte header and zstd's checksum: the 'delta p=4' column above). "
        "The order-0 "
        f"entropy of the quantised values per layer is {_entropy_bits(m, 4) / 8:.3f} bytes/weight (a lower bound only "
        "for a coder with free tables).\n"
    )
    print("| coder | bytes/weight | encode (M weights/s) |")
    print("|---|---:|---:|")
    for name, fn in coders:
        size = sum(len(fn(pl)) for pl in planes)
        seconds = best_of(lambda fn=fn: [fn(pl) for pl in planes], 3)
        print(f"| {name} | {size / m.n:.3f} | {m.n / seconds / 1e6:.1f} |")


def download_table(run: dict[str, np.ndarray], shapes: list[tuple[int, ...]]) -> None:
    """A global model sent against an earlier version the receiver keeps, against sending it whole."""
    print("\n## Downloads: a global model against an earlier version the receiver keeps (p=4)\n")
    print(
        "Global model v sent whole (polyline p=4, or the delta codec against zero), or, as the barrier sends a real "
        "client its task and the collector its evaluation requests (against the newest request sent whole: 5, 10 "
        "and 15 versions older with an evaluation every 5), against version v-k as the client decoded it: "
        "losslessly, on the whole model's grid "
        "(`wire.encode_against`; the client decodes exactly the model sent whole). A pool worker keeps no model, "
        "so its tasks carry the model whole. Bytes per weight.\n"
    )
    ks = (1, 5, 10, 20)
    head = ["polyline whole", *(f"polyline vs v-{k}" for k in ks), "delta whole", *(f"delta vs v-{k}" for k in ks)]
    print("| version | " + " | ".join(head) + " |")
    print("|---:|" + "---:|" * len(head))
    names = [f"w{i}" for i in range(len(shapes))]
    for v in (20, 40, CAPTURE_ROUNDS):
        cells = []
        for codec in ("polyline", "delta"):
            layers = encode_model(split(run[f"global{v}"], shapes), names, codec, 4)
            n = sum(layer.size for layer in layers)
            cells.append(model_bytes(layers) / n)
            whole = decode_model(layers)
            for k in ks:
                kept = decode_model(encode_model(split(run[f"global{v - k}"], shapes), names, codec, 4))
                cells.append(model_bytes(encode_against(layers, whole, kept)) / n)
        print(f"| {v} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print the Markdown tables."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-capture", action="store_true", help="only the polyline tables")
    args = parser.parse_args(argv)
    polyline_tables()
    if args.no_capture:
        return
    run = captured()
    shapes = [tuple(int(d) for d in s.strip("()").split(",") if d.strip()) for s in run["shapes"]]
    models: dict[str, Model] = {}
    accuracy: dict[str, float] = {}
    for phase, at in CAPTURE_AT.items():
        base = split(run[f"{phase}-base"], shapes)
        name = f"update, {phase} (round {at})"
        models[name] = Model(split(run[f"{phase}-update0"], shapes), base)
        accuracy[name] = float(run[f"accuracy{at - 1}"])
    for v in (20, CAPTURE_ROUNDS):
        name = f"whole model, version {v}"
        models[name] = Model(split(run[f"global{v}"], shapes), None)
        accuracy[name] = float(run[f"accuracy{v}"])
    size_table(models, accuracy)
    middle = models[f"update, middle (round {CAPTURE_AT['middle']})"]
    speed_table(middle)
    coder_table(middle)
    download_table(run, shapes)


if __name__ == "__main__":
    main()
