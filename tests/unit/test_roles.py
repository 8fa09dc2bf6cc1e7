"""The roles' permission regexes match exactly the names each service needs, and nothing else."""

from __future__ import annotations

import re

import pytest

from fedat.deploy.roles import ADMIN, NOTHING, ROLES, SERVICE_ROLES, exact, roles
from fedat.protocol import topology as t

N = 5
QUEUES = {q.name for q in t.queues(N)}
EXCHANGES = set(t.EXCHANGES)
# Names that must never match: the default exchange, a tier beyond N, prefixes, suffixes and look-alikes. (No
# resource is named "": the default exchange is checked as "amq.default", an unnamed queue gets "amq.gen-...";
# so "^$", RabbitMQ's usual "nothing", matches no resource.)
DECOYS = {
    "amq.default",
    "amq.gen-abc",
    t.train_queue(N + 1),
    t.barrier_queue(N + 1),
    t.train_queue(1) + "0",
    "x" + t.GLOBAL,
    t.GLOBAL + ".x",
    "fedatxglobal",  # an unescaped "." would match this
    t.STATE + ".worker",
    t.journal_queue("worker"),
    t.journal_queue("worker", 1),
}
NAMES = QUEUES | EXCHANGES | DECOYS
ALL_KEYS = {
    *(t.tier_key(m) for m in range(1, N + 2)),
    t.PROFILE_KEY,
    t.EVALUATION_KEY,
    t.ROUND_REPORT_KEY,
    *t.STATEFUL,
    *(t.journal_key(s, side) for s in t.STATEFUL for side in t.JOURNAL_SIDES),
    "",
    "#",
    "evil",
    t.tier_key(1) + ".x",
}
TIERS = range(1, N + 1)

READS = {
    "worker": {*(t.train_queue(m) for m in TIERS), t.PROFILE_QUEUE},
    "barrier": {
        *(t.barrier_queue(m) for m in TIERS),
        t.BARRIER_GLOBAL,
        t.BARRIER_ASSIGNMENTS,
        t.BARRIER_EVALUATIONS,
        t.state_queue("barrier"),
        t.journal_queue("barrier", 0),
        t.journal_queue("barrier", 1),
    },
    "aggregator": {
        t.AGGREGATOR_TIER_MODELS,
        t.AGGREGATOR_GLOBAL,
        t.state_queue("aggregator"),
        t.journal_queue("aggregator", 0),
        t.journal_queue("aggregator", 1),
    },
    "profiler": {
        t.PROFILER_RESULTS,
        t.PROFILER_REPORTS,
        t.PROFILER_MEMBERS,
        t.state_queue("profiler"),
        t.journal_queue("profiler", 0),
        t.journal_queue("profiler", 1),
    },
    "evaluator": {t.EVALUATOR_GLOBAL},
    "collector": {t.COLLECTOR_GLOBAL, t.COLLECTOR_EVALUATIONS, t.COLLECTOR_ASSIGNMENTS},
    "seed": set(),
    "recorder": {t.RECORDER_GLOBAL, t.RECORDER_EVENTS},
}
WRITES = {
    "worker": {t.RESULTS, t.DLX},
    "barrier": {t.TRAIN, t.TIER_MODELS, t.EVENTS, t.DLX, t.STATE},
    "aggregator": {t.GLOBAL, t.DLX, t.STATE},
    "profiler": {t.TRAIN, t.CONTROL, t.DLX, t.STATE},
    "evaluator": {t.EVENTS, t.DLX},
    "collector": {t.EVALUATE, t.EVENTS, t.DLX},
    "seed": {t.GLOBAL},
    "recorder": {t.DLX},
}
TOPIC_WRITES = {
    ("worker", t.RESULTS): {*(t.tier_key(m) for m in TIERS), t.PROFILE_KEY},
    ("barrier", t.EVENTS): {t.ROUND_REPORT_KEY},
    ("barrier", t.STATE): {"barrier", t.journal_key("barrier", 0), t.journal_key("barrier", 1)},
    ("aggregator", t.STATE): {"aggregator", t.journal_key("aggregator", 0), t.journal_key("aggregator", 1)},
    ("profiler", t.STATE): {"profiler", t.journal_key("profiler", 0), t.journal_key("profiler", 1)},
    ("evaluator", t.EVENTS): {t.EVALUATION_KEY},
    ("collector", t.EVENTS): {t.EVALUATION_KEY},
}


