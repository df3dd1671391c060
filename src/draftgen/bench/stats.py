"""Raw benchmark records → one row per request and one row per server × level, each number with its source.

Tokens per request, in order of preference:
  ``usage``     the server's own count (usage.completion_tokens);
  ``sglext``    spec_accept_length × spec_verify_ct from the same response (exact, SGLang 0.5.23+);
  ``metrics``   the level's /metrics generation-token difference, shared out by each answer's text length;
  ``chunks``    the number of streamed text chunks (a lower bound: a chunk carries one decode step, which is
                several tokens with speculative decoding).
Acceptance length per level, in order of preference:
  ``sglext``    Σ tokens / Σ spec_verify_ct over the level's requests (per request: spec_accept_length);
  ``metrics``   counter differences around the level (SGLang tokens / verify calls; vLLM 1 + accepted / drafts);
  ``no speculation``  1.0 when /server_info says speculative decoding is off;
  otherwise missing, with the reason. The cumulative /server_info value is kept beside it for reference only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from draftgen.bench.records import LevelRun, RequestRecord, ServerFacts
from draftgen.client.metrics import acceptance_length, generated_tokens

PERCENTILES = (50, 90, 99)

TOKENS_USAGE = "usage"
TOKENS_SGLEXT = "sglext"
TOKENS_METRICS = "metrics"
TOKENS_CHUNKS = "chunks"


@dataclass(frozen=True)
class RequestTokens:
    tokens: float | None
    source: str


def resolve_request_tokens(level: LevelRun) -> list[RequestTokens]:
    """Completion tokens of each request of the level (failed requests: None), with the source used."""
    generated = generated_tokens(level.metrics_window) if level.metrics_window is not None else None
    ok = [r for r in level.requests if r.ok]
    unknown = [r for r in ok if not _direct_tokens(r)]
    chars_unknown = sum(r.reasoning_chars + r.content_chars for r in unknown)
    # The counter difference covers every request of the level; what the direct counts explain is subtracted.
    known = sum(_direct_tokens(r)[0] for r in ok if _direct_tokens(r))  # type: ignore[index]
    left_for_unknown = None if generated is None else max(0.0, generated[0] - known)
    out = []
    for record in level.requests:
        if not record.ok:
            out.append(RequestTokens(None, "failed"))
            continue
        direct = _direct_tokens(record)
        if direct:
            out.append(RequestTokens(direct[0], direct[1]))
        elif left_for_unknown is not None and chars_unknown > 0:
            share = (record.reasoning_chars + record.content_chars) / chars_unknown
            out.append(RequestTokens(left_for_unknown * share, TOKENS_METRICS))
        else:
            out.append(RequestTokens(float(len(record.chunk_offsets)), TOKENS_CHUNKS))
    return out


def _direct_tokens(record: RequestRecord) -> tuple[float, str] | None:
    if record.usage_reported and record.completion_tokens is not None:
        return float(record.completion_tokens), TOKENS_USAGE
    if record.spec_accept_length is not None and record.spec_verify_ct:
        return round(record.spec_accept_length * record.spec_verify_ct), TOKENS_SGLEXT
    return None


def _summary(prefix: str, values: Sequence[float]) -> dict[str, float | None]:
    array = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    if array.size == 0:
        return {f"{prefix}_mean": None, **{f"{prefix}_p{p}": None for p in PERCENTILES}}
    row: dict[str, float | None] = {f"{prefix}_mean": float(array.mean())}
    for p in PERCENTILES:
        row[f"{prefix}_p{p}"] = float(np.percentile(array, p))
    return row


def _source_of(sources: Sequence[str]) -> str:
    distinct = sorted(set(sources))
    return distinct[0] if len(distinct) == 1 else "mixed: " + ", ".join(distinct)


def level_acceptance(
    level: LevelRun, tokens: Sequence[RequestTokens], facts: ServerFacts
) -> tuple[float | None, str]:
    """The level's acceptance length and where it came from (never the cumulative /server_info value)."""
    pairs = [
        (t.tokens, r.spec_verify_ct)
        for r, t in zip(level.requests, tokens, strict=True)
        if r.ok and r.spec_verify_ct and t.tokens is not None
    ]
    if pairs:
        return sum(t for t, _ in pairs) / sum(v for _, v in pairs), TOKENS_SGLEXT
    if level.metrics_window is not None:
        found = acceptance_length(level.metrics_window)
        if found is not None:
            return found[0], f"metrics ({found[1]})"
    if facts.speculation is False:
        return 1.0, "no speculation (/server_info: speculative_algorithm is null)"
    reasons = []
    if not facts.sglext:
        reasons.append("no sglext in responses")
    if level.metrics_window is None:
        reasons.append(level.metrics_note or "no /metrics")
    else:
        reasons.append("/metrics has no verify-call or draft counters")
    return None, "missing: " + "; ".join(reasons)


