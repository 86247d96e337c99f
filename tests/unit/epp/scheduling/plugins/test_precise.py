"""The precise-prefix-cache-scorer on plain snapshots: precise where an endpoint's
events are trusted, the approximate scorer elsewhere; and its use by the latency scorer
and the P/D decider."""

from __future__ import annotations

import random
from array import array
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.common.params import ConfigError
from epp.config import build_scheduler
from epp.kvevents.wire import BlockStored
from epp.scheduling.base import CycleContext
from epp.scheduling.latency import UNCACHED_KEY
from epp.scheduling.plugins.precise import PrecisePrefixCacheScorer, PromptMemo, _Prompt
from epp.scheduling.plugins.prefix import PrefixCacheScorer
from epp.scheduling.scheduler import ProfileScheduler
from epp.types import Endpoint, EndpointState, InferenceRequest, SchedulingResult, Snapshot
from epp_harness.sim.tokenizer import encode, write_tokenizer_files

NOW = 100.0
BS = 16
PROMPT = ("You are a careful assistant. " * 8)[: 14 * BS]  # 14 blocks of 16 tokens (bytes)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer_files(tmp_path_factory.mktemp("tok"))


def config(tokenizer_dir: Path, extra: str = "", profile: str = "") -> str:
    return f"""
plugins:
- type: prefix-cache-scorer
- type: precise-prefix-cache-scorer
  parameters:
    tokenizer: {tokenizer_dir}
    loadBound: 0
    {extra}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: precise-prefix-cache-scorer
  {profile}
  - pluginRef: max-score-picker
"""


def states(n: int) -> tuple[EndpointState, ...]:
    return tuple(EndpointState(Endpoint("10.0.0.1", 8000 + i)) for i in range(n))


def request(prompt: str) -> InferenceRequest:
    body = {"model": "m", "prompt": prompt}
    return InferenceRequest("r", "m", "/v1/completions", prompt=prompt, body=body)


def hold(scorer: PrecisePrefixCacheScorer, address: str, text: str, medium: str = "GPU") -> None:
    """``address`` reports holding the full blocks of ``text`` (one chain)."""
    ids = encode(text)
    n = len(ids) // BS
    event = BlockStored(tuple(range(1, n + 1)), None, array("q", ids[: n * BS]), BS, medium=medium)
    scorer.index.apply(address, [event], NOW)


def cycle(snapshot: Snapshot, req: InferenceRequest, vectorize_from: int = 64) -> CycleContext:
    return CycleContext(req, snapshot, NOW, random.Random(0), vectorize_from=vectorize_from)


def plugins(text: str) -> tuple[ProfileScheduler, PrecisePrefixCacheScorer, PrefixCacheScorer]:
    sched = build_scheduler(text, clock=lambda: NOW)
    precise, approx = (
        sched.plugins["precise-prefix-cache-scorer"],
        sched.plugins["prefix-cache-scorer"],
    )
    assert isinstance(precise, PrecisePrefixCacheScorer) and isinstance(approx, PrefixCacheScorer)
    return sched, precise, approx


@pytest.mark.parametrize("vectorize_from", [1, 64])
def test_trusted_endpoints_score_by_what_they_hold_others_approximately(
    tokenizer_dir: Path, vectorize_from: int
) -> None:
    _, precise, approx = plugins(config(tokenizer_dir))
    eps = states(4)
    a, b, c, d = (s.address for s in eps)
    for address in (a, b, c):
        precise.index.reset(address, NOW, complete=True)
    precise.index.reset(d, NOW, complete=False)  # events lost: approximate for now
    hold(precise, a, PROMPT)  # all 14 blocks
    hold(precise, b, PROMPT[: 7 * BS])  # half
    snap = Snapshot(eps, {})
    req = request(PROMPT + "question?")
    # the EPP routed this prompt to c and d (the approximate index believes both hold it)
    approx.on_routed(req, SchedulingResult((eps[2].endpoint,), eps[3].endpoint), snap)
    scores = precise.score(cycle(snap, req, vectorize_from), eps)
    assert list(scores) == pytest.approx([1.0, 0.5, 0.0, 1.0])  # c: trusted, holds nothing


