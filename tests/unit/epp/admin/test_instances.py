"""``/status`` documents (epp.admin.instances.status_doc) on plain datastores."""

from __future__ import annotations

import time

from epp.admin.instances import status_doc
from epp.datalayer.ejection import FailureState
from epp.datastore import Datastore
from epp.types import Endpoint, EndpointMetrics

A, B = Endpoint("10.0.0.1", 1), Endpoint("10.0.0.2", 2)


def test_load_shows_the_kv_cache_geometry_once_reported() -> None:
    ds = Datastore()
    ds.add(A)
    ds.add(B)
    now = time.monotonic()
    ds.update_metrics(A.address, EndpointMetrics(now, 0, 1, 0.5, block_size=128, num_blocks=64))
    ds.update_metrics(B.address, EndpointMetrics(now, 0, 1, 0.5))
    doc = {m["instance"]: m for m in status_doc(ds, lambda _: FailureState())["endpoints"]}
    assert (doc[A.address]["load"]["block_size"], doc[A.address]["load"]["num_blocks"]) == (128, 64)
    assert "block_size" not in doc[B.address]["load"]


def test_load_shows_lora_state_only_where_a_server_reports_it() -> None:
    ds = Datastore()
    ds.add(A)
    ds.add(B)
    now = time.monotonic()
    lora = EndpointMetrics(
        now, 0, 1, 0.5, lora_running=frozenset({"b", "a"}), lora_waiting=frozenset(), max_lora=2
    )
    ds.update_metrics(A.address, lora)
    ds.update_metrics(B.address, EndpointMetrics(now, 0, 1, 0.5))
    doc = {m["instance"]: m for m in status_doc(ds, lambda _: FailureState())["endpoints"]}
    assert doc[A.address]["load"]["lora"] == {"max_lora": 2, "running": ["a", "b"], "waiting": []}
    assert "lora" not in doc[B.address]["load"]


def test_load_shows_the_prefix_cache_counters_where_a_server_reports_them() -> None:
    ds = Datastore()
    ds.add(A)
    ds.add(B)
    now = time.monotonic()
    counted = EndpointMetrics(now, 0, 1, 0.5, prefix_cache_queries=1000.0, prefix_cache_hits=250.0)
    ds.update_metrics(A.address, counted)
    ds.update_metrics(B.address, EndpointMetrics(now, 0, 1, 0.5))
    doc = {m["instance"]: m for m in status_doc(ds, lambda _: FailureState())["endpoints"]}
    cache = doc[A.address]["load"]["prefix_cache"]
    assert cache == {"queried_tokens": 1000.0, "hit_tokens": 250.0}
    assert "prefix_cache" not in doc[B.address]["load"]