def request_rows(level: LevelRun, facts: ServerFacts, max_tokens: int) -> list[dict]:
    """One dict per request: what was measured and, for tokens, where the number came from."""
    tokens = resolve_request_tokens(level)
    rows = []
    for record, counted in zip(level.requests, tokens, strict=True):
        offsets = list(record.chunk_offsets)
        gaps = np.diff(offsets) if len(offsets) > 1 else np.asarray([])
        n = counted.tokens
        tpot = None
        if record.ok and record.ttft_s is not None and n is not None and n > 1:
            tpot = (record.e2e_s - record.ttft_s) / (n - 1)
        accept = record.spec_accept_length
        if accept is None and record.spec_verify_ct and n:
            accept = n / record.spec_verify_ct
        rows.append(
            {
                "server": record.server,
                "gpu": record.gpu,
                "concurrency": record.concurrency,
                "seq": record.seq,
                "prompt_id": record.prompt_id,
                "category": record.category,
                "arm": record.arm,
                "response_id": record.response_id,
                "ok": record.ok,
                "error": record.error,
                "started_at": record.started_at,
                "finished_at": record.started_at + record.e2e_s,
                "ttft_s": record.ttft_s,
                "e2e_s": record.e2e_s,
                "tpot_s": tpot,
                "itl_s_p50": float(np.median(gaps)) if gaps.size else None,
                "chunks": len(offsets),
                "chunk_offsets": offsets,
                "prompt_tokens": record.prompt_tokens,
                "completion_tokens": n,
                "completion_tokens_source": counted.source,
                "usage_reported": record.usage_reported,
                "finish_reason": record.finish_reason,
                "truncated": record.ok and _truncated(record.finish_reason, n, max_tokens),
                "empty_answer": record.ok and record.finish_reason == "stop" and record.content_blank,
                "reasoning_chars": record.reasoning_chars,
                "content_chars": record.content_chars,
                "spec_accept_length": accept,
                "spec_verify_ct": record.spec_verify_ct,
                "done_sentinel": record.done_sentinel,
                "answer_point": record.answer_point,
                "diverged": record.diverged,
                "source_called": record.source_called,
            }
        )
    return rows


def _truncated(finish_reason: str | None, tokens: float | None, max_tokens: int) -> bool:
    if finish_reason is not None:
        return finish_reason == "length"
    return tokens is not None and tokens >= max_tokens


def missing_parts(level: LevelRun, facts: ServerFacts, tokens_source: str, accept_source: str) -> list[str]:
    """Plain-language list of what this server did not send, for the report."""
    missing = []
    ok = [r for r in level.requests if r.ok]
    if ok and not all(r.usage_reported for r in ok):
        missing.append(f"usage (tokens counted from {tokens_source})")
    if ok and any(r.done_sentinel is False for r in ok):
        missing.append("the [DONE] line ending each stream (tolerated)")
    if accept_source.startswith("missing"):
        missing.append("acceptance data (" + accept_source.removeprefix("missing: ") + ")")
    elif not accept_source.startswith(TOKENS_SGLEXT) and facts.speculation is not False:
        missing.append(f"per-request acceptance (sglext); acceptance per level from {accept_source}")
    if level.metrics_window is None:
        missing.append(level.metrics_note or "the /metrics window")
    return missing


