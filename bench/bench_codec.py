"""Benchmark fedat.codec against the pure-Python polyline package; prints a Markdown report."""

from __future__ import annotations

import time
from collections.abc import Callable
from importlib.metadata import version

import numpy as np
import polyline

from fedat.codec import decode_layer, encode_layer, encode_raw

N_VALUES = 1_000_000
PACKAGE_SUBSET = 100_000  # the package runs ~1 M values/s, so it is timed on a subset
SIGMA = 0.05
PRECISION = 4
SIZE_PRECISIONS = (3, 4, 5, 6)
REPEATS = 7
PACKAGE_REPEATS = 3
SEED = 0


def best_of(fn: Callable[[], object], repeats: int) -> float:
    """Fastest wall-clock time of `repeats` calls, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    """Run the benchmark and print the Markdown tables."""
    values = np.random.default_rng(SEED).normal(0.0, SIGMA, N_VALUES).astype(np.float32)
    data = encode_layer(values, PRECISION)

    subset = values[:PACKAGE_SUBSET]
    flat = subset.astype(np.float64).tolist()
    # Pairs and the string are prepared outside the timed region: the package is timed on its own work.
    pairs = list(zip(flat[0::2], flat[1::2], strict=True))
    text = polyline.encode(pairs, PRECISION)
    if text.encode("ascii") != encode_layer(subset, PRECISION):
        raise SystemExit("fedat.codec output differs from the polyline package")

    ours_enc = N_VALUES / best_of(lambda: encode_layer(values, PRECISION), REPEATS) / 1e6
    ours_dec = N_VALUES / best_of(lambda: decode_layer(data, values.shape, PRECISION), REPEATS) / 1e6
    pkg_enc = PACKAGE_SUBSET / best_of(lambda: polyline.encode(pairs, PRECISION), PACKAGE_REPEATS) / 1e6
    pkg_dec = PACKAGE_SUBSET / best_of(lambda: polyline.decode(text, PRECISION), PACKAGE_REPEATS) / 1e6

    print(
        f"## Polyline codec throughput: {N_VALUES:,} N(0, {SIGMA}) float32 values, p={PRECISION}\n\n"
        f"fedat.codec timed on all {N_VALUES:,} values (numpy in, numpy out); the polyline "
        f"{version('polyline')} package on the first {PACKAGE_SUBSET:,} (pairs in, str out and back). "
        f"Best of {REPEATS} / {PACKAGE_REPEATS} runs.\n"
    )
    print("| direction | fedat.codec (M values/s) | polyline package (M values/s) | speed-up |")
    print("|---|---:|---:|---:|")
    print(f"| encode | {ours_enc:.1f} | {pkg_enc:.2f} | {ours_enc / pkg_enc:.1f}x |")
    print(f"| decode | {ours_dec:.1f} | {pkg_dec:.2f} | {ours_dec / pkg_dec:.1f}x |")

    raw_bytes = len(encode_raw(values))
    print(f"\n## Size vs raw float32 ({raw_bytes / N_VALUES:.0f} bytes/value)\n")
    print("| precision | bytes/value | compression vs raw | max abs error |")
    print("|---:|---:|---:|---:|")
    for p in SIZE_PRECISIONS:
        encoded = encode_layer(values, p)
        err = float(np.max(np.abs(decode_layer(encoded, values.shape, p) - values)))
        print(f"| {p} | {len(encoded) / N_VALUES:.3f} | {raw_bytes / len(encoded):.2f}x | {err:.2e} |")


if __name__ == "__main__":
    main()
