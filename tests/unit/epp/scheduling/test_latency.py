"""The latency model and the predicted-latency scorer, on plain data."""

from __future__ import annotations

import random

import pytest

from epp.common.params import ConfigError, Params
from epp.common.requestparse import parse_request
from epp.config import build_scheduler
from epp.errors import BadRequestError
from epp.scheduling.base import CycleContext
from epp.scheduling.groups import GroupShares, homes_needed
from epp.scheduling.latency import (
    MAX_NUM_SEQS_LABEL,
    Dispatch,
    LatencyModel,
    LatencyPriors,
    RobustLine,
    TokenRatio,
)
from epp.scheduling.plugins.latency import PredictedLatencyScorer, predicted_latency_scorer
from epp.scheduling.plugins.prefix import PrefixCacheScorer
from epp.types import (
    Endpoint,
    EndpointMetrics,
    EndpointState,
    InferenceRequest,
    SchedulingResult,
    Snapshot,
)

NOW = 50.0


def state(port: int, labels: dict[str, str] | None = None, **metrics: float) -> EndpointState:
    m = EndpointMetrics(updated_at=NOW, **metrics) if metrics else None  # type: ignore[arg-type]
    return EndpointState(Endpoint("10.0.0.1", port, labels=labels or {}), m)


def test_robust_line_converges_and_ignores_outliers() -> None:
    rng = random.Random(3)
    line = RobustLine(a0=0.05, b0=0.0005, x_ref=1000, weight=4, window=128)
    for i in range(200):
        x = rng.uniform(0, 2000)
        y = 0.005 + 0.0001 * x + rng.gauss(0, 0.001)
        if i % 10 == 0:  # a stalled request now and then
            y += 2.0
        line.add(x, y)
    assert line.a == pytest.approx(0.005, abs=0.002)
    assert line.b == pytest.approx(0.0001, rel=0.05)


def test_robust_line_keeps_its_prior_slope_when_x_never_varies() -> None:
    line = RobustLine(a0=0.01, b0=0.0002, x_ref=1000, weight=4, window=64)
    for _ in range(50):
        line.add(100.0, 0.03)  # every request the same size: the slope is unknowable
    assert line(100.0) == pytest.approx(0.03, rel=0.1)
    assert line.b > 0


def test_robust_line_never_goes_negative() -> None:
    line = RobustLine(a0=0.01, b0=0.0001, x_ref=1000, weight=1, window=64)
    for x in range(0, 2000, 50):
        line.add(float(x), 0.5 - 0.0002 * x)  # falling with size: nonsense for a cost
    assert line.a >= 0 and line.b >= 0


def observe_prefills(
    model: LatencyModel, s: EndpointState, rng: random.Random, n: int = 100
) -> None:
    """Streamed requests that found a free slot: TTFT = 8 ms + 0.2 ms per uncached
    token; 40 output tokens at 10 ms each."""
    for _ in range(n):
        uncached = rng.randrange(0, 3000)
        pred = model.predict(s, None, 0, uncached)
        sent = 0.0
        ttft = 0.008 + 0.0002 * uncached
        dispatch = Dispatch(s.address, sent, pred, True, first_byte_at=ttft)
        model.observe(dispatch, ttft + 39 * 0.010, uncached, 0, 40)


def test_model_learns_prefill_decode_and_slot_time() -> None:
    model = LatencyModel(LatencyPriors())
    s = state(1)
    observe_prefills(model, s, random.Random(1))
    learned = model.status(s.address)
    assert learned is not None
    assert learned["overhead_ms"] == pytest.approx(8, abs=0.5)
    assert learned["prefill_ms_per_token"] == pytest.approx(0.2, rel=0.03)
    # every request ran alone (batch 1): 10 ms per token there
    assert model.endpoint(s).decode(1) == pytest.approx(0.010, rel=0.05)
    # in a slot: prefill (8 ms + 0.2 x ~1500 on average) + 390 ms of decode
    assert learned["slot_s"] == pytest.approx(0.008 + 0.3 + 0.39, rel=0.15)
    assert model.predict(s, None, 0, 1000).ttft_s == pytest.approx(0.208, rel=0.03)


