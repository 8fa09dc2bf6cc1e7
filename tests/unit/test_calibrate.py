"""Calibrating the latency model to the machine: the closed form (the plan's first guess), the demand model that
queues the training on the worker processes, the CPU accounting."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedat.deploy.experiment import Experiment, load_experiment
from fedat.fl.latency import ClientProfile, StragglerProfile, client_profiles
from fedat.lab import calibrate as cal
from fedat.lab.utilisation import Sample, proc_cpu_seconds, train_seconds_total, worker_utilisation
from fedat.runtime import config

ROOT = Path(__file__).resolve().parents[2]
FMNIST2 = ROOT / "experiments" / "fmnist2-fedat.yaml"


def fmnist2(step_seconds: float = 0.009, unstable: int = 10) -> tuple[ClientProfile, ...]:
    d = (0, 0, 0, 5, 6, 10, 11, 15, 20, 30)
    p = StragglerProfile(0.1, tuple(zip(d[::2], d[1::2], strict=True)), (100, 250), unstable, step_seconds=step_seconds)
    return client_profiles(100, p, seed=0)


def calibrated(measured: float = 0.0035, target: float = 0.9, time_scale: float = 0.1, **kw) -> cal.Calibration:
    args = dict(step_seconds=0.009, capacity=2.0, num_tiers=5, clients_per_round=10)
    return cal.calibrate(
        kw.pop("profiles", fmnist2()), [144] * 100, measured, time_scale=time_scale, target=target, **{**args, **kw}
    )


def test_a_round_lasts_as_long_as_its_slowest_client():
    low, high = np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.0, 2.0, 3.0, 4.0])
    assert cal.tier_round_seconds(low, high, ((0, 1), (2, 3)), clients_per_round=2) == (2.0, 4.0)
    # one client of two at random: the mean of the two
    assert cal.tier_round_seconds(low, high, ((0, 1),), clients_per_round=1)[0] == pytest.approx(1.5, abs=0.05)


def test_a_rounds_delay_draw_is_uniform_within_the_group():
    low, high = np.zeros(3), np.ones(3)
    # E[max of k uniform(0, 1)] = k / (k + 1)
    assert cal.tier_round_seconds(low, high, ((0, 1, 2),), 3)[0] == pytest.approx(0.75, abs=0.02)
    assert cal.tier_round_seconds(low, high, ((0, 1, 2),), 1)[0] == pytest.approx(0.5, abs=0.02)


def test_demand_is_each_tiers_trainings_per_round_over_its_round_time():
    rate, busy = cal.worker_demand((4.0, 8.0), ((0, 1, 2), (3, 4)), 2, [1.0, 1.0, 1.0, 3.0, 3.0])
    assert rate == pytest.approx(2 / 4 + 2 / 8)
    assert busy == pytest.approx(2 * 1.0 / 4 + 2 * 3.0 / 8)


def test_tiers_are_cut_by_expected_latency_fastest_first():
    assert cal.expected_tiers([5.0, 1.0, 3.0, 2.0], 2) == ((1, 3), (2, 0))


def test_at_the_calibrated_time_scale_the_model_meets_the_target():
    c = calibrated()
    again = calibrated(time_scale=c.time_scale)
    assert again.reference_utilisation == pytest.approx(0.9, rel=1e-9)
    assert again.time_scale == pytest.approx(c.time_scale)


def test_a_slower_machine_or_a_lower_target_stretches_time_by_the_same_factor():
    c = calibrated(0.0035)
    assert calibrated(0.007).time_scale == pytest.approx(2 * c.time_scale)
    assert calibrated(0.0035, target=0.45).time_scale == pytest.approx(2 * c.time_scale)
    assert calibrated(0.0035, capacity=4.0).time_scale == pytest.approx(c.time_scale / 2)


def test_calibration_keeps_the_tiers_speed_ratios():
    c = calibrated()
    ratios = np.array(c.round_seconds) / c.round_seconds[0]
    reference = np.array(calibrated(time_scale=c.time_scale * 3).round_seconds)
    assert np.allclose(reference / reference[0], ratios)
    assert list(c.round_seconds) == sorted(c.round_seconds)  # tier 1 fastest
    assert c.factor == pytest.approx(c.time_scale / 0.1)


def test_with_measured_training_times_the_probe_sets_the_latencies_too():
    profiles = fmnist2(step_seconds=0.0)
    slow = calibrated(0.007, profiles=profiles, step_seconds=0.0)
    fast = calibrated(0.0035, profiles=profiles, step_seconds=0.0)
    assert calibrated(0.007, profiles=profiles, step_seconds=0.0, time_scale=slow.time_scale).reference_utilisation == (
        pytest.approx(0.9)
    )
    # Work and latency grow together, but the delays do not: a slower machine needs a smaller scale than 2x.
    assert fast.time_scale < slow.time_scale < 2 * fast.time_scale


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"measured": 0.0}, "measured seconds per step"),
        ({"target": 0.0}, "target utilisation"),
        ({"time_scale": 0.0}, "time_scale must be > 0"),
        ({"capacity": 0.0}, "capacity > 0"),
    ],
)
def test_impossible_inputs_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        calibrated(**kw)


def test_helpers():
    assert cal.worker_capacity(2, 2) == 2.0 and cal.worker_capacity(16, 2) == 2.0 and cal.worker_capacity(1, 8) == 1.0


def test_the_latency_model_is_read_from_the_experiments_variables():
    exp = load_experiment(FMNIST2)
    profile = config.latency(exp.env())
    assert profile.step_seconds == exp.settings["step_seconds"] and profile.time_scale == exp.settings["time_scale"]
    assert profile.delays[-1] == (20.0, 30.0) and profile.device_factor == tuple(exp.settings["device_factor"])
    with pytest.raises(config.ConfigError, match="FEDAT_DELAYS must list lo,hi pairs"):
        config.latency({"FEDAT_DELAYS": "0,1,2"})


def test_only_fedat_run_calibrates_comparisons_and_simulations_keep_the_files_time_scale():
    from fedat.lab.compare_run import load_comparison

    assert load_experiment(FMNIST2).calibrate == 0.9
    assert load_experiment(FMNIST2).settings["time_scale"] == 0.1
    _, _, _, exps = load_comparison(ROOT / "experiments" / "compare-fmnist2.yaml")
    assert exps and all(e.calibrate == 0.0 and e.settings["time_scale"] == 0.1 for e in exps)


def test_a_calibration_target_out_of_range_is_named(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ncalibrate: 5\nsettings: {epochs: 3}\n")
    with pytest.raises(ValueError, match="calibrate is the workers' target utilisation"):
        load_experiment(bad)


def demand(cost: float, workers: int = 2, minutes: float = 3.0, settings: dict | None = None, **kw):
    """The demand model on FMNIST #2 at the file's time scale (and `settings`), each training `cost` seconds a step."""
    from fedat_sim.demand import measure

    exp = load_experiment(FMNIST2)
    changed = {**exp.settings, **(settings or {})}
    return measure(Experiment(exp.name, workers, minutes, changed), [480] * 100, cost, **kw)


