"""The invariant checks on hand-made runs: each catches the break it is for, and lets
through what a fault explains."""

from __future__ import annotations

from dataclasses import replace

import orjson

from tests.scenarios.invariants import (
    CONVERSATION_TURNS,
    i1_avoidable_errors,
    i2_misrouted,
    i3_not_at_rest,
    i4_over_budget,
    i5_counters_disagree,
    i6_not_recovered,
    i7_prompt_sizes_misjudged,
)
from tests.scenarios.model import (
    ADAPTER,
    BASE_MODEL,
    PRIORITY_HEADER,
    REWRITE_HEADER,
    Fault,
    FaultEvent,
    Outcome,
    RequestSpec,
    Run,
    Scenario,
    Workload,
)

A, B = "127.0.0.1:1", "127.0.0.1:2"
WORKLOAD = Workload(3, 2, 0.5, 0.0, 0.0, 0.5, (8, 24))
DONE = b"data: {}\n\ndata: [DONE]\n\n"


def outcome(i: int, status: int, body: bytes, served: str = A, model: str = BASE_MODEL) -> Outcome:
    spec = RequestSpec(i, b"{}", model, True, False)
    return Outcome(spec, started=10.0, status=status, served=served, body=body, seconds=1.0)


def run(outcomes: list[Outcome], *events: FaultEvent, fault: str = "none") -> Run:
    scenario = Scenario(1, "plain", Fault(fault), WORKLOAD)
    serves = {A: {BASE_MODEL, ADAPTER}, B: {BASE_MODEL}}
    return Run(scenario, outcomes, list(events), serves, [A, B])


def test_i1_lets_through_a_cut_on_the_killed_server_only() -> None:
    cut = outcome(0, 200, b"data: {}\n\n")
    kill = FaultEvent("sigkill-mid-stream", at=10.5, victim=A)
    assert i1_avoidable_errors(run([cut], kill)) == []
    other = FaultEvent("sigkill-mid-stream", at=10.5, victim=B)
    assert len(i1_avoidable_errors(run([cut], other))) == 1
    later = FaultEvent("sigkill-mid-stream", at=12.0, victim=A)
    assert len(i1_avoidable_errors(run([cut], later))) == 1
    started = outcome(2, 502, b'{"error":{"code":"upstream_reset_after_response_started"}}', "")
    assert i1_avoidable_errors(run([started], kill)) == []  # Envoy's own 502, no retry
    assert len(i1_avoidable_errors(run([started]))) == 1
    headers_only = outcome(1, 200, b"")  # frozen between its headers and first token
    freeze = FaultEvent("sigstop-mid-stream", at=10.5, victim=A)
    assert i1_avoidable_errors(run([headers_only], freeze)) == []


def test_i1_catches_a_real_404_and_lets_an_injected_one_through() -> None:
    real = outcome(0, 404, b'{"error": {"message": "The model does not exist."}}')
    injected = outcome(1, 503, b'{"error": {"message": "injected fault (503)"}}')
    found = i1_avoidable_errors(run([real, injected, outcome(2, 200, DONE)]))
    assert len(found) == 1 and "request 0" in found[0]


def test_i1_catches_a_connection_failure_before_the_first_byte() -> None:
    failed = outcome(0, 0, b"")
    failed.error = "ConnectionResetError: reset"
    assert len(i1_avoidable_errors(run([failed]))) == 1


def test_i2_catches_an_adapter_on_a_server_without_it() -> None:
    wrong = outcome(0, 200, DONE, served=B, model=ADAPTER)
    right = outcome(1, 200, DONE, served=A, model=ADAPTER)
    assert len(i2_misrouted(run([wrong, right]))) == 1


def test_i1_lets_through_what_envoy_s_restart_cut_and_a_refused_sheddable_request() -> None:
    refused = outcome(0, 0, b"")
    refused.error = "ConnectionRefusedError: [Errno 111] Connection refused"
    restart = FaultEvent("envoy-restart", at=10.5, until=12.0, victim="envoy")
    assert i1_avoidable_errors(run([refused], restart)) == []
    later = FaultEvent("envoy-restart", at=11.5, until=12.0, victim="envoy")
    assert len(i1_avoidable_errors(run([refused], later))) == 1  # it ended before
    shed = outcome(1, 429, b'{"error": {}}')
    shed.dropped = "rejected-saturated"
    assert len(i1_avoidable_errors(run([shed]))) == 1  # priority 0: not sheddable
    sheddable = RequestSpec(2, b"{}", BASE_MODEL, False, False, ((PRIORITY_HEADER, "-1"),))
    shed.spec = sheddable
    assert i1_avoidable_errors(run([shed])) == []


def test_i2_judges_a_rewritten_request_by_the_model_it_was_answered_as() -> None:
    # asked for a name nobody serves, rewritten to the adapter only A holds
    on_a = outcome(0, 200, b'{"model":"ad-1","choices":[]}', served=A, model="alias")
    on_b = outcome(1, 200, b'data: {"model": "ad-1"}\n\n', served=B, model="alias")
    base = outcome(2, 200, b'{"model":"sim-model","choices":[]}', served=B, model="alias")
    found = i2_misrouted(run([on_a, on_b, base]))
    assert len(found) == 1 and "request 1 for ad-1" in found[0]


