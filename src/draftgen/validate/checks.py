"""The per-sample flags: text checks (vectorized with polars), mask checks, and corpus-wide duplicate checks.

Duplicates need the whole corpus, so ``index_corpus`` reads only ``id`` and ``content`` of every shard first
(one shard at a time) and keeps hashes and row positions, then the few repeated rows' texts; ``flag_batch`` then
flags one batch of samples with its masks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from draftgen.client.loops import REPETITION_LOOP
from draftgen.client.records import STOPPED
from draftgen.generate.length_cap import BY_MAX_LENGTH
from draftgen.generate.store import OUTPUT_SCHEMA
from draftgen.training.conversation import generated_calls
from draftgen.training.masks import MaskBatch
from draftgen.training.tools import parsed_arguments, tool_names
from draftgen.training.trainers import SpanTrainer
from draftgen.validate.config import CUT_CONSEQUENCES, FLAGS, LOOP_CONSEQUENCES, ValidateConfig
from draftgen.validate.hashes import HASH_SEED, candidate_ids, place_columns, repeated
from draftgen.validate.reader import GenerationOutput, read_shard
from draftgen.validate.token_rows import SERVER, TokenRows

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
# Characters that mark broken text: NUL, U+FFFD (bytes the detokenizer could not decode), U+FFFE/U+FFFF.
INVALID_CHARS = r"[\x00\x{FFFD}\x{FFFE}\x{FFFF}]"
# Lone UTF-16 surrogates cannot be stored in parquet strings (Arrow requires valid UTF-8: a shard holding one
# fails to read, and is reported as unreadable); what does reach us is the escaped form "\ud83d" left by a
# double JSON encoding. A lone one is a high escape without a low escape right after it, or the reverse.
SURROGATE_ESCAPE = r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}"
SURROGATE_PAIR_ESCAPE = r"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"


@dataclass(frozen=True)
class CorpusIndex:
    duplicate_answers: pl.Series  # UInt64 hashes of answers shared by >= duplicate_answer_min_prompts rows
    duplicate_rows: frozenset[tuple[str, str, int]]  # (folder, shard file name, row) of every repeat of an id
    duplicate_answer_examples: pl.DataFrame  # answer hash, count, the answer text (first 80 chars)


def _answer_key(column: pl.Expr) -> pl.Expr:
    return column.fill_null("").str.strip_chars()


def _shard_hashes(frame: pl.DataFrame, number: int) -> pl.DataFrame:
    """What duplicate detection needs of one shard's rows, in 24 bytes a row: hashes and the row's place."""
    answer = _answer_key(pl.col("content"))
    return frame.select(
        pl.col("id").hash(HASH_SEED).alias("id_hash"),
        pl.when(answer != "").then(answer.hash(HASH_SEED)).alias("answer_hash"),  # null: no answer
        *place_columns(number),
    )


def _answer_previews(shared: pl.DataFrame, shards: Sequence[Path]) -> pl.Series:
    """The first 80 characters of each shared answer, read from the shard holding its first occurrence."""
    previews: dict[int, str] = {}
    for (number,), rows in shared.group_by("shard"):
        content = read_shard(shards[number], ["content"]).select(
            _answer_key(pl.col("content")).str.slice(0, 80)
        )
        texts = content.to_series().gather(rows["row"]).to_list()
        previews.update(zip(rows["answer_hash"].to_list(), texts, strict=True))
    return pl.Series("answer", [previews[h] for h in shared["answer_hash"].to_list()], dtype=pl.String)


def index_corpus(outputs: Sequence[GenerationOutput], min_prompts: int) -> CorpusIndex:
    """Hash every answer and id (reading two columns per shard, every folder) to find corpus-wide duplicates.

    Only hashes and row positions are kept per row (not the ids or answers: a 1M-row corpus costs ~24 MB here,
    not ~400; validate.hashes); the texts are read back for just the rows that turn out repeated."""
    places = [(o, s) for o in outputs for s in o.shards]
    shards = [s for _, s in places]
    corpus = pl.concat(
        [_shard_hashes(read_shard(shard, ["id", "content"]), n) for n, shard in enumerate(shards)]
    )
    candidates = candidate_ids(corpus, shards)
    repeats = candidates.filter(~pl.col("id").is_first_distinct())  # the first occurrence is kept
    duplicate_rows = frozenset(
        (str(places[n][0].directory), shards[n].name, int(row))
        for n, row in repeats.select("shard", "row").iter_rows()
    )
    common = repeated(corpus["answer_hash"], max(min_prompts, 1))
    shared = (
        corpus.filter(pl.col("answer_hash").is_in(common.implode()))
        .group_by("answer_hash", maintain_order=True)  # groups and their rows in corpus order
        .agg(pl.len().alias("count"), pl.col("shard").first(), pl.col("row").first())
        .sort("count", descending=True, maintain_order=True)
    )
    del corpus
    examples = shared.select("answer_hash", "count").with_columns(_answer_previews(shared, shards))
    return CorpusIndex(
        duplicate_answers=examples["answer_hash"],
        duplicate_rows=duplicate_rows,
        duplicate_answer_examples=examples,
    )


def _blank(column: str) -> pl.Expr:
    return pl.col(column).is_null() | (pl.col(column).str.strip_chars() == "")


def _invalid(expr: pl.Expr) -> pl.Expr:
    text = expr.fill_null("")
    lone = text.str.count_matches(SURROGATE_ESCAPE) != 2 * text.str.count_matches(SURROGATE_PAIR_ESCAPE)
    return text.str.contains(INVALID_CHARS) | lone


def _answer_flags(thinking: pl.Expr) -> list[pl.Expr]:
    """Flags of one generated answer (columns content, reasoning_content, finish_reason, tool_calls; ``thinking``:
    whether it was asked to think). An answer that is only tool calls is not empty."""
    content = pl.col("content").fill_null("")
    opens = content.str.count_matches(THINK_OPEN, literal=True)
    closes = content.str.count_matches(THINK_CLOSE, literal=True)
    return [
        (_blank("content") & pl.col("tool_calls").is_null()).alias("empty_answer"),
        (_blank("reasoning_content") & thinking).alias("empty_reasoning"),
        (
            (
                _blank("content") & ~_blank("reasoning_content") & (pl.col("finish_reason") == "length")
            ).fill_null(False)
            | (opens > closes)
        ).alias("unclosed_think"),
        (
            pl.col("finish_reason").is_null() | ~pl.col("finish_reason").is_in([*STOPPED, REPETITION_LOOP])
        ).alias("truncated"),
        (pl.col("finish_reason") == REPETITION_LOOP).fill_null(False).alias("repetition_loop"),
        ((opens + closes) > 0).alias("think_markers_in_answer"),
        (_invalid(pl.col("content")) | _invalid(pl.col("reasoning_content"))).alias("invalid_text"),
    ]


def _per_turn(turn_column: str, column: str) -> pl.Expr:
    """A sample's generated turns' values of ``column``; rows without turn columns hold one turn (the scalar)."""
    single = pl.concat_list(pl.col(column))
    turns = pl.col(turn_column)
    if turn_column == "turn_tool_calls":  # null when no turn called: one null per turn
        turns = turns.fill_null(pl.col("turn_content").list.eval(pl.lit(None, dtype=pl.String)))
    return pl.when(pl.col("turn_after").is_null()).then(single).otherwise(turns).alias(column)


TURN_TEXT = ("turn_content", "turn_reasoning", "turn_finish_reason", "turn_tool_calls")
ANSWER_COLUMNS = ("content", "reasoning_content", "finish_reason", "tool_calls")


def answer_flags(frame: pl.DataFrame, enable_thinking: bool) -> pl.DataFrame:
    """The answer flags of every generated turn, combined per sample: a sample carries a flag when any of its
    turns does (the trainer supervises every answer of a multi-turn conversation). A ``thinking`` column (a
    sampling plan's arms: ``draftgen.sampling_plan``) says per sample whether reasoning is expected;
    without it, ``enable_thinking`` says it for all."""
    columns = ANSWER_COLUMNS
    thinking = pl.col("thinking") if "thinking" in frame.columns else pl.lit(enable_thinking)
    turns = frame.select(
        pl.int_range(pl.len(), dtype=pl.Int64).alias("sample"),
        thinking.fill_null(enable_thinking).alias("thinking"),
        *(_per_turn(t, c) for t, c in zip(TURN_TEXT, columns, strict=True)),
    ).explode(list(columns))
    flags = turns.select("sample", *_answer_flags(pl.col("thinking")))
    return flags.group_by("sample").agg(pl.exclude("sample").any()).sort("sample").drop("sample")


def text_flags(
    frame: pl.DataFrame, config: ValidateConfig, index: CorpusIndex, foreign: np.ndarray | None = None
) -> pl.DataFrame:
    """The flags that need only the text: one boolean column per flag, one row per sample."""
    prompt_invalid = (
        pl.col("messages")
        .list.eval(_invalid(pl.element().struct.field("content").cast(pl.String)))
        .list.any()
        .fill_null(False)
    )
    repeated = pl.Series(
        [
            key in index.duplicate_rows
            for key in zip(frame["folder"], frame["shard"], frame["row"], strict=True)
        ]
        if index.duplicate_rows
        else [False] * frame.height,
        dtype=pl.Boolean,
    )
    absent = [c for c in ("turn_after", *TURN_TEXT) if c not in frame.columns]
    if absent:  # a frame not read by iter_batches: single-turn rows
        frame = frame.with_columns(pl.lit(None, dtype=OUTPUT_SCHEMA[c]).alias(c) for c in absent)
    if (
        "tool_calls" not in frame.columns
    ):  # a row per turn carries its turn's calls here; stored rows per turn
        frame = frame.with_columns(pl.lit(None, dtype=pl.String).alias("tool_calls"))
    answers = answer_flags(frame, config.enable_thinking)
    sample = frame.select(
        (
            ~_blank("content")
            & _answer_key(pl.col("content")).hash(HASH_SEED).is_in(index.duplicate_answers.implode())
        ).alias("duplicate_answer"),
        prompt_invalid.alias("prompt_invalid"),
        pl.lit(repeated).alias("duplicate_id"),
        pl.Series(
            "foreign_assistant_turn", foreign if foreign is not None else np.zeros(frame.height, dtype=bool)
        ),
    )
    return (
        pl.concat([answers, sample, tool_flags(frame)], how="horizontal")
        .with_columns((pl.col("invalid_text") | pl.col("prompt_invalid")).alias("invalid_text"))
        .drop("prompt_invalid")
    )


def tool_flags(frame: pl.DataFrame) -> pl.DataFrame:
    """Per sample, what its generated turns did with tools: ``unknown_tool`` (a call to a function its tools do not
    offer), ``invalid_tool_arguments`` (arguments that are not a JSON object), ``tool_divergence`` (the turn the
    conversation ended at: its calls were not the source's), and the figures the card counts: ``agentic`` (the
    conversation had tools) and ``tool_calls`` (calls in the sample's generated turns)."""
    unknown, invalid, calls_made = [], [], []
    columns = [c for c in ("turn_after", "turn_tool_calls", "tool_calls", "tools") if c in frame.columns]
    for row in frame.select(columns).iter_rows(named=True):
        offered = tool_names(json.loads(row["tools"])) if row.get("tools") else frozenset()
        calls = [c for turn in generated_calls(row, len(row.get("turn_tool_calls") or ())) for c in turn]
        calls_made.append(len(calls))
        unknown.append(any(c["function"]["name"] not in offered for c in calls))
        invalid.append(any(parsed_arguments(c) is None for c in calls))
    diverged = (
        frame["tool_divergence"].is_not_null()
        if "tool_divergence" in frame.columns
        else pl.Series([False] * frame.height)
    )
    agentic = frame["tools"].is_not_null() if "tools" in frame.columns else pl.Series([False] * frame.height)
    return pl.DataFrame(
        {
            "unknown_tool": pl.Series(unknown, dtype=pl.Boolean),
            "invalid_tool_arguments": pl.Series(invalid, dtype=pl.Boolean),
            "tool_divergence": diverged.alias("tool_divergence"),
            "agentic": agentic.alias("agentic"),
            "tool_calls": pl.Series(calls_made, dtype=pl.Int64),
        }
    )


def _token_columns(tokens: TokenRows | None, masks: MaskBatch, frame: pl.DataFrame) -> pl.DataFrame:
    """Where each row's tokens came from and what they cost: the record's token columns."""
    size = frame.height
    if tokens is None:  # rows built from the text alone (a conversation per row, or token_ids: retokenize)
        made = (
            frame["completion_tokens"].fill_null(0).to_numpy()
            if "completion_tokens" in frame
            else np.zeros(size)
        )
        return pl.DataFrame(
            {
                "token_source": ["retokenized"] * size,
                "differs_at": pl.Series([None] * size, dtype=pl.Int64),
                "difference": pl.Series([None] * size, dtype=pl.String),
                "ids_problem": pl.Series([None] * size, dtype=pl.String),
                "generated_tokens": pl.Series(made, dtype=pl.Int64),
                "supervised_generated": pl.Series(np.minimum(made, masks.mask_sum), dtype=pl.Int64),
                "cut_generated": pl.Series(np.zeros(size), dtype=pl.Int64),
                "closing_tokens": pl.Series([None] * size, dtype=pl.Int64),
            }
        )
    return pl.DataFrame(
        {
            "token_source": tokens.source,
            "differs_at": pl.Series(tokens.differs_at, dtype=pl.Int64),
            "difference": pl.Series(tokens.difference, dtype=pl.String),
            "ids_problem": pl.Series(tokens.ids_problem, dtype=pl.String),
            "generated_tokens": pl.Series(tokens.generated, dtype=pl.Int64),
            "supervised_generated": pl.Series(tokens.supervised_generated, dtype=pl.Int64),
            "cut_generated": pl.Series(tokens.cut_generated, dtype=pl.Int64),
            "closing_tokens": pl.Series(tokens.closing, dtype=pl.Int64),
        }
    )


def past_max_length(masks: MaskBatch, generated: np.ndarray, config: ValidateConfig) -> np.ndarray:
    """Per row: its answer lies past the trainer's max_length (a conversation that long, generated without
    generate's cap), so the trainer's window leaves it nothing to train. The trainer's cut, not a defect: the row is
    dropped (kept where ``keep_flagged`` keeps tiny masks) and counted with the cuts at max_length, never as degenerate (tiny_mask stays off; trainer_rejects
    says what the trainer's loader does with it, and counts.py does not call that a defect here)."""
    if config.max_length is None:
        return np.zeros(len(masks.n_tokens), dtype=bool)
    window_empty = (masks.n_tokens > config.max_length) & (masks.mask_sum <= config.min_assistant_tokens)
    return window_empty & (generated > config.min_assistant_tokens)


def _rejected_by_trainer(masks: MaskBatch, config: ValidateConfig) -> np.ndarray:
    rules = config.mask_spec().rules
    if not isinstance(rules, SpanTrainer):
        return masks.mask_sum < 1
    return np.array([not rules.accepts(masks.loss_mask(i).tolist()) for i in range(len(masks))], dtype=bool)


def trains_as_generated(frame: pl.DataFrame, tokens: TokenRows | None, config: ValidateConfig) -> np.ndarray:
    """Per row: a turn cut by max_tokens that trains as generated — its row is the server's prompt + output ids,
    nothing appended (``config.trains_cut_turns``). A re-tokenized row cannot be: its text goes through the chat
    template, which closes the think block and the turn with tokens the model never wrote."""
    if tokens is None or not config.trains_cut_turns or "finish_reason" not in frame.columns:
        return np.zeros(frame.height, dtype=bool)
    cut = (frame["finish_reason"] == "length").fill_null(False).to_numpy()
    return cut & np.array([source == SERVER for source in tokens.source], dtype=bool)


def _last_turn(frame: pl.DataFrame, column: str, turn_column: str) -> pl.Expr:
    """A sample's last turn's value: a per-turn row's own column, else the stored row's turn list's last."""
    if column in frame.columns and turn_column not in frame.columns:
        return pl.col(column)
    if turn_column in frame.columns:
        return pl.col(turn_column).list.last()
    return pl.lit(None)


def cut_at_max_length(frame: pl.DataFrame, max_length: int | None) -> np.ndarray:
    """Per row: its (last) turn was cut where the trainer's max_length set its budget — an expected cut, never
    judged against the run (generate.length_cap). Rows from shards that did not record the budget's cause count so
    when their prompt and completion together reached max_length."""
    if "finish_reason" not in frame.columns or max_length is None:
        return np.zeros(frame.height, dtype=bool)
    by = _last_turn(frame, "budget_by", "turn_budget_by")
    reached = (
        _last_turn(frame, "prompt_tokens", "turn_prompt_tokens")
        + _last_turn(frame, "completion_tokens", "turn_completion_tokens")
    ) >= max_length
    capped = pl.when(by.is_null()).then(reached).otherwise(by == BY_MAX_LENGTH)
    cut = frame.select(((pl.col("finish_reason") == "length") & capped).fill_null(False)).to_series()
    return cut.to_numpy().astype(bool)


def _drops(flag: str, config: ValidateConfig) -> pl.Expr:
    """Whether ``flag`` drops a row: any defect does, except what a cut by max_tokens explains in a turn that trains
    as generated (``cut_trained``), and, with train_loops, what a loop explains in a turn it ended."""
    spared = pl.lit(False)
    if flag in CUT_CONSEQUENCES:
        spared = spared | pl.col("cut_trained")
    if flag in LOOP_CONSEQUENCES and config.train_loops:
        spared = spared | pl.col("repetition_loop")
    return pl.col(flag) & ~spared


def flag_batch(
    frame: pl.DataFrame,
    masks: MaskBatch,
    config: ValidateConfig,
    index: CorpusIndex,
    foreign: np.ndarray | None = None,
    tokens: TokenRows | None = None,
) -> pl.DataFrame:
    """All flags for one batch, plus the mask figures: the per-sample record the report is built from.
    ``foreign``: per sample, whether its conversation holds assistant text the target did not write; ``tokens``:
    the rows' tokens as exported (server ids or re-tokenized; None: re-tokenized, ``masks`` are the export's)."""
    token_columns = _token_columns(tokens, masks, frame)
    past = past_max_length(masks, token_columns["generated_tokens"].fill_null(0).to_numpy(), config)
    flags = text_flags(frame, config, index, foreign).with_columns(
        pl.Series("tiny_mask", (masks.mask_sum <= config.min_assistant_tokens) & ~past),
        pl.Series("over_max_length", masks.n_tokens > (config.max_length or np.iinfo(np.int64).max)),
        pl.Series("template_mismatch", np.array([m is not None for m in masks.mismatch], dtype=bool)),
        pl.Series(
            "retokenized_differs",
            np.array([d is not None for d in tokens.differs_at], dtype=bool)
            if tokens is not None
            else np.zeros(frame.height, dtype=bool),
        ),
        pl.Series(
            "ids_missing", tokens.ids_missing if tokens is not None else np.zeros(frame.height, dtype=bool)
        ),
        pl.Series(
            "ids_unusable",
            np.array([p is not None for p in tokens.ids_problem], dtype=bool)
            if tokens is not None
            else np.zeros(frame.height, dtype=bool),
        ),
        pl.Series("trainer_rejects", _rejected_by_trainer(masks, config)),
    )
    figures = flags.select("agentic", "tool_calls")  # the card's agentic counts
    flags = flags.select(list(FLAGS))
    drop = [f for f in FLAGS if f in config.drop_flags]
    cut = trains_as_generated(frame, tokens, config)
    where = [
        c
        for c in ("id", "prompt_id", "turn", "folder", "shard", "row", "finish_reason", "arm")
        if c in frame.columns
    ]
    records = pl.concat(
        [
            frame.select(where),
            pl.DataFrame(
                {
                    "n_tokens": masks.n_tokens,
                    "n_prompt_tokens": masks.n_prompt,
                    "mask_sum": masks.mask_sum,
                    "mismatch": pl.Series(masks.mismatch, dtype=pl.String),
                }
            ),
            token_columns,
            flags,
            figures,
            frame.select(
                pl.col("content").fill_null("").str.len_chars().alias("answer_chars"),
                pl.col("reasoning_content").fill_null("").str.len_chars().alias("reasoning_chars"),
                pl.col("content").str.slice(0, 80).alias("answer"),
                pl.col("reasoning_content").str.slice(0, 80).alias("reasoning"),
            ),
        ],
        how="horizontal",
    ).with_columns(
        pl.concat_list([pl.when(pl.col(f)).then(pl.lit(f)) for f in FLAGS]).list.drop_nulls().alias("flags"),
        pl.Series("cut_trained", cut),
        pl.Series("cut_at_max_length", cut_at_max_length(frame, config.max_length) | past),
        pl.Series("past_max_length", past),
    )
    dropped = pl.any_horizontal([_drops(f, config) for f in drop] or [pl.lit(False)])
    # a row past the window trains as little as a tiny mask: kept only where those are
    if "tiny_mask" in drop:
        dropped = dropped | pl.col("past_max_length")
    # cut_trained: exported as a cut turn (one with a defect is dropped, like any row)
    return records.with_columns(dropped.alias("dropped")).with_columns(
        pl.col("cut_trained") & ~pl.col("dropped")
    )
