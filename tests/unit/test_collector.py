"""The collector (federated evaluation for real clients), driven directly (no broker)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from prometheus_client import generate_latest

from fedat.fl.evaluation import EvalSchedule
from fedat.protocol import ids, topology
from fedat.protocol.service import Reject
from fedat.protocol.wire import (
    ClientEvaluation,
    Evaluation,
    EvaluationRequest,
    TierAssignment,
    decode_model,
    encode_model,
    model_bytes,
)
from fedat_aggregator.collector import Collector, CollectorConfig
from fedat_aggregator.metrics import collector_metrics

from ..driver import Driver
from ..factories import seed

GLOBAL, ASSIGNMENTS, REPORTS = topology.COLLECTOR_GLOBAL, topology.COLLECTOR_ASSIGNMENTS, topology.COLLECTOR_EVALUATIONS


def collector(every: int = 1, interval: float = 0.0, window: float = 20.0, max_pending: int = 8) -> Driver:
    d = Driver(Collector(CollectorConfig(EvalSchedule(every, interval), window, max_pending)))
    d.start(0.0)
    return d


def model(version: int):
    return replace(seed(1, [(3,)]), id=f"g{version}", version=version)


def assignment(epoch: int, *tiers: tuple[int, ...]) -> TierAssignment:
    return TierAssignment(ids.assignment(epoch), epoch, tiers, {c: 1.0 for t in tiers for c in t}, 0.0)


def report(client: int, version: int, accuracy: float, n: int = 10, loss: float = 1.0) -> ClientEvaluation:
    return ClientEvaluation(ids.client_evaluation(version, client), client, version, loss, accuracy, n, 0.0)


def published(fx, kind):
    return [o.message for o in fx.publish if isinstance(o.message, kind)]


def test_a_due_version_is_sent_to_every_client_as_it_came_with_a_window():
    c = collector(every=5)
    g = model(0)
    fx = c.deliver(GLOBAL, g, 1.0)
    (out,) = fx.publish
    assert out.exchange == topology.EVALUATE and out.routing_key == ""
    assert out.message == EvaluationRequest("er0", 0, 1.0, g.layers)  # the layers as they came, never decoded
    assert fx.timers == ((20.0, "window:0"),) and fx.ack == (1,)
    assert c.deliver(GLOBAL, model(3), 2.0).publish == ()  # not due: acked, nothing asked
    assert published(c.deliver(GLOBAL, model(5), 3.0), EvaluationRequest)[0].version == 5


def test_once_every_assigned_client_scored_a_version_its_evaluation_is_published():
    c = collector()
    c.deliver(ASSIGNMENTS, assignment(1, (1, 4), (2,)), 0.0)
    c.deliver(GLOBAL, model(7), 1.0)
    assert c.deliver(REPORTS, report(1, 7, 0.5, n=10, loss=2.0), 2.0).publish == ()
    assert c.deliver(REPORTS, report(4, 7, 0.9, n=30, loss=1.0), 2.5).publish == ()
    (ev,) = published(c.deliver(REPORTS, report(2, 7, 0.7, n=10, loss=0.0), 3.0), Evaluation)
    assert ev.id == "e7" and ev.version == 7 and ev.n_clients == 3 and ev.evaluated_at == 3.0
    assert ev.accuracy == pytest.approx((5 + 27 + 7) / 50) and ev.loss == pytest.approx((20 + 30) / 50)
    assert ev.variance == pytest.approx(np.var([0.5, 0.9, 0.7]))
    # by client id; client 0 and 3 did not report (not assigned): they read as the weighted mean
    assert ev.accuracies == pytest.approx((ev.accuracy, 0.5, 0.7, ev.accuracy, 0.9))
    assert c.timer("window:7", 21.0).publish == ()  # published already


def test_the_window_publishes_what_came_and_nothing_if_nobody_answered():
    c = collector()
    c.deliver(ASSIGNMENTS, assignment(1, (1,), (2,)), 0.0)
    c.deliver(GLOBAL, model(1), 0.0)
    c.deliver(GLOBAL, model(2), 1.0)
    c.deliver(REPORTS, report(2, 1, 0.25), 5.0)
    (ev,) = published(c.timer("window:1", 20.0), Evaluation)
    assert ev.n_clients == 1 and ev.accuracy == 0.25
    assert c.timer("window:2", 21.0).publish == () and c.state.pending == {}


def test_unrequested_late_unassigned_and_duplicate_reports_are_acked_ignored_and_counted():
    c = collector()
    c.deliver(ASSIGNMENTS, assignment(1, (1,), (2,)), 0.0)
    c.deliver(GLOBAL, model(1), 0.0)
    outcomes = {}
    for why, r in [
        ("unrequested", report(1, 9, 0.5)),
        ("unassigned", report(3, 1, 0.5)),
        (None, report(1, 1, 0.5)),
        ("duplicate", report(1, 1, 0.0)),
    ]:
        fx = c.deliver(REPORTS, r, 1.0)
        assert fx.ack == (c.tag,) and fx.publish == ()
        outcomes[why] = [o.name for o in fx.observe]
    assert outcomes == {"unrequested": ["unrequested"], "unassigned": ["unassigned"], None: ["reported"],
                        "duplicate": ["duplicate"]}  # fmt: skip
    assert c.state.pending[1].scores[1].accuracy == 0.5  # the first report stands
    c.timer("window:1", 20.0)
    fx = c.deliver(REPORTS, report(2, 1, 0.5), 21.0)
    assert [o.name for o in fx.observe] == ["late"] and fx.publish == ()


@pytest.mark.parametrize(
    ("bad", "reason"),
    [(report(1, 1, 1.5), "accuracy must be within 0..1"), (report(1, 1, 0.5, n=0), "n_samples must be >= 1")],
)
def test_a_malformed_report_is_refused(bad, reason):
    c = collector()
    c.deliver(ASSIGNMENTS, assignment(1, (1,)), 0.0)
    c.deliver(GLOBAL, model(1), 0.0)
    with pytest.raises(Reject, match=reason):
        c.deliver(REPORTS, bad, 1.0)


def test_a_newer_assignment_without_the_missing_client_completes_a_version_and_an_older_one_is_ignored():
    c = collector()
    c.deliver(ASSIGNMENTS, assignment(2, (1,), (2,)), 0.0)
    c.deliver(GLOBAL, model(1), 0.0)
    c.deliver(REPORTS, report(1, 1, 0.5), 1.0)
    assert c.deliver(ASSIGNMENTS, assignment(1, (1,)), 2.0).publish == ()  # older epoch: changes nothing
    (ev,) = published(c.deliver(ASSIGNMENTS, assignment(3, (1,)), 3.0), Evaluation)  # client 2 left
    assert ev.version == 1 and ev.n_clients == 1


def test_clients_that_fall_behind_do_not_pile_up_versions():
    c = collector(max_pending=2)
    c.deliver(ASSIGNMENTS, assignment(1, (1,), (2,)), 0.0)
    for v in (1, 2):
        c.deliver(GLOBAL, model(v), float(v))
        c.deliver(REPORTS, report(1, v, 0.5), float(v))
    (ev,) = published(c.deliver(GLOBAL, model(3), 3.0), Evaluation)
    assert ev.version == 1 and sorted(c.state.pending) == [2, 3]


def test_the_collector_uses_the_evaluator_s_rule():
    from fedat.fl import evaluation
    from fedat_aggregator import collector as col
    from fedat_worker import evaluator

    assert col.due is evaluation.due and evaluator.due is evaluation.due
    c = collector(every=0, interval=15.0)
    versions = []
    for v, t in enumerate([0.0, 5.0, 14.9, 15.0, 20.0, 31.0]):
        versions += [r.version for r in published(c.deliver(GLOBAL, model(v), t), EvaluationRequest)]
    assert versions == [0, 3, 5]


def test_its_metrics_are_labelled_by_tier_or_reason_never_by_client():
    c = collector()
    m = collector_metrics()
    fx = [c.deliver(ASSIGNMENTS, assignment(1, (11,), (12,)), 0.0), c.deliver(GLOBAL, model(1), 0.0)]
    fx += [c.deliver(REPORTS, report(11, 1, 0.5), 1.0), c.deliver(REPORTS, report(12, 1, 0.75), 2.0)]
    fx += [c.deliver(REPORTS, report(12, 1, 0.75), 3.0)]
    for f in fx:
        for o in f.observe:
            m.observe(o)
    text = generate_latest(m.transport.registry).decode()
    assert 'fedat_eval_client_reports_total{tier="1"} 1.0' in text
    assert 'fedat_eval_tier_accuracy_ratio{tier="2"} 0.75' in text
    assert 'fedat_collector_reports_ignored_total{reason="late"} 1.0' in text
    assert "fedat_eval_accuracy_ratio 0.625" in text and "fedat_eval_model_version 1.0" in text
    assert "client=" not in text and '"11"' not in text and '"12"' not in text


def drifting(versions: int, seed_: int = 0):
    """Polyline global models 0..versions-1, each a small step from the one before (as training moves them)."""
    rng = np.random.default_rng(seed_)
    w = [rng.normal(0, 0.05, s).astype(np.float32) for s in ((3, 3, 8), (8,), (200, 10))]
    out = []
    for v in range(versions):
        w = [(a + rng.normal(0, 0.002, a.shape)).astype(np.float32) for a in w]
        layers = encode_model(w, ["k", "b", "d"], "polyline", 4)
        out.append(replace(seed(1, [(1,)]), id=f"g{v}", version=v, layers=layers))
    return out


def asking(whole_every: int, *clients: int) -> Driver:
    """A collector asking for every version, with `clients` in one tier each."""
    c = Driver(Collector(CollectorConfig(EvalSchedule(every=1), whole_every=whole_every)))
    c.start(0.0)
    c.deliver(ASSIGNMENTS, assignment(1, *((k,) for k in clients)), 0.0)
    return c


def ask(c: Driver, g, scored_by: tuple[int, ...]) -> EvaluationRequest:
    """The request for `g`, then the reports of the clients that scored it."""
    (request,) = published(c.deliver(GLOBAL, g, float(g.version)), EvaluationRequest)
    for k in scored_by:
        c.deliver(REPORTS, report(k, g.version, 0.5), float(g.version))
    return request


def test_requests_between_whole_ones_go_against_the_newest_whole_one_and_decode_to_it_exactly():
    c = asking(3, 1, 2)
    models = drifting(7)
    requests = [ask(c, g, (1, 2)) for g in models]
    assert [r.relative_to for r in requests] == [-1, 0, 0, -1, 3, 3, -1]
    kept = {}
    for g, r in zip(models, requests, strict=True):
        if r.relative_to < 0:
            assert r.layers == g.layers  # whole: the layers as they came
            kept = {r.version: decode_model(r.layers)}
            continue
        # what a client that kept the whole one decodes: exactly the model sent whole, bit for bit
        got = decode_model(r.layers, kept[r.relative_to])
        assert [a.tobytes() for a in got] == [a.tobytes() for a in decode_model(g.layers)]
        assert model_bytes(r.layers) < 0.6 * model_bytes(g.layers)


def test_until_every_assigned_client_is_known_to_keep_the_whole_one_the_next_request_goes_whole_too():
    c = asking(4, 1, 2)
    m = drifting(6)
    # client 2 was training while the whole request came and its queue kept only a newer one: it cannot decode
    assert ask(c, m[0], scored_by=(1,)).relative_to == -1
    assert ask(c, m[1], scored_by=(1, 2)).relative_to == -1  # sent whole again; both keep version 1 now
    assert ask(c, m[2], scored_by=(2,)).relative_to == 1  # a report on a request sent against it counts too
    # a client joins: it keeps nothing yet
    c.deliver(ASSIGNMENTS, assignment(2, (1,), (2,), (3,)), 3.5)
    assert ask(c, m[3], scored_by=(1, 2, 3)).relative_to == -1
    assert ask(c, m[4], scored_by=()).relative_to == 3
    # before any assignment nobody is known to be expected: whole
    assert ask(asking(4), m[0], ()).relative_to == -1 and ask(asking(4), m[1], ()).relative_to == -1


def test_with_whole_every_1_or_a_model_on_no_grid_every_request_goes_whole():
    every = Driver(Collector(CollectorConfig(EvalSchedule(every=1), whole_every=1)))
    every.start(0.0)
    sent = [published(every.deliver(GLOBAL, g, 0.0), EvaluationRequest)[0] for g in drifting(3)]
    assert [r.relative_to for r in sent] == [-1, -1, -1] and every.state.whole is None
    raw = collector()  # the raw codec: no grid to send against
    assert [published(raw.deliver(GLOBAL, model(v), 0.0), EvaluationRequest)[0].relative_to for v in (1, 2)] == [-1, -1]
    with pytest.raises(ValueError, match="whole_every must be >= 1"):
        CollectorConfig(whole_every=0)


def test_a_restarted_collector_sends_its_next_request_whole():
    c = asking(4, 1)
    models = drifting(3)
    ask(c, models[0], (1,))
    assert ask(c, models[1], (1,)).relative_to == 0
    fresh = asking(4, 1)  # not durable: a new state
    assert ask(fresh, models[2], (1,)).relative_to == -1


def test_request_bytes_are_counted_by_how_they_went():
    c = asking(2, 1)
    m = collector_metrics()
    requests = []
    for g in drifting(2):
        fx = c.deliver(GLOBAL, g, 0.0)
        requests += published(fx, EvaluationRequest)
        c.deliver(REPORTS, report(1, g.version, 0.5), 0.0)
        for o in fx.observe:
            m.observe(o)
    assert m.request_bytes.labels("whole")._value.get() == model_bytes(requests[0].layers)
    assert m.request_bytes.labels("against_kept")._value.get() == model_bytes(requests[1].layers)
    assert m.requests._value.get() == 2


def test_whole_every_is_read_from_the_environment_and_checked():
    from fedat.errors import ConfigError
    from fedat_aggregator.collector_main import settings

    dev = {"FEDAT_SIGNING": "off"}
    assert settings(dev).collector.whole_every == 4
    assert settings({**dev, "FEDAT_EVAL_WHOLE_EVERY": "1"}).collector.whole_every == 1
    with pytest.raises(ConfigError, match="FEDAT_EVAL_WHOLE_EVERY=0 must be >= 1"):
        settings({**dev, "FEDAT_EVAL_WHOLE_EVERY": "0"})
