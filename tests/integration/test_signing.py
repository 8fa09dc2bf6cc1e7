"""Signed messages on the real broker: forged, unsigned and other-client updates are dead-lettered with the reason,
a replayed update is never merged twice, and a global model signed by anyone but the aggregator is refused."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fedat.protocol import signing, topology, wire
from fedat.protocol.wire import GlobalModel

from ..factories import answer
from .broker import fetch, fetch_n, publish, running
from .test_pipeline import aggregator, barrier, start_tier

pytestmark = pytest.mark.broker

SECRET = bytes(range(32))
KEYRING = signing.Keyring.from_secret(SECRET)


def dead_letter_reasons(url: str, n: int) -> list[str]:
    out = []
    for _ in range(n):
        got = fetch(url, topology.DEAD_LETTERS, timeout=15, raw=True)
        assert got is not None, f"only {len(out)} of {n} dead letters: {out}"
        out.append(got[0].headers[topology.HEADER_REASON])
    return out


def test_only_updates_signed_by_their_own_client_are_merged_and_a_replay_counts_once(vhost_url):
    key = topology.tier_key(1)
    with (
        running(barrier(clients_per_round=2, min_clients=2), vhost_url, 1, keyring=KEYRING),
        running(aggregator(), vhost_url, 1, keyring=KEYRING),
    ):
        start_tier(vhost_url, (0, 1, 2), keyring=KEYRING)
        a, b = fetch_n(vhost_url, topology.train_queue(1), 2)
        good_a = answer(a, 1.0)
        publish(vhost_url, topology.RESULTS, key, good_a, 1)  # unsigned
        # Signed by the other client: a worker of client b impersonating client a.
        b_key = KEYRING.key(signing.client_name(b.client))
        forged_headers = {
            signing.HEADER_SIGNER: signing.client_name(b.client),
            signing.HEADER_SIGNATURE: signing.signature(b_key, wire.encode(good_a)),
        }
        publish(vhost_url, topology.RESULTS, key, good_a, 1, headers=forged_headers)
        tampered = replace(good_a, n_samples=10_000)  # signed, then changed on the way
        body = wire.encode(good_a)
        headers = signing.sign(KEYRING, good_a, body)
        publish(vhost_url, topology.RESULTS, key, tampered, 1, headers=headers)
        reasons = dead_letter_reasons(vhost_url, 3)
        assert any("unsigned" in r for r in reasons), reasons
        assert any(f"signed by client-{b.client}" in r for r in reasons), reasons
        assert any("does not match" in r for r in reasons), reasons
        for t in (a, b):
            publish(vhost_url, topology.RESULTS, key, answer(t, 2.0), 1, keyring=KEYRING)
        publish(vhost_url, topology.RESULTS, key, answer(a, 2.0), 1, keyring=KEYRING)  # replayed, validly signed
        versions = [fetch(vhost_url, topology.RECORDER_GLOBAL, timeout=20) for _ in range(2)]
        assert [g.version for g in versions] == [0, 1] and versions[1].updates == 2
        assert fetch(vhost_url, topology.DEAD_LETTERS, timeout=2) is None  # the replay was acked as a copy


def test_a_global_model_not_signed_by_the_aggregator_is_refused(vhost_url):
    with running(barrier(clients_per_round=1, min_clients=1), vhost_url, 1, keyring=KEYRING):
        start_tier(vhost_url, (0,), keyring=KEYRING)
        (task,) = fetch_n(vhost_url, topology.train_queue(1), 1)
        fake = GlobalModel("g1", 1, 1, 1, ((1, 1),), (1,), (1,), (1.0,), 0, 0, 0, 1, 0.0, task.layers)
        worker_keys = signing.Keyring.from_mapping(signing.keys_for_role(SECRET, "worker"))
        with pytest.raises(signing.SigningError):  # a worker holds no key that could sign a global model
            signing.sign(worker_keys, fake, b"")
        body = wire.encode(fake)
        as_client = {
            signing.HEADER_SIGNER: "client-0",
            signing.HEADER_SIGNATURE: signing.signature(KEYRING.key("client-0"), body),
        }
        publish(vhost_url, topology.GLOBAL, "", fake, 1, headers=as_client)
        reasons = dead_letter_reasons(vhost_url, 1)
        assert "global-model" in reasons[0] and "client-0" in reasons[0], reasons
        assert fetch(vhost_url, topology.train_queue(1), timeout=2) is None  # no round 2 from a forged version
