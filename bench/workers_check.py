"""Short checks of ``epp serve --workers N`` against 4 instant simulators, per worker
count (seconds each; docs/workers.md quotes them):

* scrapes per endpoint per second, read from the group's ``epp_scrapes_total`` (every
  process's, merged): one scraper in the parent, so it must not grow with N;
* how far the workers' approximate prefix indexes diverge (no KV events): groups of
  requests that share a long prefix, one after another, and the share of each group's
  requests that land on the group's most used server. One process keeps a group on one
  server; workers learn only what they routed themselves.

``python -m bench.workers_check --workers 1 2``"""

from __future__ import annotations

import argparse
import collections
import random
import time
import urllib.request

import orjson
from prometheus_client.parser import text_string_to_metric_families

from epp_harness.stack import LocalStack, StackOptions

SERVERS = 4


def post(url: str, body: bytes) -> str:
    request = urllib.request.Request(url, body, {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        reply.read()
        return str(reply.headers.get("x-sim-instance", ""))


def scrapes(http_url: str) -> float:
    with urllib.request.urlopen(f"{http_url}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "epp_scrapes_total"
    )


def scrape_rate(http_url: str, seconds: float) -> float:
    """Scrapes per endpoint per second over ``seconds``."""
    first, began = scrapes(http_url), time.monotonic()
    time.sleep(seconds)
    return (scrapes(http_url) - first) / (time.monotonic() - began) / SERVERS


def same_server_share(url: str, groups: int, per_group: int, rng: random.Random) -> float:
    """Mean over groups of the share sent to the group's most used server."""
    shares = []
    for g in range(groups):
        prefix = f"group {g}: " + "shared context sentence. " * 80
        served = [
            post(url, orjson.dumps({"model": "sim-model", "prompt": f"{prefix}{rng.random()}",
                                    "max_tokens": 1}))
            for _ in range(per_group)
        ]  # fmt: skip
        shares.append(collections.Counter(served).most_common(1)[0][1] / len(served))
    return sum(shares) / len(shares)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--groups", type=int, default=40)
    parser.add_argument("--per-group", type=int, default=8)
    args = parser.parse_args()
    for workers in args.workers:
        opts = StackOptions(
            servers=SERVERS, envoy_port=0, envoy_admin_port=0, grpc_port=0, http_port=0,
            log_level="warning", sim_args=["--time-scale", "0"], workers=workers,
        )  # fmt: skip
        with LocalStack(opts) as stack:
            rate = scrape_rate(stack.epp_http_url, 3.0)
            url = f"{stack.envoy_url}/v1/completions"
            share = same_server_share(url, args.groups, args.per_group, random.Random(1))
        print(
            f"{workers} worker(s): {rate:.1f} scrapes per endpoint per second; "
            f"{share:.0%} of a prefix group's requests on its most used server "
            f"({args.groups} groups of {args.per_group}, one at a time, {SERVERS} servers)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
