"""The invariants, as pure functions of a recorded run: each returns its violations
(empty: it holds). I1-I7 as docs/testing.md states them."""

from __future__ import annotations

from collections.abc import Callable

import orjson

from epp.scheduling.latency import TokenRatio
from epp.types import CHARS_PER_TOKEN
from tests.scenarios.model import IDLE_S, Outcome, RequestSpec, Run, stream_first_byte_s

# Envoy tries a request on each of the EPP's 3 picks plus one fallback host
ATTEMPTS = 4
# generation itself (queueing, prefill, 48 tokens) on a loaded shared machine: generous
GENERATION_S = 30.0
# faults that stop or freeze a server: the streams under way on it are cut
SERVER_DEATHS = (
    "sigkill-mid-stream",
    "sigstop-mid-stream",
    "sigkill-at-once",
    "sigstop-at-once",
    "restart-same-port",
    "restart-new-port",
    "kv-publisher-restart",
)
# faults that kill an EPP process: what was open on it is lost (docs/replicas.md,
# docs/workers.md), and its counters start again
EPP_DEATHS = ("epp-replica-kill", "epp-worker-kill")
RECOVERY_REQUESTS = 60  # I6: the victim serves again within this many requests
# I4, a stream after its first byte: the EPP ends it once its server is silent for the
# stream chunk timeout (IDLE_S); as much again for a loaded machine to deliver the end
BETWEEN_CHUNKS_S = 2 * IDLE_S
# shapes whose Envoy sends the EPP no response body (fail-open: processing buffered), so
# no stream chunk timeout: Envoy's per-try idle timeout, the streams' first-byte budget,
# bounds the silence after the first byte as well (limits.md, "Stalled streams")
RESPONSE_UNSEEN = ("fail-open",)
FLOW_QUEUE = "llm_d_epp_flow_control_queue_size"  # I3: requests waiting in the EPP
STARTED = b"upstream_reset_after_response_started"  # Envoy's detail in its own 502
# I7: the EPP's characters per token, learned from its answers' usage
RATIO = "epp_prompt_chars_per_token"


def _window(run: Run, o: Outcome, kinds: tuple[str, ...], victim: str | None = None) -> bool:
    """Whether a fault of ``kinds`` (on ``victim``, if given) struck while ``o`` ran
    (a fault that lasts, e.g. Envoy away: overlapped it)."""
    end = o.started + o.seconds
    return any(
        e.what in kinds
        and o.started <= (e.until or e.at)
        and e.at <= end
        and (victim is None or e.victim == victim)
        for e in run.events
    )


def _explained(run: Run, o: Outcome) -> str | None:
    """Why a failed outcome is not an avoidable error, or None if it is one."""
    if o.hung_up:
        return "the client hung up"
    if o.injected:
        return "injected by the simulator"
    if _window(run, o, EPP_DEATHS):
        return "open on an EPP process that died (docs/replicas.md, docs/workers.md)"
    if _window(run, o, ("envoy-restart",)):
        return "open, or sent, while Envoy (the listener) restarted"
    if o.status == 429 and o.dropped and o.spec.priority < 0:
        return f"sheddable (priority {o.spec.priority}), refused by the EPP: {o.dropped}"
    # begun: its 200 reached the client. A server sends a stream's headers before its
    # first token (the simulator as vLLM), so one frozen between the two is cut with no
    # body at all: the status is out, Envoy cannot retry (docs/timeouts.md)
    if o.status == 200 and _window(run, o, SERVER_DEATHS, o.served):
        return "cut mid-stream by its server's death or freeze"
    # the server died after its response began but before Envoy passed the headers on
    # (they wait for the EPP's answer): Envoy answers 502 itself and cannot retry
    if o.status == 502 and STARTED in o.body and _window(run, o, SERVER_DEATHS):
        return "cut after its server's answer began, by the server's death"
    return None