def test_workers_fast_enough_answer_every_task_at_its_modelled_time():
    d = demand(1e-5)
    assert d.update_times and not d.late_times
    assert all(t is not None and t < 90 for t in d.first_merge) and d.profiled_at < min(d.first_merge)
    assert d.busy_seconds < 0.01 * 2 * d.horizon_seconds
    assert d.steps == d.trainings * 144 and 0 < d.window_seconds < d.horizon_seconds == 180.0


def test_training_queues_for_the_worker_processes_and_comes_late_when_they_cannot_keep_up():
    slow = demand(0.02, minutes=6.0)  # 2.9 s a training: more than two processes can do
    assert len(slow.late_times) > 0.8 * len(slow.update_times)
    assert slow.busy_seconds > 0.95 * 2 * slow.horizon_seconds
    # the profiling pass waits for the workers too: no sooner than its 100 one-epoch tasks take two of them
    profiling_work = 100 * 48 * 0.02 / 2
    assert slow.profiled_at >= profiling_work - 1e-6 > demand(1e-5).profiled_at
    one, two = demand(0.004, workers=1), demand(0.004, workers=2)
    assert len(one.late_times) / len(one.update_times) > len(two.late_times) / len(two.update_times)


def test_evaluations_take_the_workers_time_too():
    plain, evaluated = demand(0.001), demand(0.001, evaluation_seconds=2.0)
    assert evaluated.evaluations > 5
    assert evaluated.busy_seconds == pytest.approx(plain.busy_seconds + 2.0 * evaluated.evaluations, rel=0.05)


def test_a_trial_stops_once_every_tier_has_merged_enough_rounds():
    d = demand(1e-5, minutes=30.0, stop_after_rounds=3)
    assert min(d.rounds) >= 3 and d.horizon_seconds < 30 * 60
    assert demand(1e-5, minutes=30.0, max_trainings=50).horizon_seconds < d.horizon_seconds


def test_the_codec_changes_no_time_in_the_demand_model():
    """The plan's trials send models raw (cheaper); the times are the ones the experiment's polyline would give."""
    assert load_experiment(FMNIST2).settings.get("codec", "polyline") == "polyline"
    polyline = demand(0.015, minutes=4.0, evaluation_seconds=3.0)
    raw = demand(0.015, minutes=4.0, settings={"codec": "raw"}, evaluation_seconds=3.0)
    assert len(raw.update_times) > 100 and raw.late_times  # enough answers, some late: the times are exercised
    assert raw.update_times == polyline.update_times and raw.late_times == polyline.late_times
    assert raw.first_merge == polyline.first_merge and raw.busy_seconds == polyline.busy_seconds


def test_cpu_seconds_come_from_proc_stat_even_with_odd_command_names():
    fields = ["S", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "250", "50"] + ["0"] * 30
    stat = "4242 (python -m (x)) " + " ".join(fields)
    assert proc_cpu_seconds(stat, 100) == pytest.approx(3.0)


def test_training_seconds_are_summed_over_tiers():
    text = "\n".join(
        [
            "# HELP fedat_client_train_seconds Wall time of one local training",
            'fedat_client_train_seconds_bucket{le="0.5",tier="1"} 3.0',
            'fedat_client_train_seconds_sum{tier="0"} 1.5',
            'fedat_client_train_seconds_sum{tier="1"} 2.25',
            'fedat_client_train_seconds_count{tier="1"} 4.0',
        ]
    )
    assert train_seconds_total(text) == pytest.approx(3.75)


def test_worker_utilisation_is_cpu_and_training_seconds_per_wall_second():
    start = Sample(100.0, {"worker-0": 10.0, "worker-1": 5.0}, {"worker-0": 1.0, "worker-1": None})
    end = Sample(200.0, {"worker-0": 90.0, "worker-1": 65.0}, {"worker-0": 86.0, "worker-1": 50.0})
    u = worker_utilisation(start, end)
    assert u["per_worker"] == {"worker-0": 0.8, "worker-1": 0.6} and u["mean"] == 0.7
    assert u["training_per_worker"] == {"worker-0": 0.85, "worker-1": None} and u["training_mean"] == 0.85
    assert u["window_seconds"] == 100.0
