"""The strategies, registered by name. Adding one is a file beside these and one line in `REGISTRY`.

Each strategy is a frozen dataclass whose setting fields (`base.setting`) declare the experiment settings it
reads: their names, types, defaults and bounds. From them come the environment reader
(`fedat.runtime.config.strategy`), the keys an experiment file may use (`fedat.deploy.experiment.SETTINGS`) and
the table in docs/architecture.md (`settings_table`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fedat.fl.aggregate import fedat_tier_weights, uniform_tier_weights
from fedat.fl.strategies.asofed import ASOFed, Copies
from fedat.fl.strategies.base import (
    Basics,
    Bounds,
    CrossTier,
    GlobalMerge,
    Strategy,
    TierStats,
    bounds_of,
    default_of,
    settings_of,
)
from fedat.fl.strategies.delta import FedATDelta
from fedat.fl.strategies.fedasync import FedAsync
from fedat.fl.strategies.fedat import TierWeighted
from fedat.fl.strategies.fedbuff import Buffer, FedBuff
from fedat.fl.strategies.tifl import TiFL

__all__ = [
    "ASOFed",
    "Basics",
    "Buffer",
    "Copies",
    "CrossTier",
    "FedATDelta",
    "FedAsync",
    "FedBuff",
    "GlobalMerge",
    "REGISTRY",
    "SETTINGS",
    "STATE_TYPES",
    "STRATEGIES",
    "Strategy",
    "TiFL",
    "TierStats",
    "TierWeighted",
    "Entry",
    "build_strategy",
    "setting_bounds",
    "settings_table",
]


@dataclass(frozen=True)
class Entry:
    """A registered strategy: its class, and the fields this name fixes (they are not settings of this name)."""

    cls: type
    fixed: Mapping[str, Any] = field(default_factory=dict)

    def settings(self) -> list[str]:
        """The experiment settings this strategy reads."""
        return [f.name for f in settings_of(self.cls) if f.name not in self.fixed]


REGISTRY: dict[str, Entry] = {
    "fedat": Entry(TierWeighted, {"name": "fedat", "weigh": fedat_tier_weights}),
    "fedat-uniform": Entry(TierWeighted, {"name": "fedat-uniform", "weigh": uniform_tier_weights}),
    "fedat-delta": Entry(FedATDelta),
    # The appendix's rule: no staleness discount and a server step of 1, as the paper's analysis has them.
    "fedat-step": Entry(
        FedATDelta, {"name": "fedat-step", "staleness": "constant", "server_lr": 1.0, "tier_balance": 0.0,
                     "server_lr_decay": 0.0, "paper_weight": True},
    ),
    "tifl": Entry(TiFL),
    "fedasync": Entry(FedAsync),
    "fedbuff": Entry(FedBuff),
    "aso-fed": Entry(ASOFed),
}  # fmt: skip
STRATEGIES = tuple(REGISTRY)


def setting_bounds() -> dict[str, tuple[type, Any, Bounds]]:
    """Every strategy setting: its type, default and bounds (one name means one thing in every strategy)."""
    out: dict[str, tuple[type, Any, Bounds]] = {}
    for entry in REGISTRY.values():
        for f in settings_of(entry.cls):
            kind = type(default_of(f))
            seen = out.setdefault(f.name, (kind, default_of(f), bounds_of(f)))
            if seen[0] is not kind or seen[2] != bounds_of(f):
                raise TypeError(f"strategy setting {f.name!r} is declared twice with different types or bounds")
    return out


SETTINGS = frozenset(setting_bounds())
# Classes of strategy state the aggregator persists (registered with its state codec).
STATE_TYPES: tuple[type, ...] = tuple(dict.fromkeys(e.cls.state_type for e in REGISTRY.values() if e.cls.state_type))


def build_strategy(name: str, **values: Any) -> Strategy:
    """The strategy registered as `name` with these settings (the rest keep their defaults); ValueError names a bad one.

    Settings this strategy does not read are ignored: an experiment shares one set of settings across methods.
    """
    if name not in REGISTRY:
        raise ValueError(f"unknown strategy {name!r}; known: {sorted(REGISTRY)}")
    entry = REGISTRY[name]
    bounds = setting_bounds()
    for key, value in values.items():
        if key not in bounds:
            raise ValueError(f"{key!r} is not a strategy setting; settings: {sorted(bounds)}")
        problem = bounds[key][2].problem(value)
        if problem:
            raise ValueError(f"{key}={value!r} {problem}")
    own = {k: v for k, v in values.items() if k in entry.settings()}
    return entry.cls(**own, **entry.fixed)


def settings_table() -> str:
    """The markdown table of every strategy setting: its default, its range, which strategies read it, and why."""
    bounds = setting_bounds()
    users = {k: [n for n, e in REGISTRY.items() if k in e.settings()] for k in bounds}
    rows = ["| setting | default | accepts | read by | meaning |", "|---|---|---|---|---|"]
    for key in sorted(bounds):
        defaults: dict[str, list[str]] = {}
        for n in users[key]:
            f = next(f for f in settings_of(REGISTRY[n].cls) if f.name == key)
            defaults.setdefault(str(default_of(f)), []).append(n)
        shown = (
            next(iter(defaults))
            if len(defaults) == 1
            else "; ".join(f"{d} ({', '.join(ns)})" for d, ns in defaults.items())
        )
        rows.append(f"| `{key}` | {shown} | {bounds[key][2].text()} | {', '.join(users[key])} | {bounds[key][2].doc} |")
    return "\n".join(rows) + "\n"
