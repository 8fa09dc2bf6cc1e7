"""The narrow interface every strategy implements, the views it is given, and what every strategy does alike."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np

from fedat.fl.aggregate import STALENESS, Weights, sample_weighted_average

S = TypeVar("S")  # a strategy's state between merges (None for the strategies that keep none)


@dataclass(frozen=True)
class CrossTier(Generic[S]):
    """What the aggregator knows when a tier model arrives (already stored and counted)."""

    global_model: Weights | None
    tier_models: tuple[Weights | None, ...]
    counts: tuple[int, ...]
    arrived: int  # index of the tier that just reported (0 = fastest)
    staleness: int  # global versions published since the arrival's base version
    base_model: Weights | None = None  # the global model the arrival was trained from (None: unknown, too old)
    clients: tuple[int, ...] = ()  # clients whose updates make the arriving tier model
    n_samples: int = 0  # samples behind the arriving tier model
    state: S | None = None  # what the strategy's last GlobalMerge returned as state
    pending: int = 0  # arrivals absorbed since the last published global model, this one included


@dataclass(frozen=True)
class GlobalMerge(Generic[S]):
    """What merge_global decided; the strategy keeps no state of its own, so the aggregator holds and returns it."""

    model: Weights | None  # the new global model; None: the arrival is absorbed and nothing is published yet
    tier_weights: np.ndarray  # the weight each tier's model got in this merge
    state: S | None = None  # handed back in the next view's `state`


@dataclass(frozen=True)
class TierStats:
    """What the barrier knows about each tier (index 0 = fastest) when it decides which tiers run next."""

    rounds: tuple[int, ...]  # rounds closed so far
    losses: tuple[float, ...]  # sample-weighted training loss of the last closed round (inf: never ran)
    open: tuple[int, ...] = ()  # rounds still waiting for answers (busy also counts closed, unmerged ones)
    accuracies: tuple[float, ...] = ()  # mean test accuracy of the tier's clients at the last evaluation (nan: none)


class Strategy(Protocol[S]):
    """Schedule tiers, select clients for a round, merge a tier's round, merge the tiers into the global model."""

    name: str
    history: int  # global versions the aggregator keeps (and persists) so that arrivals find their base model
    reads_every_tier: bool  # merge_global reads every tier's latest model; False: only the arrival's, kept by no one

    def schedule(self, busy: Mapping[int, int], stats: TierStats, rng: np.random.Generator) -> list[int]:
        """Tiers (1 = fastest; repeated to open several) that start a round now, given each tier's unmerged rounds."""
        ...

    def select_clients(self, candidates: Sequence[int], k: int, rng: np.random.Generator) -> list[int]:
        """Pick the clients of one tier round."""
        ...

    def merge_tier(self, models: Sequence[Weights], n_samples: Sequence[int]) -> Weights:
        """Synchronous merge of one round's client models."""
        ...

    def merge_global(self, view: CrossTier[S]) -> GlobalMerge[S]:
        """The new global model (or None: not yet), each tier's weight in it, and the state for the next view."""
        ...


# --- declared settings -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bounds:
    """What values a strategy setting accepts, and what it means (for the docs table)."""

    doc: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    choices: tuple[str, ...] = ()

    def problem(self, value: Any) -> str | None:
        """Why `value` is refused, or None."""
        if self.choices:
            return None if value in self.choices else f"is not one of {sorted(self.choices)}"
        if isinstance(value, float) and not math.isfinite(value):
            return "must be a finite number"
        for bound, ok, text in (
            (self.ge, lambda b: value >= b, ">="),
            (self.gt, lambda b: value > b, ">"),
            (self.le, lambda b: value <= b, "<="),
        ):
            if bound is not None and not ok(bound):
                return f"must be {text} {bound:g}"
        return None

    def text(self) -> str:
        """The accepted range, as the docs table shows it."""
        if self.choices:
            return " / ".join(self.choices)
        lo = f"≥ {self.ge:g}" if self.ge is not None else f"> {self.gt:g}" if self.gt is not None else ""
        hi = f"≤ {self.le:g}" if self.le is not None else ""
        return ", ".join(x for x in (lo, hi) if x) or "any"


