"""Where the benchmark asks an agentic row, and whether the target's answer there diverged from the source's.

With ``turns: all`` generate ends an agentic conversation at the first answer the source's next messages do not
follow from (``training.conversation.follow_up``: other calls, a call where the source answered in text, none where
it called): its later answer points are never sent. How often that happens is the target's own behaviour, so the
benchmark measures it. With ``turns: all`` (generate's default) a sampled row with ``tools`` that has answer points
the source followed with an assistant message (``compared_points``) is sent at ONE of them, chosen uniformly by a
hash of the row's id (so calling and text points are measured in proportion, and a resumed run sends the same),
with the request generate builds for that point; its answer is then compared with the source's as generate compares
it. Any other row, and every row with ``turns: last``, is sent whole (its last answer point, where there is no
source answer to compare with), as generate sends it with ``turns: last``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from draftgen.client.records import STOPPED, ChatResult
from draftgen.prompts.rows import PromptRow
from draftgen.training.conversation import (
    answer_points,
    compared_points,
    follow_up,
    request_messages,
    source_answers,
    source_reply,
)


@dataclass(frozen=True)
class SentPoint:
    """What the benchmark sends for one sampled row, and what its answer is compared with."""

    messages: tuple[dict[str, Any], ...]  # the request's messages (tool-call arguments as JSON objects)
    after: int | None  # the answer point asked (None: the row sent whole, nothing to compare)
    source_called: bool | None  # the source's reply at ``after`` has tool calls (None: nothing compared)

    def diverged(self, source: Sequence[Mapping[str, Any]], result: ChatResult) -> bool | None:
        """Whether generate would end the conversation after this answer (None: nothing compared). ``cut``, as
        generate passes it, only words the reason: an answer cut before its calls diverged all the same."""
        if self.after is None:
            return None
        cut = None if result.finish_reason in STOPPED else result.finish_reason
        _, divergence = follow_up(source, self.after, result.tool_calls, cut=cut)
        return divergence is not None


def chosen_point(row: PromptRow, turns: str = "all") -> int | None:
    """The answer point the benchmark asks ``row`` at with generate's ``turns``: one of its compared points, by a
    hash of its id, when it offers tools and turns is "all"; else None (sent whole, as generate sends it with
    "last")."""
    if not row.tools or turns != "all":
        return None
    points = compared_points(row.messages)
    if not points:
        return None
    digest = hashlib.blake2b(row.id.encode(), digest_size=8, person=b"bench-point").digest()
    return points[int.from_bytes(digest, "little") % len(points)]


def sent_point(row: PromptRow, turns: str = "all") -> SentPoint:
    """The request for ``row`` (``chosen_point``): generate's request for that answer point, built by the same
    ``request_messages``. The earlier answers in it are the source's own (text and calls, its tool results after
    them): in generate they are the target's, which do not exist before the run; the prompt audit stands the
    source's in alike. A row sent whole is its messages as they are."""
    after = chosen_point(row, turns)
    if after is None:
        return SentPoint(row.messages, None, None)
    earlier = [p for p in answer_points(row.messages, "all") if p < after]
    stand_ins = source_answers(row.messages, earlier)
    request = request_messages(row.messages, after, [(p, stand_ins[p]) for p in earlier], "all")
    reply = source_reply(row.messages, after)
    assert reply is not None, "a compared point has a source reply"
    return SentPoint(request, after, bool(reply.get("tool_calls")))
