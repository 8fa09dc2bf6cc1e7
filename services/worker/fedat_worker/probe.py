"""`python -m fedat_worker.probe`: how many seconds one mini-batch step of the experiment's training takes here.

Builds the worker's workload from the FEDAT_* variables (data, model, trainer, TensorFlow threads) exactly as a
worker does, traces the training, then prints `ready` and waits for a line on stdin, so that a launcher can start
its measurement in every probe at once (the cores loaded as the workers will load them). It then trains whole
client tasks (the model decoded from and encoded to the wire codec, as a worker does) for `--seconds` and prints
one JSON line: wall and CPU seconds per step, and each client's number of training samples. With `--evaluate` it
then also scores the model on every client's test split, as the evaluator does each time, and adds the CPU and wall
seconds of one such evaluation (after a first one that traces).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from fedat.protocol.wire import decode_model, encode_model
from fedat.runtime import config
from fedat_worker.workload import build, workload_from_env


def main(argv: list[str] | None = None) -> None:
    """Trace, say `ready`, wait for `go`, measure, print the result."""
    p = argparse.ArgumentParser(prog="python -m fedat_worker.probe", description=__doc__)
    p.add_argument("--seconds", type=float, default=4.0, help="measure for at least this long")
    p.add_argument("--min-tasks", type=int, default=3, help="and at least this many client tasks")
    p.add_argument("--evaluate", action="store_true", help="then time one evaluation on every client's test split")
    args = p.parse_args(argv)
    env = os.environ
    from fedat_worker.models import weight_names

    clients, model, trainer = build(workload_from_env(env), config.get_int(env, "FEDAT_TF_THREADS", 1))
    epochs = config.get_int(env, "FEDAT_EPOCHS", 3)
    batch = config.get_int(env, "FEDAT_BATCH_SIZE", 10)
    lr = config.get_float(env, "FEDAT_LEARNING_RATE", 1e-3)
    prox = config.get_float(env, "FEDAT_PROX_LAMBDA", 0.0)
    codec, precision = config.get_str(env, "FEDAT_CODEC", "polyline"), config.get_int(env, "FEDAT_PRECISION", 4)
    names = weight_names(model)
    layers = encode_model(model.get_weights(), names, codec, precision)

    def task(i: int) -> int:
        """One client task as a worker runs it; returns its mini-batch steps."""
        nonlocal layers
        c = clients[i % len(clients)]
        r = trainer.train(
            decode_model(layers),
            c.x_train,
            c.y_train,
            epochs=epochs,
            prox_lambda=prox,
            seed=i,
            learning_rate=lr,
            batch_size=batch,
        )
        layers = encode_model(r.weights, names, codec, precision)
        return epochs * -(-r.n_samples // batch)

    task(0)  # the first call traces the epoch function: a worker pays that once, not per task
    print("ready", flush=True)
    sys.stdin.readline()
    steps = tasks = 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - wall0 < args.seconds or tasks < args.min_tasks:
        tasks += 1
        steps += task(tasks)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    evaluation = evaluate(trainer, decode_model(layers), clients) if args.evaluate else {}
    result = {
        "step_seconds": wall / steps,
        "cpu_step_seconds": cpu / steps,
        "tasks": tasks,
        "steps": steps,
        "seconds": wall,
        "train_samples": [len(c.x_train) for c in clients],
        **evaluation,
    }
    print(json.dumps(result), flush=True)


def evaluate(trainer, weights, clients) -> dict[str, float]:
    """CPU and wall seconds of one evaluation on every client's test split, traced by a first one beforehand."""
    tests = [(c.x_test, c.y_test) for c in clients]
    trainer.evaluate_per_client(weights, tests)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    trainer.evaluate_per_client(weights, tests)
    return {"evaluation_seconds": time.process_time() - cpu0, "evaluation_wall_seconds": time.perf_counter() - wall0}


if __name__ == "__main__":
    main()
