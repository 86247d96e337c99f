from prometheus_client import generate_latest

from epp.datastore import Datastore
from epp.observability.metrics import SERIES_GRACE_S, EppMetrics
from epp.types import Endpoint


def test_series_survive_ejection_and_go_a_grace_after_removal() -> None:
    now = [100.0]
    ds = Datastore(clock=lambda: now[0])
    metrics = EppMetrics(ds, series_grace_s=SERIES_GRACE_S, clock=lambda: now[0])
    ds.add(Endpoint("10.0.0.1", 1))
    ds.add(Endpoint("10.0.0.1", 2))
    for port in (1, 2):
        metrics.scrape_failures.labels(f"10.0.0.1:{port}").inc()
        metrics.responses.labels(f"10.0.0.1:{port}", "2xx").inc()

    def text() -> str:
        metrics.expire_series()  # what GET /metrics does first
        return generate_latest(metrics.registry).decode()

    ds.eject("10.0.0.1:1")
    assert 'epp_scrape_failures_total{endpoint="10.0.0.1:1"} 1.0' in text()
    assert 'epp_endpoint_status{endpoint="10.0.0.1:1",status="ejected"} 1.0' in text()
    metrics.scrape_failures.labels("10.0.0.1:1").inc()  # still counting while ejected
    ds.remove("10.0.0.1:1")
    now[0] += SERIES_GRACE_S - 1  # removed, within the grace: the final counts stay
    assert 'epp_scrape_failures_total{endpoint="10.0.0.1:1"} 2.0' in text()
    assert 'epp_endpoint_status{endpoint="10.0.0.1:1"' not in text()
    now[0] += 1
    assert "10.0.0.1:1" not in text()
    assert 'epp_scrape_failures_total{endpoint="10.0.0.1:2"} 1.0' in text()
    assert 'epp_responses_total{endpoint="10.0.0.1:2",status_class="2xx"} 1.0' in text()
    # an endpoint back after its series went starts them again (its kept child went
    # with them: the one labels() hands out is the one exposed)
    ds.add(Endpoint("10.0.0.1", 1))
    metrics.responses.labels("10.0.0.1:1", "2xx").inc()
    assert 'epp_responses_total{endpoint="10.0.0.1:1",status_class="2xx"} 1.0' in text()


def test_an_endpoint_back_within_the_grace_keeps_its_series() -> None:
    now = [0.0]
    ds = Datastore(clock=lambda: now[0])
    metrics = EppMetrics(ds, clock=lambda: now[0])
    ds.add(Endpoint("10.0.0.1", 1))
    metrics.responses.labels("10.0.0.1:1", "5xx").inc()
    ds.remove("10.0.0.1:1")
    ds.add(Endpoint("10.0.0.1", 1))
    now[0] += SERIES_GRACE_S + 1
    metrics.expire_series()
    text = generate_latest(metrics.registry).decode()
    assert 'epp_responses_total{endpoint="10.0.0.1:1",status_class="5xx"} 1.0' in text


def test_prefix_index_size_is_exported_by_plugin_name() -> None:
    from epp.config import build_scheduler
    from epp.scheduling.plugins.prefix import PrefixCacheScorer
    from epp.types import InferenceRequest, SchedulingResult

    ds = Datastore()
    ds.add(Endpoint("10.0.0.1", 1))
    metrics = EppMetrics(ds)
    scheduler = build_scheduler("")
    scorers = {n: p for n, p in scheduler.plugins.items() if isinstance(p, PrefixCacheScorer)}
    assert list(scorers) == ["prefix-cache-scorer"]
    metrics.report_prefix_indexes(lambda: {n: p.index for n, p in scorers.items()})
    text = generate_latest(metrics.registry).decode()
    assert 'epp_prefix_index_blocks{plugin="prefix-cache-scorer"} 0.0' in text
    snap = ds.snapshot()
    req = InferenceRequest("r", "m", "/v1/completions", prompt="x" * 64 * 5)  # 5 blocks
    scorers["prefix-cache-scorer"].on_routed(
        req, SchedulingResult((snap.endpoints[0].endpoint,)), snap
    )
    text = generate_latest(metrics.registry).decode()
    assert 'epp_prefix_index_blocks{plugin="prefix-cache-scorer"} 5.0' in text
