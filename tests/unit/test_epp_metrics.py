from prometheus_client import generate_latest

from epp.admin.metrics import EppMetrics
from epp.datastore import Datastore
from epp.types import Endpoint


def test_series_of_removed_endpoints_are_dropped() -> None:
    ds = Datastore()
    metrics = EppMetrics(ds)
    ds.add(Endpoint("10.0.0.1", 1))
    ds.add(Endpoint("10.0.0.1", 2))
    for port in (1, 2):
        metrics.scrape_failures.labels(f"10.0.0.1:{port}").inc()
        metrics.responses.labels(f"10.0.0.1:{port}", "2xx").inc()
    ds.remove("10.0.0.1:1")
    text = generate_latest(metrics.registry).decode()
    assert "10.0.0.1:1" not in text
    assert 'epp_scrape_failures_total{endpoint="10.0.0.1:2"} 1.0' in text
    assert 'epp_responses_total{endpoint="10.0.0.1:2",status_class="2xx"} 1.0' in text
