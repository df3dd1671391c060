"""The dataset card written with every export: ``README.md`` for people, ``dataset_info.json`` for programs.

A training export outlives the run that made it: whoever trains on it next week needs to know which model wrote
it, with which engine and sampling, what was dropped and why, whose loss mask it carries, whether its tokens are
the target's own or re-tokenized, and how much of what the GPUs generated it supervises. The README's YAML header
names the files as configurations, so ``datasets.load_dataset(EXPORT_DIR, "prompts")`` (or "conversations") loads
them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from draftgen.draft_positions import COLUMN as DRAFTS_HISTOGRAM
from draftgen.draft_positions import from_histograms, from_rows
from draftgen.generate.cache_share import cache_tables, share
from draftgen.generate.gpu_time import gpu_seconds, per_million
from draftgen.generate.store import scan_shards
from draftgen.rundir import write_json, write_text
from draftgen.rundir.layout import EXPORT_CARD as CARD_FILE
from draftgen.rundir.layout import (
    EXPORT_CONVERSATIONS,
    EXPORT_HOLDOUT,
    EXPORT_PROMPTS,
    EXPORT_TOKENS,
    shard_paths,
)
from draftgen.rundir.layout import EXPORT_INFO as INFO_FILE
from draftgen.training.trainers import SpanTrainer
from draftgen.validate.coverage import set_aside_counts

FORMAT = "draftgen.export/1"
SAMPLING_KEYS = ("model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "enable_thinking", "turns")


def _engines(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each distinct server of every session (url, engine, version, where its token ids came from)."""
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for manifest in manifests:
        for session in manifest.get("sessions", []):
            for server in session.get("servers", []) or []:
                key = (
                    server.get("url"),
                    server.get("engine"),
                    server.get("version"),
                    server.get("token_ids"),
                )
                seen.setdefault(key, dict(server))
    return list(seen.values())


def engine_line(engines: list[dict[str, Any]]) -> str:
    """ "7 servers: sglang 0.5.23 (sglext)" — each engine, version and token-id source once, with its count."""
    groups: dict[str, int] = {}
    for server in engines:
        name = f"{server.get('engine')} {server.get('version') or ''}".strip()
        label = f"{name} ({server.get('token_ids') or 'no token ids'})"
        groups[label] = groups.get(label, 0) + 1
    total = sum(groups.values())
    if not total:
        return "not recorded"
    kinds = (
        next(iter(groups)) if len(groups) == 1 else ", ".join(f"{n} × {label}" for label, n in groups.items())
    )
    return f"{total} server{'s' if total > 1 else ''}: {kinds}"