def matching(regex: str, names) -> set[str]:
    """What RabbitMQ would allow: it matches the regex (PCRE, unanchored search) against the whole name."""
    return {n for n in names if re.search(regex, n)}


def test_every_role_is_defined_once_and_only_admin_is_an_administrator():
    rs = roles(N)
    assert tuple(rs) == ROLES
    assert set(READS) == set(SERVICE_ROLES)
    # the recorder may read queue depths over the management API (KEDA's HTTP scaler), nothing more
    expected = {ADMIN: ("administrator",), "recorder": ("management",)}
    for name, role in rs.items():
        assert role.tags == expected.get(name, ())


@pytest.mark.parametrize("name", SERVICE_ROLES)
def test_a_service_role_configures_nothing(name):
    role = roles(N)[name]
    assert role.configure == NOTHING
    assert matching(role.configure, NAMES) == set()


@pytest.mark.parametrize("name", SERVICE_ROLES)
def test_a_service_role_reads_exactly_its_queues(name):
    assert matching(roles(N)[name].read, NAMES) == READS[name]


@pytest.mark.parametrize("name", SERVICE_ROLES)
def test_a_service_role_writes_exactly_its_exchanges(name):
    assert matching(roles(N)[name].write, NAMES) == WRITES[name]


@pytest.mark.parametrize("name", SERVICE_ROLES)
def test_topic_permissions_allow_exactly_the_role_s_routing_keys(name):
    role = roles(N)[name]
    topic_exchanges = {x for x, kind in t.EXCHANGES.items() if kind == "topic"}
    assert {p.exchange for p in role.topic} == topic_exchanges  # one per topic exchange: absent would allow all
    for p in role.topic:
        if p.exchange in WRITES[name]:
            assert matching(p.write, ALL_KEYS) == TOPIC_WRITES[(name, p.exchange)], p.exchange
        else:  # the plain write permission already refuses the exchange
            assert p.write == NOTHING
        assert p.read == NOTHING  # only admin binds


@pytest.mark.parametrize("name", SERVICE_ROLES)
def test_no_service_role_can_bind(name):
    # queue.bind needs write on the queue, exchange.bind read on the source exchange: neither may ever match.
    role = roles(N)[name]
    assert matching(role.write, QUEUES) == set()
    assert matching(role.read, EXCHANGES) == set()
    assert not QUEUES & EXCHANGES


def test_every_service_regex_is_anchored_and_escaped():
    for role in roles(N).values():
        if role.name == ADMIN:
            continue
        for regex in (role.configure, role.write, role.read, *(p.write for p in role.topic)):
            assert regex.startswith("^") and regex.endswith("$"), (role.name, regex)
            if regex != NOTHING:
                assert "." not in regex.replace("\\.", ""), (role.name, regex)  # every dot escaped


def test_admin_may_do_everything_and_has_no_topic_restriction():
    admin = roles(N)[ADMIN]
    assert admin.permissions() == {"configure": ".*", "write": ".*", "read": ".*"}
    assert admin.topic == ()


def test_every_queue_but_the_dead_letters_has_exactly_one_reading_role():
    rs = roles(N)
    for q in QUEUES - {t.DEAD_LETTERS}:
        readers = [r.name for r in rs.values() if r.name != ADMIN and re.search(r.read, q)]
        assert len(readers) == 1, (q, readers)
    assert not [r.name for r in rs.values() if r.name != ADMIN and re.search(r.read, t.DEAD_LETTERS)]


def test_tiers_follow_num_tiers():
    worker = roles(2)["worker"]
    assert matching(worker.read, {t.train_queue(m) for m in range(1, 6)}) == {t.train_queue(1), t.train_queue(2)}
    results = next(p for p in worker.topic if p.exchange == t.RESULTS)
    assert matching(results.write, {t.tier_key(m) for m in range(1, 6)}) == {t.tier_key(1), t.tier_key(2)}
    with pytest.raises(ValueError):
        roles(0)


def test_exact_escapes_and_anchors():
    assert exact([]) == NOTHING
    assert exact(["a.b", "a.b"]) == r"^(a\.b)$"
    assert matching(exact(["a.b", "c-d"]), {"a.b", "axb", "c-d", "a.b.c", "xa.b"}) == {"a.b", "c-d"}
