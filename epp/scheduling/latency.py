"""A latency model per endpoint, learned online from what the EPP sees (pure: no I/O,
no clock of its own; callers pass times in seconds).

For one request on one endpoint it predicts the time to first token::

    TTFT = queue wait + overhead + prefill cost per token x uncached prompt tokens

* **Prefill** (``overhead``, ``per token``): a robust line fitted to the TTFTs of
  requests that found a free slot (no queue), against their uncached prompt tokens
  (the server's ``usage.prompt_tokens_details.cached_tokens`` when it reports it, else
  the prefix index's estimate at routing time).
* **Decode** (time per output token against the running batch): a robust line fitted
  to (end - first byte) / (output tokens - 1) of streamed responses.
* **Slot time**: how long a request holds one of the endpoint's slots (prefill +
  decode), a moving average of what was observed.
* **Slots** (``max_num_seqs``; vLLM does not export it): an endpoint label or the
  config, else learned as the highest running count reported while requests waited.
  Until it is known, only the engine's own reported queue predicts a wait.
* **Queue wait**: with ``load`` requests on the endpoint (the EPP's in-flight count, or
  the engine's running + waiting when that is higher) and ``slots`` slots, a newcomer
  waits for ``load - slots + 1`` slots to free, each freeing every ``slot time / slots``
  seconds on average.

Until an endpoint has samples, configured priors stand in; each prior weighs as much as
``priorSamples`` observations, so a few observations move it and many replace it.
Outliers (a request stuck behind a GC pause, a retried request) are trimmed from each fit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from epp.common.sections import setting
from epp.scheduling.columns import CandidateView, FloatArray, IndexArray
from epp.types import (
    CHARS_PER_TOKEN,
    EndpointMetrics,
    EndpointState,
    InferenceRequest,
    Prediction,
)

BoolArray = npt.NDArray[np.bool_]

# An endpoint label that sets how many sequences the server runs at once (vLLM's
# --max-num-seqs), for pools whose servers differ and whose queues the EPP cannot see.
MAX_NUM_SEQS_LABEL = "epp.dev/max-num-seqs"
# a TTFT this far (at least) above its prefill says the request queued for a slot
QUEUED_MIN_S = 0.03
# CycleContext.cache key where a scorer leaves address -> uncached prompt tokens, so the
# scheduler's prediction for the chosen endpoint uses the same estimate
UNCACHED_KEY = "latency/uncached"


@dataclass(frozen=True, slots=True)
class LatencyPriors:
    """What the latency model assumes of an endpoint before it has seen it serve."""

    overhead_ms: float = setting(
        10.0, "overheadMs", "fixed time to first token of every request (ms)", minimum=0.0
    )
    prefill_ms_per_token: float = setting(
        0.1, "prefillMsPerToken", "prefill time per uncached prompt token (ms)", minimum=0.0
    )
    decode_ms_per_token: float = setting(
        20.0, "decodeMsPerToken", "time per output token with an empty batch (ms)", minimum=0.0
    )
    decode_ms_per_running: float = setting(
        0.5, "decodeMsPerRunning", "added to that per running sequence (ms)", minimum=0.0
    )
    output_tokens: float = setting(
        128.0, "outputTokens", "mean output length, for the first slot-time guess", minimum=1.0
    )
    prior_samples: float = setting(
        4.0, "priorSamples", "how many observations each prior weighs", minimum=0.001
    )
    window: int = setting(128, "window", "observations kept per endpoint for each fit", minimum=8)
    max_num_seqs: int | None = setting(
        None,
        "maxNumSeqs",
        f"slots of every endpoint; null: the {MAX_NUM_SEQS_LABEL} label, else learned",
        minimum=1,
    )


class RobustLine:
    """``y = a + b x`` over a window of observations, pulled toward a prior line and
    refitted without the points whose residuals are far beyond the typical one.

    The prior enters as pseudo-observations, half at ``x = 0`` and half at ``x = x_ref``,
    so it fixes both the intercept and the slope until data do. The fit
    never returns a negative intercept or slope (costs cannot be negative).

    An observation costs O(1): the window is a ring of numpy arrays beside running sums
    of x, y, x², xy (summed afresh once per window's worth of observations, so rounding
    cannot accumulate), and the fit is made when ``a`` or ``b`` is read after a change:
    the least-squares line from the sums, then the outlier trims with numpy over the
    window. The fit depends on the window's points only, so fitting on read gives what
    fitting on every observation gave, up to float rounding."""

    __slots__ = (
        "_count",
        "_fit",
        "_next",
        "_resum_in",
        "_sums",
        "_xs",
        "_ys",
        "a0",
        "b0",
        "weight",
        "x_ref",
    )

    def __init__(self, a0: float, b0: float, x_ref: float, weight: float, window: int) -> None:
        self.a0, self.b0, self.x_ref, self.weight = a0, b0, x_ref, weight
        size = max(window, 2)
        self._xs = np.zeros(size)
        self._ys = np.zeros(size)
        self._count = 0  # points in the window
        self._next = 0  # where the next point goes (the oldest, once the ring is full)
        self._resum_in = size  # observations until the sums are summed afresh
        self._sums = (0.0, 0.0, 0.0, 0.0)  # x, y, x², xy over the window
        self._fit: tuple[float, float] | None = (a0, b0)  # None: to be fitted on read

    @property
    def a(self) -> float:
        return (self._fit or self._refit())[0]

    @a.setter
    def a(self, value: float) -> None:
        """Set by hand (a test's model): holds until the next observation."""
        self._fit = (value, self.b)

    @property
    def b(self) -> float:
        return (self._fit or self._refit())[1]

    @property
    def points(self) -> int:
        """Observations in the window."""
        return self._count

    def __call__(self, x: float) -> float:
        a, b = self._fit or self._refit()
        return a + b * x

    def add(self, x: float, y: float) -> None:
        if not (math.isfinite(x) and math.isfinite(y)):
            return
        x, y = float(x), float(y)
        xs, ys, at = self._xs, self._ys, self._next
        sx, sy, sxx, sxy = self._sums
        if self._count == len(xs):  # the oldest point leaves the window
            ox, oy = float(xs[at]), float(ys[at])
            sx, sy, sxx, sxy = sx - ox, sy - oy, sxx - ox * ox, sxy - ox * oy
        else:
            self._count += 1
        xs[at], ys[at] = x, y
        self._next = (at + 1) % len(xs)
        self._resum_in -= 1
        if self._resum_in <= 0:
            self._resum_in = len(xs)
            px, py = xs[: self._count], ys[: self._count]
            self._sums = (
                float(px.sum()),
                float(py.sum()),
                float(px @ px),
                float(px @ py),
            )
        else:
            self._sums = (sx + x, sy + y, sxx + x * x, sxy + x * y)
        self._fit = None

    def _refit(self) -> tuple[float, float]:
        count = self._count
        a, b = self._solve(count, *self._sums)
        if count >= 8:  # fewer: too few to tell an outlier from the rest
            px, py = self._xs[:count], self._ys[:count]
            for _ in range(2):  # trim what lies far beyond the typical residual, refit
                residuals = np.abs(py - a - b * px)
                middle = len(residuals) // 2
                spread = float(np.partition(residuals, middle)[middle]) * 1.4826  # MAD
                limit = 3.0 * max(spread, 1e-3 * max(abs(a), 1e-3))
                kept = residuals <= limit
                if kept.all():
                    break
                px, py = px[kept], py[kept]
                sums = (float(px.sum()), float(py.sum()), float(px @ px), float(px @ py))
                a, b = self._solve(len(px), *sums)
                if len(px) < 8:
                    break
        self._fit = (a, b)
        return a, b

    def _solve(
        self, count: int, sx: float, sy: float, sxx: float, sxy: float
    ) -> tuple[float, float]:
        """Weighted least squares over ``count`` points (their sums) plus the prior's
        pseudo-points, whose weight fades as points accumulate (``weight`` while there
        are fewer, then ``weight^2 / points``): a wrong prior must not bias a well-fed
        fit."""
        weight = self.weight * min(1.0, self.weight / max(count, 1))
        half = weight / 2
        x_ref, y_ref = self.x_ref, self.a0 + self.b0 * self.x_ref
        n = 2 * half + count
        sx += half * x_ref
        sy += half * self.a0 + half * y_ref
        sxx += half * x_ref * x_ref
        sxy += half * x_ref * y_ref
        det = n * sxx - sx * sx
        if n <= 0 or det <= 1e-12 * max(n * sxx, 1e-300):
            mean = sy / n if n > 0 else self.a0
            return max(mean - self.b0 * (sx / n if n > 0 else 0.0), 0.0), self.b0
        b = (n * sxy - sx * sy) / det
        if b < 0:  # a cost cannot fall with size: the best flat line instead
            return max(sy / n, 0.0), 0.0
        a = (sy - b * sx) / n
        if a < 0:  # through the origin instead
            return 0.0, max(sxy / sxx, 0.0) if sxx > 0 else self.b0
        return a, b


@dataclass(slots=True)
class EndpointLatency:
    """One endpoint's learned latencies (seconds)."""

    prefill: RobustLine  # TTFT without a queue, against uncached prompt tokens
    decode: RobustLine  # time per output token, against the running batch
    slot_s: float  # mean time a request holds a slot (moving average)
    configured_slots: int | None = None
    learned_slots: int = 0  # highest running count reported while requests waited
    running_seen: int = 0  # highest running count ever reported: slots are at least this
    queued_at: int = 0  # fewest requests on it at which a request was seen to queue
    # when the EPP last saw a request end there: an older report still counts it
    last_done: float = -math.inf
    ttft_samples: int = 0
    completions: int = 0
    abs_error_s: float = 0.0  # moving average of |observed - predicted| TTFT

    @property
    def slots(self) -> int | None:
        """Sequences it runs at once: configured, else the running count reported while
        requests waited, else the load at which a request was seen to queue (never below
        a running count reported), else unknown."""
        if self.configured_slots or self.learned_slots:
            return self.configured_slots or self.learned_slots
        return max(self.queued_at, self.running_seen) if self.queued_at else None

    @property
    def reported_slots(self) -> int | None:
        """Its slots as configured or reported (the running count while requests
        waited), not inferred from a slow first token: what room is judged against."""
        return self.configured_slots or self.learned_slots or None

    @property
    def surely_free(self) -> int:
        """Below this many requests on it, a newcomer certainly finds a free slot."""
        return self.configured_slots or self.learned_slots or max(self.running_seen, 1)

    def wait_s(
        self, load: float, waiting: float, running: float, limit: int | None = None
    ) -> float:
        """Expected queue wait of a request arriving behind ``load`` requests (the
        engine reporting ``waiting`` and ``running``, 0 when unknown); ``limit``: a
        concurrency the EPP keeps to (below the slots), for which it waits instead."""
        slots = self.slots
        if limit is not None:
            slots = min(slots, limit) if slots else limit
        if slots is not None:
            ahead = load - slots + 1
            return ahead * self.slot_s / slots if ahead > 0 else 0.0
        # slots unknown: only the engine's own queue says the endpoint is full
        if waiting <= 0:
            return 0.0
        return (waiting + 1) * self.slot_s / max(running, 1.0)


@dataclass(slots=True)
class Dispatch:
    """A request as it left for an endpoint: what the model needs to learn from how it
    went (kept by the caller, handed back to :meth:`LatencyModel.observe`)."""

    address: str
    sent_at: float
    prediction: Prediction
    streaming: bool
    first_byte_at: float | None = None


class TokenRatio:
    """Characters per engine token, learned from completed requests: their prompt
    text's length against the server's ``usage.prompt_tokens`` (chat templates
    included). A ratio of decayed sums, starting from ``CHARS_PER_TOKEN`` as if
    ``PRIOR_TOKENS`` tokens had been seen; kept within ``BOUNDS``. Token estimates,
    the prefix index's block sizes and the servers' KV capacity in characters divide
    or multiply by it: a tokenizer far from 4 characters a token (code, CJK text, a
    byte tokenizer) would otherwise skew them all."""

    PRIOR_TOKENS = 1000.0
    WINDOW_TOKENS = 1_000_000.0  # past this, both sums are halved (old traffic fades)
    BOUNDS = (0.25, 16.0)
    MIN_CHARS = 16  # shorter prompts are mostly template: they teach nothing

    def __init__(self) -> None:
        self._chars = CHARS_PER_TOKEN * self.PRIOR_TOKENS
        self._tokens = self.PRIOR_TOKENS
        self.chars_per_token = CHARS_PER_TOKEN

    def observe(self, chars: int, tokens: int) -> None:
        """One completed request: ``chars`` of prompt text the server counted as
        ``tokens``."""
        if chars < self.MIN_CHARS or tokens <= 0:
            return
        self._chars += chars
        self._tokens += tokens
        if self._tokens > self.WINDOW_TOKENS:
            self._chars /= 2
            self._tokens /= 2
        low, high = self.BOUNDS
        self.chars_per_token = min(max(self._chars / self._tokens, low), high)


class LatencyModel:
    """Every endpoint's :class:`EndpointLatency`, created on first use from the priors.

    The values the predictions use are also kept as columns (one row per endpoint), so
    :meth:`predict_view` prices 1,000 candidates with a few numpy operations; a row is
    rewritten whenever its endpoint learns something."""

    # slots: 0 = unknown; decode_slope: seconds per output token per running request
    _COLUMNS = ("overhead", "rate", "slot_s", "slots", "reported", "last_done", "decode_slope")

    def __init__(self, priors: LatencyPriors | None = None) -> None:
        self._epoch = 0  # bumped when rows are handed out or freed
        # bumped when an endpoint's reported slots may have changed (what room is judged
        # against: epp.scheduling.roomwatch judges the pool again)
        self.slots_version = 0
        self.tokens = TokenRatio()  # the servers' tokenizer: kept across resets
        self.reset(priors or LatencyPriors())

    def reset(self, priors: LatencyPriors) -> None:
        """Forget what was learned and start again from ``priors`` (a reloaded
        ``latencyModel`` section). The object stays, so whoever reports on it keeps it."""
        self.priors = priors
        self._endpoints: dict[str, EndpointLatency] = {}
        self.slots_version += 1
        self._row: dict[str, int] = {}
        self._free_rows: list[int] = []
        self._columns = {name: np.zeros(8) for name in self._COLUMNS}
        self._epoch += 1
        # (id(addresses), epoch) -> (addresses, model rows): held, so the id stays unique
        self._rows_memo: dict[tuple[int, int], tuple[tuple[str, ...], IndexArray]] = {}

    def endpoint(self, state: EndpointState) -> EndpointLatency:
        found = self._endpoints.get(state.address)
        if found is None:
            found = self._create(state)
        return found

    def _create(self, state: EndpointState) -> EndpointLatency:
        p = self.priors
        model = self._endpoints[state.address] = EndpointLatency(
            prefill=RobustLine(
                p.overhead_ms / 1000,
                p.prefill_ms_per_token / 1000,
                1000.0,
                p.prior_samples,
                p.window,
            ),
            decode=RobustLine(
                p.decode_ms_per_token / 1000,
                p.decode_ms_per_running / 1000,
                16.0,
                p.prior_samples,
                p.window,
            ),
            slot_s=(p.overhead_ms + p.output_tokens * p.decode_ms_per_token) / 1000,
            configured_slots=_configured_slots(state, p),
        )
        if self._free_rows:
            row = self._free_rows.pop()
        else:
            row = len(self._row)
            size = len(self._columns["overhead"])
            if row >= size:
                for name, column in self._columns.items():
                    self._columns[name] = np.concatenate([column, np.zeros(size)])
        self._row[state.address] = row
        self._epoch += 1
        self.slots_version += 1
        self._rows_memo.clear()
        self._sync(state.address, model)
        return model

    def _sync(self, address: str, model: EndpointLatency) -> None:
        row = self._row[address]
        cols = self._columns
        cols["overhead"][row] = model.prefill.a
        cols["rate"][row] = model.prefill.b
        cols["slot_s"][row] = model.slot_s
        cols["slots"][row] = model.slots or 0
        cols["reported"][row] = model.reported_slots or 0
        cols["last_done"][row] = model.last_done
        cols["decode_slope"][row] = model.decode.b

    def retain(self, addresses: set[str]) -> None:
        """Forget endpoints that left the pool."""
        gone = [a for a in self._endpoints if a not in addresses]
        for address in gone:
            del self._endpoints[address]
            self._free_rows.append(self._row.pop(address))
        if gone:
            self._epoch += 1
            self._rows_memo.clear()

    def predict(
        self,
        state: EndpointState,
        metrics: EndpointMetrics | None,
        in_flight: int,
        uncached_tokens: int,
        limit: int | None = None,
    ) -> Prediction:
        """TTFT of a request with ``uncached_tokens`` to prefill on this endpoint now
        (``metrics``: its fresh report or None; ``in_flight``: the EPP's count there, or
        more: requests held for it ahead of this one; ``limit``: the concurrency the EPP
        keeps to there, when lower than its slots)."""
        model = self.endpoint(state)
        waiting = running = 0.0
        if metrics is not None and metrics.updated_at > model.last_done:
            waiting, running = _known(metrics.waiting), _known(metrics.running)
        load = max(in_flight, math.ceil(running + waiting))
        wait = model.wait_s(load, waiting, running, limit)
        slots = model.slots
        batch = min(load + 1, slots) if slots else load + 1
        return Prediction(
            ttft_s=wait + model.prefill(uncached_tokens),
            wait_s=wait,
            uncached_tokens=uncached_tokens,
            tpot_s=model.decode(batch),
            load=load,
        )

    def predict_view(
        self, view: CandidateView, in_flight: Mapping[str, int], uncached: FloatArray
    ) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, FloatArray]:
        """:meth:`predict` for every candidate of ``view`` at once: (TTFT, load, prefill
        rate per token, decode slowdown per output token and running request, slot time)
        arrays, the same numbers as the scalar path."""
        rows = self._rows(view)
        cols = self._columns
        # a report older than the last request the EPP saw end there still counts it:
        # then the EPP's own count is the better one
        newer = view.columns.updated_at[view.rows] > cols["last_done"][rows]
        waiting = np.where(newer, _known_array(view.metric("waiting")), 0.0)
        running = np.where(newer, _known_array(view.metric("running")), 0.0)
        load = np.maximum(view.counts(in_flight), np.ceil(running + waiting))
        slots, slot_s = cols["slots"][rows], cols["slot_s"][rows]
        known = slots > 0
        per_slot = slot_s / np.where(known, slots, 1.0)
        wait_known = np.maximum(load - slots + 1, 0.0) * per_slot
        wait_queue = np.where(waiting > 0, (waiting + 1) * slot_s / np.maximum(running, 1.0), 0.0)
        wait = np.where(known, wait_known, wait_queue)
        rate = cols["rate"][rows]
        ttft: FloatArray = wait + cols["overhead"][rows] + rate * uncached
        return ttft, load, rate, cols["decode_slope"][rows], slot_s

    def reported_slots_view(self, view: CandidateView) -> FloatArray:
        """Each candidate's :attr:`EndpointLatency.reported_slots` (0: unknown)."""
        rows = self._rows(view)  # first: new endpoints may grow (replace) the columns
        result: FloatArray = self._columns["reported"][rows]
        return result

    def _rows(self, view: CandidateView) -> IndexArray:
        """The model rows of ``view``'s candidates (creating missing endpoints), found
        once per column set and epoch: successive snapshots share their addresses."""
        addresses = view.columns.addresses
        key = (id(addresses), self._epoch)
        memo = self._rows_memo.get(key)
        if memo is None or memo[0] is not addresses:
            row = self._row
            if any(a not in row for a in addresses):
                for state in view.columns.states:
                    if state.address not in row:
                        self._create(state)
                key = (id(addresses), self._epoch)
            rows = np.fromiter(map(row.__getitem__, addresses), np.intp, len(addresses))
            if len(self._rows_memo) >= 8:
                self._rows_memo.clear()
            memo = self._rows_memo[key] = (addresses, rows)
        result: IndexArray = memo[1][view.rows]
        return result

    def observe_load(self, state: EndpointState, metrics: EndpointMetrics | None) -> None:
        """Learn the endpoint's slots from a report: while requests wait, the running
        count is the most the engine runs at once."""
        if metrics is None:
            return
        running = int(min(_known(metrics.running), 1e6))
        model = self.endpoint(state)
        changed = False
        if running > model.running_seen:
            model.running_seen, changed = running, True
        if _known(metrics.waiting) > 0 and running > model.learned_slots:
            model.learned_slots, changed = running, True
            self.slots_version += 1
        if changed:
            self._sync(state.address, model)

    def request_done(self, address: str, at: float) -> None:
        """A request routed to ``address`` ended (however it ended) at ``at``."""
        model = self._endpoints.get(address)
        if model is not None and at > model.last_done:
            model.last_done = at
            self._columns["last_done"][self._row[address]] = at

    def observe(
        self,
        dispatch: Dispatch,
        finished_at: float,
        prompt_tokens: int | None,
        cached_tokens: int | None,
        completion_tokens: int | None,
    ) -> float | None:
        """Learn from a request that completed successfully; returns the TTFT error
        (observed - predicted, seconds) when the TTFT was observable, else None.

        The TTFT is observable for streamed responses whose body the EPP sees (the
        first body chunk carries the first token); a non-streamed body arrives whole at
        the end, so it only teaches the slot time."""
        model = self._endpoints.get(dispatch.address)
        if model is None:  # left the pool meanwhile
            return None
        model.completions += 1
        pred = dispatch.prediction
        uncached = pred.uncached_tokens
        if prompt_tokens is not None and cached_tokens is not None:
            uncached = max(prompt_tokens - cached_tokens, 0)
        error = None
        first = dispatch.first_byte_at if dispatch.streaming else None
        if first is not None:
            prefill_s = model.prefill(uncached)  # (before this TTFT joins the fit)
            ttft = first - dispatch.sent_at
            error = ttft - pred.ttft_s
            model.ttft_samples += 1
            model.abs_error_s += (abs(error) - model.abs_error_s) / min(model.ttft_samples, 32)
            if pred.load < model.surely_free:  # found a free slot: the TTFT is all prefill
                model.prefill.add(uncached, ttft)
            elif not (model.configured_slots or model.learned_slots):
                # waited far beyond its prefill: every slot was taken at this load
                waited = ttft - prefill_s
                if waited > max(0.5 * model.slot_s / pred.load, QUEUED_MIN_S) and (
                    not model.queued_at or pred.load < model.queued_at
                ):
                    model.queued_at = pred.load
            if completion_tokens is not None and completion_tokens >= 2:
                tpot = (finished_at - first) / (completion_tokens - 1)
                slots = model.slots
                model.decode.add(min(pred.load + 1, slots) if slots else pred.load + 1, tpot)
            in_slot = finished_at - first + prefill_s
        else:
            in_slot = finished_at - dispatch.sent_at - pred.wait_s
        if in_slot > 0:
            model.slot_s += (in_slot - model.slot_s) / min(model.completions, 32)
        self._sync(dispatch.address, model)
        return error

    def status(self, address: str) -> dict[str, float | int | None] | None:
        """The endpoint's learned values, for ``/status`` (None: never seen)."""
        m = self._endpoints.get(address)
        if m is None:
            return None
        return {
            "overhead_ms": round(m.prefill.a * 1000, 3),
            "prefill_ms_per_token": round(m.prefill.b * 1000, 5),
            "decode_ms_per_token": round(m.decode.a * 1000, 3),
            "decode_ms_per_running": round(m.decode.b * 1000, 4),
            "slot_s": round(m.slot_s, 4),
            "slots": m.slots,
            "ttft_samples": m.ttft_samples,
            "completions": m.completions,
            "ttft_abs_error_ms": round(m.abs_error_s * 1000, 2),
        }

    def addresses(self) -> Mapping[str, EndpointLatency]:
        return self._endpoints