def setting(default: Any, doc: str, **bounds: Any) -> Any:
    """A dataclass field that is an experiment setting: its name is the setting's, its type and bounds declared."""
    return field(default=default, metadata={"setting": Bounds(doc, **bounds)})


def settings_of(cls: type) -> list[Field]:
    """The fields of a strategy class that are experiment settings."""
    return [f for f in fields(cls) if "setting" in f.metadata]


def bounds_of(f: Field) -> Bounds:
    """The declared bounds of a setting field."""
    return f.metadata["setting"]


def default_of(f: Field) -> Any:
    """A setting field's default value."""
    return f.default if f.default is not MISSING else None


# Settings several strategies share: declared once, so that one name always means one thing.
def staleness(default: str = "polynomial") -> Any:
    """s(t − τ), how much an update's staleness discounts it: a key of fedat.fl.aggregate.STALENESS."""
    return setting(default, "staleness function s(t − τ)", choices=tuple(STALENESS))


def concurrency(default: int = 20) -> Any:
    """Rounds open at once per tier."""
    return setting(default, "rounds open at once per tier", ge=1)


def server_lr(default: float = 1.0) -> Any:
    """The server's step η."""
    return setting(default, "server step η", gt=0.0)


def history(default: int) -> Any:
    """Global versions kept so that an arrival finds the model it was trained from."""
    return setting(default, "global versions kept to find an arrival's base model", ge=1)


# --- behaviour every strategy shares ---------------------------------------------------------------------------


class Basics:
    """What every strategy does alike, written once: uniformly random clients and a sample-weighted tier merge."""

    history: int = 0  # global versions kept for arrivals' bases; only the delta-based strategies need any
    # Whether merge_global reads the latest model of every tier or only the arriving one. The aggregator keeps and
    # persists the other tiers' models only when it is true, so the default is the safe one: a strategy that says
    # False sees only the arrival's model in `CrossTier.tier_models`, every time, and spares its checkpoints a model.
    reads_every_tier: ClassVar[bool] = True
    state_type: ClassVar[type | None] = None  # the class of the state it persists between merges, if any

    def select_clients(self, candidates: Sequence[int], k: int, rng: np.random.Generator) -> list[int]:
        """Uniformly random k of the tier's idle clients."""
        k = min(k, len(candidates))
        return sorted(int(c) for c in rng.choice(np.asarray(candidates, dtype=np.int64), size=k, replace=False))

    def merge_tier(self, models: Sequence[Weights], n_samples: Sequence[int]) -> Weights:
        """Sample-weighted average (FedAvg; a single client's model when the round has one client)."""
        return sample_weighted_average(models, n_samples)


def each_tier_loops(busy: Mapping[int, int]) -> list[int]:
    """FedAT's Algorithm 2: each tier whose last round is merged starts the next."""
    return [m for m, n in busy.items() if n == 0]


def top_up(counts: Mapping[int, int], concurrency: int) -> list[int]:
    """Each tier repeated as many times as it is short of `concurrency` rounds."""
    return [m for m, n in counts.items() for _ in range(max(0, concurrency - n))]


def seed_from_first(view: CrossTier[Any]) -> GlobalMerge[Any]:
    """No seed model seen: the first arrival becomes the global model."""
    w = np.zeros(len(view.tier_models))
    w[view.arrived] = 1.0
    return GlobalMerge([a.copy() for a in view.tier_models[view.arrived]], w)


def arrival_only(view: CrossTier[Any], weight: float) -> np.ndarray:
    """Tier weights with `weight` on the arriving tier and 0 elsewhere."""
    w = np.zeros(len(view.tier_models))
    w[view.arrived] = weight
    return w


def names(items: Iterable[Field]) -> list[str]:
    """The names of some fields."""
    return [f.name for f in items]
