"""The wall-time model: a server's measured rate curve, the measured completion lengths, and a fleet simulation.

Rate curve. Each server is a continuous-batching engine: with ``b`` requests running, every one of them gets a
token every ``tpot(b) = alpha + beta·b`` seconds (weights read once per step, plus per-request KV and verify work:
linear in the batch while decoding is memory-bound), so the server makes ``b / tpot(b)`` tokens/s. Requests beyond
``max_running_requests`` wait in the server's queue and make nothing. ``alpha`` and ``beta`` are fitted to the
benchmark's own streams (``draftgen.bench.occupancy``), so queueing, prefill and stream overheads met during the
benchmark are inside them.

Fleet. The generate notebook keeps ``concurrency`` requests in flight per server, each server pulling the next
prompt from one shared queue when a request ends. ``simulate_fleet`` plays exactly that, request by request,
with completion lengths drawn from the benchmark's measured distribution (clipped at ``max_tokens``). Long runs
are simulated for a few thousand requests per server and the rest added at the steady full-batch rate: the
last requests' tail (the drain, when batches empty out) is simulated, never guessed.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from draftgen.estimate.conversations import Conversations, work_ratio

EXACT_ROUNDS = 8  # requests per slot simulated exactly before extending at the steady rate
EXACT_MIN_PER_SERVER = 400
# Plays of the simulation averaged into a point estimate. The drain of a run a few conversations per slot long moves
# by several percent from one draw of lengths to the next (3.2-3.5% s.d. on the bundled set at 7 x 64), so the
# plan's own simulation noise must be averaged away well below that; a play of a few thousand requests takes
# about a millisecond.
POINT_REPEATS = 64


@dataclass(frozen=True)
class RateModel:
    """Per-server decode speed: ``tpot(b) = alpha_s + beta_s·b`` seconds per token per running request."""

    alpha_s: float
    beta_s: float
    max_running: int | None = None  # the server's batch cap; None = unlimited
    source: str = ""

    def running(self, in_flight: int) -> int:
        return in_flight if self.max_running is None else min(in_flight, self.max_running)

    def tpot(self, running: int) -> float:
        return self.alpha_s + self.beta_s * running

    def tok_s(self, in_flight: int) -> float:
        """Output tokens/s of one server with ``in_flight`` requests (the rest queue past the cap)."""
        b = self.running(in_flight)
        return b / self.tpot(b) if b > 0 else 0.0

    def scaled(self, factor: float, source: str) -> RateModel:
        """The same curve, ``factor`` times faster."""
        return RateModel(self.alpha_s / factor, self.beta_s / factor, self.max_running, source)


@dataclass(frozen=True)
class RateFit:
    model: RateModel
    points: pl.DataFrame  # running, seconds, tokens, measured_tok_s, fitted_tok_s, rel_error
    note: str  # anything the reader should know about the fit

    @property
    def max_abs_rel_error(self) -> float:
        """Largest |fitted/measured − 1| over points holding ≥ 5% of the measured time."""
        total = self.points["seconds"].sum()
        heavy = self.points.filter(pl.col("seconds") >= 0.05 * total)
        return float(heavy["rel_error"].abs().max() or 0.0)


def fit_rate_model(occupancy: pl.DataFrame, max_running: int | None, source: str = "benchmark") -> RateFit:
    """Weighted least squares of tpot(b) = b·seconds/tokens against b, weighted by the seconds spent at b."""
    if occupancy.is_empty():
        raise ValueError("the benchmark has no occupancy data (every request failed?): nothing to fit")
    running = (
        pl.col("in_flight") if max_running is None else pl.min_horizontal("in_flight", pl.lit(max_running))
    )
    points = (
        occupancy.with_columns(running.alias("running"))
        .group_by("running")
        .agg(pl.col("seconds").sum(), pl.col("tokens").sum())
        .filter((pl.col("tokens") > 0) & (pl.col("seconds") > 0))
        .sort("running")
    )
    if points.is_empty():
        raise ValueError("the benchmark recorded no generated tokens: nothing to fit")
    b = points["running"].to_numpy().astype(float)
    seconds = points["seconds"].to_numpy()
    tokens = points["tokens"].to_numpy()
    y = b * seconds / tokens
    w = seconds
    note = ""
    if len(b) == 1:
        alpha, beta = float(y[0]), 0.0
        note = "one in-flight count measured: per-request speed assumed constant in the batch"
    else:
        wb, wy = np.average(b, weights=w), np.average(y, weights=w)
        var = np.average((b - wb) ** 2, weights=w)
        beta = float(np.average((b - wb) * (y - wy), weights=w) / var) if var > 0 else 0.0
        alpha = float(wy - beta * wb)
        if beta < 0:
            # Flat at the largest batch with a real share of the time (10%), not at the time-weighted mean: a
            # full run spends its time at its largest batch, and the slower small batches (where the mean's weight
            # is) would make the faster setting look slower. Seen on CPU servers, where a batch of 2 costs a step
            # of 1.
            steady = b[seconds >= 0.1 * seconds.sum()].max()
            alpha, beta = float(y[b == steady][0]), 0.0
            note = (
                f"per-request speed did not fall with batch size: flat tpot at {int(steady)} in flight fitted"
            )
        elif alpha < 0:
            alpha, beta = 0.0, float(np.sum(w * y * b) / np.sum(w * b * b))
            note = "tpot fitted through the origin"
    model = RateModel(alpha, beta, max_running, source)
    fitted = np.asarray([model.tok_s(int(v)) for v in b])
    measured = tokens / seconds
    table = points.with_columns(
        pl.Series("measured_tok_s", measured),
        pl.Series("fitted_tok_s", fitted),
        pl.Series("rel_error", fitted / measured - 1.0),
    )
    return RateFit(model=model, points=table, note=note)


def with_answer_tokens(requests: pl.DataFrame) -> pl.DataFrame:
    """``requests`` with ``answer_tokens``: of each request's completion tokens, those after its reasoning, counted as
    its share of characters that came as answer text (``content_chars`` of ``content_chars + reasoning_chars``; 0
    where the benchmark recorded no characters). The chat template keeps only this part of an earlier turn, and a
    turn that ends in tool calls writes its reasoning and the calls instead of it."""
    if not {"content_chars", "reasoning_chars"} <= set(requests.columns):
        return requests.with_columns(pl.lit(0, pl.Int64).alias("answer_tokens"))
    chars = pl.col("content_chars") + pl.col("reasoning_chars")
    share = pl.when(chars > 0).then(pl.col("content_chars") / chars).otherwise(0.0)
    return requests.with_columns(
        (pl.col("completion_tokens").fill_null(0) * share).round().cast(pl.Int64).alias("answer_tokens")
    )


def kept_answers(tokens: np.ndarray, answers: np.ndarray, limit: float) -> np.ndarray:
    """The answer tokens left of each completion cut at ``limit`` (the reasoning comes first)."""
    return np.clip(answers - np.maximum(tokens - limit, 0.0), 0.0, None)


@dataclass(frozen=True)
class LengthSample:
    """Measured completion lengths, grouped by prompt (a prompt measured twice counts once in resampling)."""

    prompt_ids: tuple[str, ...]
    tokens: np.ndarray  # completion tokens per request
    truncated: np.ndarray  # finish_reason == "length" per request
    max_tokens: int  # the benchmark's max_tokens
    _groups: tuple[np.ndarray, ...] = field(default=(), repr=False)
    max_length: int = 0  # the trainer's max_length each request was capped at (0: none)
    set_aside: int = 0  # requests whose prompt alone reached max_length: generate sends none of them
    answers: np.ndarray | None = None  # of ``tokens``, those after the reasoning (None: not measured)

    @classmethod
    def from_requests(cls, requests: pl.DataFrame, max_tokens: int, max_length: int = 0) -> LengthSample:
        """The benchmark's completion lengths; with ``max_length``, as generate's cap makes them: each request's
        at most max_length − its prompt tokens (cut ones count as truncated), none for a prompt with no room."""
        ok = requests.filter(
            pl.col("ok") & pl.col("completion_tokens").is_not_null() & (pl.col("completion_tokens") > 0)
        )
        set_aside = 0
        if max_length and "prompt_tokens" in ok.columns:
            room = pl.lit(max_length) - pl.col("prompt_tokens").fill_null(0)
            set_aside = ok.filter(room <= 0).height
            ok = ok.filter(room > 0).with_columns(
                (pl.col("truncated") | (pl.col("completion_tokens") > room)).alias("truncated"),
                pl.min_horizontal("completion_tokens", room).alias("completion_tokens"),
            )
        if ok.is_empty():
            raise ValueError(
                "the benchmark has no successful request with a token count: no length distribution"
            )
        ids = ok["prompt_id"].to_list()
        order: dict[str, list[int]] = {}
        for i, pid in enumerate(ids):
            order.setdefault(pid, []).append(i)
        tokens = ok["completion_tokens"].to_numpy().astype(float)
        measured = {"content_chars", "reasoning_chars"} <= set(ok.columns)
        answers = with_answer_tokens(ok)["answer_tokens"].to_numpy().astype(float) if measured else None
        return cls(
            prompt_ids=tuple(order),
            tokens=tokens,
            truncated=ok["truncated"].to_numpy().astype(bool),
            max_tokens=max_tokens,
            _groups=tuple(np.asarray(v) for v in order.values()),
            max_length=max_length,
            set_aside=set_aside,
            answers=None if answers is None else np.minimum(answers, tokens),
        )

    @property
    def prompts(self) -> int:
        return len(self._groups)

    def extrapolated(self, max_tokens: int) -> bool:
        """True when ``max_tokens`` exceeds the benchmark's and some completions were cut: lengths are a floor."""
        return max_tokens > self.max_tokens and bool(self.truncated.any())

    def per_prompt(self, max_tokens: int) -> np.ndarray:
        """Mean completion length per prompt with every request clipped at ``max_tokens``."""
        clipped = np.minimum(self.tokens, max_tokens)
        return np.asarray([clipped[g].mean() for g in self._groups])

    def answers_per_prompt(self, max_tokens: int) -> np.ndarray:
        """Mean answer tokens (after the reasoning) per prompt, every request cut at ``max_tokens``; zeros when the
        benchmark did not measure them."""
        if self.answers is None:
            return np.zeros(len(self._groups))
        kept = kept_answers(self.tokens, self.answers, max_tokens)
        return np.asarray([kept[g].mean() for g in self._groups])

    def truncated_rate(self, max_tokens: int) -> float:
        if max_tokens >= self.max_tokens:
            return float(self.truncated.mean())
        return float((self.tokens >= max_tokens).mean())