def i1_avoidable_errors(run: Run) -> list[str]:
    """I1: no client error that another endpoint could have avoided: every failure is an
    injected status, a hang-up, a stream cut after its first byte by a fault on its own
    server, or open on a dying EPP replica."""
    out = []
    for o in run.outcomes:
        if o.complete or _explained(run, o) is not None:
            continue
        what = o.error or f"status {o.status}, {len(o.body)} bytes, incomplete"
        out.append(f"I1: request {o.spec.index} ({o.spec.model}) failed: {what} {o.body[:160]!r}")
    kills = [o for o in run.outcomes if not o.complete and _window(run, o, EPP_DEATHS)]
    if len(kills) > run.scenario.workload.clients:
        out.append(f"I1: {len(kills)} failures around the EPP's death, more than were open")
    return out


def i2_misrouted(run: Run) -> list[str]:
    """I2: a request for a model or adapter only reaches a server that serves it (holds
    it, or may load it where the shape's config lets the EPP load adapters); a request
    whose model is rewritten, by the config or a header, is judged by the model the
    server answered as (one cut before its answer named it: by what it may have
    become, Outcome.served_as)."""
    return [
        f"I2: request {o.spec.index} for {'/'.join(sorted(o.served_as))} served by "
        f"{o.served}, which serves {sorted(run.serves.get(o.served, set()))}"
        for o in [*run.outcomes, *run.recovery, *run.placement]
        if o.served and not o.served_as & run.serves.get(o.served, set())
    ]


def i3_not_at_rest(run: Run) -> list[str]:
    """I3: in-flight counts, pending decodes, flow-control queues and the servers'
    queues return to 0; the EPP processes' open sockets return to their baseline."""
    return [f"I3: {e}" for e in (run.quiesce_error, run.sockets_error) if e]


def i4_over_budget(run: Run) -> list[str]:
    """I4: every request gets an answer or a clean cut, within the budget of its
    phases (docs/timeouts.md): before the first byte one per-try idle timeout per
    attempt, plus generation; a stream after its first byte, no silence longer than
    the stream chunk timeout (the EPP ends the stream) and a margin."""
    first_byte = stream_first_byte_s(run.scenario.fault.kind)
    between, bound = BETWEEN_CHUNKS_S, f"the stream chunk timeout {IDLE_S:g}s"
    if run.scenario.shape in RESPONSE_UNSEEN:
        between = first_byte + IDLE_S
        bound = f"no chunk timeout without response bodies: the {first_byte:g}s idle timeout"
    out = []
    for o in run.outcomes:
        budget = ATTEMPTS * (first_byte if o.spec.stream else IDLE_S) + GENERATION_S
        if o.seconds > budget or "timed out" in o.error:
            out.append(
                f"I4: request {o.spec.index} took {o.seconds:.1f}s (budget {budget:.0f}s): "
                f"{o.error}"
            )
        if o.spec.stream and o.longest_gap_s > between:
            out.append(
                f"I4: request {o.spec.index} (a stream, served by {o.served}) was silent "
                f"{o.longest_gap_s:.1f}s after its first byte (between chunks at most "
                f"{between:g}s: {bound}, and {IDLE_S:g}s to deliver the end)"
            )
    missing = run.scenario.workload.requests - len(run.outcomes)
    return out + ([f"I4: {missing} requests got no outcome"] if missing else [])


def _delta(run: Run, name: str, match: Callable[[str], bool] = lambda _k: True) -> float:
    def total(samples: list[dict[str, float]]) -> float:
        return sum(v for s in samples for k, v in s.items() if k.split("{")[0] == name and match(k))

    return total(run.epp_after) - total(run.epp_before)


def i5_counters_disagree(run: Run) -> list[str]:
    """I5: after quiescing, the EPPs counted the requests the clients sent (routed once
    each, whatever Envoy's retries to model servers; one abandoned before any answer may
    not be; one whose ext_proc stream Envoy opened again on another EPP may be routed by
    both). Not checked where an EPP process died (its counters started again)."""
    if run.epp_restarted or not run.epp_after:  # (none: not at rest, I3 says so)
        return []
    routed = _delta(run, "epp_requests_total", lambda k: 'outcome="routed"' in k)
    # the EPP's own refusals (429 shed, queue_full, ...) are counted by their status
    refused = sum(bool(o.dropped) for o in run.outcomes)
    sent = len(run.outcomes) - refused
    # a client that walks away before any answer may leave before its request is
    # routed, and one sent while Envoy restarted may never reach it
    early = sum(
        (o.hung_up and not o.spec.stream) or (o.status == 0 and _window(run, o, ("envoy-restart",)))
        for o in run.outcomes
    )
    again = run.epp_stream_retries
    if not sent - early <= routed <= sent + again:
        return [f"I5: the EPPs routed {routed:g} requests; the clients sent {sent} it did not "
                f"refuse, {early} of them abandoned or cut before any answer; Envoy opened "
                f"{again:g} ext_proc streams again on another EPP"]  # fmt: skip
    return []


