"""A real client's role matches its own two queues and its own routing keys, and nothing else; its folder's
client.env is what docs/wire-format.md §11.1 says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedat.deploy.enroll import client_env, close_connection, username
from fedat.deploy.roles import NOTHING, client_role
from fedat.errors import ProvisionError
from fedat.protocol import topology as t

N = 5
DOC = (Path(__file__).resolve().parents[2] / "docs" / "wire-format.md").read_text()
OTHERS = {q.name for q in t.queues(N)} | {q.name for k in (0, 1, 17, 70, 77) for q in t.client_queues(k)}
NAMES = OTHERS | {q.name for q in t.client_queues(7)} | set(t.EXCHANGES) | {"amq.default", "fedat.client.7x"}


def matching(regex: str, names) -> set[str]:
    return {n for n in names if re.search(regex, n)}


def test_a_client_reads_its_own_two_queues_and_writes_the_results_and_dead_letter_exchanges_only():
    r = client_role(7)
    assert r.configure == NOTHING
    assert matching(r.read, NAMES) == {"fedat.client.7", "fedat.client.7.evaluate"}
    assert matching(r.write, NAMES) == {t.RESULTS, t.DLX}


def test_on_the_results_exchange_every_key_it_may_use_names_it():
    (results,) = [p for p in client_role(7).topic if p.exchange == t.RESULTS]
    keys = [
        f"{k}.client-{c}" for k in ("tier-1", "tier-12", "profile", "join", "leave", "evaluation") for c in (7, 8, 70)
    ]
    keys += ["tier-1", "profile", "join", "tier-x.client-7", "tier-1.client-7.x", "round-report.client-7", "#", ""]
    assert matching(results.write, keys) == {f"{k}.client-7" for k in ("tier-1", "tier-12", "profile", "join",
                                                                     "leave", "evaluation")}  # fmt: skip
    assert results.read == NOTHING
    others = [p for p in client_role(7).topic if p.exchange != t.RESULTS]
    assert {p.exchange for p in others} == {x for x, kind in t.EXCHANGES.items() if kind == "topic"} - {t.RESULTS}
    assert all(p.write == NOTHING and p.read == NOTHING for p in others)


def test_client_users_are_named_like_the_roles_users_and_the_env_file_is_the_documented_one():
    assert username("fedat-prod-", 7) == "fedat-prod-client-7"
    text = client_env(7, "fedat-prod", 5, tls=False)
    assert text.splitlines() == [
        "# FedAT client 7 of vhost fedat-prod, enrolled by `fedat enroll`; paths are relative to this folder",
        "FEDAT_CLIENT_ID=7",
        "FEDAT_AMQP_URL_FILE=amqp-url",
        "FEDAT_KEYRING_FILE=keyring.json",
        "FEDAT_NUM_TIERS=5",
        "FEDAT_DECLARE_TOPOLOGY=0",
    ]
    assert f"```\n{text}```" in DOC  # the example of docs/wire-format.md §11.1, exactly
    tls = client_env(7, "v", 5, tls=True, extra={"FEDAT_APP": "my_app:app"}).splitlines()
    assert tls[-2:] == ["FEDAT_TLS_CA_FILE=ca.pem", "FEDAT_APP=my_app:app"]
    with pytest.raises(ValueError, match="integer >= 0"):
        client_role(-1)


class ClosingApi:
    """A management API whose connection DELETE fails `failures` times with a 500, and which lists the connection
    until `gone_after` GETs of it have been answered (None: for ever)."""

    def __init__(self, failures: int, gone_after: int | None):
        self.failures, self.gone_after, self.gets, self.deletes = failures, gone_after, 0, 0

    def call(self, method, path, body=None, missing_ok=False):
        if method == "DELETE":
            self.deletes += 1
            if self.deletes <= self.failures:
                raise ProvisionError(f"DELETE /api/{path} failed: HTTP 500 Internal Server Error: ")
            return None
        self.gets += 1
        return None if self.gone_after is not None and self.gets >= self.gone_after else {"name": path}


def test_revoking_a_connection_that_closes_meanwhile_is_fine_one_that_stays_is_an_error():
    closing = ClosingApi(failures=1, gone_after=1)  # RabbitMQ closed it itself: the DELETE met it closing
    close_connection(closing, "c1", pause=0)
    assert closing.deletes == 1
    busy = ClosingApi(failures=1, gone_after=None)  # still listed: tried again, and the second DELETE works
    close_connection(busy, "c1", pause=0)
    assert busy.deletes == 2
    stuck = ClosingApi(failures=99, gone_after=None)
    with pytest.raises(ProvisionError, match="HTTP 500"):
        close_connection(stuck, "c1", tries=3, pause=0)
    assert stuck.deletes == 3