def file_contents(config: Any, counts: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Which rows each training file holds: every exported row in the files of ids, cut turns left out of
    train.jsonl (its chat template would close them with tokens the model never wrote)."""
    cut = counts["cut_turns"]
    every = {
        "rows": counts["out"],
        "trained_tokens": counts["yield"]["trained_tokens"],
        "cut_turns": cut["trained"],
    }
    contents: dict[str, dict[str, Any]] = {}
    if config.export_prompts:
        contents[EXPORT_PROMPTS] = dict(every)
    if config.export_tokens:
        contents[f"{EXPORT_TOKENS}/*.parquet"] = dict(every)
    if config.export_jsonl:
        contents[EXPORT_CONVERSATIONS] = {
            "rows": counts["conversation_rows"],
            "trained_tokens": every["trained_tokens"] - cut["trained_tokens"],
            "cut_turns": 0,
        }
    return contents


def per_arm(result: Any) -> list[dict[str, Any]]:
    """Rows, exported rows, generated and trained tokens and yield per sampling-plan arm ([] without a plan)."""
    records = result.scan()
    columns = records.collect_schema().names()
    if "arm" not in columns:
        return []
    held = pl.col("held_out") if "held_out" in columns else pl.lit(False)
    kept = ~pl.col("dropped") & ~held
    table = (
        records.filter(pl.col("arm").is_not_null())
        .group_by("arm")
        .agg(
            pl.len().alias("rows"),
            kept.sum().alias("exported"),
            pl.col("generated_tokens").sum().alias("generated_tokens"),
            pl.col("supervised_generated").filter(kept).sum().alias("trained_tokens"),
        )
        .sort("arm")
        .collect()
    )
    return [
        {**row, "yield": row["trained_tokens"] / row["generated_tokens"] if row["generated_tokens"] else None}
        for row in table.iter_rows(named=True)
    ]


def agentic_counts(result: Any) -> dict[str, int]:
    """Rows of conversations with tools (and how many were exported), the target's tool calls in them, and the
    divergences: turns where the target's calls were not the source's, so the conversation ended there."""
    records = result.scan()
    columns = records.collect_schema().names()
    if "agentic" not in columns:
        return {"rows": 0, "exported": 0, "tool_calls": 0, "divergences": 0, "divergences_exported": 0}
    held = pl.col("held_out") if "held_out" in columns else pl.lit(False)
    kept = ~pl.col("dropped") & ~held
    totals = (
        records.select(
            pl.col("agentic").sum().alias("rows"),
            (pl.col("agentic") & kept).sum().alias("exported"),
            pl.col("tool_calls").sum().alias("tool_calls"),
            pl.col("tool_divergence").sum().alias("divergences"),
            (pl.col("tool_divergence") & kept).sum().alias("divergences_exported"),
        )
        .collect()
        .row(0, named=True)
    )
    return {name: int(value or 0) for name, value in totals.items()}


def _gpu_hour_usd(manifests: list[dict[str, Any]]) -> float | None:
    """The GPU-hour price of the estimate a generation run was compared with (None: no estimate, no price)."""
    for manifest in manifests:
        path = (manifest.get("parameters") or {}).get("estimate")
        if path:
            try:
                price = json.loads(Path(path).read_text()).get("gpu_hour_usd")
            except (OSError, ValueError):
                continue
            if isinstance(price, (int, float)):
                return float(price)
    return None


def generation_cost(manifests: list[dict[str, Any]], trained: int) -> dict[str, Any]:
    """GPU-seconds the generation held its servers (on the hardware's clock), and per million trained tokens (and
    dollars, at the price of the estimate the run was compared with)."""
    sessions = [s for m in manifests for s in m.get("sessions", [])]
    gpu_s = gpu_seconds(sessions)
    price = _gpu_hour_usd(manifests)
    clock = (manifests[0].get("clock") or {}) if manifests else {}
    hardware, factor = clock.get("hardware"), clock.get("factor") or 1.0
    return {
        "gpu_seconds": gpu_s,
        "trained_tokens": trained,
        **per_million(gpu_s, trained, price),
        "gpu_hour_usd": price,
        "clock": f"simulated {hardware} clock, sim ×{factor:g}, as the simulator kept it"
        if hardware
        else "wall clock",
    }


def prefix_cache(folders: Sequence[Path]) -> dict[str, Any]:
    """The share of prompt tokens the servers' prefix caches served while the data was generated: overall, per
    server and per turn index, over the turns whose server reported it (``draftgen.generate.cache_share``)."""
    scans = [scan_shards(paths) for folder in folders if (paths := shard_paths(folder))]
    if not scans:
        return {"share": None, "by_server": [], "by_turn": []}
    tables = cache_tables(pl.concat(scans, how="vertical_relaxed"))
    by_turn = tables["turn"]
    return {
        "share": share(int(by_turn["cached_tokens"].sum()), int(by_turn["prompt_tokens"].sum())),
        "by_server": tables["server"].to_dicts(),
        "by_turn": by_turn.to_dicts(),
    }


def draft_positions(folders: Sequence[Path]) -> dict[str, Any]:
    """Acceptance per draft position while the data was generated: every stored turn's drafts histogram (SGLang's
    spec_correct_drafts_histogram) summed (``draftgen.draft_positions``); no turns where the servers sent none."""
    scans = [
        scan_shards(paths).select(DRAFTS_HISTOGRAM) for folder in folders if (paths := shard_paths(folder))
    ]
    if not scans:
        return from_histograms([]).as_dict()
    return from_rows(pl.concat(scans)).as_dict()


def _positions_line(positions: dict[str, Any]) -> str:
    shares = positions.get("share_by_position") or []
    if not shares:
        return (
            "not reported (servers that send no drafts histogram: SGLang 0.5.23 with speculation sends one)"
        )
    listed = ", ".join(f"{k} {share:.1%}" for k, share in enumerate(shares, start=1))
    return f"{listed} of {positions['verify_steps']:,} verify steps (the share whose k-th draft was accepted)"


def _cache_line(cache: dict[str, Any]) -> str:
    if cache.get("share") is None:
        return "not reported (servers without SGLang's --enable-cache-report)"
    turns = ", ".join(f"turn {t['turn']} {t['cached_share']:.1%}" for t in cache["by_turn"])
    return f"{cache['share']:.1%} of prompt tokens ({turns}; per server in `{INFO_FILE}`)"


def _cost_line(cost: dict[str, Any]) -> str:
    per_m = cost.get("gpu_s_per_m_trained")
    if per_m is None:
        return "not recorded"
    usd = cost.get("usd_per_m_trained")
    dollars = f" (${usd:,.2f} at ${cost['gpu_hour_usd']:g} per GPU-hour)" if usd is not None else ""
    return f"**{per_m:,.0f}**{dollars}; {cost['gpu_seconds'] / 3600:,.2f} GPU-hours in all ({cost['clock']})"


def dataset_info(result: Any) -> dict[str, Any]:
    """Everything the card says, as one JSON-able mapping (``result``: a validate ``ValidationResult``)."""
    config = result.config
    manifests = [m for m in result.output.manifests if m]
    parameters = manifests[0].get("parameters", {}) if manifests else {}
    rules = config.mask_spec().rules
    counts = result.counts
    files: dict[str, str] = {}
    if config.export_jsonl:
        files["conversations"] = EXPORT_CONVERSATIONS
    if config.export_prompts:
        files["prompts"] = EXPORT_PROMPTS
    if config.export_tokens:
        files["tokens"] = f"{EXPORT_TOKENS}/*.parquet"
    if counts["held_out"]["prompts"]:
        files["holdout"] = f"{EXPORT_HOLDOUT}/{EXPORT_PROMPTS}"
    trainer: dict[str, Any] = {
        "name": config.trainer.value,
        "max_length": config.max_length,
        "rows": config.rows,
        "last_turn_only": config.rows == "per_turn",
    }
    if isinstance(rules, SpanTrainer):
        trainer.update(
            assistant_header=rules.assistant_header,
            end_of_turn=rules.end_of_turn,
            min_loss_tokens=rules.min_loss_tokens,
            needs_consecutive=rules.needs_consecutive,
        )
    return {
        "format": FORMAT,
        "target_model": parameters.get("model"),
        "engines": _engines(manifests),
        "sampling": {k: parameters[k] for k in SAMPLING_KEYS if k in parameters},
        "sampling_plan": parameters.get("sampling_plan") or [],
        "arms": per_arm(result),
        "generation": [
            {"folder": str(folder), "fingerprint": (m or {}).get("fingerprint")}
            for folder, m in zip(result.output.directories, result.output.manifests, strict=True)
        ],
        "counts": {
            "samples": counts["in"],
            "exported": counts["out"],
            "cut_turns": counts["cut_turns"],
            "cut_by_max_tokens": counts["length_limited"],
            "cut_at_max_length": counts.get("cut_at_max_length") or {"rows": 0, "trained": 0},
            "dropped": counts["dropped"],
            "dropped_by_flag": counts["dropped_by_flag"],
            "flagged_but_kept": counts["flagged_but_kept"],
            "held_out": counts["held_out"],
        },
        "holdout": {
            "share": config.holdout_share,
            "rule": "blake2b keyed 'draftgen-holdout' of the prompt id, as a fraction of 2**64, below the share",
            "file": files.get("holdout"),
        },
        "trainer": trainer,
        # generate's turns with too little room under the trainer's max_length, never sent (docs/generate.md)
        "set_aside": {
            "min_turn_budget": parameters.get("min_turn_budget"),
            "by": set_aside_counts(result.output),
        },
        "agentic": agentic_counts(result),
        "token_source": counts["token_source"],
        "yield": counts["yield"],
        "cost": generation_cost(manifests, counts["yield"]["trained_tokens"]),
        "prefix_cache": prefix_cache(result.output.directories),
        "draft_positions": draft_positions(result.output.directories),
        "files": files,
        "contents": file_contents(config, counts),
    }


def _yaml_header(files: dict[str, str]) -> str:
    lines = ["---", "configs:"]
    default = "prompts" if "prompts" in files else next(iter(files), None)
    for name, path in files.items():
        if name in ("tokens", "holdout"):
            continue
        lines += [f"- config_name: {name}", f"  data_files: {path}"]
        if name == default:
            lines.append("  default: true")
    lines.append("---")
    return "\n".join(lines)


def _contents_table(info: dict[str, Any]) -> str:
    """Which rows each training file holds, with counts."""
    lines = ["| file | rows | trained tokens | cut turns |", "|---|---|---|---|"]
    for path, held in info["contents"].items():
        lines.append(f"| `{path}` | {held['rows']:,} | {held['trained_tokens']:,} | {held['cut_turns']:,} |")
    cut = info["counts"]["cut_turns"]
    if not cut["trained"]:
        return "\n".join(lines)
    closing = ""
    if cut["closing_measured"]:
        mean = cut["closing_tokens"] / cut["closing_measured"]
        closing = (
            f" (rendered so, {cut['closing_measured']:,} of them would carry {cut['closing_tokens']:,} such tokens, "
            f"{mean:.1f} a turn)"
        )
    at_length = info["counts"].get("cut_at_max_length") or {"trained": 0}
    expected, by_tokens = at_length["trained"], cut["trained"] - at_length["trained"]
    room = "where the trainer's max_length left less room than max_tokens (expected: a long conversation's later turns)"
    if not expected:
        cause = "cut by max_tokens"
    elif not by_tokens:
        cause = f"cut {room}"
    else:
        cause = f"cut at their limit, {expected:,} {room} and {by_tokens:,} by max_tokens,"
    note = (
        f"\n\n{cut['trained']:,} turns were {cause} and train **as generated**: the server's prompt and "
        "output ids, nothing appended, the mask over exactly the generated tokens. The files of ids carry them; "
        "`train.jsonl` leaves them out, because a trainer renders its conversations through the chat template, "
        "which would end each cut turn with tokens the model never wrote: `\\n</think>\\n\\n<|im_end|>\\n` after a "
        f"cut inside the reasoning, `<|im_end|>\\n` after one inside the answer{closing}."
    )
    return "\n".join(lines) + note


def _arms_section(info: dict[str, Any]) -> str:
    """The sampling plan and its rows, tokens and yield per arm (nothing without a plan)."""
    if not info.get("arms"):
        return ""
    plan = {a["name"]: a for a in info.get("sampling_plan") or []}
    lines = []
    for row in info["arms"]:
        arm = plan.get(row["arm"], {})
        sampling = ", ".join(f"{k} {v}" for k, v in arm.items() if k != "name" and v is not None)
        share = "n/a" if row["yield"] is None else f"{row['yield']:.1%}"
        lines.append(
            f"| {row['arm']} | {sampling} | {row['rows']:,} | {row['exported']:,} | {row['generated_tokens']:,} | "
            f"{row['trained_tokens']:,} | {share} |"
        )
    return (
        "## The sampling plan, per arm\n\n"
        "Each arm's samples are rows of their own (id `{prompt id}#s{k}`, `arm` in train.jsonl).\n\n"
        "| arm | sampling | rows | exported | generated tokens | trained tokens | yield |\n"
        "|---|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n\n"
    )


def render_readme(info: dict[str, Any]) -> str:
    trainer, source, made = info["trainer"], info["token_source"], info["yield"]
    share = f"{made['share']:.1%}" if made.get("share") is not None else "n/a"
    buckets = (
        "\n".join(f"| {bucket} | {n:,} |" for bucket, n in made.get("buckets", {}).items())
        or "| (nothing generated) | 0 |"
    )
    dropped = (
        "\n".join(f"| {flag} | {n:,} |" for flag, n in info["counts"]["dropped_by_flag"].items() if n)
        or "| (none) | 0 |"
    )
    rows_note = (
        "one row per generated turn: the history as the target saw it when it wrote that turn, that turn "
        "supervised (SpecForge: `data.train_only_last_turn: true` for train.jsonl; prompts.jsonl carries its masks)"
        if trainer["last_turn_only"]
        else "one row per conversation: every assistant turn as the chat template renders it"
    )
    tokens = (
        f"{source['server']:,} rows from the target's own token ids (as its server returned them), "
        f"{source['retokenized']:,} re-tokenized from the text"
    )
    if source.get("retokenized_differs_rate") is not None:
        tokens += (
            f"; re-tokenizing would have changed {source['retokenized_differs']:,} of the server-id rows "
            f"({source['retokenized_differs_rate']:.1%})"
        )
    sampling = ", ".join(f"{k} {v}" for k, v in info["sampling"].items() if k != "model")
    arms = _arms_section(info)
    agentic = info.get("agentic") or {}
    tools_row = (
        f"| agentic rows (conversations with tools) | {agentic['rows']:,} rows ({agentic['exported']:,} exported), "
        f"{agentic['tool_calls']:,} tool calls by the target; {agentic['divergences']:,} turns where the target's "
        f"calls were not the source's ended their conversation (`tool_divergence`, {agentic['divergences_exported']:,} "
        "exported) |\n"
        if agentic.get("rows")
        else ""
    )
    aside = (info.get("set_aside") or {}).get("by") or {}
    aside_row = ""
    if any(n for counts in aside.values() for n in counts.values()):
        floor = (info.get("set_aside") or {}).get("min_turn_budget")
        parts = [
            f"{counts['turns']:,} later turns and {counts['prompts']:,} whole prompts "
            + ("with no room" if why == "max_length" else f"below min_turn_budget {floor}")
            for why, counts in aside.items()
            if counts["turns"] or counts["prompts"]
        ]
        aside_row = (
            "| set aside by generate (too little room under the trainer's max_length: never sent, so nothing to "
            f"train) | {'; '.join(parts)} |\n"
        )
    prompts_path = info["files"].get("prompts")
    training = (
        f"SpecForge: `data.prompts_path: {prompts_path}`, `data.max_length: {trainer['max_length']}` "
        "(the rows are already cut there; the loader keeps every one)"
        if prompts_path
        else "SpecForge: `data.train_data_path: train.jsonl`"
    )
    return f"""{_yaml_header(info["files"])}