# I6's placement (run.settle): a new conversation of CONVERSATION_TURNS turns, sent one
# after another, stays on one server from turn SETTLED_BY (by shape; default 1, the
# second turn: it finds the first one's prefix where that went) on
CONVERSATION_TURNS = 5
SETTLED_BY: dict[str, int] = {}
# not checked where each EPP replica or worker places prefixes on its own: without KV
# events their indexes diverge, so a conversation goes to each one's home in turn
# (replicas.md, workers.md; the full tier found it in workers-2: seed 1050 and 7 more)
UNSETTLED = ("replicas", "stack-replicas", "workers-2")


def i6_not_recovered(run: Run) -> list[str]:
    """I6: after the fault heals, its victim rejoins the pool and is served again within
    RECOVERY_REQUESTS requests; then placement recovers: a new conversation sent a turn
    at a time (run.settle) settles on one server, every turn from its shape's SETTLED_BY
    on going where the turn before it went (the home of its prefix)."""
    if run.recovery_error:
        return [f"I6: {run.recovery_error}"]
    turns = run.placement
    if run.scenario.shape in UNSETTLED:
        return []
    failed = next((i for i, o in enumerate(turns) if not o.complete), None)
    if failed is not None:
        o = turns[failed]
        return [f"I6: turn {failed} of the conversation after the load failed: status "
                f"{o.status} {o.error} {o.body[:200]!r}"]  # fmt: skip
    if len(turns) < CONVERSATION_TURNS:
        return [f"I6: {len(turns)} of the conversation's {CONVERSATION_TURNS} turns were sent"]
    by = SETTLED_BY.get(run.scenario.shape, 1)
    served = [o.served for o in turns]
    if len(set(served[by - 1 :])) > 1:
        return [
            f"I6: a conversation sent a turn at a time after the load did not settle on one "
            f"server from turn {by} on: its turns went to {', '.join(served)}"
        ]
    return []


def reported_prompt_tokens(o: Outcome) -> int | None:
    """The prompt tokens its server reported in a complete answer's ``usage`` (a
    stream's: the chunk that carries it, with ``stream_options.include_usage``); None
    for an answer that is not complete or has none."""
    if not o.complete:
        return None
    docs = (
        [orjson.loads(line[6:]) for line in o.body.split(b"\n") if line.startswith(b"data: {")]
        if o.spec.stream
        else [orjson.loads(o.body)]
    )
    usage = next((d["usage"] for d in reversed(docs) if d.get("usage")), None)
    return None if usage is None else int(usage["prompt_tokens"])


def _text(spec: RequestSpec) -> str:
    prompt = orjson.loads(spec.body)["prompt"]
    return prompt if isinstance(prompt, str) else ""


def _taught(answers: list[tuple[int, int]]) -> float:
    """The characters per token an EPP holds that learned (TokenRatio, from its prior)
    from exactly these answers: (prompt characters, the server's prompt tokens)."""
    ratio = TokenRatio()
    for chars, tokens in answers:
        ratio.observe(chars, tokens)
    return ratio.chars_per_token


