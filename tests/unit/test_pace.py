"""A calibrated run that falls behind its latency model changes its time scale (`fedat.lab.pace`)."""

from __future__ import annotations

import pytest

from fedat.lab import pace as pc
from fedat.lab.utilisation import Sample


def sample(at: float, cpu: float, train: float) -> Sample:
    return Sample(at, {"worker-0": cpu, "worker-1": cpu}, {"worker-0": train, "worker-1": train})


def test_the_cpu_a_training_got_comes_from_the_workers_samples():
    assert pc.cpu_per_training_second(sample(0, 10, 10), sample(60, 25, 60)) == pytest.approx(0.3)
    assert pc.cpu_per_training_second(None, sample(60, 25, 60)) is None
    assert pc.cpu_per_training_second(sample(0, 10, 10), sample(1, 10.1, 10.2)) is None  # too little to say
    gone = Sample(60, {"worker-0": None, "worker-1": 25}, {"worker-0": 50, "worker-1": 60})
    assert pc.cpu_per_training_second(sample(0, 10, 10), gone) == pytest.approx(0.3)


def test_a_change_is_due_only_in_the_early_part_of_the_budget_and_at_most_twice():
    p = pc.Pace(0.1, 600.0, 0.9, since=sample(0, 0, 0))
    now = sample(100, 15, 50)  # 0.3 of a core per training second
    assert p.due(100, 5, 100, now) is None  # keeps up
    assert p.due(60, 40, 100, now) is None  # still in the first fifth: profiling and the first rounds
    assert p.due(400, 40, 100, now) is None  # past 60 % of the budget: too late to change
    new, why = p.due(130, 40, 100, now)
    assert new == pytest.approx(0.3) and "40% (40 of 100)" in why and "since the start" in why and "0.30" in why
    p.changes.append({"at_seconds": 130.0, "from": 0.1, "to": new, "why": why})
    p.time_scale, p.late, p.updates = new, 40, 100
    assert p.due(200, 43, 140, now) is None  # since the change: 3 of 40 late
    again = p.due(250, 70, 140, now)
    assert again is not None and "since 2:10" in again[1]
    p.changes.append({"at_seconds": 250.0})
    assert p.due(300, 200, 400, now) is None  # two changes at most


def test_no_change_is_due_when_the_workers_would_restart_too_late_to_follow_it():
    p = pc.Pace(0.1, 600.0, 0.9, since=sample(0, 0, 0), restart_seconds=100.0)
    now = sample(100, 15, 50)
    assert p.due(260, 40, 100, now) is not None  # running again at 360 s: 60 % of the budget
    assert p.due(261, 40, 100, now) is None  # not before 361 s: too little of the run would follow the new scale


class FakeSupervisor:
    """Records what restart_workers asks of a supervisor."""

    def __init__(self, names):
        self.procs = {n: type("Proc", (), {"env": {"FEDAT_TIME_SCALE": "0.1"}})() for n in names}
        self.calls: list[tuple[str, str]] = []

    def stop(self, names):
        self.calls += [("stop", n) for n in names]

    def restart(self, name):
        self.calls.append(("restart", name))

    def wait_until(self, ready, timeout, what):
        self.calls.append(("wait", what))


def test_workers_restart_one_at_a_time_with_the_new_scale(monkeypatch):
    monkeypatch.setattr(pc, "reports_connected", lambda port: True)
    sup = FakeSupervisor(["worker-0", "worker-1"])
    pc.restart_workers(sup, {"worker-0": 1, "worker-1": 2}, ["worker-0", "worker-1"], 0.25)
    assert all(p.env["FEDAT_TIME_SCALE"] == "0.25" for p in sup.procs.values())
    assert sup.calls == [
        ("stop", "worker-0"),
        ("restart", "worker-0"),
        ("wait", "worker-0 to reconnect"),
        ("stop", "worker-1"),
        ("restart", "worker-1"),
        ("wait", "worker-1 to reconnect"),
    ]