def simulate_fleet(lengths: np.ndarray, servers: int, concurrency: int, rate: RateModel) -> float:
    """Seconds until the last of ``lengths`` finishes on ``servers`` servers with ``concurrency`` in flight each.

    Processor sharing per server (every running request advances one token per tpot(b)); requests past the
    server's cap wait in its FIFO queue; a finished request's slot pulls the next length from the shared queue.
    Every estimate plays it thousands of times, so its inner loop uses locals and a table of tpot(b) (a server
    never runs more than ``concurrency``: each holds that many requests, running or queued).
    """
    if servers < 1 or concurrency < 1:
        raise ValueError("servers and concurrency must be >= 1")
    queue = [float(length) for length in lengths]
    n = len(queue)
    cap = rate.max_running or math.inf
    tpot = [rate.tpot(b) for b in range(concurrency + 1)]
    service = [0.0] * servers  # tokens each running request has received since the server started
    clock = [0.0] * servers
    running: list[list[float]] = [[] for _ in range(servers)]  # heaps of finishing service values
    waiting: list[deque[float]] = [deque() for _ in range(servers)]
    version = [0] * servers
    events: list[tuple[float, int, int]] = []
    push, pop = heapq.heappush, heapq.heappop
    next_index = 0

    for _ in range(concurrency):
        for s in range(servers):
            if next_index < n:
                if len(running[s]) < cap:
                    push(running[s], service[s] + queue[next_index])
                else:
                    waiting[s].append(queue[next_index])
                next_index += 1
    for s in range(servers):
        version[s] += 1
        if running[s]:
            push(events, (clock[s] + (running[s][0] - service[s]) * tpot[len(running[s])], s, version[s]))
    wall = 0.0
    while events:
        t, s, ver = pop(events)
        if ver != version[s]:
            continue
        heap, queued = running[s], waiting[s]
        done = service[s] + (t - clock[s]) / tpot[len(heap)]
        service[s] = done
        clock[s] = t
        wall = t
        limit = done * (1 + 1e-12) + 1e-9
        finished = 0
        while heap and heap[0] <= limit:
            pop(heap)
            finished += 1
        for _ in range(finished):  # each freed slot pulls the next prompt; it queues behind older waiters
            if next_index < n:
                queued.append(queue[next_index])
                next_index += 1
        while queued and len(heap) < cap:
            push(heap, done + queued.popleft())
        version[s] += 1
        if heap:
            push(events, (t + (heap[0] - done) * tpot[len(heap)], s, version[s]))
    return wall


