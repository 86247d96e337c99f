"""LoRA adapters preloaded on some servers (vLLM's ``--lora-modules NAME=PATH``), end to
end through a real Envoy and EPP to four simulators: a1 on sim-0, a2 on sim-1 and
sim-2, nothing on sim-3. Every request for an adapter reaches a server that holds it,
one at a time and many at once, in the default config and with placement on; an
adapter loaded or unloaded behind the EPP's back is seen at its next listing; a server
that lost an adapter answers 404 and Envoy retries on the next holder, so the client
never sees it; an adapter nobody holds is the servers' 404, as before."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

from epp_harness.stack import LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.http import get_json, request
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e
PRELOADED = [["--lora-modules", "a1=/adapters/a1"], ["--lora-modules", "a2=/adapters/a2"]]
PRELOADED += [["--lora-modules", "a2=/adapters/a2"], ["--enable-lora"]]
HELD = {"a1": {0}, "a2": {1, 2}}  # adapter -> the simulators it is preloaded on
SEQUENTIAL, CONCURRENT = 20, 20  # requests per adapter
_prompts = itertools.count()


@contextmanager
def started(tmp: Path, config: str) -> Iterator[LocalStack]:
    """The four simulators behind Envoy and the EPP (``config``: its config file), once
    the EPP has listed what each one holds."""
    (tmp / "epp.yaml").write_text(config)
    args = ["--config", str(tmp / "epp.yaml")]
    opts = ephemeral(
        servers=4, sim_args=["--max-loras", "2"], sim_args_each=PRELOADED, epp_args=args
    )
    with LocalStack(opts) as stack:
        wait_for(lambda: knows(stack, HELD), 30, "the EPP lists every server's adapters")
        yield stack


def knows(stack: LocalStack, held: dict[str, set[int]]) -> bool:
    """Whether the EPP's view (GET /lora/adapters) is ``held``, on every server."""
    servers = get_json(f"{stack.epp_http_url}/lora/adapters")["servers"]
    return all(
        sorted(servers.get(address, ["?"])) == sorted(a for a, on in held.items() if i in on)
        for i, address in enumerate(stack.sim_addresses)
    )


def complete(stack: LocalStack, model: str, prompt: str = "") -> tuple[int, int | None, Any]:
    """(status, index of the simulator that answered, JSON body) of one completion; a
    prompt of its own each unless given (no prefix affinity to follow)."""
    prompt = prompt or f"request {next(_prompts)} for {model}"
    body = orjson.dumps({"model": model, "prompt": prompt, "max_tokens": 2})
    status, headers, raw = request(f"{stack.envoy_url}/v1/completions", body)
    instance = headers.get("x-sim-instance")
    index = next((i for i, s in enumerate(stack.sims) if s.info["instance"] == instance), None)
    return status, index, orjson.loads(raw) if raw else None


def send_all(stack: LocalStack) -> list[tuple[str, int, int | None]]:
    """SEQUENTIAL requests per adapter one at a time (alternating), then CONCURRENT per
    adapter all at once: (adapter, status, simulator) of each."""
    out = []
    for _ in range(SEQUENTIAL):
        for adapter in HELD:
            status, index, _ = complete(stack, adapter)
            out.append((adapter, status, index))
    models = [a for a in HELD for _ in range(CONCURRENT)]
    with ThreadPoolExecutor(max_workers=len(models)) as pool:
        answers = list(pool.map(lambda a: complete(stack, a), models))
    out += [(a, status, index) for a, (status, index, _) in zip(models, answers, strict=True)]
    return out


def adapters_on(stack: LocalStack, index: int) -> list[str]:
    cards = get_json(f"{stack.sim_urls[index]}/v1/models")["data"]
    return [c["id"] for c in cards if c.get("parent")]


def sim_call(stack: LocalStack, index: int, path: str, adapter: str) -> None:
    """Load or unload ``adapter`` on a simulator through its own API, behind the EPP."""
    doc = orjson.dumps({"lora_name": adapter, "lora_path": f"/adapters/{adapter}"})
    status, _, body = request(f"{stack.sim_urls[index]}{path}", doc)
    assert status == 200, body


# -- the default config ----------------------------------------------------------------------


# The built-in default but for the listing interval (10 s): a listing every second
# changes no pick, and a change behind the EPP's back is seen within a second, not ten.
LISTING = "loraPlacement: {listIntervalSeconds: 1}\n"