def test_cached_tokens_reported_by_the_server_win_over_the_estimate() -> None:
    model = LatencyModel(LatencyPriors())
    s = state(1)
    for uncached in range(0, 3000, 30):
        # the router thought everything was uncached; the server says otherwise
        pred = model.predict(s, None, 0, 3000)
        ttft = 0.008 + 0.0002 * uncached
        dispatch = Dispatch(s.address, 0.0, pred, True, first_byte_at=ttft)
        model.observe(dispatch, ttft + 0.1, 3000, 3000 - uncached, 10)
    assert model.predict(s, None, 0, 1000).ttft_s == pytest.approx(0.208, rel=0.05)


def test_slots_come_from_a_label_the_config_or_a_queue_seen() -> None:
    model = LatencyModel(LatencyPriors())
    unknown = state(1)
    assert model.endpoint(unknown).slots is None
    model.observe_load(unknown, EndpointMetrics(NOW, waiting=0.0, running=3.0))
    assert model.endpoint(unknown).slots is None  # nobody waited: 3 is only a lower bound
    model.observe_load(unknown, EndpointMetrics(NOW, waiting=2.0, running=4.0))
    assert model.endpoint(unknown).slots == 4
    assert model.endpoint(state(2, {MAX_NUM_SEQS_LABEL: "16"})).slots == 16
    assert LatencyModel(LatencyPriors(max_num_seqs=8)).endpoint(state(3)).slots == 8


def test_queue_wait_grows_with_requests_ahead() -> None:
    model = LatencyModel(LatencyPriors(max_num_seqs=4))
    s = state(1)
    model.endpoint(s).slot_s = 0.4
    waits = [model.predict(s, None, load, 0).wait_s for load in range(7)]
    assert waits[:4] == [0.0, 0.0, 0.0, 0.0]  # a free slot
    assert waits[4:] == pytest.approx([0.1, 0.2, 0.3])  # one slot frees every 0.1 s
    # with slots unknown, only the engine's own queue predicts a wait
    unknown = LatencyModel(LatencyPriors())
    unknown.endpoint(s).slot_s = 0.4
    busy = EndpointMetrics(NOW, waiting=1.0, running=4.0)
    assert unknown.predict(s, None, 9, 0).wait_s == 0.0
    assert unknown.predict(s, busy, 0, 0).wait_s == pytest.approx(0.2)


# -- the scorer on a hand-built snapshot --------------------------------------------------

PROMPT = "x" * 64 * 100  # 100 blocks of 16 tokens (1,600 tokens)


def scheduler_parts(
    slot_s: float = 0.4,
) -> tuple[LatencyModel, PrefixCacheScorer, PredictedLatencyScorer]:
    model = LatencyModel(LatencyPriors(max_num_seqs=4, overhead_ms=5, prefill_ms_per_token=0.1))
    prefix = PrefixCacheScorer(16, 256, 100_000)
    scorer = PredictedLatencyScorer("test", None, eviction_weight=0.0)
    scorer.bind({"prefix-cache-scorer": prefix}, [])
    for port in (1, 2):
        model.endpoint(state(port)).slot_s = slot_s
    return model, prefix, scorer


def cycle(
    model: LatencyModel,
    in_flight: dict[str, int],
    request: InferenceRequest | None = None,
) -> CycleContext:
    snap = Snapshot((state(1), state(2)), in_flight)
    req = request or InferenceRequest("r", "m", "/v1/completions", prompt=PROMPT, max_tokens=16)
    return CycleContext(req, snap, NOW, random.Random(0), latency=model)


def home_on_port_1(prefix: PrefixCacheScorer, model: LatencyModel) -> None:
    routed = InferenceRequest("r0", "m", "/v1/completions", prompt=PROMPT)
    snap = Snapshot((state(1), state(2)), {})
    prefix.on_routed(routed, SchedulingResult((state(1).endpoint,)), snap)


def test_a_hit_behind_a_short_queue_beats_an_idle_miss() -> None:
    model, prefix, scorer = scheduler_parts()
    home_on_port_1(prefix, model)
    # home: all 4 slots busy, one waits (0.1 s each); elsewhere: idle but 1,600 uncached
    # tokens cost 0.165 s
    scores = scorer.score(cycle(model, {"10.0.0.1:1": 4, "10.0.0.1:2": 0}), [state(1), state(2)])
    assert scores[0] > scores[1]