def level_row(level: LevelRun, facts: ServerFacts, requests: Sequence[dict], max_tokens: int) -> dict:
    """One server × concurrency level: throughput, latency percentiles, acceptance, length and quality rates."""
    tokens = resolve_request_tokens(level)
    ok_rows = [r for r in requests if r["ok"]]
    starts = [r["started_at"] for r in requests]
    ends = [r["finished_at"] for r in requests]
    window = (max(ends) - min(starts)) if requests else 0.0
    ok_tokens = [t for r, t in zip(level.requests, tokens, strict=True) if r.ok]
    generated = generated_tokens(level.metrics_window) if level.metrics_window is not None else None
    if ok_tokens and all(t.source == TOKENS_USAGE for t in ok_tokens):
        output_tokens, tokens_source = sum(t.tokens or 0.0 for t in ok_tokens), TOKENS_USAGE
    elif generated is not None:
        output_tokens, tokens_source = generated[0], f"{TOKENS_METRICS} ({generated[1]} difference)"
    else:
        output_tokens = sum(t.tokens or 0.0 for t in ok_tokens)
        tokens_source = _source_of([t.source for t in ok_tokens]) if ok_tokens else "none"
    accept, accept_source = level_acceptance(level, tokens, facts)
    metrics_accept = acceptance_length(level.metrics_window) if level.metrics_window is not None else None
    gaps = [g for r in ok_rows for g in np.diff(r["chunk_offsets"]).tolist()]
    per_request_accept = [r["spec_accept_length"] for r in ok_rows if r["spec_accept_length"] is not None]
    lengths = [r["completion_tokens"] for r in ok_rows if r["completion_tokens"] is not None]
    lag = np.asarray(level.client_lag_ms or [0.0])
    row: dict = {
        "server": level.server,
        "gpu": level.gpu,
        "concurrency": level.concurrency,
        "requests": len(requests),
        "ok": len(ok_rows),
        "failed": len(requests) - len(ok_rows),
        "rounds": len(requests) / level.concurrency,
        "window_s": window,
        "output_tokens": output_tokens,
        "output_tokens_source": tokens_source,
        "output_tok_s": output_tokens / window if window > 0 else None,
        "requests_per_s": len(ok_rows) / window if window > 0 else None,
        **_summary("ttft_s", [r["ttft_s"] for r in ok_rows]),
        **_summary("itl_s", gaps),
        **_summary("tpot_s", [r["tpot_s"] for r in ok_rows]),
        **_summary("e2e_s", [r["e2e_s"] for r in ok_rows]),
        "accept_length": accept,
        "accept_length_source": accept_source,
        "accept_length_request_p50": float(np.median(per_request_accept)) if per_request_accept else None,
        "metrics_generation_tokens": generated[0] if generated else None,
        "metrics_accept_length": metrics_accept[0] if metrics_accept else None,
        "server_info_cumulative_accept_length": level.cumulative_accept_length,
        "mean_completion_tokens": float(np.mean(lengths)) if lengths else None,
        "truncated_rate": float(np.mean([r["truncated"] for r in ok_rows])) if ok_rows else None,
        "empty_answer_rate": float(np.mean([r["empty_answer"] for r in ok_rows])) if ok_rows else None,
        "usage_reported_rate": float(np.mean([r["usage_reported"] for r in ok_rows])) if ok_rows else None,
        "max_running_requests": facts.max_running_requests,
        "client_lag_ms_p99": float(np.percentile(lag, 99)),
        "client_lag_ms_max": float(lag.max()),
        "started_at": level.started_at,
        "finished_at": level.finished_at,
        "reused": level.reused,
        "clock_kept": level.clock_kept,  # draftgen sim: share of its clock kept (None elsewhere)
    }
    row["missing"] = "; ".join(missing_parts(level, facts, tokens_source, accept_source)) or ""
    return row


def worker_rows(level: LevelRun) -> list[dict]:
    """A router's level, one row per worker behind it: its generated tokens and acceptance from its own /metrics."""
    rows = []
    for worker in level.worker_windows:
        window = worker.window
        generated = generated_tokens(window) if window is not None and not window.reset else None
        found = acceptance_length(window) if window is not None and not window.reset else None
        if found is not None:
            source = f"metrics ({found[1]})"
        elif window is None or window.reset:
            source = "missing: " + (worker.note or "no /metrics window")
        else:
            source = "missing: no verify calls in the window"
        rows.append(
            {
                "server": level.server,
                "gpu": level.gpu,
                "concurrency": level.concurrency,
                "worker": worker.worker,
                "generated_tokens": generated[0] if generated else None,
                "output_tok_s": generated[0] / window.seconds
                if generated and window and window.seconds
                else None,
                "accept_length": found[0] if found else None,
                "accept_length_source": source,
            }
        )
    return rows