@pytest.fixture(scope="module")
def default(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with started(tmp_path_factory.mktemp("lora-preloaded"), LISTING) as s:
        yield s


def test_every_request_reaches_a_server_holding_its_adapter(default: LocalStack) -> None:
    answers = send_all(default)
    failed = [a for a in answers if a[1] != 200]
    astray = [a for a in answers if a[2] not in HELD[a[0]]]
    assert failed == [] and astray == []
    assert len(answers) == len(HELD) * (SEQUENTIAL + CONCURRENT)


def test_an_adapter_loaded_then_unloaded_behind_its_back_is_seen(default: LocalStack) -> None:
    s = default
    sim_call(s, 3, "/v1/load_lora_adapter", "a3")
    try:  # seen at the next listing (every listIntervalSeconds)
        wait_for(lambda: knows(s, {**HELD, "a3": {3}}), 30, "the EPP lists a3 on sim-3")
        answers = [complete(s, "a3")[:2] for _ in range(10)]
        assert answers == [(200, 3)] * 10
    finally:
        sim_call(s, 3, "/v1/unload_lora_adapter", "a3")
    wait_for(lambda: knows(s, HELD), 30, "the EPP sees a3 gone")
    status, index, body = complete(s, "a3")  # nobody holds it: the servers' 404, as before
    assert status == 404 and index is not None
    assert "a3" in body["error"]["message"] and set(body["error"]) >= {"message", "type"}


def test_a_model_nobody_serves_is_still_a_404_in_openai_shape(default: LocalStack) -> None:
    status, _, body = complete(default, "nope")
    assert status == 404
    assert "nope" in body["error"]["message"] and set(body["error"]) >= {"message", "type"}


# -- placement on: adapters of the catalogue, loaded on demand where none is -----------------

PLACEMENT = """
models:
  adapters: {a1: /adapters/a1, a2: /adapters/a2}
loraPlacement: {enabled: true, listIntervalSeconds: 3600}
"""


@pytest.fixture(scope="module")
def placement(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with started(tmp_path_factory.mktemp("lora-preloaded-placement"), PLACEMENT) as s:
        yield s


def test_with_placement_requests_go_where_the_adapter_is_or_was_loaded(
    placement: LocalStack,
) -> None:
    s = placement
    answers = send_all(s)
    assert [a for a in answers if a[1] != 200] == []
    at_home = sum(index in HELD[adapter] for adapter, _, index in answers)
    assert at_home >= 0.95 * len(answers)
    for adapter, _, index in answers:  # the others only where it was loaded first
        assert index is not None and adapter in adapters_on(s, index)


def test_a_server_that_lost_the_adapter_answers_404_and_the_next_holder_serves(
    placement: LocalStack,
) -> None:
    """The holder of a2 that served it last loses it behind the EPP's back (no listing
    for an hour): the EPP still sends a2 there first, the server answers vLLM's 404,
    Envoy retries on the other holder (the EPP listed only holders), and the EPP takes
    a2 off the first."""
    s = placement
    status, home, _ = complete(s, "a2")
    assert status == 200 and home in HELD["a2"]
    [other] = HELD["a2"] - {home}
    sim_call(s, home, "/v1/unload_lora_adapter", "a2")
    try:
        for i in range(60):  # until the EPP sends a2 to home first (it prefers it)
            prompt = f"after the unload, {i}"
            assert complete(s, "a2", prompt)[:2] == (200, other)
            if last_prompt(s, home) == prompt:
                break  # home got it (and answered 404): Envoy retried on the other
        else:
            pytest.fail("the EPP never sent a2 to its old holder in 60 tries")
        address = s.sim_addresses[home]
        wait_for(lambda: "a2" not in servers_of(s)[address], 10, "a2 taken off its old holder")
        assert [complete(s, "a2")[:2] for _ in range(5)] == [(200, other)] * 5
    finally:
        sim_call(s, home, "/v1/load_lora_adapter", "a2")


def last_prompt(stack: LocalStack, index: int) -> str | None:
    """The prompt of the last completion a simulator received (None: none yet)."""
    status, _, raw = request(f"{stack.sim_urls[index]}/sim/last-request")
    return orjson.loads(raw)["body"]["prompt"] if status == 200 else None


def servers_of(stack: LocalStack) -> dict[str, list[str]]:
    servers: dict[str, list[str]] = get_json(f"{stack.epp_http_url}/lora/adapters")["servers"]
    return servers
