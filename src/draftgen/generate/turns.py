"""One prompt's conversation while it is generated: the next turn's request, finished turns, and its stored row.

A conversation with k answer points (``draftgen.training.conversation.answer_points``; k = 1 with ``turns: last``) is k
requests in order, each sending the target's own earlier answers as history. Dispatch holds one of these per
prompt in progress: it asks ``request()`` for what to send, ``record()``s each finished turn, and stores
``output_row()`` once ``finished``. Nothing here is written to disk before then: a conversation cut short by a
stop or a crash is simply generated again on resume. An agentic conversation whose target called for something else
than the source did ends at that turn (``divergence``; docs/generate.md#agentic-conversations), finished all the same.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from draftgen.client.errors import RequestError
from draftgen.client.records import STOPPED, ChatResult
from draftgen.generate.length_cap import BY_MAX_TOKENS, NO_ROOM
from draftgen.prompts.rows import PromptRow
from draftgen.training.conversation import (
    Answer,
    Divergence,
    answer_points,
    encode_calls,
    follow_up,
    message_columns,
    request_messages,
)
from draftgen.training.token_ids import compact
from draftgen.training.tools import wire_messages


@dataclass(frozen=True)
class FinishedTurn:
    result: ChatResult
    attempts: int
    max_tokens: int | None = None  # what the request was sent with (the run's, or the trainer's cap)
    budget_by: str = BY_MAX_TOKENS  # which limit set max_tokens (length_cap.BY_MAX_TOKENS / BY_MAX_LENGTH)


def _sum(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


@dataclass
class Conversation:
    """The state of one prompt's generation: built from a valid prompt row and the run's ``turns`` mode."""

    prompt: PromptRow
    mode: str
    points: tuple[int, ...] = ()
    finished_turns: list[FinishedTurn] = field(default_factory=list)
    set_aside: int = 0  # answer points not generated: their prompt left too little room under max_length
    set_aside_by: str | None = None  # why (length_cap.NO_ROOM, BELOW_FLOOR)
    divergence: Divergence | None = None  # the turn whose calls the source's next messages do not follow

    def __post_init__(self) -> None:
        self.points = answer_points(self.prompt.messages, self.mode)

    @property
    def id(self) -> str:
        return self.prompt.id

    @property
    def turn(self) -> int:
        """Index of the next turn to generate (== ``turns`` once finished)."""
        return len(self.finished_turns)

    @property
    def turns(self) -> int:
        return len(self.points)

    @property
    def finished(self) -> bool:
        return self.turn + self.set_aside >= self.turns or self.divergence is not None

    @property
    def tools(self) -> tuple[dict[str, Any], ...] | None:
        """The conversation's tool schemas, sent with every one of its requests."""
        return self.prompt.tools

    def label(self) -> str:
        """The prompt id, with the turn when there is more than one (guard examples, events)."""
        return self.id if self.turns == 1 else f"{self.id} (turn {self.turn + 1}/{self.turns})"

    def request(self) -> tuple[dict[str, Any], ...]:
        """The messages to send for the next turn: the source up to its answer point, earlier answers ours (with our
        tool calls, and the source's results spliced after them)."""
        earlier = [
            (point, Answer(done.result.content, done.result.tool_calls))
            for point, done in zip(self.points, self.finished_turns, strict=False)
        ]
        return request_messages(self.prompt.messages, self.points[self.turn], earlier, self.mode)

    def wire_request(self) -> list[dict[str, Any]]:
        """``request()`` as the HTTP request carries it (tool-call arguments as JSON strings)."""
        return wire_messages(self.request())

    def record(
        self, result: ChatResult, attempts: int, max_tokens: int | None = None, budget_by: str = BY_MAX_TOKENS
    ) -> None:
        """Keep a finished turn; in mode ``all`` an answer the source's next messages do not follow from (other tool
        calls, a call where the source answered in text, none where it called) ends the conversation there."""
        if self.finished:
            raise RuntimeError(f"conversation {self.id} got a result after its last turn: a draftgen bug")
        self.finished_turns.append(FinishedTurn(result, attempts, max_tokens, budget_by))
        if self.mode == "all" and not self.finished:
            turn = self.turn - 1
            cut = None if result.finish_reason in STOPPED else result.finish_reason
            _, self.divergence = follow_up(
                self.prompt.messages, self.points[turn], result.tool_calls, turn, cut
            )

    def set_aside_rest(self, why: str | None = NO_ROOM) -> None:
        """The next turn's prompt leaves too little to train: it and every later turn (whose prompts hold it) are
        not generated. With earlier turns done, the conversation is stored up to its last answer; else nothing is."""
        self.set_aside = self.turns - self.turn
        self.set_aside_by = why

    def rejected_row(self, reason: str) -> dict[str, Any]:
        """rejected.parquet's row for a conversation set aside before its first turn."""
        raw = json.dumps(list(self.prompt.messages), ensure_ascii=False)
        return {"row": self.prompt.row, "id": self.prompt.id, "reason": reason, "raw": raw[:300]}

    def output_row(self) -> dict[str, Any]:
        """The stored row (docs/design.md#generation-output-the-run-folder, per-turn columns included)."""
        if not self.finished or not self.finished_turns:
            raise RuntimeError(f"conversation {self.id} stored before its last turn: a draftgen bug")
        results = [t.result for t in self.finished_turns]
        points = list(self.points[: len(results)])
        # Turns set aside: the row is the conversation up to its last answer (validate's assemble wants that).
        messages, extras = message_columns(list(self.prompt.messages)[: points[-1] + 1])
        last = results[-1]
        completion = [r.completion_tokens for r in results]
        accept = [
            (r.spec_accept_length, r.completion_tokens) for r in results if r.spec_accept_length is not None
        ]
        weight = sum(tokens or 0 for _, tokens in accept)
        output_ids = [r.output_ids for r in results]
        prompt_shared, prompt_suffixes = compact([r.prompt_ids for r in results], output_ids)
        if not accept:
            accept_length = None
        elif weight > 0:
            accept_length = sum(length * (tokens or 0) for length, tokens in accept) / weight
        else:
            accept_length = sum(length for length, _ in accept) / len(accept)
        return {
            "id": self.prompt.id,
            "messages": messages,
            "reasoning_content": last.reasoning_content,
            "content": last.content,
            "finish_reason": last.finish_reason,
            "prompt_tokens": last.prompt_tokens,
            "completion_tokens": _sum(completion),
            "spec_accept_length": accept_length,
            "spec_verify_ct": _sum([r.spec_verify_ct for r in results]),
            "server": last.server,
            "latency_s": sum(r.latency_s for r in results),
            "attempts": sum(t.attempts for t in self.finished_turns),
            "response_id": last.response_id,
            "started_at": results[0].started_at,
            "usage_reported": all(r.usage_reported for r in results),
            "ttft_s": last.ttft_s,
            "source_row": self.prompt.row,
            "category": self.prompt.category,
            "prompt_id": self.prompt.prompt_id,
            "arm": self.prompt.arm,
            "sample": self.prompt.sample,
            "turn_after": points,
            "turn_reasoning": [r.reasoning_content for r in results],
            "turn_content": [r.content for r in results],
            "turn_finish_reason": [r.finish_reason for r in results],
            "turn_prompt_tokens": [r.prompt_tokens for r in results],
            "turn_completion_tokens": completion,
            "turn_spec_accept_length": [r.spec_accept_length for r in results],
            "turn_spec_verify_ct": [r.spec_verify_ct for r in results],
            "turn_latency_s": [r.latency_s for r in results],
            "turns_mode": self.mode,
            "turn_output_ids": output_ids,
            "turn_loop": [r.loop.as_row() if r.loop is not None else None for r in results],
            "turn_prompt_ids": prompt_suffixes,
            "turn_prompt_shared": prompt_shared,
            "turn_max_tokens": [t.max_tokens for t in self.finished_turns],
            "turn_budget_by": [t.budget_by for t in self.finished_turns],
            "turn_server": [r.server for r in results],
            "turn_cached_tokens": [r.cached_tokens for r in results],
            "turn_drafts_histogram": [r.drafts_histogram for r in results],
            "turn_entropy": [r.entropy for r in results],
            "turns_set_aside": self.set_aside,
            "turns_set_aside_by": self.set_aside_by if self.set_aside else None,
            **self._tool_columns(extras),
        }

    def _tool_columns(self, extras: list[str | None] | None) -> dict[str, Any]:
        """The stored row's agentic columns: message fields, tools, each turn's calls, the divergence."""
        results = [t.result for t in self.finished_turns]
        calls = [encode_calls(r.tool_calls) for r in results]
        left = self.turns - len(results) - self.set_aside
        return {
            "message_extras": extras,
            "tools": json.dumps(list(self.tools), ensure_ascii=False) if self.tools else None,
            "turn_tool_calls": calls if any(c is not None for c in calls) else None,
            "tool_divergence": self.divergence.as_json(left) if self.divergence is not None else None,
        }

    def failure_row(self, error: RequestError, attempts: int, server: str | None) -> dict[str, Any]:
        """failed.parquet's row: the turn that exhausted its attempts (earlier turns are not kept)."""
        messages, extras = message_columns(self.prompt.messages)
        return {
            "id": self.prompt.id,
            "messages": messages,
            "message_extras": extras,
            "error": str(error)[:2000],
            "error_kind": error.kind,
            "status": error.status,
            "attempts": attempts,  # of the failed turn
            "server": server,
            "failed_at": time.time(),
            "source_row": self.prompt.row,
            "turn": self.turn,
        }