@dataclass(frozen=True)
class WallTime:
    wall_s: float
    steady_s: float  # the same tokens at the full-batch rate, no ramp or drain
    total_tokens: float
    simulated_requests: int  # simulated request by request; the rest added at the steady rate

    @property
    def tail_s(self) -> float:
        return self.wall_s - self.steady_s


def estimate_wall(
    per_prompt: np.ndarray,
    num_prompts: int,
    servers: int,
    concurrency: int,
    rate: RateModel,
    rng: np.random.Generator,
    repeats: int = POINT_REPEATS,
    conversations: Conversations | None = None,
    weights: np.ndarray | None = None,
    tokens: np.ndarray | None = None,
    answers: np.ndarray | None = None,
) -> WallTime:
    """Expected wall time for ``num_prompts`` requests whose lengths follow ``per_prompt``.

    wall = all tokens at the steady full-batch rate + the tail (ramp and drain) measured in the simulation of
    the first ``exact`` requests, as the simulation's wall time minus its own tokens at the steady rate. Taking
    the tail this way keeps the random draw of lengths from moving the steady part. With ``conversations`` (the
    prompt file's, generate's ``turns: all``, each turn with its room under the trainer's max_length) the simulated
    jobs are conversations: one slot runs a conversation's requests one after another, so their lengths add up,
    each a draw clipped at its turn's room (``tokens``: each draw's tokens where ``per_prompt`` is work, the rate
    curve's units; the work is clipped in proportion; a turn that answers with tool calls writes the draw's tokens
    less its ``answers`` and the calls). With ``weights`` (a sampling plan's arms pooled:
    ``draftgen.estimate.arms``) each length is drawn with its probability.
    """
    if num_prompts < 1:
        raise ValueError("num_prompts must be >= 1")
    tokens = per_prompt if tokens is None else tokens
    if conversations is None:
        mean = float(per_prompt.mean() if weights is None else np.dot(per_prompt, weights))
    else:
        mean = conversations.mean_work(per_prompt, tokens, weights, answers)
    fleet_rate = servers * rate.tok_s(concurrency)
    per_server = math.ceil(num_prompts / servers)
    exact = min(num_prompts, servers * min(per_server, max(EXACT_ROUNDS * concurrency, EXACT_MIN_PER_SERVER)))
    ratio = work_ratio(per_prompt, tokens)
    tails = []
    for _ in range(repeats):
        if conversations is None:
            lengths = jobs = rng.choice(per_prompt, size=exact, replace=True, p=weights)
        else:
            count = max(1, round(exact / conversations.mean_turns))
            lengths, jobs = conversations.play(rng, count, tokens, answers, weights, ratio)
        tails.append(simulate_fleet(jobs, servers, concurrency, rate) - float(lengths.sum()) / fleet_rate)
    total = num_prompts * mean
    steady = total / fleet_rate
    return WallTime(
        wall_s=steady + float(np.mean(tails)), steady_s=steady, total_tokens=total, simulated_requests=exact
    )


