"""Adding a strategy is one file and one registry line: its settings reach the environment reader, the experiment
file's allowed keys and the docs table, and it runs in the services (here under the simulator) unchanged."""

from __future__ import annotations

import json

import pytest

from fedat.deploy.experiment import Experiment, check_settings
from fedat.errors import ConfigError
from fedat.fl.strategies import REGISTRY, Entry, settings_table
from fedat.runtime import config
from fedat_sim import fakes
from fedat_sim.simulate import simulate
from tests.unit.toy_strategy import HalfWay


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(REGISTRY, "toy", Entry(HalfWay))  # the one registry line


def test_its_settings_are_read_checked_allowed_and_documented(toy):
    assert config.strategy({"FEDAT_STRATEGY": "toy", "FEDAT_TOY_STEP": "0.25"}) == HalfWay(toy_step=0.25)
    with pytest.raises(ConfigError, match="FEDAT_TOY_STEP"):
        config.strategy({"FEDAT_STRATEGY": "toy", "FEDAT_TOY_STEP": "1.5"})
    assert check_settings({"strategy": "toy", "toy_step": 0.25}, "toy.yaml")
    assert "| `toy_step` | 0.5 | > 0, ≤ 1 | toy |" in settings_table()


def test_without_the_registry_line_it_does_not_exist():
    with pytest.raises(ConfigError, match="FEDAT_STRATEGY='toy'"):
        config.strategy({"FEDAT_STRATEGY": "toy"})
    with pytest.raises(ValueError, match="toy_step"):
        check_settings({"toy_step": 0.25}, "toy.yaml")


def test_it_runs_in_the_services(toy, tmp_path, monkeypatch):
    import fedat.lab.plots

    monkeypatch.setattr(fedat.lab.plots, "plot_run", lambda folder: None)
    settings = {
        "strategy": "toy",
        "toy_step": 0.25,
        "num_clients": 8,
        "num_tiers": 2,
        "clients_per_round": 2,
        "min_clients": 1,
        "epochs": 1,
        "step_seconds": 0.01,
        "delays": [0, 0, 1, 2],
        "time_scale": 1.0,
        "eval_interval": 5,
        "eval_every": 0,
        "seed": 0,
    }
    exp = Experiment("toy", 1, 1.0, check_settings(settings, "toy"))
    # 12 virtual seconds: tier 1 (no delay) merges ~500 rounds, tier 2 (1-2 s) ~5; a minute is 30,000
    # deliveries and adds nothing to what is checked.
    summary = simulate(exp, tmp_path, 0.2, parts=fakes.fake_parts(8, 20), tag="sim")
    assert summary["failure"] is None and summary["handler_errors"] == 0
    assert min(summary["tier_rounds"]) >= 3  # both tiers merge, so both tiers' weights are checked
    globals_ = [json.loads(x) for x in (tmp_path / "sim" / "events.jsonl").read_text().splitlines()]
    weights = [e["tier_weights"] for e in globals_ if e["event"] == "global" and e["version"] >= 2]
    assert weights and all(sorted(w) == [0.0, 0.25] for w in weights)  # every merge moved a quarter of the way
