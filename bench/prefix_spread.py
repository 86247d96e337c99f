"""How far the workers' approximate prefix indexes diverge (``epp serve --workers N``,
no KV events): groups of requests that share a long prefix, sent one after another, and
the share of each group's requests that land on the group's most used server. One
process keeps every group on one server; workers that each learn only what they routed
send a group's first request through each worker to a server of its own choosing.

``python -m bench.prefix_spread --workers 1 2`` prints one line per worker count (a
short run: seconds); docs/workers.md quotes it."""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import random
import urllib.request

import orjson

from epp_harness.stack import LocalStack, StackOptions


def post(url: str, body: bytes) -> str:
    request = urllib.request.Request(url, body, {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        reply.read()
        return str(reply.headers.get("x-sim-instance", ""))


def same_server_share(url: str, groups: int, per_group: int, rng: random.Random) -> float:
    """Mean over groups of the share sent to the group's most used server; each group's
    requests go 4 at a time, so they reach every worker."""
    prefixes = [f"group {g}: " + "shared context sentence. " * 80 for g in range(groups)]
    shares = []
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for prefix in prefixes:
            bodies = [
                orjson.dumps(
                    {
                        "model": "sim-model",
                        "prompt": prefix + f"question {rng.random()}",
                        "max_tokens": 1,
                    }
                )
                for _ in range(per_group)
            ]
            served = list(pool.map(lambda b: post(url, b), bodies))
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
            servers=4, envoy_port=0, envoy_admin_port=0, grpc_port=0, http_port=0,
            log_level="warning", sim_args=["--time-scale", "0"], workers=workers,
        )  # fmt: skip
        with LocalStack(opts) as stack:
            url = f"{stack.envoy_url}/v1/completions"
            share = same_server_share(url, args.groups, args.per_group, random.Random(1))
        print(
            f"{workers} worker(s): {share:.0%} of a prefix group's requests on its most used "
            f"server ({args.groups} groups of {args.per_group}, 4 at a time, 4 servers)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