def bootstrap_walls(
    per_prompt: np.ndarray,
    rates: list[RateModel],
    num_prompts: int,
    servers: int,
    concurrency: int,
    rng: np.random.Generator,
    conversations: Conversations | None = None,
    weights: np.ndarray | None = None,
    tokens: np.ndarray | None = None,
    answers: np.ndarray | None = None,
) -> np.ndarray:
    """One wall time per resample: prompts resampled with replacement (each with its weight), each paired with
    one resampled rate."""
    tokens = per_prompt if tokens is None else tokens
    out = []
    for rate in rates:
        picks = rng.choice(per_prompt.size, size=per_prompt.size, replace=True, p=weights)
        wall = estimate_wall(
            per_prompt[picks],
            num_prompts,
            servers,
            concurrency,
            rate,
            rng,
            repeats=1,
            conversations=conversations,
            tokens=tokens[picks],
            answers=None if answers is None else answers[picks],
        )
        out.append(wall.wall_s)
    return np.asarray(out)


def resampled_rates(
    occupancy: pl.DataFrame, max_running: int | None, count: int, rng: np.random.Generator
) -> list[RateModel]:
    """Rate curves refitted on servers drawn with replacement (the spread between GPUs); one server: the fit."""
    servers = occupancy["server"].unique().sort().to_list()
    if len(servers) < 2:
        fitted = fit_rate_model(occupancy, max_running).model
        return [fitted] * count
    rates = []
    for _ in range(count):
        picks = rng.choice(len(servers), size=len(servers), replace=True)
        frame = pl.concat([occupancy.filter(pl.col("server") == servers[i]) for i in picks])
        rates.append(fit_rate_model(frame, max_running).model)
    return rates
