"""`fedat simulate`: one experiment in virtual time, written to the same results folder as `fedat run`.

The folder holds `experiment.json` (with a `simulated` section), `events.jsonl` written by the production recorder,
`summary.json` from `fedat.lab.run.summarize` (plus the simulation's own counts) and the plots. `events.jsonl` has no
wall-clock field: its times are virtual seconds since the profiling pass began, so the same experiment and seed give
the same file byte for byte, as long as latencies use the nominal `step_seconds` (with measured training time the
virtual schedule follows how long each real training took, which varies from run to run).
"""

from __future__ import annotations

import json
import random
import resource
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pika

from fedat.deploy.experiment import Experiment, load_experiment
from fedat.lab.recorder import RunState
from fedat.lab.run import summarize
from fedat.protocol import topology
from fedat.runtime import config
from fedat_sim.clients import Parts, TensorflowRecipe
from fedat_sim.clock import Clock, Livelock
from fedat_sim.memory import MemoryBroker
from fedat_sim.pool import PoolBroken, PoolTrainer, Recipe
from fedat_sim.shell import ServiceDied
from fedat_sim.system import System, secret_for
from fedat_worker.workload import workload_from_env

STOP_GRAIN = 30.0  # virtual seconds between looks at `stop`


def stop_on_sigterm() -> Callable[[], bool]:
    """A stop flag raised by SIGTERM: the run in progress ends early as the folder of a shorter run."""
    flag = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: flag.set())
    return flag.is_set


def _experiment(experiment: Experiment | str | Path, seed: int | None) -> Experiment:
    exp = experiment if isinstance(experiment, Experiment) else load_experiment(experiment)
    return exp if seed is None else replace(exp, settings={**exp.settings, "seed": seed})


def cpu_seconds() -> float:
    """CPU seconds of this process and of its child processes that have ended (a pool's, once it is closed)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def simulate(
    experiment: Experiment | str | Path,
    results_dir: str | Path,
    virtual_minutes: float | None = None,
    seed: int | None = None,
    *,
    parts: Parts | Recipe | None = None,
    tag: str = "",
    workers: int = 1,
    signed: bool = True,
    stop: Callable[[], bool] | None = None,
    progress: Callable[[float], None] | None = None,
    plots: bool = True,
    processes: int = 1,
    durable: bool = True,
) -> dict:
    """Run `experiment` for `virtual_minutes` (default: its `minutes`) of virtual time; return its summary.

    `seed` replaces the experiment's `seed` setting (partition, model, client selection, delays) and seeds the
    clock's tie-breaking. `parts` replaces the experiment's data and model (tests use `fedat_sim.fakes`), or builds
    them (a picklable recipe). `processes` > 1 trains in that many other processes (`fedat_sim.pool`; it needs a
    nominal `step_seconds`, and a recipe for custom parts): the same run on more cores. If `stop()`
    turns true, the run ends at the next whole STOP_GRAIN of virtual time and its folder is that shorter run's:
    everything up to then happened exactly as in the full run (the simulation is deterministic). `progress` is
    called with the virtual minutes done after every STOP_GRAIN. `plots=False` leaves out the figures.
    `durable=False` saves no service state: the same run with less work, for a caller that only counts what it did.
    """
    exp = _experiment(experiment, seed)
    seed = int(exp.settings.get("seed", 0))
    minutes = exp.minutes if virtual_minutes is None else float(virtual_minutes)
    run_id = tag or f"{time.strftime('%Y%m%d-%H%M%S')}-{exp.name}-sim-{uuid.uuid4().hex[:4]}"
    out = Path(results_dir) / run_id
    out.mkdir(parents=True)
    planned = minutes

    def describe(ran: float) -> None:
        simulated = {"virtual_minutes": ran, "seed": seed, "worker_processes": workers, "training_processes": processes}
        if ran < planned:
            simulated["planned_minutes"] = planned  # stopped early: this folder is the `ran`-minute run
        meta = {"name": exp.name, "workers": exp.workers, "minutes": ran, "settings": exp.settings}
        (out / "experiment.json").write_text(json.dumps({**meta, "simulated": simulated}, indent=2))

    nominal = bool(float(exp.settings.get("step_seconds") or 0))
    if processes > 1 and not nominal:
        raise ValueError(
            f"{exp.name}: training in {processes} processes needs a nominal step_seconds (without one, when an "
            "update answers depends on how long its training took, so it cannot train while virtual time goes on)"
        )
    if processes > 1 and isinstance(parts, Parts):
        raise ValueError("training in several processes builds the parts in each: give a recipe, not built parts")
    describe(minutes)
    if not nominal:
        print(
            f"[fedat simulate] {exp.name} sets no step_seconds: latencies follow each training's measured time, so "
            "this run is not reproducible event for event (give a nominal step_seconds for that)",
            flush=True,
        )
    wall0 = time.perf_counter()  # for summary.json's wall_seconds only; the simulation never reads it
    cpu0 = cpu_seconds()  # the compute a run cost, whatever else shared the machine
    env = exp.env()
    recipe = parts if callable(parts) else None
    if parts is None:
        recipe = TensorflowRecipe(workload_from_env(env), config.get_int(env, "FEDAT_TF_THREADS", 1))
    built = recipe() if recipe is not None else parts
    assert isinstance(built, Parts)
    pool = PoolTrainer(built, recipe, processes) if processes > 1 and recipe is not None else None
    if pool is not None:
        built = replace(built, trainer=pool)
    clock = Clock(rng=random.Random(seed))
    broker = MemoryBroker(clock)
    trainings: Counter[str] = Counter()

    def count(exchange: str, routing_key: str, body: bytes, properties: pika.BasicProperties) -> None:
        if exchange == topology.RESULTS:
            trainings[routing_key] += 1

    broker.taps.append(count)
    state = RunState(started_at=clock.now)  # events.jsonl's clock starts with the profiling pass, as in fedat run
    failure = None
    with open(out / "events.jsonl", "w") as events:
        secret = secret_for(seed) if signed else None
        system = System(exp, built, clock, broker, state, events, workers, secret, durable)
        try:
            system.start()
            end = clock.now + minutes * 60.0
            while clock.now < end:
                clock.run(min(end, clock.now + STOP_GRAIN))
                if progress is not None:
                    progress((clock.now - state.started_at) / 60.0)
                if stop is not None and stop() and clock.now < end:
                    minutes = (clock.now - state.started_at) / 60.0
                    describe(minutes)
                    break
        except (ServiceDied, Livelock, PoolBroken) as exc:
            failure = str(exc)
        finally:
            system.stop()
            if pool is not None:
                pool.close()
    summary = summarize(exp, state, time.perf_counter() - wall0)
    summary.update(
        {
            "failure": failure,
            "run_dir": str(out),
            "simulated": True,
            "virtual_seconds": minutes * 60.0,
            "seed": seed,
            "client_trainings": sum(n for k, n in trainings.items() if k != topology.PROFILE_KEY),
            "profile_trainings": trainings[topology.PROFILE_KEY],
            "events_run": clock.events_run,
            "cpu_seconds": round(cpu_seconds() - cpu0, 1),  # the pool's processes included: closed above
            **system.counts(),
        }
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    if not plots:
        return summary
    try:
        from fedat.lab.plots import plot_run

        plot_run(out)
    except ImportError:
        pass  # plots are optional (matplotlib), as in fedat run
    return summary