def test_i2_judges_a_rewritten_request_cut_before_its_answer_named_a_model() -> None:
    """Scenario seed 1042: a request for the alias got its 200 from a server killed
    before any body; the alias may become the base model, which B serves."""
    cut = outcome(0, 200, b"", served=B, model="alias")
    assert i2_misrouted(run([cut])) == []
    elsewhere = outcome(1, 200, b"", served="127.0.0.1:3", model="alias")
    by_header = outcome(2, 200, b"", served=B, model="anything")
    by_header.spec = replace(by_header.spec, headers=((REWRITE_HEADER, ADAPTER),))
    found = i2_misrouted(run([elsewhere, by_header]))
    assert len(found) == 2
    assert "request 1 for ad-1/sim-model" in found[0] and "request 2 for ad-1 " in found[1]


def test_i3_reports_sockets_that_stay_open() -> None:
    r = run([])
    assert i3_not_at_rest(r) == []
    r.sockets_error = "EPP sockets above their baseline + 9 after 20s: pid 7: 20 -> 60"
    assert i3_not_at_rest(r) == [f"I3: {r.sockets_error}"]


def test_i4_catches_a_request_past_its_budget_and_a_missing_one() -> None:
    slow = outcome(0, 200, DONE)
    slow.seconds = 500.0
    found = i4_over_budget(run([slow, outcome(1, 200, DONE)]))
    assert len(found) == 2 and "1 requests got no outcome" in found[1]


def test_i4_catches_a_stream_silent_past_its_chunk_budget_after_its_first_byte() -> None:
    held = outcome(0, 200, b"data: {}\n\n")  # frozen mid-stream, cut by Envoy's 12 s
    held.first_byte_s, held.longest_gap_s, held.seconds = 0.1, 12.0, 12.1
    ended = outcome(1, 200, b"data: {}\n\nevent: error\n")  # the EPP's 4 s chunk timeout
    ended.first_byte_s, ended.longest_gap_s, ended.seconds = 0.1, 4.3, 4.4
    # the first byte may take the streams' longer first-byte budget (4 tries of 12 s)
    slow_start = outcome(2, 200, DONE)
    slow_start.first_byte_s, slow_start.seconds = 49.5, 50.0
    found = i4_over_budget(run([held, ended, slow_start], fault="sigstop-mid-stream"))
    assert len(found) == 1 and "request 0" in found[0] and "silent 12.0s" in found[0]
    # elsewhere the first byte's budget is 4 tries of 4 s (+ 30 s of generation)
    found = i4_over_budget(run([ended, slow_start, outcome(3, 200, DONE)]))
    assert len(found) == 1 and "request 2 took 50.0s" in found[0]
    # where the EPP sees no response body (fail-open: buffered), Envoy's idle timeout
    # bounds the silence after the first byte too (scenario seed 1033: 13.0 s)
    unseen = run([held, ended, slow_start], fault="sigstop-mid-stream")
    unseen.scenario = replace(unseen.scenario, shape="fail-open")
    assert i4_over_budget(unseen) == []
    held.longest_gap_s = 16.5
    assert "at most 16s: no chunk timeout without" in i4_over_budget(unseen)[0]


def test_i5_compares_routed_requests_with_the_clients() -> None:
    r = run([outcome(0, 200, DONE), outcome(1, 200, DONE)])
    key = 'epp_requests_total{outcome="routed"}'
    r.epp_before, r.epp_after = [{key: 5.0}], [{key: 7.0}]
    assert i5_counters_disagree(r) == []
    r.epp_after = [{key: 8.0}]
    assert len(i5_counters_disagree(r)) == 1
    r.epp_stream_retries = 1.0  # a stream Envoy opened again on the other EPP: both routed
    assert i5_counters_disagree(r) == []
    r.epp_after, r.epp_stream_retries = [{key: 9.0}], 1.0
    assert "1 ext_proc streams again" in i5_counters_disagree(r)[0]
    r.epp_stream_retries = 0.0
    r.outcomes[1].dropped = "rejected-saturated"  # refused by the EPP: not routed
    r.epp_after = [{key: 6.0}]
    assert i5_counters_disagree(r) == []
    r.epp_after = []  # not at rest, so not scraped: I3 says so, not I5
    assert i5_counters_disagree(r) == []
    r.epp_after = [{key: 9.0}]
    r.epp_restarted = True
    assert i5_counters_disagree(r) == []


def turns(*served: str) -> list[Outcome]:
    """A conversation's turns after the load, answered by ``served`` in turn."""
    return [outcome(20_000 + i, 200, DONE, at) for i, at in enumerate(served)]