def test_untokenizable_requests_fall_back_entirely(tokenizer_dir: Path) -> None:
    _, precise, approx = plugins(config(tokenizer_dir))
    eps = states(2)
    precise.index.reset(eps[0].address, NOW, complete=True)
    hold(precise, eps[0].address, PROMPT)
    req = InferenceRequest("r", "m", "/v1/completions", prompt=PROMPT)  # no body
    approx.on_routed(req, SchedulingResult((eps[1].endpoint,)), Snapshot(eps, {}))
    assert list(precise.score(cycle(Snapshot(eps, {}), req), eps)) == [0.0, 1.0]


def test_blocks_held_off_the_gpu_count_cpu_weight(tokenizer_dir: Path) -> None:
    _, precise, _ = plugins(config(tokenizer_dir, "cpuWeight: 0.25"))
    eps = states(1)
    address = eps[0].address
    precise.index.reset(address, NOW, complete=True)
    hold(precise, address, PROMPT, medium="CPU")
    ctx = cycle(Snapshot(eps, {}), request(PROMPT))
    assert list(precise.score(ctx, eps)) == [0.25]
    assert precise.cached_tokens(ctx) == {address: round(0.25 * 14 * BS)}


def test_cached_tokens_and_fraction_use_real_token_counts(tokenizer_dir: Path) -> None:
    _, precise, _ = plugins(config(tokenizer_dir))
    eps = states(2)
    a = eps[0].address
    precise.index.reset(a, NOW, complete=True)
    hold(precise, a, PROMPT[: 10 * BS])
    ctx = cycle(Snapshot(eps, {}), request(PROMPT))
    assert precise.prompt_tokens(ctx) == len(PROMPT)  # one token per byte here
    assert precise.cached_tokens(ctx) == {a: 10 * BS}
    assert precise.cached_fraction(ctx, a) == pytest.approx(10 * BS / len(PROMPT))
    assert precise.cached_fraction(ctx, eps[1].address) == 0.0


def test_an_untrusted_endpoints_estimate_is_counted_in_the_engines_tokens(
    tokenizer_dir: Path,
) -> None:
    """The approximate index knows shares of the prompt, not engine tokens: an
    untrusted endpoint it believes holds the whole prompt caches all of its tokens."""
    _, precise, approx = plugins(config(tokenizer_dir))
    eps = states(2)
    trusted, untrusted = (s.address for s in eps)
    precise.index.reset(trusted, NOW, complete=True)
    snap = Snapshot(eps, {})
    approx.on_routed(request(PROMPT), SchedulingResult((eps[1].endpoint,)), snap)
    ctx = cycle(snap, request(PROMPT))
    assert precise.prompt_tokens(ctx) == len(PROMPT)  # bytes, 4x the estimate
    assert precise.cached_tokens(ctx) == {untrusted: len(PROMPT)}
    assert precise.cached_fraction(ctx, untrusted) == 1.0


def test_the_latency_scorer_prefers_the_precise_scorer(tokenizer_dir: Path) -> None:
    profile = "- pluginRef: predicted-latency-scorer\n  "
    text = config(tokenizer_dir, profile=profile).replace(
        "- type: max-score-picker", "- type: predicted-latency-scorer\n- type: max-score-picker"
    )
    sched, precise, _ = plugins(text)
    eps = states(2)
    a, b = (s.address for s in eps)
    for address in (a, b):
        precise.index.reset(address, NOW, complete=True)
    hold(precise, b, PROMPT)
    req = request(PROMPT)
    result = sched.schedule(req, Snapshot(eps, {}), random.Random(0))
    assert result.primary.address == b
    assert result.prediction is not None and result.prediction.uncached_tokens == 0
    ctx = cycle(Snapshot(eps, {}), req)
    latency = sched.plugins["predicted-latency-scorer"]
    latency.score(ctx, eps)  # type: ignore[attr-defined]
    assert ctx.cache[UNCACHED_KEY].get(a, -1) == len(PROMPT)


