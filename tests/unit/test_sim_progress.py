"""A sweep's runs say how far they are and how long they still need, at most once per interval of wall time, and
skip a run another sweep has filed meanwhile."""

from __future__ import annotations

import json

from fedat_sim.compare import Progress, _duration, filed


class FakeWall:
    """A wall clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_progress_reports_the_rate_so_far_once_per_interval(capsys):
    wall = FakeWall()
    report = Progress("fedat seed 1", 45, every=600, clock=wall)
    wall.now += 599
    report(3.0)
    assert capsys.readouterr().out == ""  # not yet an interval
    wall.now += 601  # 20 wall minutes for 5 virtual: 40 virtual minutes still need 160 wall minutes
    report(5.0)
    assert capsys.readouterr().out == (
        "[fedat compare --simulate] fedat seed 1: 5.0 of 45 virtual min after 20 min; "
        "about 2 h 40 min to go at this rate\n"
    )
    wall.now += 300
    report(6.0)
    assert capsys.readouterr().out == ""  # the interval counts from the last report


def test_progress_every_zero_is_silent(capsys):
    wall = FakeWall()
    report = Progress("tifl seed 0", 30, every=0, clock=wall)
    wall.now += 10_000
    report(10.0)
    assert capsys.readouterr().out == ""


def test_durations_read_as_people_say_them():
    assert [_duration(s) for s in (40, 59.4, 60, 725, 3600, 11_100)] == [
        "40 s",
        "59 s",
        "1 min",
        "12 min",
        "1 h 00 min",
        "3 h 05 min",
    ]


def test_a_run_filed_by_another_sweep_at_least_as_long_is_not_run_again(tmp_path):
    from fedat.lab import sweep

    out = sweep.record_path(tmp_path, "cmp", "fedat", 1)
    assert filed(tmp_path, "cmp", "fedat", 1, 30.0) is None
    out.parent.mkdir(parents=True)
    out.write_text(json.dumps({"virtual_minutes": 30.0, "seed": 1}))
    assert filed(tmp_path, "cmp", "fedat", 1, 30.0) == {"virtual_minutes": 30.0, "seed": 1}
    assert filed(tmp_path, "cmp", "fedat", 1, 60.0) is None  # shorter than this sweep's run: it runs
    assert filed(tmp_path, "cmp", "fedat", 2, 30.0) is None
