"""Simulator speed, side by side in one run; prints Markdown tables.

1. Simulated client-epochs/s against the bare trainer training the same clients one by one (target >= 90 %).
2. Virtual seconds per real second of every shipped experiment and comparison method (a short run of each).
3. A sweep of short simulations, one after another against two at once (both cores, one TF thread each).
4. Training a round's clients together in one grouped step against one by one: speed and equivalence.
5. One run training in its own process against the same run training in a pool of processes (target >= 1.5× on
   two free cores), and that both write the same events.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from fedat.deploy.experiment import Experiment, load_experiment  # noqa: E402
from fedat.lab.compare_run import load_comparison  # noqa: E402
from fedat.protocol import topology  # noqa: E402

MAIN = ROOT / "experiments" / "fmnist2-fedat.yaml"
PROFILE_EPOCHS = "profile_epochs"


def timed(fn: Callable[[], object]) -> float:
    """Wall-clock seconds of one call."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def shipped() -> list[Experiment]:
    """Every experiment in experiments/: single files as they are, comparisons as one experiment per method."""
    out = []
    for path in sorted((ROOT / "experiments").glob("*.yaml")):
        if path.name.startswith("compare-"):
            out.extend(load_comparison(path)[3])
        else:
            out.append(load_experiment(path))
    return out


# --- 1. the simulation against the bare trainer ------------------------------------------------------------------
class TimedTrainer:
    """The project's trainer, with the seconds spent in training and in scoring summed (to see where time goes)."""

    def __init__(self, trainer) -> None:
        self.trainer, self.train_s, self.eval_s = trainer, 0.0, 0.0
        self.calls = self.epochs = 0

    def train(self, *args, **kwargs):
        """`LocalTrainer.train`, timed and counted."""
        self.calls += 1
        self.epochs += int(kwargs["epochs"])
        start = time.perf_counter()
        try:
            return self.trainer.train(*args, **kwargs)
        finally:
            self.train_s += time.perf_counter() - start

    def evaluate_per_client(self, *args, **kwargs):
        """`LocalTrainer.evaluate_per_client`, timed."""
        start = time.perf_counter()
        try:
            return self.trainer.evaluate_per_client(*args, **kwargs)
        finally:
            self.eval_s += time.perf_counter() - start


def warm_parts(exp: Experiment):
    """The experiment's parts (data, model, trainer) with the train and score functions traced once."""
    from fedat.runtime import config
    from fedat_sim.clients import tensorflow_parts
    from fedat_worker.workload import workload_from_env

    env = exp.env()
    parts = tensorflow_parts(workload_from_env(env), config.get_int(env, "FEDAT_TF_THREADS", 1))
    c = parts.clients[0]
    parts.trainer.train(list(parts.initial), c.x_train, c.y_train, epochs=1, prox_lambda=0.0, seed=0)
    parts.trainer.evaluate_per_client(list(parts.initial), [(c.x_test, c.y_test)])
    return parts


def bare_trainings(parts, exp: Experiment, count: int) -> float:
    """Seconds for `count` clients trained one by one as the experiment's tasks train them."""
    s = exp.settings
    start = time.perf_counter()
    for i in range(count):
        c = parts.clients[i % len(parts.clients)]
        parts.trainer.train(
            list(parts.initial),
            c.x_train,
            c.y_train,
            epochs=int(s["epochs"]),
            prox_lambda=float(s.get("prox_lambda", 0.0)),
            seed=i,
            learning_rate=float(s.get("learning_rate", 1e-3)),
            batch_size=int(s.get("batch_size", 10)),
        )
    return time.perf_counter() - start


