"""What a checkpoint is only valid for, and how two of those differ.

A durable service's checkpoint is its state as one run, under one set of settings, left it. The state's shape
follows some of those settings (one slot per tier, one latency per client, the strategy's own state) and its
meaning follows the others (the seed that picked the clients, the run it belongs to). A fingerprint names them:
the state version, the tiers, the clients, the strategy and the settings it reads, the seed and the run id. Every
checkpoint carries the fingerprint of the process that wrote it; a process restores a checkpoint only when the
fingerprints agree, and the chart's pre-upgrade/pre-rollback check compares the saved ones with the new release's
before anything is changed. Everything else (learning rate, epochs, deadlines, evaluation cadence, ...) may change
between restarts: the state does not depend on it.

Pure: the settings come in as the FEDAT_* mapping a service reads, the strategy's defaults from the caller.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgpack

STATE_VERSION = "state_version"
STRATEGY = "strategy"
RUN_ID = "run_id"

# Settings every checkpoint is bound to, with the value a service uses when the variable is unset.
BOUND: Mapping[str, str] = {
    "num_tiers": "5",
    "tiers": "",  # the barrier's subset of tiers; unset: all of them
    "num_clients": "100",
    # Logical clients or real ones: a profiler's state means a fixed list in one and the members who joined in the
    # other, so a deployment that switches must start a new run.
    "clients": "pool",
    STRATEGY: "fedat",
    "seed": "0",
    RUN_ID: "",
}

Fingerprint = Mapping[str, str]


def canonical(value: Any) -> str:
    """A setting's text in one spelling: `5`, `5.0` and `5e0` are `5`; `0.001` and `1e-3` are `0.001`."""
    text = str(value).strip()
    try:
        number = float(text)
    except ValueError:
        return text
    if number != number or number in (float("inf"), float("-inf")):
        return text
    return str(int(number)) if number.is_integer() else repr(number)


def of_settings(state_version: int, env: Mapping[str, str], strategy_defaults: Mapping[str, Any]) -> dict[str, str]:
    """The fingerprint of a process: its state version and the bound settings as `env` (FEDAT_*) gives them.

    `strategy_defaults`: each setting the strategy named by FEDAT_STRATEGY reads, with its default; the settings
    it does not read stay out (changing them changes nothing the strategy does).
    """
    out = {STATE_VERSION: str(state_version)}
    for key, default in BOUND.items():
        out[key] = canonical(env.get(f"FEDAT_{key.upper()}", "").strip() or default)
    for key, default in strategy_defaults.items():
        given = env.get(f"FEDAT_{key.upper()}", "").strip()
        out[f"{STRATEGY}.{key}"] = canonical(given if given else ("" if default is None else default))
    return dict(sorted(out.items()))


def differences(saved: Fingerprint, current: Fingerprint) -> list[str]:
    """Each bound value that differs, as `key: saved -> current`; keys only one side knows are not compared.

    A key one side lacks was added or dropped by another version of this code: neither side can say what it
    was, so it neither blocks nor passes anything. The state version is in every fingerprint.
    """
    out = []
    for key in sorted(set(saved) & set(current)):
        if saved[key] != current[key]:
            out.append(f"{key}: {saved[key] or '(unset)'} -> {current[key] or '(unset)'}")
    return out


def state_version(state: bytes) -> int | None:
    """The version a service's state bytes were written with (`fedat.protocol.statecodec`), or None if unreadable."""
    try:
        body = msgpack.unpackb(state, raw=False, strict_map_key=False)
    except Exception:  # msgpack raises several unrelated types for garbage; the codec names the problem later
        return None
    version = body.get("v") if isinstance(body, Mapping) else None
    return version if isinstance(version, int) else None


def refusal(service: str, where: str, diffs: list[str]) -> str:
    """The message that refuses a checkpoint: what differs, and the two ways on."""
    state = any(d.startswith(f"{STATE_VERSION}:") for d in diffs)
    how = (
        "this version of the code has no migration from that state version: "
        if state
        else "to continue this run, go back to the settings it was written with; otherwise "
    )
    return (
        f"{service}: the checkpoint in {where} does not fit this process ({'; '.join(diffs)}). "
        f"{how}start a new run on a fresh vhost (the chart's broker.vhost, or `fedat provision --vhost NEW`), "
        "which leaves this run's checkpoints untouched. Nothing was restored or changed."
    )
