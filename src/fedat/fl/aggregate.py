"""Pure aggregation math: averaging, cross-tier weights, staleness, asynchronous server steps. No I/O, clock, config."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

Weights = list[np.ndarray]


def weighted_average(models: Sequence[Sequence[np.ndarray]], coefficients: Sequence[float]) -> Weights:
    """Layer-wise Σ c_i · model_i with coefficients normalised to sum to 1, computed in float64."""
    if len(models) == 0:
        raise ValueError("weighted_average: no models")
    if len(models) != len(coefficients):
        raise ValueError(f"weighted_average: {len(models)} models but {len(coefficients)} coefficients")
    c = np.asarray(coefficients, dtype=np.float64)
    if np.any(c < 0) or not np.isfinite(c).all() or c.sum() <= 0:
        raise ValueError(f"weighted_average: coefficients must be finite, >= 0 and not all 0, got {c.tolist()}")
    c = c / c.sum()
    n_layers = len(models[0])
    for i, m in enumerate(models):
        if len(m) != n_layers:
            raise ValueError(f"weighted_average: model {i} has {len(m)} layers, model 0 has {n_layers}")
    out = []
    for layer in range(n_layers):
        shape = models[0][layer].shape
        acc = np.zeros(shape, dtype=np.float64)
        for i, m in enumerate(models):
            if m[layer].shape != shape:
                raise ValueError(
                    f"weighted_average: layer {layer} of model {i} has shape {m[layer].shape}, expected {shape}"
                )
            if c[i]:
                acc += c[i] * m[layer]
        out.append(acc.astype(np.float32))
    return out


def sample_weighted_average(models: Sequence[Sequence[np.ndarray]], n_samples: Sequence[int]) -> Weights:
    """FedAvg merge: Σ (n_k / N) · w_k over the clients of one round."""
    return weighted_average(models, n_samples)


def fedat_tier_weights(counts: Sequence[int]) -> np.ndarray:
    """FedAT cross-tier weights: tier m (index 0 = fastest) gets T_(M+1−m) / T.

    Start-up rule: a tier that has not reported yet holds no model and gets weight 0; the mirror rule is applied
    among the reported tiers only (the i-th fastest reported tier gets the count of the i-th slowest reported
    tier, over their total). Once every tier has reported this is exactly the paper's T_(M+1−m)/T, and since a
    reported tier has count >= 1 no update is ever weighted 0 (counting from 0 over all tiers would pair fresh
    tiers with the untouched w0 and ignore most early updates). With no reports the caller keeps w0.
    """
    t = np.asarray(counts, dtype=np.float64)
    if t.ndim != 1 or np.any(t < 0):
        raise ValueError(f"fedat_tier_weights: counts must be a 1-D sequence of non-negative ints, got {counts}")
    w = np.zeros_like(t)
    reported = np.flatnonzero(t > 0)
    if reported.size:
        w[reported] = t[reported[::-1]] / t[reported].sum()
    return w


def uniform_tier_weights(counts: Sequence[int]) -> np.ndarray:
    """The paper's ablation: every reported tier weighs the same."""
    t = np.asarray(counts, dtype=np.float64)
    w = (t > 0).astype(np.float64)
    return w / w.sum() if w.sum() else w


def constant_staleness(staleness: int) -> float:
    """s(t − τ) = 1."""
    return 1.0


def polynomial_staleness(staleness: int, a: float = 0.5) -> float:
    """FedAsync's polynomial staleness function s(t − τ) = (t − τ + 1)^−a."""
    if staleness < 0:
        raise ValueError(f"staleness must be >= 0, got {staleness}")
    return float((staleness + 1) ** -a)


def hinge_staleness(staleness: int, a: float = 10.0, b: int = 4) -> float:
    """FedAsync's hinge function: 1 up to b, then 1 / (a (t − τ − b) + 1)."""
    if staleness < 0:
        raise ValueError(f"staleness must be >= 0, got {staleness}")
    return 1.0 if staleness <= b else 1.0 / (a * (staleness - b) + 1.0)


STALENESS: dict[str, Callable[[int], float]] = {
    "constant": constant_staleness,
    "polynomial": polynomial_staleness,
    "hinge": hinge_staleness,
}


def fedasync_mix(
    global_model: Sequence[np.ndarray], local_model: Sequence[np.ndarray], alpha: float, staleness_factor: float
) -> Weights:
    """FedAsync server step: w ← (1 − α_t) w + α_t w_new with α_t = α · s(t − τ)."""
    a = alpha * staleness_factor
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"fedasync_mix: α·s must be in [0, 1], got {a}")
    return weighted_average([global_model, local_model], [1.0 - a, a]) if a < 1.0 else [x.copy() for x in local_model]