def test_a_pick_follows_the_server_that_holds_the_prefix(tokenizer_dir: Path) -> None:
    sched, precise, approx = plugins(config(tokenizer_dir))
    eps = states(2)
    a, b = (s.address for s in eps)
    snap = Snapshot(eps, {})
    req = request(PROMPT)
    approx.on_routed(req, SchedulingResult((eps[0].endpoint,)), snap)  # routed to a
    assert sched.schedule(req, snap, random.Random(0)).primary.address == a
    for address in (a, b):  # both now publish: a evicted it, b holds it
        precise.index.reset(address, NOW, complete=True)
    hold(precise, b, PROMPT)
    assert sched.schedule(req, snap, random.Random(0)).primary.address == b


def test_without_a_declared_fallback_it_keeps_its_own(tokenizer_dir: Path) -> None:
    text = config(tokenizer_dir).replace("- type: prefix-cache-scorer\n", "")
    sched = build_scheduler(text, clock=lambda: NOW)
    precise = sched.plugins["precise-prefix-cache-scorer"]
    assert isinstance(precise, PrecisePrefixCacheScorer) and precise.fallback is not None
    eps = states(2)
    req = InferenceRequest("r", "m", "/v1/completions", prompt=PROMPT)
    sched.on_routed(req, SchedulingResult((eps[1].endpoint,)), Snapshot(eps, {}))
    assert list(precise.score(cycle(Snapshot(eps, {}), req), eps)) == [0.0, 1.0]


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ("cpuWeight: 2", "cpuWeight"),
        ("fallbackPlugin: max-score-picker", "fallbackPlugin"),
        ("kvEvents: {port: 70000}", "kvEvents.port"),
        ("kvEvents: {topic: 5}", "kvEvents.topic"),
        ("kvEvents: {bogus: 1}", "bogus"),
        ("maxBlocksPerEndpoint: 0", "maxBlocksPerEndpoint"),
    ],
)
def test_bad_parameters_are_config_errors(tokenizer_dir: Path, extra: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        build_scheduler(config(tokenizer_dir, extra))


def test_a_missing_tokenizer_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tokenizer\.json"):
        build_scheduler(config(tmp_path))


def test_kv_event_addresses_follow_the_endpoint_labels(tokenizer_dir: Path) -> None:
    _, precise, _ = plugins(config(tokenizer_dir, "kvEvents: {port: 7000, replayPort: 7001}"))
    settings = precise.events
    assert settings.addresses(Endpoint("10.0.0.9", 8000)) == (
        "tcp://10.0.0.9:7000",
        "tcp://10.0.0.9:7001",
    )
    labelled = Endpoint(
        "10.0.0.9", 8000, labels={"epp.dev/kv-events": "7100", "epp.dev/kv-events-replay": "none"}
    )
    assert settings.addresses(labelled) == ("tcp://10.0.0.9:7100", None)
    other = Endpoint("fd00::1", 8000, labels={"epp.dev/kv-events": "[fd00::2]:9"})
    assert settings.addresses(other)[0] == "tcp://[fd00::2]:9"
    off = Endpoint("10.0.0.9", 8000, labels={"epp.dev/kv-events": "none"})
    assert settings.addresses(off) == (None, None)
    with pytest.raises(ValueError, match=r"epp\.dev/kv-events"):
        settings.addresses(Endpoint("10.0.0.9", 8000, labels={"epp.dev/kv-events": "99999"}))


def test_the_shipped_example_config_loads() -> None:
    path = Path(__file__).resolve().parents[5] / "configs" / "precise-prefix.yaml"
    sched = build_scheduler(path.read_text(), source=str(path))
    precise = sched.plugins["precise-prefix-cache-scorer"]
    assert isinstance(precise, PrecisePrefixCacheScorer)
    assert precise.fallback is sched.plugins["prefix-cache-scorer"]
    assert precise.tokenizer is None  # none named: token-id prompts only


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["none", "rebuilding", "trusted"]),
            st.integers(0, 14),
            st.booleans(),
            st.integers(0, 14),
            st.integers(0, 6),
        ),
        min_size=1,
        max_size=8,
    ),
    st.booleans(),
)
def test_numpy_and_list_paths_give_the_same_scores(
    tokenizer_dir: Path, specs: list[tuple[str, int, bool, int, int]], half: bool
) -> None:
    text = config(tokenizer_dir).replace("loadBound: 0", "loadBound: 1.25")
    _, precise, approx = plugins(text)
    eps = states(len(specs))
    in_flight = {}
    for s, (trust, blocks, on_cpu, routed, load) in zip(eps, specs, strict=True):
        if trust != "none":
            precise.index.reset(s.address, NOW, complete=trust == "trusted")
        if blocks:
            hold(precise, s.address, PROMPT[: blocks * BS], "CPU" if on_cpu else "GPU")
        if routed:
            cut = InferenceRequest("r", "m", "/v1/completions", prompt=PROMPT[: routed * BS])
            approx.on_routed(cut, SchedulingResult((s.endpoint,)), Snapshot(eps, {}))
        in_flight[s.address] = load
    candidates = eps[::2] if half else eps
    snap = Snapshot(eps, in_flight)
    lists = precise.score(cycle(snap, request(PROMPT), vectorize_from=10_000), candidates)
    arrays = precise.score(cycle(snap, request(PROMPT), vectorize_from=1), candidates)
    assert isinstance(lists, list)
    assert list(arrays) == pytest.approx(lists)