def test_a_long_queue_loses_to_a_miss() -> None:
    model, prefix, scorer = scheduler_parts()
    home_on_port_1(prefix, model)
    # home: 3 queued ahead = 0.3 s wait > the 0.165 s of a miss on the idle endpoint
    scores = scorer.score(cycle(model, {"10.0.0.1:1": 6, "10.0.0.1:2": 0}), [state(1), state(2)])
    assert scores[1] > scores[0]


def test_eviction_cost_keeps_a_prefix_home_longer() -> None:
    model, _, _ = scheduler_parts()
    # endpoint 2 is full of other prompts: a miss there pushes 100 blocks out
    small = PrefixCacheScorer(16, 256, 100)
    for port in (1, 2):
        other = InferenceRequest("o", "m", "/v1/completions", prompt=f"{port}" * 64 * 100)
        small.on_routed(other, SchedulingResult((state(port).endpoint,)), Snapshot((), {}))
    small.on_routed(
        InferenceRequest("r0", "m", "/v1/completions", prompt=PROMPT),
        SchedulingResult((state(1).endpoint,)),
        Snapshot((state(1), state(2)), {}),
    )
    loads = {"10.0.0.1:1": 5, "10.0.0.1:2": 0}  # home: 2 ahead, 0.2 s > a 0.165 s miss
    plain = PredictedLatencyScorer("test", None, eviction_weight=0.0)
    plain.bind({"prefix-cache-scorer": small}, [])
    careful = PredictedLatencyScorer("test", None, eviction_weight=1.0)
    careful.bind({"prefix-cache-scorer": small}, [])
    a = plain.score(cycle(model, loads), [state(1), state(2)])
    b = careful.score(cycle(model, loads), [state(1), state(2)])
    assert a[1] > a[0]  # without it: spill
    assert b[0] > b[1]  # with it: the 100 evicted blocks would cost another 0.16 s


def test_equal_predictions_go_to_the_least_loaded() -> None:
    model, _, scorer = scheduler_parts()
    req = InferenceRequest("r", "m", "/v1/completions", prompt="unique " * 100)
    scores = scorer.score(
        cycle(model, {"10.0.0.1:1": 2, "10.0.0.1:2": 1}, req), [state(1), state(2)]
    )
    assert scores[1] > scores[0]


def test_slo_prefers_endpoints_predicted_to_meet_it_else_best_effort() -> None:
    model, prefix, scorer = scheduler_parts()
    home_on_port_1(prefix, model)
    loads = {"10.0.0.1:1": 4, "10.0.0.1:2": 0}  # home 0.105 s (queued), other 0.165 s
    tight = InferenceRequest(
        "r", "m", "/v1/completions", prompt=PROMPT, max_tokens=16, slo_ttft_ms=150
    )
    scores = scorer.score(cycle(model, loads, tight), [state(1), state(2)])
    assert scores[0] > 0.5 > scores[1]
    # nobody can do 20 ms: both below 0.5, the cheaper still ahead
    hopeless = InferenceRequest(
        "r", "m", "/v1/completions", prompt=PROMPT, max_tokens=16, slo_ttft_ms=20
    )
    scores = scorer.score(cycle(model, loads, hopeless), [state(1), state(2)])
    assert 0.5 >= scores[0] > scores[1]
    # a TPOT objective the batch cannot meet (20 ms per token prior + 0.5 per running)
    slow = InferenceRequest(
        "r", "m", "/v1/completions", prompt=PROMPT, max_tokens=16, slo_tpot_ms=21
    )
    scores = scorer.score(cycle(model, loads, slow), [state(1), state(2)])
    assert scores[1] > 0.5 >= scores[0]  # the idle one keeps its batch small


def test_the_scheduler_reports_its_prediction_and_the_slo_verdict() -> None:
    sched = build_scheduler(
        """
plugins:
- type: prefix-cache-scorer
- type: predicted-latency-scorer
- type: max-score-picker
latencyModel: {maxNumSeqs: 4}
""",
        clock=lambda: NOW,
    )
    snap = Snapshot((state(1), state(2)), {"10.0.0.1:1": 0, "10.0.0.1:2": 0})
    req = InferenceRequest(
        "r", "m", "/v1/completions", prompt=PROMPT, max_tokens=16, slo_ttft_ms=10_000
    )
    result = sched.schedule(req, snap, random.Random(0))
    assert result.prediction is not None
    assert result.prediction.uncached_tokens == 1600
    assert result.prediction.meets_slo is True
    assert result.prediction.ttft_s == pytest.approx(0.010 + 0.0001 * 1600)