def row_simulation_vs_bare(minutes: float, repeats: int, bare_count: int) -> None:
    """Client-epochs/s of `fedat simulate` (start-up excluded: parts built and traced first) vs the bare trainer."""
    from fedat_sim.clients import Parts
    from fedat_sim.simulate import simulate

    exp = load_experiment(MAIN)
    parts = warm_parts(exp)
    epochs = int(exp.settings["epochs"])
    profile_epochs = int(exp.settings.get(PROFILE_EPOCHS, 1))
    bare, sim, shares = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):  # interleaved, so that drift of the machine's load hits both alike
            bare.append(bare_count * epochs / bare_trainings(parts, exp, bare_count))
            timed_trainer = TimedTrainer(parts.trainer)
            summary = simulate(
                exp, tmp, minutes, parts=Parts(parts.clients, timed_trainer, parts.names, parts.initial), tag=f"r{r}"
            )
            # Counted as trained, not as answered: an update whose not_before is past the end is trained all the same.
            wall = summary["wall_seconds"]
            sim.append(timed_trainer.epochs / wall)
            shares.append((timed_trainer.train_s / wall, timed_trainer.eval_s / wall, summary, timed_trainer))
    b, s = statistics.median(bare), statistics.median(sim)
    last, counted = shares[-1][2], shares[-1][3]
    print(
        f"## 1. Simulation vs bare trainer: {exp.name}, {minutes:g} virtual min, start-up excluded "
        f"(data, model and traced functions built before), median of {repeats}, interleaved\n"
    )
    print("| what | client-epochs/s |\n|---|---:|")
    print(f"| bare trainer, {bare_count} clients one by one, E={epochs} | {b:.2f} |")
    print(
        f"| `simulate` ({counted.calls} trainings, {counted.epochs} epochs in {last['wall_seconds']:.1f} s; "
        f"answered by the end: {last['client_trainings']} of E={epochs} + {last['profile_trainings']} profiling "
        f"of E={profile_epochs}) | {s:.2f} |"
    )
    print(f"| **ratio simulated / bare** | **{s / b:.0%}** (target >= 90 %) |")
    train_share = statistics.median(sh[0] for sh in shares)
    eval_share = statistics.median(sh[1] for sh in shares)
    print(
        f"\nWhere the simulation's time goes: training {train_share:.0%}, scoring (evaluator) {eval_share:.0%}, "
        f"everything else (services, broker, codec) {1 - train_share - eval_share:.0%}.\n"
    )


# --- 2. virtual seconds per real second --------------------------------------------------------------------------
_PARTS: dict = {}


def _init_child() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import logging

    logging.basicConfig(level=logging.ERROR)  # stale stragglers are dead-lettered by the thousand, as in a run


def short_run(exp: Experiment, cap_seconds: float) -> dict:
    """`simulate`'s wiring (System on a memory broker) run until its minutes or `cap_seconds` of real time."""
    from fedat.lab.recorder import RunState
    from fedat_sim.clock import Clock
    from fedat_sim.memory import MemoryBroker
    from fedat_sim.shell import ServiceDied
    from fedat_sim.system import System, secret_for
    from fedat_worker.workload import workload_from_env

    key = workload_from_env(exp.env())
    if key not in _PARTS:  # one data set and model per workload and process, as simulate builds once per run
        _PARTS[key] = warm_parts(exp)
    parts = _PARTS[key]
    seed = int(exp.settings.get("seed", 0))
    clock = Clock(rng=random.Random(seed))
    broker = MemoryBroker(clock)
    trainings: Counter[str] = Counter()
    broker.taps.append(lambda ex, rk, body, props: trainings.update([rk]) if ex == topology.RESULTS else None)
    start, end = clock.now, clock.now + exp.minutes * 60.0
    failure = ""
    with open(os.devnull, "w") as events:
        system = System(exp, parts, clock, broker, RunState(started_at=clock.now), events, 1, secret_for(seed))
        wall0 = time.perf_counter()
        try:
            system.start()
            while clock.now < end and time.perf_counter() - wall0 < cap_seconds:
                clock.run(min(end, clock.now + 1.0))
        except ServiceDied as exc:
            failure = str(exc)
        finally:
            system.stop()
        wall = time.perf_counter() - wall0
    profiles = trainings.pop(topology.PROFILE_KEY, 0)
    return {
        "name": exp.name,
        "virtual": clock.now - start,
        "wall": wall,
        "trainings": sum(trainings.values()),
        "profiles": profiles,
        "step_seconds": "step_seconds" in exp.settings,
        "failure": failure,
    }