# Drafter training data regenerated with {info["target_model"] or "the target model"}

Written by draftgen validate ({info["format"]}). Target model: **{info["target_model"]}**, served by {engine_line(info["engines"])}.
Sampling: {sampling or "not recorded"}.

| | |
|---|---|
| samples checked | {info["counts"]["samples"]:,} |
| exported | {info["counts"]["exported"]:,} |
| dropped | {info["counts"]["dropped"]:,} |
| held out (never trained on; for the drafter verdict) | {info["counts"]["held_out"]["prompts"]:,} prompts, {info["counts"]["held_out"]["rows"]:,} rows |
| trainer (loss mask) | {trainer["name"]}, max_length {trainer["max_length"]} |
| rows | {rows_note} |
| tokens | {tokens} |
{tools_row}{aside_row}| **trained tokens**: generated tokens an exported row supervises | **{made.get("trained_tokens", 0):,}** of {made.get("generated_tokens", 0):,} generated (**{share}**) |
| GPU-seconds per million trained tokens | {_cost_line(info.get("cost") or {})} |
| prompt tokens served from the servers' prefix caches | {_cache_line(info.get("prefix_cache") or {})} |
| acceptance per draft position while generating | {_positions_line(info.get("draft_positions") or {})} |

Train with {training}.

{arms}## Which file holds which rows

{_contents_table(info)}

## Where every generated token went

Each token the target generated is in exactly one bucket; they sum to {made.get("generated_tokens", 0):,}.

| bucket | tokens |
|---|---|
{buckets}

## Dropped, by flag

| flag | rows |
|---|---|
{dropped}

Files: {", ".join(f"`{path}` ({name})" for name, path in info["files"].items())}. Machine-readable: `{INFO_FILE}`.
"""


def write_card(folder: Path, result: Any) -> dict[str, Any]:
    """Write README.md and dataset_info.json into ``folder`` (the staged export); returns the info."""
    info = dataset_info(result)
    write_json(Path(folder) / INFO_FILE, info, indent=2, end="\n")
    write_text(Path(folder) / CARD_FILE, render_readme(info))
    return info