def test_the_prompt_memo_tokenizes_a_body_once_and_forgets_the_oldest() -> None:
    made: list[str] = []

    def tokenize(path: str, body: object, lora: str) -> _Prompt | None:
        made.append(f"{path}:{lora}")
        return _Prompt(b"", len(made), lora)

    memo = PromptMemo(2)
    one, two, three = {"prompt": "a"}, {"prompt": "a"}, {"prompt": "c"}  # equal, not same
    first = memo.get(one, "/p", "", tokenize)
    assert memo.get(one, "/p", "", tokenize) is first  # the same body: remembered
    assert memo.get(two, "/p", "", tokenize) is not first  # an equal body is another request
    assert memo.get(one, "/p", "x", tokenize) is not first  # another adapter: tokenized anew
    memo.get(three, "/p", "", tokenize)  # one (with "x") and three kept: two forgotten
    memo.get(two, "/p", "", tokenize)
    assert made == ["/p:", "/p:", "/p:x", "/p:", "/p:"] and memo.misses == 5
    assert memo.get(None, "/p", "", tokenize) is not None  # no body: nothing kept
    assert memo.misses == 5


def test_a_request_scheduled_again_is_not_tokenized_again(tokenizer_dir: Path) -> None:
    """Flow control schedules a request more than once (its home, then the best endpoint
    with room; again after a hold), each time a new cycle on a copy of the request."""
    _, precise, _ = plugins(config(tokenizer_dir))
    eps = states(2)
    precise.index.reset(eps[0].address, NOW, complete=True)
    hold(precise, eps[0].address, PROMPT)
    snap = Snapshot(eps, {})
    req = request(PROMPT + "question?")
    first = list(precise.score(cycle(snap, req), eps))
    again = replace(req, subset=frozenset({eps[1].address}))  # what _within makes
    assert list(precise.score(cycle(snap, again), eps)) == first == [1.0, 0.0]
    assert precise._prompts.misses == 1
    precise.score(cycle(snap, request(PROMPT + "question?")), eps)  # another request
    assert precise._prompts.misses == 2
