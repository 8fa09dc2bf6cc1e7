"""Benchmark LocalTrainer against a plain model.fit baseline on the CNN; prints a Markdown table."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

N_TRAIN = 480
N_EVAL = 10_000
N_CLIENTS_EVAL = 100
BATCH = 10
SHAPE = (28, 28, 1)
CLASSES = 10
SEED = 0


def timed(fn: Callable[[], object]) -> float:
    """Wall-clock seconds of one call."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print the Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--eval-repeats", type=int, default=3)
    args = parser.parse_args(argv)

    from fedat_worker.models import build_model, configure_threads

    configure_threads(args.threads)  # must precede any TF op
    from tensorflow import keras

    from fedat_worker.trainer import LocalTrainer

    rng = np.random.default_rng(SEED)
    x = rng.random((N_TRAIN, *SHAPE), dtype=np.float32)
    y = rng.integers(0, CLASSES, N_TRAIN)
    xe = rng.random((N_EVAL, *SHAPE), dtype=np.float32)
    ye = rng.integers(0, CLASSES, N_EVAL)

    trainer = LocalTrainer(build_model("cnn", SHAPE, CLASSES, seed=SEED), batch_size=BATCH)
    w0 = trainer.model.get_weights()
    fit_model = build_model("cnn", SHAPE, CLASSES, seed=SEED)
    fit_model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )

    def run_trainer(seed: int) -> None:
        trainer.train(w0, x, y, epochs=1, prox_lambda=0.0, seed=seed)

    def run_fit() -> None:
        # Same per-task work as LocalTrainer.train: load the global weights, train, read them back.
        fit_model.set_weights(w0)
        fit_model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=True, verbose=0)
        fit_model.get_weights()

    first_trainer = timed(lambda: run_trainer(0))
    first_fit = timed(run_fit)
    warm_trainer, warm_fit = [], []
    for i in range(args.repeats):  # interleaved so machine-load drift hits both equally
        warm_trainer.append(timed(lambda i=i: run_trainer(i + 1)))
        warm_fit.append(timed(run_fit))
    med_trainer, med_fit = statistics.median(warm_trainer), statistics.median(warm_fit)

    first_eval = timed(lambda: trainer.evaluate(w0, xe, ye))
    eval_s = statistics.median(timed(lambda: trainer.evaluate(w0, xe, ye)) for _ in range(args.eval_repeats))
    predict_s = statistics.median(
        timed(lambda: fit_model.predict(xe, batch_size=1000, verbose=0)) for _ in range(args.eval_repeats)
    )
    clients = list(zip(np.array_split(xe, N_CLIENTS_EVAL), np.array_split(ye, N_CLIENTS_EVAL), strict=True))
    per_client_s = statistics.median(
        timed(lambda: trainer.evaluate_per_client(w0, clients)) for _ in range(args.eval_repeats)
    )

    print(
        f"## LocalTrainer vs model.fit — CNN, {N_TRAIN} samples × {SHAPE}, batch {BATCH}, "
        f"{args.threads} thread(s), median of {args.repeats}\n"
    )
    print("| method | first epoch incl. tracing (s) | warm s / client-epoch | client-epochs/s |")
    print("|---|---:|---:|---:|")
    rate = 1 / med_trainer
    print(f"| LocalTrainer.train(epochs=1) | {first_trainer:.3f} | {med_trainer:.3f} | {rate:.2f} |")
    print(f"| model.fit baseline | {first_fit:.3f} | {med_fit:.3f} | {1 / med_fit:.2f} |")
    print(f"| ratio fit / LocalTrainer | {first_fit / first_trainer:.2f}× | {med_fit / med_trainer:.2f}× | |")
    print(f"\ntrain step traces: {trainer.trace_count}\n")
    print(f"| evaluation on {N_EVAL} images (median of {args.eval_repeats}) | s |")
    print("|---|---:|")
    print(f"| LocalTrainer.evaluate, first call incl. tracing | {first_eval:.3f} |")
    print(f"| LocalTrainer.evaluate, warm | {eval_s:.3f} |")
    print(f"| LocalTrainer.evaluate_per_client, {N_CLIENTS_EVAL} clients | {per_client_s:.3f} |")
    print(f"| model.predict baseline (batch 1000) | {predict_s:.3f} |")


if __name__ == "__main__":
    main()
