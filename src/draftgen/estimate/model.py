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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import polars as pl

EXACT_ROUNDS = 8  # requests per slot simulated exactly before extending at the steady rate
EXACT_MIN_PER_SERVER = 400


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
    """
    if servers < 1 or concurrency < 1:
        raise ValueError("servers and concurrency must be >= 1")
    n = len(lengths)
    cap = rate.max_running or math.inf
    service = [0.0] * servers  # tokens each running request has received since the server started
    clock = [0.0] * servers
    running: list[list[float]] = [[] for _ in range(servers)]  # heaps of finishing service values
    waiting: list[deque[float]] = [deque() for _ in range(servers)]
    version = [0] * servers
    events: list[tuple[float, int, int]] = []
    next_index = 0

    def admit(s: int, length: float) -> None:
        if len(running[s]) < cap:
            heapq.heappush(running[s], service[s] + length)
        else:
            waiting[s].append(length)

    def schedule(s: int) -> None:
        version[s] += 1
        if running[s]:
            tpot = rate.tpot(len(running[s]))
            heapq.heappush(events, (clock[s] + (running[s][0] - service[s]) * tpot, s, version[s]))

    for _ in range(concurrency):
        for s in range(servers):
            if next_index < n:
                admit(s, float(lengths[next_index]))
                next_index += 1
    for s in range(servers):
        schedule(s)
    wall = 0.0
    while events:
        t, s, ver = heapq.heappop(events)
        if ver != version[s]:
            continue
        service[s] += (t - clock[s]) / rate.tpot(len(running[s]))
        clock[s] = t
        wall = t
        limit = service[s] * (1 + 1e-12) + 1e-9
        finished = 0
        while running[s] and running[s][0] <= limit:
            heapq.heappop(running[s])
            finished += 1
        for _ in range(finished):  # each freed slot pulls the next prompt; it queues behind older waiters
            if next_index < n:
                waiting[s].append(float(lengths[next_index]))
                next_index += 1
        while waiting[s] and len(running[s]) < cap:
            heapq.heappush(running[s], service[s] + waiting[s].popleft())
        schedule(s)
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


@dataclass(frozen=True)
class Conversations:
    """The conversations a run sends, as the fleet simulation plays them: a slot runs one conversation's turns one
    after another, as generate sends them, each turn's completion clipped at its room (the tokens the trainer's
    max_length leaves after its prompt, which shrinks turn by turn; inf: the full max_tokens). A turn that answers
    with tool calls writes its reasoning and those calls (``calls``: their tokens), not a text answer.
    ``ordered``: they are the whole set in generate's order (else a uniform sample, drawn at random)."""

    rooms: np.ndarray  # every turn's room, conversation after conversation
    turns: np.ndarray  # each conversation's turns (≥ 1)
    weights: np.ndarray  # each conversation's probability
    calls: np.ndarray | None = None  # every turn's tool-call tokens (0: a text answer); None: all in text
    ordered: bool = False
    # ordered: where each version of the whole set begins in ``turns`` (the versions the prompt audit drew)
    versions: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))

    @classmethod
    def of(
        cls,
        rooms: Sequence[Sequence[float]],
        calls: Sequence[Sequence[int]] = (),
        ordered: bool = False,
        draws: int = 1,
    ) -> Conversations:
        """Conversations given by their turns' rooms (and call tokens), each as likely: the prompt audit's, ``draws``
        versions of its counted conversations one after another (a conversation that sends nothing: no rooms)."""
        if calls and [len(c) for c in calls] != [len(r) for r in rooms]:
            raise ValueError("give one call count per turn of every conversation, or none")
        if draws < 1 or len(rooms) % draws:
            raise ValueError(f"{len(rooms)} conversations are not {draws} versions of one set")
        size = len(rooms) // draws
        sending = [i for i, r in enumerate(rooms) if len(r)]
        if not sending:
            raise ValueError("no conversation sends a turn")
        turns = np.fromiter((len(rooms[i]) for i in sending), dtype=np.int64, count=len(sending))
        flat_calls = np.concatenate([np.asarray(calls[i], dtype=float) for i in sending]) if calls else None
        return cls(
            rooms=np.concatenate([np.asarray(rooms[i], dtype=float) for i in sending]),
            turns=turns,
            weights=np.full(turns.size, 1.0 / turns.size),
            calls=flat_calls if flat_calls is not None and flat_calls.any() else None,
            ordered=ordered,
            versions=np.searchsorted(np.asarray(sending), np.arange(draws) * size),
        )

    @classmethod
    def uncapped(cls, counts: Mapping[int, int]) -> Conversations:
        """Conversations of ``k`` turns, ``counts[k]`` of them, every turn with the full max_tokens."""
        kept = {k: n for k, n in counts.items() if k > 0 and n > 0}
        if not kept:
            raise ValueError("every conversation needs at least one turn")
        turns = np.fromiter(kept, dtype=np.int64)
        weights = np.fromiter(kept.values(), dtype=float)
        return cls(rooms=np.full(int(turns.sum()), np.inf), turns=turns, weights=weights / weights.sum())

    @property
    def trivial(self) -> bool:
        """One turn each with the full max_tokens, in text: independent requests, nothing to model."""
        return bool((self.turns == 1).all() and np.isinf(self.rooms).all() and self.calls is None)

    @cached_property
    def mean_turns(self) -> float:
        return float(np.dot(self.turns, self.weights))

    @cached_property
    def _firsts(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.turns)[:-1]])

    @cached_property
    def _clip_tables(self) -> tuple[_ClipTable | None, _ClipTable | None]:
        """(text turns, call turns), each as a table of its rooms (a call turn's less its calls: min(v + c, room) =
        min(v, room − c) + c) that clips any draw in one search."""
        shares = np.repeat(self.weights, self.turns)
        shares = shares / shares.sum()
        calls = np.zeros(self.rooms.size) if self.calls is None else self.calls
        called = calls > 0
        return tuple(  # type: ignore[return-value]
            _ClipTable.of(
                self.rooms[mask] - calls[mask], shares[mask], float(np.dot(calls[mask], shares[mask]))
            )
            if mask.any()
            else None
            for mask in (~called, called)
        )

    def mean_work(
        self,
        work: np.ndarray,
        tokens: np.ndarray,
        weights: np.ndarray | None = None,
        answers: np.ndarray | None = None,
    ) -> float:
        """The mean work of one turn, exactly: each draw (``tokens``, its ``work`` in proportion; a call turn writes
        ``tokens − answers`` and its calls) clipped at each turn's room, every turn weighted alike within its
        conversation's probability."""
        draw_weights = np.full(work.size, 1.0 / work.size) if weights is None else weights
        text, called = self._clip_tables
        total = np.zeros(tokens.size)
        if text is not None:
            total += text.sums(tokens)
        if called is not None:
            total += called.sums(tokens if answers is None else tokens - answers)
        return float(np.dot(total * _work_ratio(work, tokens), draw_weights))

    def draw(self, rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``count`` conversations (ordered: the last ``count`` of one version of the set, drawn at random, in order;
        else drawn by their probability): every turn's room and call tokens in order, and each one's turns."""
        if self.ordered:
            version = int(rng.integers(self.versions.size))
            start = int(self.versions[version])
            end = int(self.versions[version + 1]) if version + 1 < self.versions.size else self.turns.size
            picks = start + (np.arange(count) - count) % (end - start)
        else:
            picks = rng.choice(self.turns.size, size=count, replace=True, p=self.weights)
        counts = self.turns[picks]
        offsets = np.repeat(self._firsts[picks] - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
        index = offsets + np.arange(int(counts.sum()))
        calls = np.zeros(index.size) if self.calls is None else self.calls[index]
        return self.rooms[index], calls, counts


@dataclass(frozen=True)
class _ClipTable:
    """Rooms sorted with their running sums: Σ share · min(v, room) + added for any v in one binary search."""

    rooms: np.ndarray
    below_sum: np.ndarray  # Σ share · room over the rooms before each position (inf rooms never count)
    below_share: np.ndarray  # Σ share over the same
    added: float  # Σ share · what every turn adds (its calls)

    @classmethod
    def of(cls, rooms: np.ndarray, shares: np.ndarray, added: float) -> _ClipTable:
        order = np.argsort(rooms)
        rooms, shares = rooms[order], shares[order]
        return cls(
            rooms=rooms,
            below_sum=np.concatenate([[0.0], np.cumsum(np.where(np.isfinite(rooms), rooms * shares, 0.0))]),
            below_share=np.concatenate([[0.0], np.cumsum(shares)]),
            added=added,
        )

    def sums(self, values: np.ndarray) -> np.ndarray:
        at = np.searchsorted(self.rooms, values, side="left")  # the rooms smaller than each value clip it
        return self.below_sum[at] + (self.below_share[-1] - self.below_share[at]) * values + self.added


def _work_ratio(work: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Work per token of each draw (1 where it has no tokens)."""
    return np.divide(work, tokens, out=np.ones_like(work, dtype=float), where=tokens > 0)


def estimate_wall(
    per_prompt: np.ndarray,
    num_prompts: int,
    servers: int,
    concurrency: int,
    rate: RateModel,
    rng: np.random.Generator,
    repeats: int = 3,
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
    ratio = _work_ratio(per_prompt, tokens)
    reasoning = tokens if answers is None else tokens - answers
    tails = []
    for _ in range(repeats):
        if conversations is None:
            lengths = jobs = rng.choice(per_prompt, size=exact, replace=True, p=weights)
        else:
            rooms, calls, counts = conversations.draw(rng, max(1, round(exact / conversations.mean_turns)))
            picks = rng.choice(per_prompt.size, size=rooms.size, replace=True, p=weights)
            written = np.where(calls > 0, reasoning[picks] + calls, tokens[picks])
            lengths = np.minimum(written, rooms) * ratio[picks]
            jobs = np.add.reduceat(lengths, np.concatenate([[0], np.cumsum(counts)[:-1]]))
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
