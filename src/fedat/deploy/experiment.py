"""An experiment file: a name, how many worker processes, how long, and the FEDAT_* settings every service shares."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fedat.fl.strategies import setting_bounds

# What an experiment may set: every FEDAT_* variable the services read (lower-cased, without the prefix), except
# the ones a launcher sets per process. A typo must fail loudly, not run the default silently. The strategies'
# own settings come from their declared parameters.
SERVICE_SETTINGS = frozenset(
    """app batch_size classes_per_client clients clients_per_round codec data_root dataset deadline_factor delays
    device_factor dirichlet_alpha drift_fraction drop_window epochs eval_anchor eval_every eval_interval
    eval_whole_every eval_window ewma_alpha group_sizes
    learning_rate log_level max_message_bytes max_misses min_clients min_deadline model num_clients num_tiers
    partition precision prefetch profile_concurrency profile_deadline profile_epochs prox_lambda relative_downloads
    retier_every
    samples_per_client seed step_seconds straggler_fraction strategy tf_threads tier_sizes time_scale
    unstable_clients""".split()
)
SETTINGS = SERVICE_SETTINGS | frozenset(setting_bounds())  # as shipped; `known_settings` also sees later additions


def known_settings() -> frozenset[str]:
    """Every setting an experiment may use now: the services' and every registered strategy's."""
    return SERVICE_SETTINGS | frozenset(setting_bounds())


@dataclass(frozen=True)
class Experiment:
    """An experiment file: a name, how many worker processes, FEDAT_* settings shared by every service, and whether
    `fedat run` rescales the latency model so that the workers are busy a target share of the time (0: never)."""

    name: str
    workers: int
    minutes: float
    settings: dict[str, Any]
    calibrate: float = 0.0  # `fedat run` only: a comparison or a simulation keeps the file's fixed time scale

    def env(self) -> dict[str, str]:
        """The settings as FEDAT_* environment variables (lists become comma-separated)."""

        def text(v: Any) -> str:
            if isinstance(v, list | tuple):
                return ",".join(text(x) for x in v)
            return str(v)

        return {f"FEDAT_{k.upper()}": text(v) for k, v in self.settings.items()}


def check_settings(settings: dict[str, Any], where: str) -> dict[str, Any]:
    """The settings unchanged, or ValueError naming every unknown key."""
    known = known_settings()
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ValueError(f"{where}: unknown setting(s) {unknown}; known settings: {' '.join(sorted(known))}")
    return settings


def load_experiment(path: str | Path) -> Experiment:
    """Read an experiment YAML file; errors name the file and the key."""
    raw = yaml.safe_load(Path(path).read_text())
    if not isinstance(raw, dict) or not isinstance(raw.get("settings"), dict):
        raise ValueError(f"{path}: expected a map with 'name', 'workers', 'minutes' and a 'settings' map")
    check_settings(raw["settings"], str(path))
    target = float(raw.get("calibrate") or 0)
    if not 0 <= target <= 2:
        raise ValueError(f"{path}: calibrate is the workers' target utilisation, within (0, 2] (0: off), got {target}")
    return Experiment(
        name=str(raw.get("name", Path(path).stem)),
        workers=int(raw.get("workers", 2)),
        minutes=float(raw.get("minutes", 10)),
        settings=dict(raw["settings"]),
        calibrate=target,
    )
