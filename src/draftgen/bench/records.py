"""What a benchmark measured, as plain frozen records: ``run`` fills them, ``stats`` and ``report`` read them."""

from __future__ import annotations

from dataclasses import dataclass

from draftgen.bench.config import BenchmarkConfig
from draftgen.client.metrics import CounterWindow


@dataclass(frozen=True)
class ServerFacts:
    """What one server is and reports, read once before the first level."""

    index: int
    url: str
    engine: str
    version: str | None
    model_ids: tuple[str, ...]
    extra_fields: bool  # accepts non-OpenAI body fields
    sglext: bool  # answers per-request acceptance (sglext.spec_tokens_details)
    metrics: bool  # GET /metrics answers Prometheus text
    max_running_requests: int | None  # from /server_info; None when the server does not say
    speculative_algorithm: str | None
    speculation: bool | None  # from /server_info: True/False, None when unknown
    workers: tuple[str, ...] = ()  # a gateway (smg): its workers, whose /metrics are scraped
    clock_factor: float = 1.0  # hardware seconds per wall-clock second: draftgen sim's --speed, else 1
    hardware: str | None = None  # the GPU a simulator stands for ("B200"); None on real servers


@dataclass(frozen=True)
class RequestRecord:
    """One benchmark request as the client saw it (wall-clock seconds)."""

    server: str
    gpu: int
    concurrency: int
    seq: int  # order sent within the level
    prompt_id: str  # the prompt's id (with a sampling plan: the prompt the sample answers)
    ok: bool
    error: str | None
    started_at: float  # time.time() when sent
    e2e_s: float  # sent → last byte (or → failure)
    ttft_s: float | None  # sent → first reasoning/answer text
    chunk_offsets: tuple[float, ...]  # arrival of each text chunk, seconds after sending
    response_id: str | None = None
    usage_reported: bool = False
    prompt_tokens: int | None = None
    completion_tokens: int | None = None  # from usage only
    finish_reason: str | None = None
    reasoning_chars: int = 0
    content_chars: int = 0
    content_blank: bool = True  # no answer text at all (whitespace only)
    spec_accept_length: float | None = None  # per request, from sglext
    spec_verify_ct: int | None = None
    done_sentinel: bool | None = None  # the stream ended with "data: [DONE]"
    category: str | None = None  # the prompt row's category (draftgen.prompts.rows.row_category)
    arm: str | None = None  # the sampling plan's arm the request was sampled by (None: no plan)
    # An agentic row is asked at one answer point its source followed with an assistant message
    # (bench.answer_point): which one (None: sent whole), whether the target's answer there diverged from the
    # source's as generate judges it, and whether the source's reply there called tools (both None: not compared).
    answer_point: int | None = None
    diverged: bool | None = None
    source_called: bool | None = None


@dataclass(frozen=True)
class WorkerWindow:
    """One worker behind a router over one level: its own /metrics counter differences."""

    worker: str
    window: CounterWindow | None  # None when its /metrics could not be read before or after
    note: str | None = None


@dataclass(frozen=True)
class LevelRun:
    server: str
    gpu: int
    concurrency: int
    started_at: float
    finished_at: float
    requests: tuple[RequestRecord, ...]
    metrics_window: CounterWindow | None  # None when /metrics was unavailable before or after
    metrics_note: str | None
    cumulative_accept_length: (
        float | None
    )  # /server_info avg_spec_accept_length after the level: reference only
    client_lag_ms: tuple[
        float, ...
    ]  # event-loop lateness samples: high values mean the client was the bottleneck
    reused: bool = False  # read from levels/ by a resumed run, not measured by this one
    worker_windows: tuple[WorkerWindow, ...] = ()  # a router's level: each worker's own counters
    sending_ended_at: float | None = (
        None  # time.time() the steady window ended: the last send, or (tune) the first freed slot not refilled
    )
    cancelled: int = 0  # requests in flight after the last send, cancelled instead of drained (tune's jobs)
    clock_kept: float | None = None  # draftgen sim: the share of its clock the server kept over the level


@dataclass(frozen=True)
class BenchmarkRun:
    config: BenchmarkConfig
    servers: tuple[ServerFacts, ...]
    levels: tuple[LevelRun, ...]
    sample_size: int
    sample_rows_read: int
    sample_rejected: int
    started_at: float
    finished_at: float