def test_i6_reports_a_victim_that_never_came_back() -> None:
    r = run([])
    r.placement = turns(*[B] * CONVERSATION_TURNS)
    assert i6_not_recovered(r) == []
    r.recovery_error = "sim-1 served none of 60 requests after healing"
    assert i6_not_recovered(r) == ["I6: sim-1 served none of 60 requests after healing"]


def test_i6_reports_a_conversation_that_does_not_settle_on_one_server() -> None:
    r = run([])
    r.placement = turns(A, B, B, B, B)  # the second turn not where the first went
    assert len(found := i6_not_recovered(r)) == 1
    assert "did not settle on one server from turn 1 on" in found[0]
    r.placement = turns(A, A, A)  # two turns not sent
    assert "3 of the conversation's 5 turns were sent" in i6_not_recovered(r)[0]
    r.placement = [*turns(A, A, A), outcome(20_003, 503, b"{}")]
    assert "turn 3 of the conversation after the load failed: status 503" in i6_not_recovered(r)[0]
    r.placement = []  # where each EPP replica places prefixes on its own: not judged
    r.scenario = replace(r.scenario, shape="replicas")
    assert i6_not_recovered(r) == []


def prompt_answered(i: int, prompt: str | list[int], stream: bool, tokens: int | None) -> Outcome:
    """A completed request for ``prompt`` (text or token ids) whose server counted
    ``tokens`` (None: no usage in the answer)."""
    body = orjson.dumps({"model": BASE_MODEL, "prompt": prompt})
    ids = len(prompt) if isinstance(prompt, list) else 0
    spec = RequestSpec(i, body, BASE_MODEL, stream, False, (), ids)
    usage = None if tokens is None else {"prompt_tokens": tokens, "completion_tokens": 8}
    if stream:
        last = orjson.dumps({"choices": [], "usage": usage})
        answer = b'data: {"choices":[{"text":"a"}],"usage":null}\n\ndata: ' + last + DONE[8:]
    else:
        answer = orjson.dumps({"choices": [{"text": "a"}], "usage": usage})
    return Outcome(spec, started=10.0, status=200, served=A, body=answer, seconds=1.0)


def ratio_run(outcomes: list[Outcome], learned: float) -> Run:
    r = run(outcomes)
    r.epp_before = [{"epp_prompt_chars_per_token": 4.0}]  # the prior
    r.epp_after = [{"epp_prompt_chars_per_token": learned}]
    return r


def test_i7_holds_the_learned_ratio_to_what_the_text_prompts_alone_teach() -> None:
    # a byte tokenizer: 100 and 60 characters are 100 and 60 tokens; the EPP starts
    # from 1000 tokens at 4 characters; 50 token ids teach nothing
    text = [prompt_answered(0, "x" * 100, False, 100), prompt_answered(1, "y" * 60, True, 60)]
    ids = prompt_answered(2, [7] * 50, True, 50)
    assert i7_prompt_sizes_misjudged(ratio_run([*text, ids], 4160 / 1160)) == []
    # the ids spelled as 4 characters each and learned: 200 characters, 50 tokens
    found = i7_prompt_sizes_misjudged(ratio_run([*text, ids], 4360 / 1210))
    assert len(found) == 1 and "learned 3.603306" in found[0] and "teach 3.586207" in found[0]
    assert "would be 3.603306" in found[0]
    # no token-id prompt sent: not I7's to judge
    assert i7_prompt_sizes_misjudged(ratio_run(text, 4.0)) == []


def test_i7_lets_an_answer_the_client_did_not_see_count_either_way() -> None:
    text = prompt_answered(0, "x" * 100, False, 100)
    cut = prompt_answered(1, "y" * 60, True, None)
    cut.body, cut.hung_up = b'data: {"choices":[]}\n\n', True  # it walked away
    ids = prompt_answered(2, [7] * 50, False, 50)
    for learned in (4100 / 1100, 4160 / 1160):  # without the cut one, with it
        assert i7_prompt_sizes_misjudged(ratio_run([text, cut, ids], learned)) == []
    assert len(i7_prompt_sizes_misjudged(ratio_run([text, cut, ids], 4300 / 1150))) == 1


def test_i7_fails_where_it_checked_nothing_or_the_servers_count_otherwise() -> None:
    text = prompt_answered(0, "x" * 100, False, 100)
    unanswered = prompt_answered(1, [7] * 50, False, None)
    found = i7_prompt_sizes_misjudged(ratio_run([text, unanswered], 4100 / 1100))
    assert len(found) == 1 and "nothing checked" in found[0]
    ids = prompt_answered(2, [7] * 50, False, 50)
    found = i7_prompt_sizes_misjudged(ratio_run([ids], 4.0))
    assert len(found) == 1 and "nothing checked" in found[0]
    four = prompt_answered(0, "x" * 100, False, 25)  # 4 characters a token
    found = i7_prompt_sizes_misjudged(ratio_run([four, ids], 4100 / 1025))
    assert len(found) == 1 and "a token per character" in found[0]
    unscraped = ratio_run([text, ids], 4100 / 1100)
    unscraped.epp_after = []
    assert "scrapes" in i7_prompt_sizes_misjudged(unscraped)[0]