def test_slo_headers_parse_with_aliases_and_reject_nonsense() -> None:
    body = b'{"model": "m", "prompt": "hi"}'
    req, _ = parse_request("r", {"x-llm-d-slo-ttft-ms": "250", "x-slo-tpot-ms": "20"}, body)
    assert (req.slo_ttft_ms, req.slo_tpot_ms) == (250.0, 20.0)
    req, _ = parse_request("r", {}, body)
    assert (req.slo_ttft_ms, req.slo_tpot_ms) == (None, None)
    for bad in ("soon", "-5", "0", "nan", "inf"):
        with pytest.raises(BadRequestError, match="x-slo-ttft-ms"):
            parse_request("r", {"x-slo-ttft-ms": bad}, body)


def test_scorer_parameters_are_checked() -> None:
    assert predicted_latency_scorer(Params("p", {"evictionWeight": 2})).eviction_weight == 2.0
    with pytest.raises(ConfigError, match="evictionWeight"):
        predicted_latency_scorer(Params("p", {"evictionWeight": -1}))
    with pytest.raises(ConfigError, match="prefixPlugin"):
        predicted_latency_scorer(Params("p", {"prefixPlugin": 3}))


def test_a_request_that_queued_bounds_the_slots_and_never_teaches_prefill() -> None:
    model = LatencyModel(LatencyPriors(overhead_ms=5, prefill_ms_per_token=0.1))
    s = state(1)
    model.observe_load(s, EndpointMetrics(NOW, waiting=0.0, running=2.0))
    assert model.endpoint(s).slots is None and model.endpoint(s).surely_free == 2

    def served(load: int, ttft: float) -> None:
        pred = model.predict(s, None, load, 1000)
        assert pred.load == load
        model.observe(Dispatch(s.address, 0.0, pred, True, ttft), ttft + 0.1, 1000, 0, 2)

    before = model.endpoint(s).prefill(1000)
    served(5, 0.105 + 0.3)  # 5 on it, waited 0.3 s: full at 5
    assert model.endpoint(s).slots == 5
    assert model.endpoint(s).prefill(1000) == before  # the wait is not prefill
    served(3, 0.105 + 0.3)
    assert model.endpoint(s).slots == 3
    served(4, 0.105 + 0.3)  # a higher load teaches nothing new
    assert model.endpoint(s).slots == 3
    served(3, 0.106)  # no wait at 3 either: a timing blip, slots stay as learned
    assert model.endpoint(s).slots == 3


def test_a_report_older_than_a_request_seen_ending_does_not_count_it() -> None:
    model = LatencyModel(LatencyPriors(max_num_seqs=1))
    s = state(1)
    model.endpoint(s).slot_s = 1.0
    busy = EndpointMetrics(updated_at=10.0, waiting=0.0, running=1.0)
    assert model.predict(s, busy, 0, 0).wait_s == 1.0  # the report says: its slot is taken
    model.request_done(s.address, 10.5)  # ...but the EPP saw that request end since
    assert model.predict(s, busy, 0, 0).wait_s == 0.0
    fresher = EndpointMetrics(updated_at=11.0, waiting=0.0, running=1.0)  # someone else's
    assert model.predict(s, fresher, 0, 0).wait_s == 1.0


def test_with_nothing_cached_load_outweighs_small_differences_in_learned_overheads() -> None:
    """Noise in what each endpoint learned must not send every request to one of them
    (it did, before the batch term: 32 concurrent requests, all on one server)."""
    model, _, scorer = scheduler_parts()
    model.endpoint(state(1)).prefill.a = 0.005  # learned a little faster
    model.endpoint(state(2)).prefill.a = 0.008
    req = InferenceRequest("r", "m", "/v1/completions", prompt="unique " * 100, max_tokens=32)
    scores = scorer.score(
        cycle(model, {"10.0.0.1:1": 3, "10.0.0.1:2": 0}, req), [state(1), state(2)]
    )
    assert scores[1] > scores[0]


def test_slots_are_learned_when_a_request_is_routed_not_while_scheduling() -> None:
    sched = build_scheduler("{}", clock=lambda: NOW)  # the default config
    full = state(1, waiting=2.0, running=4.0)
    snap = Snapshot((full,), {})
    req = InferenceRequest("r", "m", "/v1/completions", prompt="hi")
    result = sched.schedule(req, snap, random.Random(0))
    assert sched.latency.endpoint(full).slots is None  # scheduling is a read
    sched.on_routed(req, result, snap)
    assert sched.latency.endpoint(full).slots == 4