def row_virtual_speed(cap_seconds: float, jobs: int) -> None:
    """Virtual s per real s of each shipped experiment: the first `cap_seconds` of real time (or its minutes)."""
    exps = shipped()
    ctx = multiprocessing.get_context("spawn")
    started = time.perf_counter()
    with ctx.Pool(jobs, initializer=_init_child) as pool:
        results = pool.starmap(short_run, [(e, cap_seconds) for e in exps], chunksize=1)
    elapsed = time.perf_counter() - started
    print(
        f"## 2. Virtual seconds per real second: each experiment from its start (profiling pass included) for "
        f"{cap_seconds:g} real s or its minutes, {jobs} at once (1 TF thread each, as a sweep runs them)\n"
    )
    print("| experiment | virtual s | real s | virtual s / real s | trainings | profiling | latency |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in results:
        latency = "nominal step_seconds" if r["step_seconds"] else "**measured** (schedule depends on the machine)"
        speed = f"{r['virtual'] / r['wall']:.2f}" if not r["failure"] else f"failed: {r['failure'][:60]}"
        print(
            f"| {r['name']} | {r['virtual']:.0f} | {r['wall']:.1f} | {speed} | {r['trainings']} | "
            f"{r['profiles']} | {latency} |"
        )
    print(f"\n{len(exps)} runs in {elapsed:.0f} s of real time (data loading and tracing included).\n")


# --- 3. a sweep on both cores ------------------------------------------------------------------------------------
def sweep(experiment: Path, minutes: float, seeds: list[int], jobs: int, results: Path) -> float:
    """Seconds to run `python -m fedat_sim` once per seed, `jobs` processes at a time."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": os.pathsep.join(sys.path)}
    pending = list(seeds)
    running: list[subprocess.Popen] = []
    start = time.perf_counter()
    while pending or running:
        while pending and len(running) < jobs:
            seed = pending.pop(0)
            cmd = [sys.executable, "-m", "fedat_sim", str(experiment), "--virtual-minutes", str(minutes)]
            cmd += ["--results", str(results), "--seed", str(seed), "--tag", f"j{jobs}-s{seed}"]
            running.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        proc = running.pop(0)
        _, err = proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"{proc.args} failed: {err.decode()[-500:]}")
    return time.perf_counter() - start


def row_sweep(runs: int, minutes: float) -> None:
    """The same `runs` simulations (seeds 0..runs-1) one after another, then two at once."""
    # chaos: small and on nominal step_seconds, so a run's length does not depend on the machine's speed.
    experiment = ROOT / "experiments" / "chaos.yaml"
    with tempfile.TemporaryDirectory() as tmp:
        seq = sweep(experiment, minutes, list(range(runs)), 1, Path(tmp))
        par = sweep(experiment, minutes, list(range(runs)), 2, Path(tmp))
    print(
        f"## 3. Sweep: {runs} × `python -m fedat_sim {experiment.relative_to(ROOT)} --virtual-minutes {minutes:g}` "
        f"(whole processes: TF import, data, tracing), 1 TF thread each\n"
    )
    print("| how | real s | runs/hour |\n|---|---:|---:|")
    print(f"| one after another | {seq:.1f} | {runs * 3600 / seq:.0f} |")
    print(f"| 2 at once | {par:.1f} | {runs * 3600 / par:.0f} |")
    print(f"| **speed-up** | **{seq / par:.2f}×** | |\n")


# --- 4. grouped training ------------------------------------------------------------------------------------------
class GroupedTrainer:
    """k copies of a Sequential Conv2D / MaxPooling2D / Flatten / Dense model trained together, one step for all.

    Conv layers run as one grouped convolution over the clients' channel blocks, dense layers as batched matmuls.
    The objective is the sum of every client's own (mean cross-entropy + λ/2 ||w - anchor||²), so each client's
    gradient is its own, and Keras's Adam is elementwise: stacked moments give k independent Adams.
    """

    def __init__(self, model, k: int, learning_rate: float = 1e-3, batch_size: int = 10) -> None:
        import tensorflow as tf
        from tensorflow import keras

        self.k, self.batch_size, self.lr = k, batch_size, learning_rate
        self.plan = []
        for layer in model.layers:
            if isinstance(layer, keras.layers.Conv2D):
                ok = layer.padding == "valid" and tuple(layer.strides) == (1, 1) and layer.use_bias
                kind = "conv"
            elif isinstance(layer, keras.layers.MaxPooling2D):
                ok, kind = layer.padding == "valid", "pool"
            elif isinstance(layer, keras.layers.Flatten):
                ok, kind = True, "flatten"
            elif isinstance(layer, keras.layers.Dense):
                ok, kind = layer.use_bias, "dense"
            else:
                ok, kind = False, type(layer).__name__
            if not ok:
                raise ValueError(f"layer {layer.name} ({kind}) has no grouped form here")
            self.plan.append((kind, layer))
        self.shapes = [tuple(w.shape) for w in model.weights]
        self.input_shape = tuple(model.input_shape[1:])
        self.vars = [tf.Variable(tf.zeros((k, *s))) for s in self.shapes]
        self.anchor = [tf.Variable(tf.zeros((k, *s)), trainable=False) for s in self.shapes]
        self.m = [tf.Variable(tf.zeros((k, *s)), trainable=False) for s in self.shapes]
        self.v = [tf.Variable(tf.zeros((k, *s)), trainable=False) for s in self.shapes]
        self.lam = tf.Variable(tf.zeros((k,)), trainable=False)
        self.iterations = tf.Variable(0.0, trainable=False)
        self.trace_count = 0
        x_spec = tf.TensorSpec((k, None, *self.input_shape), tf.float32)
        self._epoch = tf.function(self._epoch_impl, input_signature=[x_spec, tf.TensorSpec((k, None), tf.int32)])

    def _forward(self, x):
        import tensorflow as tf

        k, b = self.k, tf.shape(x)[1]
        h, channels = x, False  # channels: activations laid out (b, H, W, k·C), client-major channel blocks
        i = 0
        for kind, layer in self.plan:
            if kind == "conv":
                if not channels:
                    h = tf.transpose(h, [1, 2, 3, 0, 4])
                    h = tf.reshape(h, [b, h.shape[1], h.shape[2], k * h.shape[4]])
                    channels = True
                kern, bias = self.vars[i], self.vars[i + 1]
                _, kh, kw, cin, cout = kern.shape
                f = tf.reshape(tf.transpose(kern, [1, 2, 3, 0, 4]), [kh, kw, cin, k * cout])
                h = layer.activation(tf.nn.conv2d(h, f, 1, "VALID") + tf.reshape(bias, [k * cout]))
                i += 2
            elif kind == "pool":
                h = tf.nn.max_pool2d(h, layer.pool_size, layer.strides, "VALID") if channels else h
            elif kind == "flatten":
                if channels:  # back to (k, b, H·W·C) in Keras's (H, W, C) order per client
                    s = h.shape
                    h = tf.transpose(tf.reshape(h, [b, s[1], s[2], k, s[3] // k]), [3, 0, 1, 2, 4])
                    channels = False
                h = tf.reshape(h, [k, b, -1])
            else:
                h = layer.activation(tf.einsum("kbi,kio->kbo", h, self.vars[i]) + self.vars[i + 1][:, None, :])
                i += 2
        return h

    def _epoch_impl(self, x, y):
        import tensorflow as tf

        self.trace_count += 1
        n = tf.shape(x)[1]
        total = tf.zeros((self.k,))
        for lo in tf.range(0, n, self.batch_size):
            xb, yb = x[:, lo : lo + self.batch_size], y[:, lo : lo + self.batch_size]
            with tf.GradientTape() as tape:
                ce = tf.reduce_mean(
                    tf.nn.sparse_softmax_cross_entropy_with_logits(labels=yb, logits=self._forward(xb)), axis=1
                )
                prox = tf.add_n(
                    [
                        tf.reduce_sum(tf.square(v - a), axis=list(range(1, v.shape.rank)))
                        for v, a in zip(self.vars, self.anchor, strict=True)
                    ]
                )
                objective = tf.reduce_sum(ce + 0.5 * self.lam * prox)
            grads = tape.gradient(objective, self.vars)
            # Keras 3 Adam's update, elementwise (beta 0.9 / 0.999, epsilon 1e-7).
            self.iterations.assign_add(1.0)
            alpha = self.lr * tf.sqrt(1 - tf.pow(0.999, self.iterations)) / (1 - tf.pow(0.9, self.iterations))
            for var, g, m, v in zip(self.vars, grads, self.m, self.v, strict=True):
                m.assign_add((g - m) * (1 - 0.9))
                v.assign_add((tf.square(g) - v) * (1 - 0.999))
                var.assign_sub(m * alpha / (tf.sqrt(v) + 1e-7))
            total += ce * tf.cast(tf.shape(yb)[1], tf.float32)
        return total / tf.cast(n, tf.float32)

    def train(self, weights, xs, ys, *, epochs: int, prox_lambda: float, seeds: list[int]):
        """Train k clients from their own `weights` (also their anchors); same data order as `LocalTrainer.train`."""
        n = len(xs[0])
        if any(len(x) != n for x in xs):
            raise ValueError("grouped clients must hold the same number of samples")
        for i, var in enumerate(self.vars):
            stacked = np.stack([w[i] for w in weights]).astype(np.float32)
            var.assign(stacked)
            self.anchor[i].assign(stacked)
        for s in self.m + self.v:
            s.assign(np.zeros(s.shape, np.float32))
        self.iterations.assign(0.0)
        self.lam.assign(np.full(self.k, prox_lambda, np.float32))
        rngs = [np.random.default_rng(s) for s in seeds]
        for _ in range(epochs):
            perms = [r.permutation(n) for r in rngs]
            self._epoch(
                np.stack([x[p] for x, p in zip(xs, perms, strict=True)]),
                np.stack([y[p] for y, p in zip(ys, perms, strict=True)]),
            )
        return [[var[j].numpy() for var in self.vars] for j in range(self.k)]


def max_diff(a: list[list[np.ndarray]], b: list[list[np.ndarray]]) -> float:
    """Largest absolute difference between two clients-by-layers lists of weights."""
    return max(float(np.max(np.abs(p - q))) for wa, wb in zip(a, b, strict=True) for p, q in zip(wa, wb, strict=True))


def grouped_case(model_name: str, shape: tuple, classes: int, n: int, k: int, exp: Experiment, repeats: int) -> str:
    """One table row: k synthetic clients of `n` samples on `model_name`, one by one vs grouped vs the bound."""
    from fedat_worker.models import build_model
    from fedat_worker.trainer import LocalTrainer

    s = exp.settings
    epochs, lam, bs, lr = int(s["epochs"]), float(s["prox_lambda"]), int(s["batch_size"]), float(s["learning_rate"])
    model = build_model(model_name, shape, classes, seed=0)
    trainer = LocalTrainer(model, learning_rate=lr, batch_size=bs)
    grouped = GroupedTrainer(model, k, lr, bs)
    w0 = model.get_weights()
    rng = np.random.default_rng(0)
    xs = [rng.random((n, *shape), dtype=np.float32) for _ in range(k)]
    ys = [rng.integers(0, classes, n).astype(np.int32) for _ in range(k)]
    seeds = list(range(k))

    def one(xs: list = xs, ys: list = ys, epochs: int = epochs) -> list:
        return [
            trainer.train(w0, x, y, epochs=epochs, prox_lambda=lam, seed=sd).weights
            for x, y, sd in zip(xs, ys, seeds, strict=True)
        ]

    def together(xs: list = xs, ys: list = ys, epochs: int = epochs) -> list:
        return grouped.train([w0] * k, xs, ys, epochs=epochs, prox_lambda=lam, seeds=seeds)

    def bound() -> None:
        x, y = np.concatenate(xs), np.concatenate(ys)
        trainer.train(w0, x, y, epochs=epochs, prox_lambda=lam, seed=0, batch_size=k * bs)

    # One step: one batch of exactly `bs` samples per client, one epoch; also traces both.
    first = [x[:bs] for x in xs], [y[:bs] for y in ys]
    step_diff = max_diff(one(*first, epochs=1), together(*first, epochs=1))
    ref = one()
    full_diff = max_diff(ref, together())
    # Float noise floor: one by one again from w0 nudged by one float32 ulp; training amplifies any rounding.
    nudged = [np.nextafter(w, np.float32(np.inf)) for w in w0]
    floor = max_diff(
        ref,
        [
            trainer.train(nudged, x, y, epochs=epochs, prox_lambda=lam, seed=sd).weights
            for x, y, sd in zip(xs, ys, seeds, strict=True)
        ],
    )
    change = max_diff(ref, [w0] * k)
    bound()
    times: dict[str, list[float]] = {"one": [], "grouped": [], "bound": []}
    for _ in range(repeats):  # interleaved, so that drift of the machine's load hits all three alike
        times["one"].append(timed(one))
        times["grouped"].append(timed(together))
        times["bound"].append(timed(bound))
    t1, tg, tb = (statistics.median(times[key]) for key in ("one", "grouped", "bound"))
    return (
        f"| {model_name} ({n} samples) | {t1:.2f} | {tg:.2f} | **{t1 / tg:.2f}×** | {tb:.2f} ({t1 / tb:.2f}×) | "
        f"{step_diff:.1e} | {full_diff:.1e} | {floor:.1e} | {change:.1e} |"
    )


def row_grouped(k: int, repeats: int) -> None:
    """One round's k clients (the main experiment's CNN; the tweets' logistic regression) grouped vs one by one."""
    exp = load_experiment(MAIN)
    s = exp.settings
    print(
        f"## 4. Grouped training: {k} clients (a round), E={s['epochs']}, batch {s['batch_size']}, Adam, "
        f"λ={s['prox_lambda']}, same initial weights and data order, one thread, median of {repeats}, interleaved\n"
    )
    print(
        "| model | one by one (s) | grouped (s) | **speed-up** | bound: one model, batch "
        f"{k}×{s['batch_size']} (s) | max abs diff, 1 step | max abs diff, full | "
        "noise floor: one by one from w0 + 1 ulp, full | max abs weight change |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    # A client of each shipped workload: FMNIST #2 (480 samples), tweets (~305, hashed bag of words of 4,096).
    print(grouped_case("cnn", (28, 28, 1), 10, 480, k, exp, repeats))
    print(grouped_case("logreg", (4096,), 3, 305, k, exp, repeats))
    print(
        "\nThe bound trains one shared model on all clients' samples at a batch k times larger: the most any "
        "grouping could gain.\nThe simulator would adopt grouped training only where it is >= 1.3× faster.\n"
    )


# --- 5. one run on more cores -------------------------------------------------------------------------------------
def simulated(experiment: Path, minutes: float, processes: int, results: Path) -> float:
    """Seconds of one whole `python -m fedat_sim` run training in `processes` processes."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = [sys.executable, "-m", "fedat_sim", str(experiment), "--virtual-minutes", str(minutes)]
    cmd += ["--results", str(results), "--tag", f"p{processes}", "--processes", str(processes)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    if proc.returncode:
        raise RuntimeError(f"{cmd} failed: {proc.stderr.decode()[-500:]}")
    return time.perf_counter() - start


def row_pool(minutes: float, processes: int) -> None:
    """The main experiment for `minutes` virtual minutes, training in one process, then in `processes`."""
    with tempfile.TemporaryDirectory() as tmp:
        one = simulated(MAIN, minutes, 1, Path(tmp))
        pool = simulated(MAIN, minutes, processes, Path(tmp))
        same = (Path(tmp) / "p1" / "events.jsonl").read_bytes() == (
            Path(tmp) / f"p{processes}" / "events.jsonl"
        ).read_bytes()
        trainings = json.loads((Path(tmp) / "p1" / "summary.json").read_text())["client_trainings"]
    print(
        f"## 5. One run on more cores: `python -m fedat_sim {MAIN.relative_to(ROOT)} --virtual-minutes {minutes:g}` "
        f"({trainings} trainings; whole processes: TF import, data, tracing)\n"
    )
    print("| trains in | real s | events |\n|---|---:|---|")
    print(f"| its own process | {one:.1f} | |")
    print(f"| a pool of {processes} processes | {pool:.1f} | {'the same' if same else '**DIFFERENT**'} |")
    print(f"| **speed-up** | **{one / pool:.2f}×** (target >= 1.5× on {processes} free cores) | |\n")


def main(argv: list[str] | None = None) -> None:
    """Run the five rows and print their tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--virtual-minutes", type=float, default=1.0, help="row 1: virtual minutes per simulation")
    parser.add_argument("--repeats", type=int, default=2, help="row 1: simulations (and bare runs), interleaved")
    parser.add_argument("--bare", type=int, default=20, help="row 1: clients trained by the bare trainer per repeat")
    parser.add_argument("--cap", type=float, default=15.0, help="row 2: real seconds per experiment at most")
    parser.add_argument("--sweep-runs", type=int, default=4, help="row 3: simulations in the sweep")
    parser.add_argument("--sweep-minutes", type=float, default=0.25, help="row 3: virtual minutes per simulation")
    parser.add_argument("--group", type=int, default=10, help="row 4: clients trained together")
    parser.add_argument("--group-repeats", type=int, default=3, help="row 4: timed repeats")
    parser.add_argument("--pool-minutes", type=float, default=3.0, help="row 5: virtual minutes of the run")
    parser.add_argument("--pool-processes", type=int, default=2, help="row 5: processes in the pool")
    parser.add_argument("--rows", default="12345", help="which rows to run")
    args = parser.parse_args(argv)
    import logging

    logging.basicConfig(level=logging.ERROR)  # a simulation's log is for errors only
    if "1" in args.rows:
        row_simulation_vs_bare(args.virtual_minutes, args.repeats, args.bare)
    if "2" in args.rows:
        row_virtual_speed(args.cap, 2)
    if "3" in args.rows:
        row_sweep(args.sweep_runs, args.sweep_minutes)
    if "4" in args.rows:
        row_grouped(args.group, args.group_repeats)
    if "5" in args.rows:
        row_pool(args.pool_minutes, args.pool_processes)


if __name__ == "__main__":
    main()
