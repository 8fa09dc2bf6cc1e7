"""Every message id and timer key, built and parsed in one place: dedupe and timers depend on them being exact.

Ids are deterministic (a re-sent message keeps its id); `docs/wire-format.md` §3 lists them for other languages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


def task(tier: int, round_: int, client: int, version: int) -> str:
    """A round's train task for one client, carrying global model `version`."""
    return f"t{tier}-r{round_}-c{client}-v{version}"


def profile_task(client: int) -> str:
    """The profiling task of a client."""
    return f"p-c{client}"


def update(task_id: str) -> str:
    """The answer to a task."""
    return f"u-{task_id}"


def tier_model(tier: int, round_: int) -> str:
    """The merge of one tier round."""
    return f"tm{tier}-r{round_}"


def global_model(version: int) -> str:
    """A global model version (g0 is the seed)."""
    return f"g{version}"


def assignment(epoch: int) -> str:
    """A tier assignment."""
    return f"a{epoch}"


def round_report(tier: int, round_: int) -> str:
    """The latencies of a closed round."""
    return f"rr{tier}-r{round_}"


def late_report(update_id: str) -> str:
    """The latency of an answer that came after its round closed."""
    return f"late-{update_id}"


def evaluation(version: int) -> str:
    """The scores of a global model version."""
    return f"e{version}"


def evaluation_request(version: int) -> str:
    """The request that real clients score a global model version."""
    return f"er{version}"


def client_evaluation(version: int, client: int) -> str:
    """One real client's score of a global model version (a re-sent copy keeps it)."""
    return f"e{version}-c{client}"


def join(client: int, millis: int) -> str:
    """A real client's announcement; a new one per connection (`millis`: its clock, in ms since the epoch)."""
    return f"j-c{client}-{millis}"


def leave(client: int, millis: int) -> str:
    """A real client's clean goodbye."""
    return f"l-c{client}-{millis}"


def revocation(client: int) -> str:
    """The goodbye `fedat revoke` sends for a client: one id, so that revoking twice is one leave."""
    return f"l-c{client}-revoked"


# --- timers -----------------------------------------------------------------------------------------------------
DEADLINE = "deadline"  # a round's deadline: close with what arrived, or re-issue
CLOSE = "close"  # a complete round closes at its last (modelled) arrival
PROFILE_DEADLINE = "profile-deadline"  # assign tiers among the clients that answered
ARRIVAL = "arrival"  # a profiling answer that came early counts at its modelled arrival
REGROUP = "regroup"  # real clients: membership changed; assign tiers once the burst of joins and leaves settled
EXPIRE = "expire"  # real clients: a profiling task unanswered too long frees its slot
WINDOW = "window"  # federated evaluation: publish what the clients reported for a version by now

_ROUND_TIMER = re.compile(r"^(deadline|close):(\d+):(\d+)$")


@dataclass(frozen=True)
class RoundTimer:
    """A timer of one round: its kind (DEADLINE or CLOSE), tier and round number."""

    kind: str
    tier: int
    round: int


def round_timer(kind: str, tier: int, round_: int) -> str:
    """The key of a round's timer."""
    return f"{kind}:{tier}:{round_}"


def parse_round_timer(key: str) -> RoundTimer:
    """The round timer a key names; ValueError for any other key."""
    m = _ROUND_TIMER.match(key)
    if m is None:
        raise ValueError(f"not a round timer key: {key!r}")
    return RoundTimer(m.group(1), int(m.group(2)), int(m.group(3)))


def arrival_timer(client: int) -> str:
    """The key of the timer at which a client's early profiling answer counts."""
    return f"{ARRIVAL}:{client}"


def parse_arrival_timer(key: str) -> int:
    """The client an arrival timer names; ValueError for any other key."""
    kind, _, client = key.partition(":")
    if kind != ARRIVAL or not client.isdigit():
        raise ValueError(f"not an arrival timer key: {key!r}")
    return int(client)


def expire_timer(client: int) -> str:
    """The key of the timer at which a real client's unanswered profiling task frees its slot."""
    return f"{EXPIRE}:{client}"


def window_timer(version: int) -> str:
    """The key of the timer that closes federated evaluation of a version."""
    return f"{WINDOW}:{version}"


def parse_keyed_timer(kind: str, key: str) -> int:
    """The number a `<kind>:<n>` timer key carries (a client, a version); ValueError for any other key."""
    found, _, n = key.partition(":")
    if found != kind or not n.isdigit():
        raise ValueError(f"not a {kind} timer key: {key!r}")
    return int(n)


def timer_kind(key: str) -> str:
    """The kind of any timer key (what comes before the first ':'), for metrics labels."""
    return key.split(":", 1)[0]
