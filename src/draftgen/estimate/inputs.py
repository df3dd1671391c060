"""What the estimate reads: a benchmark run folder, and the size of the prompt set.

A benchmark's parquet files are raw wall-clock measurements; ``load_benchmark`` puts them on the hardware's clock
once, with the factor the benchmark recorded (``benchmark.json`` ``clock``: ``draftgen sim --speed X`` → seconds × X),
so everything the estimate computes — rates, days, dollars — is the simulated GPU's, never the sped-up clock's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from draftgen.client.clock import WALL, HardwareClock, on_clock, on_kept_clock
from draftgen.estimate.conversations import Conversations
from draftgen.estimate.model import with_answer_tokens
from draftgen.paths import resolve_path
from draftgen.prompts.answer_lengths import AnswerLengths
from draftgen.prompts.audit import NEAR_LIMIT_BESIDE_A_RUN, AuditSettings, PromptAudit, audit_prompts
from draftgen.prompts.divergence import DivergenceShares
from draftgen.prompts.rows import PromptRow, count_rows, iter_prompts
from draftgen.rundir.layout import BENCH_OCCUPANCY as OCCUPANCY_FILE
from draftgen.rundir.layout import BENCH_REQUESTS as REQUESTS_FILE
from draftgen.rundir.layout import BENCH_RESULTS as RESULTS_FILE
from draftgen.rundir.layout import BENCH_SUMMARY as SUMMARY_FILE
from draftgen.sampling_plan import Arm, samples
from draftgen.training.conversation import answer_points

if TYPE_CHECKING:
    from draftgen.estimate.config import EstimateConfig

BENCHMARK_RUNS = Path("outputs") / "benchmark"  # under the project root (draftgen.paths)


@dataclass(frozen=True)
class BenchmarkData:
    path: Path
    results: pl.DataFrame  # seconds and tok/s on ``clock`` (converted once, at load)
    requests: pl.DataFrame  # lengths and finish reasons (no times are read from it)
    occupancy: pl.DataFrame  # seconds on ``clock``
    summary: dict
    clock: HardwareClock = WALL

    @property
    def servers(self) -> int:
        return int(self.results["server"].n_unique())

    @property
    def max_tokens(self) -> int:
        return int(self.summary["max_tokens"])

    @property
    def max_running(self) -> int | None:
        caps = [v for v in self.results["max_running_requests"].to_list() if v]
        return min(caps) if caps else None

    @property
    def levels(self) -> list[int]:
        return sorted(self.results["concurrency"].unique().to_list())

    @property
    def max_in_flight(self) -> int:
        return int(self.occupancy["in_flight"].max() or 0)

    def accept_length(self) -> tuple[float | None, str]:
        """Mean acceptance length over the levels that have one, and its source(s)."""
        rows = self.results.drop_nulls("accept_length")
        if rows.is_empty():
            sources = sorted(set(self.results["accept_length_source"].to_list()))
            return None, "; ".join(sources)
        return float(rows["accept_length"].mean()), "; ".join(
            sorted(set(rows["accept_length_source"].to_list()))
        )


def find_latest_benchmark(root: Path | None = None) -> Path:
    """The newest folder under ``root`` (default: the project's outputs/benchmark) holding results.parquet."""
    root = resolve_path(BENCHMARK_RUNS) if root is None else root
    found = sorted(root.glob(f"*/{RESULTS_FILE}"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(
            f"no benchmark results under {root}/: run the benchmark notebook first "
            "(draftgen run benchmark -f params/...), or set benchmark_dir"
        )
    return found[-1].parent


def load_benchmark(path: str | Path) -> BenchmarkData:
    folder = Path(path)
    missing = [
        n for n in (RESULTS_FILE, REQUESTS_FILE, OCCUPANCY_FILE, SUMMARY_FILE) if not (folder / n).is_file()
    ]
    if missing:
        raise FileNotFoundError(
            f"benchmark folder {folder} lacks {', '.join(missing)}: point benchmark_dir at a finished benchmark run"
        )
    summary = json.loads((folder / SUMMARY_FILE).read_text())
    try:
        clock = HardwareClock.from_dict(summary.get("clock"))
    except ValueError as exc:
        raise ValueError(f"{folder / SUMMARY_FILE}: {exc}") from exc
    results = pl.read_parquet(folder / RESULTS_FILE)
    occupancy = pl.read_parquet(folder / OCCUPANCY_FILE).with_columns(pl.col("seconds") * clock.factor)
    if "clock_kept" in results.columns:
        # Each level on the clock its simulator kept: a level run late on a busy machine is not a slower GPU.
        kept = results.select("server", "concurrency", pl.col("clock_kept").cast(pl.Float64))
        occupancy = (
            occupancy.join(kept, on=["server", "concurrency"], how="left")
            .with_columns(pl.col("seconds") * pl.col("clock_kept").fill_null(1.0))
            .drop("clock_kept")
        )
    return BenchmarkData(
        path=folder,
        results=on_kept_clock(on_clock(results, clock)),
        requests=pl.read_parquet(folder / REQUESTS_FILE),
        occupancy=occupancy,
        summary=summary,
        clock=clock,
    )


def measured_answers(data: BenchmarkData) -> AnswerLengths | None:
    """The benchmark's answered requests as regenerated turns (``draftgen.prompts.answer_lengths``): completion
    tokens and, of them, the answer after the reasoning (``model.with_answer_tokens``); None without the measured
    characters or an answered request."""
    requests = data.requests
    if not {"content_chars", "reasoning_chars"} <= set(requests.columns):
        return None
    ok = with_answer_tokens(requests.filter(pl.col("ok") & (pl.col("completion_tokens").fill_null(0) > 0)))
    if ok.is_empty():
        return None
    categories = ok["category"].to_list() if "category" in ok.columns else [None] * ok.height
    return AnswerLengths.of(
        ok["completion_tokens"].to_list(),
        ok["answer_tokens"].to_list(),
        categories,
        f"the benchmark's {ok.height:,} answered requests",
        measured_divergence(requests),
    )


def measured_divergence(requests: pl.DataFrame) -> DivergenceShares | None:
    """The benchmark's agentic answers compared with the source's (``diverged`` not null), all categories pooled,
    by the kind of the source's reply (``draftgen.prompts.divergence``); a request cut at max_tokens is left out
    (the drawn lengths price a cut before the calls). None for a benchmark that recorded no comparison (older
    folders lack the columns)."""
    if not {"diverged", "source_called"} <= set(requests.columns):
        return None
    compared = requests.filter(pl.col("ok") & pl.col("diverged").is_not_null())
    if "finish_reason" in compared.columns:
        compared = compared.filter(pl.col("finish_reason").fill_null("") != "length")
    if compared.is_empty():
        return None
    return DivergenceShares.of(
        compared["source_called"].fill_null(False).to_list(),
        compared["diverged"].to_list(),
        f"the benchmark's {compared.height:,} agentic answers compared",
    )


def audit_prompt_set(config: EstimateConfig, answers: AnswerLengths | None = None) -> PromptAudit:
    """The prompt file as generate will take it (``draftgen.prompts.audit``): the conversations it sends (malformed
    rows and skipped duplicates aside) and, with ``tokenizer``, the turns it would set aside, the earlier answers
    in later turns' prompts as long as ``answers`` measured them."""
    cap = None
    if config.tokenizer and config.train_max_length:
        from draftgen.generate.length_cap import LengthCap, tokenizer_counter

        counter = tokenizer_counter(config.tokenizer)
        cap = LengthCap(config.train_max_length, counter, config.tokenizer, config.min_turn_budget)
    return audit_prompts(
        AuditSettings(
            path=config.prompt_path,
            category_field=config.category_field or None,
            keep_duplicates=config.keep_duplicates,
            turns=config.turns,
            limit=config.limit,
            near_limit=NEAR_LIMIT_BESIDE_A_RUN,
            cap=cap,
            max_tokens=config.max_tokens,
            seed=config.seed,
            answers=answers,
        )
    )


def _sent_per_conversation(audit: PromptAudit) -> dict[int, int]:
    """Answer points sent per conversation → conversations: the audit's counted sample, the turns set aside left
    out, else every conversation's answer points."""
    budgets = audit.budgets
    return dict(budgets.sent_turns) if budgets is not None and budgets.conversations else dict(audit.turns)


def mean_sent_answers(audit: PromptAudit) -> float:
    """Requests per conversation generate sends (a conversation set aside whole counts as none)."""
    counts = _sent_per_conversation(audit)
    total = sum(counts.values())
    return sum(k * n for k, n in counts.items()) / total if total else 0.0


def sent_conversations(audit: PromptAudit) -> Conversations | None:
    """The conversations the fleet simulation plays: the audit's counted ones, each turn with the room the trainer's
    max_length leaves it, else one of each sent number of answer points, uncapped; None when each sends one turn
    with the full max_tokens (nothing to model) or none sends anything."""
    budgets = audit.budgets
    if budgets is not None and any(budgets.conversation_rooms):
        # every conversation counted: in the file's order, which is generate's (a small set's drain depends on it)
        whole = budgets.conversations == budgets.of_conversations
        conversations = Conversations.of(
            budgets.conversation_rooms, budgets.conversation_calls, ordered=whole, draws=budgets.draws
        )
    else:
        counts = {k: n for k, n in _sent_per_conversation(audit).items() if k > 0}
        if not counts:
            return None
        conversations = Conversations.uncapped(counts)
    return None if conversations.trivial else conversations


def _audit_source(audit: PromptAudit) -> str:
    skipped = [f"{audit.rows:,} rows read"]
    if audit.rejected_rows:
        skipped.append(f"{audit.rejected_rows:,} malformed")
    if audit.duplicates:
        skipped.append(f"{audit.duplicates:,} duplicates " + ("kept" if audit.keep_duplicates else "skipped"))
    return f"conversations generate sends from {audit.path} ({', '.join(skipped)})"


def dataset_size(
    dataset: int, prompt_path: Path, limit: int, turns: str = "last", audit: PromptAudit | None = None
) -> tuple[int, str]:
    """(requests to generate, where the number came from).

    Prompts: ``dataset`` if given, else what the prompt ``audit`` says generate sends (else the rows of the prompt
    file); then ``limit``. With ``turns: all`` a conversation is one request per answer point
    (``draftgen.training.conversation``), so the prompts are multiplied by the mean number of answer points sent:
    the audit's, the turns generate sets aside left out when it counted them (with ``turns: last`` too), else
    those of the prompt file's first ``limit`` valid rows.
    """
    if dataset:
        size, source = dataset, "dataset_size"
    elif audit is not None:
        size, source = audit.sent, _audit_source(audit)
    else:
        size, source = count_rows(prompt_path), f"rows of {prompt_path}"
    if limit and limit < size:
        size, source = limit, f"limit {limit} (of {size:,} {source})"
    if audit is not None:
        mean = mean_sent_answers(audit)
        if mean == 1.0:
            return size, source
    elif turns == "last":
        return size, source
    else:
        answers = answers_per_prompt(prompt_path, limit)
        if answers is None:
            return size, source
        mean = float(answers.mean())
    source = f"{size:,} prompts ({source}) x {mean:.3f} answers each (turns: {turns}"
    if audit is not None and audit.budgets is not None:
        source += (
            f"; the turns set aside under max_length {audit.budgets.max_length:,} or after a conversation ended "
            "left out"
        )
    return round(size * mean), source + ")"


def answers_per_prompt(prompt_path: Path, limit: int) -> np.ndarray | None:
    """Answer points (requests with ``turns: all``) of each of the first ``limit`` valid prompts (all when 0);
    None when every prompt has one (nothing to model) or the file has no valid prompt."""
    counts = []
    for row in iter_prompts(prompt_path):
        if isinstance(row, PromptRow):
            counts.append(len(answer_points(row.messages, "all")))
            if limit and len(counts) >= limit:
                break
    if not counts or max(counts) == 1:
        return None
    return np.asarray(counts, dtype=np.int64)


def planned_requests(
    prompt_path: Path, limit: int, turns: str, arms: Sequence[Arm], keep_duplicates: bool = False
) -> tuple[int, int]:
    """(requests, prompts) a sampling plan makes of the first ``limit`` valid prompts (all when 0), counted
    exactly: each prompt's planned samples (``draftgen.sampling_plan``, by its id, as generate assigns them), each
    one request per answer point with ``turns: all``; duplicate conversations skipped as generate skips them."""
    requests = prompts = 0
    for row in iter_prompts(prompt_path, keep_duplicates=keep_duplicates):
        if isinstance(row, PromptRow):
            points = len(answer_points(row.messages, "all")) if turns == "all" else 1
            requests += len(samples(row.id, arms)) * points
            prompts += 1
            if limit and prompts >= limit:
                break
    return requests, prompts