def slo_missed(
    request: InferenceRequest, ttft_s: float | FloatArray, tpot_s: float | FloatArray
) -> bool | BoolArray:
    """Whether predicted TTFT and TPOT (seconds; floats, or arrays for many candidates)
    miss the request's SLO headers (False where it set none)."""
    missed: bool | BoolArray = False
    if request.slo_ttft_ms is not None:
        missed = missed | (ttft_s * 1000 > request.slo_ttft_ms)
    if request.slo_tpot_ms is not None:
        missed = missed | (tpot_s * 1000 > request.slo_tpot_ms)
    return missed


def _known(value: float | None) -> float:
    """A reported count, 0 when unreported or not a finite number."""
    return value if value is not None and math.isfinite(value) else 0.0


def _known_array(values: FloatArray) -> FloatArray:
    """:func:`_known` for an array (NaN = unreported)."""
    result: FloatArray = np.where(np.isfinite(values), values, 0.0)
    return result


def _configured_slots(state: EndpointState, priors: LatencyPriors) -> int | None:
    label = state.endpoint.labels.get(MAX_NUM_SEQS_LABEL)
    if label is not None:
        try:
            value = int(label)
        except ValueError:
            value = 0
        if value > 0:
            return value
    return priors.max_num_seqs


def interference_s(
    prefill_s_per_token: float, step_s: float, running: int, uncached_tokens: int, step_tokens: int
) -> float:
    """Decode time each of ``running`` decodes loses while a prefill of
    ``uncached_tokens`` shares their forward steps (the interference term).

    Chunked prefill as vLLM schedules it: every step carries the running decodes plus up
    to ``step_tokens - running`` prompt tokens. A step lasts the larger of the decodes'
    own step (``step_s``, the endpoint's time per output token at that batch) and the
    compute of all its tokens (``prefill_s_per_token`` each), so a chunk costs the
    decodes only what its compute exceeds their step by; summed over the chunks.
    """
    if running <= 0 or uncached_tokens <= 0:
        return 0.0
    chunk = max(step_tokens - running, 1)
    full, rest = divmod(uncached_tokens, chunk)
    extra = full * max(0.0, prefill_s_per_token * (chunk + running) - step_s)
    if rest:
        extra += max(0.0, prefill_s_per_token * (rest + running) - step_s)
    return extra
