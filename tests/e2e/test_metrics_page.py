"""A live EPP's /metrics page after a fixed scenario of traffic through real Envoy is
the page scrapers and the dashboard were written against: the same families (name,
type, help), the same series (sample names and label sets, histogram buckets
included) and the same values, compared with a page captured once before the llm-d
series came from one write each (metrics_page.json).

Values that depend on timing or on the machine (durations, creation times, process
and GC figures, ages, scrape counts, what the latency model learned) are compared by
presence only; everything counted per request is compared exactly. Endpoint addresses
and ports (ephemeral) read as the simulator's name.

Capture the page again (only when the page is meant to change, and say why in the
commit): ``.venv/bin/python -m tests.e2e.test_metrics_page``."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from epp_harness.stack import LocalStack
from tests.support.http import request
from tests.support.live_metrics import stack_with_traffic
from tests.support.wait import quiesce

pytestmark = pytest.mark.e2e

GOLDEN = Path(__file__).with_name("metrics_page.json")
# families whose values depend on time, the machine or the scrape schedule: compared by
# their sample and label names
VOLATILE = re.compile(
    r"^(process_|python_|epp_gc_pause_|epp_scrapes$|epp_endpoint_metrics_age_"
    r"|epp_latency_model$|epp_scrape_interval_|epp_endpoint_kv_cache_usage$"
    r"|llm_d_epp_average_kv_cache_utilization$|inference_pool_average_kv_cache_utilization$"
    r"|llm_d_epp_std_dev_kv_cache_utilization$)"
)
# families with series only when something failed by chance (a scrape timed out on a
# loaded machine): compared by presence
PRESENCE = {"epp_scrape_failures"}
# samples of other families that measure time: compared by presence (their _count is not)
TIMED = re.compile(r"_seconds(_bucket|_sum)$")


@pytest.fixture(scope="module")
def live() -> Iterator[LocalStack]:
    with stack_with_traffic() as stack:
        yield stack


def page(stack: LocalStack) -> dict[str, Any]:
    """The EPP's /metrics, by family: type, help and its samples as
    [sample name, labels, value or None where it is not compared] (for volatile
    families: [sample name, label names])."""
    quiesce(stack)  # everything the scenario's requests count is counted
    names = {
        address: sim.name for address, sim in zip(stack.sim_addresses, stack.sims, strict=True)
    }
    ports = {address.rpartition(":")[2]: f"{name}-port" for address, name in names.items()}
    _, _, body = request(f"{stack.epp_http_url}/metrics")
    out: dict[str, Any] = {}
    for family in text_string_to_metric_families(body.decode()):
        samples: list[Any] = []
        if VOLATILE.match(family.name):
            found = {(s.name, tuple(sorted(s.labels))) for s in family.samples}
            samples = [[name, list(labels)] for name, labels in sorted(found)]
        elif family.name not in PRESENCE:
            for sample in family.samples:
                labels = {k: _stable(k, v, names, ports) for k, v in sample.labels.items()}
                value: float | None = sample.value
                if sample.name.endswith("_created") or TIMED.search(sample.name):
                    value = None
                samples.append([sample.name, labels, value])
            samples.sort(key=lambda s: (s[0], sorted(s[1].items())))
        out[family.name] = {
            "type": family.type,
            "help": family.documentation,
            "samples": samples,
        }
    return out


def _stable(label: str, value: str, names: dict[str, str], ports: dict[str, str]) -> str:
    """A label value that is the same on every run: simulators by name, not address."""
    if label == "port":
        return ports.get(value, value)
    if label == "build_ref":
        return "VERSION"
    return names.get(value, value)


def test_the_page_is_the_one_scrapers_were_written_against(live: LocalStack) -> None:
    expected = json.loads(GOLDEN.read_text())
    found = page(live)
    assert sorted(found) == sorted(expected)  # the families
    for name, family in expected.items():
        assert found[name] == family, name


if __name__ == "__main__":
    with stack_with_traffic() as stack:
        GOLDEN.write_text(json.dumps(page(stack), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