def _check_like(fn: str, a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> None:
    # numpy would broadcast a mismatched layer silently instead of failing
    if len(a) != len(b):
        raise ValueError(f"{fn}: {len(a)} layers against {len(b)}")
    for layer, (x, y) in enumerate(zip(a, b, strict=True)):
        if x.shape != y.shape:
            raise ValueError(f"{fn}: layer {layer} has shape {x.shape} against {y.shape}")


def accumulate_delta(
    buffer: Sequence[np.ndarray] | None,
    model: Sequence[np.ndarray],
    base: Sequence[np.ndarray] | None,
    staleness_factor: float,
) -> Weights:
    """FedBuff's buffer after one arrival: buffer + s · (model − base) in float64 (buffer None: empty)."""
    acc = [np.zeros(m.shape, np.float64) for m in model] if buffer is None else list(buffer)
    _check_like("accumulate_delta", acc, model)
    if base is None:
        # The base version has left the history, so the delta is unknown: the arrival adds nothing (as a staleness
        # factor of 0 would) but the caller still counts it, so the buffer keeps its cadence of K arrivals.
        return acc
    _check_like("accumulate_delta", model, base)
    return [a + staleness_factor * (m.astype(np.float64) - b) for a, m, b in zip(acc, model, base, strict=True)]


def apply_buffer(
    global_model: Sequence[np.ndarray], buffer: Sequence[np.ndarray], count: int, server_lr: float
) -> Weights:
    """FedBuff server step: w ← w + η · buffer / K, the buffer holding Σ_k s_k · Δ_k over K arrivals."""
    if count <= 0:
        raise ValueError(f"apply_buffer: empty buffer (count {count})")
    _check_like("apply_buffer", global_model, buffer)
    return [(g + server_lr * acc / count).astype(np.float32) for g, acc in zip(global_model, buffer, strict=True)]


def replace_copy(
    total: Sequence[np.ndarray] | None,
    total_n: float,
    old: Sequence[np.ndarray] | None,
    old_n: float,
    new: Sequence[np.ndarray],
    new_n: float,
) -> tuple[Weights, float]:
    """ASO-Fed's running sums after a client's copy changes: (Σ n·w − old_n·old + new_n·new, Σ n − old_n + new_n)."""
    if new_n < 0 or old_n < 0:
        raise ValueError(f"replace_copy: sample counts must be >= 0, got old {old_n}, new {new_n}")
    acc = [np.zeros(m.shape, np.float64) for m in new] if total is None else list(total)
    _check_like("replace_copy", acc, new)
    if old is not None:
        _check_like("replace_copy", acc, old)
        acc = [a - old_n * o.astype(np.float64) for a, o in zip(acc, old, strict=True)]
    elif old_n:
        raise ValueError(f"replace_copy: no old copy but old_n {old_n}")
    return [a + new_n * m.astype(np.float64) for a, m in zip(acc, new, strict=True)], total_n - old_n + new_n


def copies_average(total: Sequence[np.ndarray], total_n: float) -> Weights:
    """ASO-Fed's global model: the sample-weighted average of the stored copies, Σ n·w / Σ n, as float32."""
    if not total_n > 0:
        raise ValueError(f"copies_average: the copies hold no samples (Σ n = {total_n})")
    return [(a / total_n).astype(np.float32) for a in total]


def delta_step(
    global_model: Sequence[np.ndarray], model: Sequence[np.ndarray], base: Sequence[np.ndarray], scale: float
) -> Weights:
    """fedat-delta's server step: w ← w + scale · (model − base), i.e. FedBuff's step over a buffer of one arrival."""
    _check_like("delta_step", global_model, model)
    _check_like("delta_step", model, base)
    if not np.isfinite(scale):
        raise ValueError(f"delta_step: scale must be finite, got {scale}")
    return apply_buffer(global_model, accumulate_delta(None, model, base, scale), 1, 1.0)


def tier_balance(counts: Sequence[int], arrived: int, exponent: float) -> float:
    """fedat-delta's tier factor c_m = clip(((T / M) / T_m) ** exponent, 1/M, M) over the M tiers reported so far.

    (T / M) / T_m is the inverse of tier m's share of the updates relative to an even share, so with exponent 1 every
    tier moves the global model alike per unit time (what the paper's mirrored counts aim at), with 0 not at all.
    Start-up rule as in `fedat_tier_weights`: M and T count only the tiers that have reported, so a tier that never
    runs (or has not yet) does not shrink everyone's step; a single reported tier gets 1.
    """
    t = np.asarray(counts, dtype=np.float64)
    if t.ndim != 1 or np.any(t < 0):
        raise ValueError(f"tier_balance: counts must be a 1-D sequence of non-negative ints, got {counts}")
    if not 0 <= arrived < t.size or t[arrived] <= 0:
        raise ValueError(f"tier_balance: tier {arrived} has no counted update in {counts}")
    if not np.isfinite(exponent):
        raise ValueError(f"tier_balance: exponent must be finite, got {exponent}")
    reported = t[t > 0]
    m = float(reported.size)
    share = (reported.sum() / m) / t[arrived]
    return float(np.clip(share**exponent, 1.0 / m, m))


def decayed_step(server_lr: float, merged: int, decay: float) -> float:
    """fedat-delta's step η_T = server_lr / sqrt(1 + T / decay) after T merged tier rounds; decay 0 keeps it constant.

    A full step early keeps fedat-delta's speed; shrinking it as rounds accumulate turns the late global model into a
    running average of many tier rounds, so one round's clients no longer set it alone (the device regime's swings).
    The inverse square root is SGD's classic schedule: the steps still sum to infinity, so learning never stops.
    """
    if merged < 0:
        raise ValueError(f"decayed_step: merged rounds must be >= 0, got {merged}")
    if not (np.isfinite(server_lr) and np.isfinite(decay)) or decay < 0:
        raise ValueError(f"decayed_step: server_lr and decay must be finite, decay >= 0; got {server_lr}, {decay}")
    return server_lr if decay == 0 else float(server_lr / np.sqrt(1.0 + merged / decay))