# -- homeShare: a group gets as many homes as its share of the traffic needs --
def test_group_shares_and_homes_needed() -> None:
    shares = GroupShares(window=10)
    for key in [1] * 4 + [2] * 6:
        shares.routed(key)
    assert shares.share(1) == pytest.approx(0.4)
    for _ in range(5):  # the oldest fall out of the window
        shares.routed(2)
    assert shares.share(1) == pytest.approx(0.0)
    assert shares.share(2) == pytest.approx(1.0)
    assert homes_needed(0.33, 4, 0.8) == 2  # the hot Zipf group: two homes
    assert homes_needed(0.15, 4, 0.8) == 1
    assert homes_needed(0.0, 4, 0.8) == 1  # every group gets one
    assert homes_needed(0.5, 4, 0.0) == 4  # off: no limit


def test_a_copy_beyond_the_groups_homes_costs_a_miss_more() -> None:
    model, prefix, _ = scheduler_parts()
    home_on_port_1(prefix, model)
    loads = {"10.0.0.1:1": 5, "10.0.0.1:2": 0}  # home: 0.2 s wait > a 0.165 s miss
    myopic = PredictedLatencyScorer("test", None, eviction_weight=0.0)
    homed = PredictedLatencyScorer("test", None, eviction_weight=0.0, home_share=0.8)
    for scorer in (myopic, homed):
        scorer.bind({"prefix-cache-scorer": prefix}, [])
    rare = InferenceRequest("r1", "m", "/v1/completions", prompt=PROMPT, max_tokens=16)
    snap = Snapshot((state(1), state(2)), {})
    for i in range(9):  # this group is 1 request in 10: one home is enough
        other = InferenceRequest(f"o{i}", "m", "/v1/completions", prompt=f"other {i}" * 200)
        homed.on_routed(other, SchedulingResult((state(2).endpoint,)), snap)
    homed.on_routed(rare, SchedulingResult((state(1).endpoint,)), snap)
    a = myopic.score(cycle(model, loads), [state(1), state(2)])
    b = homed.score(cycle(model, loads), [state(1), state(2)])
    assert a[1] > a[0]  # myopic: spill to a second copy
    assert b[0] > b[1]  # one home is enough: wait there
    # the same group as most of the traffic needs a second home: it spills
    hot = PredictedLatencyScorer("test", None, eviction_weight=0.0, home_share=0.8)
    hot.bind({"prefix-cache-scorer": prefix}, [])
    for _ in range(10):
        hot.on_routed(rare, SchedulingResult((state(1).endpoint,)), snap)
    c = hot.score(cycle(model, loads), [state(1), state(2)])
    assert c[1] > c[0]


def test_characters_per_token_are_learned_from_usage_and_bounded() -> None:
    ratio = TokenRatio()
    assert ratio.chars_per_token == 4.0
    ratio.observe(10, 10)  # too short to teach anything (mostly template)
    assert ratio.chars_per_token == 4.0
    for _ in range(20):  # a byte tokenizer: a character a token
        ratio.observe(1000, 1000)
    assert 1.0 < ratio.chars_per_token < 1.2  # the prior (4 x 1,000 tokens) fading
    for _ in range(2000):  # old traffic fades: now 2 characters a token
        ratio.observe(1000, 500)
    assert ratio.chars_per_token == pytest.approx(2.0, abs=0.05)
    for _ in range(2000):
        ratio.observe(1000, 10_000)  # 0.1: kept at the lower bound
    assert ratio.chars_per_token == TokenRatio.BOUNDS[0]


def test_a_parsed_request_estimates_tokens_with_the_ratio_it_was_given() -> None:
    body = b'{"model": "m", "prompt": "' + b"x" * 100 + b'"}'
    request, _ = parse_request("r", {}, body)
    assert request.prompt_tokens == 25  # 4 characters a token until learned
    request, _ = parse_request("r", {}, body, chars_per_token=1.0)
    assert request.prompt_tokens == 100
    request, _ = parse_request("r", {}, body, chars_per_token=3.0)
    assert request.prompt_tokens == 34  # rounded up
