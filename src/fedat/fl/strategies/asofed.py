"""ASO-Fed (Chen et al., 2020), as the project states it: one model copy per client, global = their average."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fedat.fl.aggregate import Weights, copies_average, replace_copy
from fedat.fl.strategies.base import Basics, CrossTier, GlobalMerge, TierStats, arrival_only, concurrency, top_up


@dataclass(frozen=True)
class Copies:
    """ASO-Fed's state: each heard-from client's latest model and sample count, and their running Σ n·w and Σ n.

    A new Copies is built per arrival (a shallow copy of `models`, no model copies), so a held state never changes.
    """

    models: Mapping[int, tuple[Weights, float]]
    total: Weights  # Σ n·w over the copies, float64
    total_n: float  # Σ n over the copies


@dataclass(frozen=True)
class ASOFed(Basics):
    """ASO-Fed: the global model is the sample-weighted average of the latest model of every client heard from.

    The paper's local constraint term is the worker's proximal term, set by config. Every round is one client (configure
    clients_per_round 1); `concurrency` rounds per tier run at once, as in FedAsync. Clients never heard from do not
    count. The running sums make an arrival cost O(model), not O(clients × model).
    """

    state_type = Copies
    reads_every_tier = False  # merge_global reads the arriving tier's model only

    name: str = "aso-fed"
    concurrency: int = concurrency()

    def schedule(self, busy: Mapping[int, int], stats: TierStats, rng: np.random.Generator) -> list[int]:
        """Top every tier up to `concurrency` unmerged rounds."""
        return top_up(busy, self.concurrency)

    def merge_global(self, view: CrossTier[Copies]) -> GlobalMerge[Copies]:
        """Replace the arriving clients' copies; the global model is the sample-weighted average of all copies."""
        if not view.clients:
            raise ValueError("aso-fed: the arriving tier model names no client")
        new = view.tier_models[view.arrived]
        held = view.state
        models = dict(held.models) if held else {}
        total, total_n = (held.total, held.total_n) if held else (None, 0.0)
        # A round of several clients has only their merge: it stands in for each of them, its samples split evenly
        # so that the round weighs n_samples in all.
        n = view.n_samples / len(view.clients)
        for c in view.clients:
            old, old_n = models.get(c, (None, 0.0))
            total, total_n = replace_copy(total, total_n, old, old_n, new, n)
            models[c] = (new, n)
        model = copies_average(total, total_n)
        return GlobalMerge(model, arrival_only(view, view.n_samples / total_n), Copies(models, total, total_n))