def _answered(run: Run) -> tuple[list[int], list[tuple[int, int]], list[int], str]:
    """What may have taught the EPP its characters per token: the token ids of each
    token-id prompt answered with its usage; (characters, the server's tokens) of each
    text prompt answered with its usage; the characters of each text prompt whose client
    saw no complete answer, which the EPP may have seen or not (an error's body has no
    usage); and a text answer not counted a token per character, if any."""
    ids: list[int] = []
    answers: list[tuple[int, int]] = []
    maybe: list[int] = []
    for o in run.outcomes:
        tokens = reported_prompt_tokens(o)
        if o.spec.token_ids:
            ids += [] if tokens is None else [tokens]
            continue
        chars = len(_text(o.spec))
        if tokens is not None and tokens != chars:
            premise = (
                f"judges servers that count a token per character (a byte of ASCII): request "
                f"{o.spec.index}'s {chars} characters were counted as {tokens} tokens"
            )
            return ids, answers, maybe, premise
        if tokens is not None:
            answers.append((chars, tokens))
        elif o.status < 400:
            maybe.append(chars)
    return ids, answers, maybe, ""


def i7_prompt_sizes_misjudged(run: Run) -> list[str]:
    """I7: what the EPP believes about prompt sizes is right: in a scenario that sends
    token-id prompts, the characters per token it learned (``epp_prompt_chars_per_token``,
    what every text prompt's token estimate divides by) is what its text answers alone
    teach: the EPP's own TokenRatio, from its prior, fed each answered text prompt's
    characters and its server's ``usage.prompt_tokens``. A token-id prompt's tokens are
    counted, not estimated, so it teaches nothing; an EPP that spells ids as 4 characters
    and learns from them drifts towards 4 where the servers count otherwise.

    Exact (to 12 digits) where every answer is known; a request whose client saw no
    complete answer (a hang-up, a cut) may have taught the EPP or not: the ratio must
    then lie between the two. Holds where the servers count a token per character (the
    byte tokenizer, ASCII prompts; checked on every answer), so that each text answer
    adds as much to both of the EPP's sums and any of them lowers the ratio. Fails,
    rather than passing unchecked, where no token-id or no text prompt was answered with
    its usage, or the EPP's ratio was not scraped."""
    sent = sum(bool(o.spec.token_ids) for o in run.outcomes)
    if not sent:
        return []
    ids, answers, maybe, premise = _answered(run)
    before = run.epp_before[0].get(RATIO) if len(run.epp_before) == 1 else None
    after = run.epp_after[0].get(RATIO) if len(run.epp_after) == 1 else None
    text_tokens = sum(t for _, t in answers) + sum(maybe)
    if premise:
        return [f"I7: {premise}"]
    if not ids or not answers:
        return [
            f"I7: nothing checked: of {sent} token-id and {len(run.outcomes) - sent} text "
            f"prompts, {len(ids)} and {len(answers)} were answered with their usage (it "
            "takes both)"
        ]
    if before != CHARS_PER_TOKEN or after is None:
        return [
            f"I7: one EPP's {RATIO} is needed, at its prior ({CHARS_PER_TOKEN:g}) before the "
            f"load and after it: {len(run.epp_before)} scrapes before ({before}), "
            f"{len(run.epp_after)} after ({after}; none: see I3)"
        ]
    if TokenRatio.PRIOR_TOKENS + text_tokens > TokenRatio.WINDOW_TOKENS:
        return [
            f"I7: cannot judge: the text answers ({text_tokens} tokens) may have taken the "
            f"EPP's learned sums past their window ({TokenRatio.WINDOW_TOKENS:g} tokens)"
        ]
    high, low = _taught(answers), _taught(answers + [(c, c) for c in maybe])
    if low * (1 - 1e-12) <= after <= high * (1 + 1e-12):
        return []
    spelled = _taught(answers + [(round(CHARS_PER_TOKEN * n), n) for n in ids])
    may = f" ({low:.6f} if it saw the {len(maybe)} answers its clients did not)" if maybe else ""
    return [
        f"I7: the EPP learned {after:.6f} characters per token; its {len(answers)} text "
        f"answers teach {high:.6f}{may}. The {len(ids)} token-id prompts answered "
        f"({sum(ids)} ids) must teach nothing: with each id taken for "
        f"{CHARS_PER_TOKEN:g} characters it would be {spelled:.6f}"
    ]


CHECKS = (
    i1_avoidable_errors,
    i2_misrouted,
    i3_not_at_rest,
    i4_over_budget,
    i5_counters_disagree,
    i6_not_recovered,
    i7_prompt_sizes_misjudged,
)


def violations(run: Run) -> list[str]:
    return [v for check in CHECKS for v in check(run)]
