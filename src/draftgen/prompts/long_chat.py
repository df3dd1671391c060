"""Long multi-turn conversations with real chat sets' shape, composed from this file's own templates.

Public multi-turn chat sets are not the bundled set's short questions: conversations run to 15 user turns, users
paste documents, code and logs of hundreds to thousands of tokens, the assistant turns were written by another
model (ShareGPT-style, regenerated with ``turns: all``), some conversations are exact copies of another, many
share their first question, long conversations were split into parts whose first turn only says "continue", and
rows carry fields nothing reads (``source``, ``language``, ``model``, ``timestamp``, tags). This generator writes
that shape, so the length cap, the floor under a turn's budget, the gates and the prompt audit are exercised
under the production parameters without third-party text (docs/design.md#the-command-line, ``draftgen prompts
--shape long-chat``).

Every conversation says what was planted in it (``LongChat.planted``): ``fresh`` (its first user turn is its own,
no other conversation's), ``duplicate`` (the same turns as ``of``, under another id and other odd fields, in
either row format), ``near`` (``of``'s conversation with its first question reworded: a near-duplicate, not an
exact one), ``shared`` (``of``'s first user turn, changed only in case and whitespace, then a conversation of its
own) and ``opener`` (a context-free "continue" first turn, then a conversation of its own). Tests compare the
prompt audit's findings with these.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

from draftgen.prompts.rows import conversation_digest, folded

PLANTED = ("fresh", "duplicate", "near", "shared", "opener")
# Shares of the conversations after the first few (which are all fresh, so every copy has an original). The
# public set of issue 42 had 5.0% exact duplicates, 10.2% sharing a first turn and 2.2% "continue" openers.
_PLANT_SHARES = (("duplicate", 0.04), ("near", 0.01), ("shared", 0.06), ("opener", 0.025))
_FRESH_BEFORE_COPIES = 20
_ORIGINALS = 5000  # the latest fresh conversations a copy is drawn from (memory stays flat on a large set)
# User turns per conversation: a few short ones, most with five or more, almost half with ten or more.
_TURN_WEIGHTS = {
    k: w for k, w in zip(range(1, 16), (6, 5, 5, 5, 6, 6, 6, 6, 6, 8, 8, 8, 8, 7, 6), strict=True)
}
OPENERS = (
    "continue",
    "Continue.",
    "go on",
    "please continue from where you stopped",
    "Continue writing please",
    "keep going",
    "continue from where you left off",
)

_NAMES = (
    "Ada",
    "Bao",
    "Chidi",
    "Dana",
    "Emil",
    "Farah",
    "Goran",
    "Hana",
    "Ivo",
    "Jun",
    "Kemal",
    "Lena",
    "Mira",
)
_TEAMS = ("payments", "search", "billing", "onboarding", "platform", "mobile", "data", "support", "growth")
_SYSTEMS_OWNED = (
    "order pipeline",
    "ingest service",
    "invoice renderer",
    "feature-flag store",
    "session cache",
    "report builder",
    "notification queue",
    "export job",
)
_VERBS = (
    "load",
    "parse",
    "merge",
    "validate",
    "render",
    "fetch",
    "normalize",
    "group",
    "score",
    "flush",
    "index",
)
_NOUNS = (
    "orders",
    "invoice",
    "header",
    "config",
    "records",
    "session",
    "batch",
    "user",
    "report",
    "token",
    "event",
)
_FIELDS = (
    "amount",
    "created_at",
    "status",
    "owner",
    "region",
    "retries",
    "size",
    "priority",
    "currency",
    "tag",
)
_LANGS = ("python", "typescript", "go", "rust", "java")
_SERVICES = ("api-gateway", "orders", "billing-worker", "auth", "search-indexer", "scheduler", "cache-proxy")
_PATHS = (
    "/v1/orders",
    "/v1/invoices",
    "/v1/users/me",
    "/v1/search",
    "/healthz",
    "/v1/export",
    "/v1/sessions",
)
_DOC_KINDS = (
    "design document",
    "incident review",
    "onboarding guide",
    "quarterly plan",
    "policy draft",
    "RFC",
)
_PLACES = ("Lisbon", "Osaka", "Nairobi", "Toronto", "Krakow", "Lima", "Hanoi", "Oslo", "Tunis", "Perth")
_MONTHS = ("January", "March", "May", "July", "September", "November")
_HOBBIES = (
    "a vegetable garden",
    "a small bakery",
    "a cycling club",
    "a book club",
    "a chess course",
    "a podcast",
)


@dataclass(frozen=True)
class LongChat:
    """One generated row and what was planted in it (``of``: the id of the conversation it copies or echoes)."""

    row: dict[str, Any]
    planted: str
    of: str | None = None


# ----- pasted context: documents, code, logs, tables, configuration ---------------------------------------------
def _sentence(rng: random.Random) -> str:
    team, system, name = rng.choice(_TEAMS), rng.choice(_SYSTEMS_OWNED), rng.choice(_NAMES)
    n, field = rng.randint(2, 400), rng.choice(_FIELDS)
    templates = (
        f"The {team} team owns the {system}, which handles about {n} thousand requests an hour at peak.",
        f"{name} proposed moving the {system} behind a queue so that a slow consumer no longer blocks writers.",
        f"During the last review we found that {n} records had an empty {field} and were retried forever.",
        f"The current plan keeps the {field} column nullable until every client sends it, then makes it required.",
        f"We measured a median latency of {n} ms on the {system}, with a long tail during the nightly export.",
        f"Nobody on the {team} team remembers why the {system} caches {field} for {n} minutes.",
        f"The migration is split into {n % 7 + 2} steps, each reversible, and each announced a week in advance.",
        f"{name} will write the runbook; until then, page the {team} on-call engineer for anything urgent.",
        f"Costs grew by {n % 40 + 3} percent last quarter, mostly storage for the {system}'s old snapshots.",
        f"An open question is whether the {field} should be validated by the client, the {system}, or both.",
    )
    return rng.choice(templates)


def _document(rng: random.Random, target_tokens: int) -> str:
    """A titled document of sections and paragraphs, about ``target_tokens`` long (≈ 24 tokens a sentence)."""
    kind = rng.choice(_DOC_KINDS)
    lines = [
        f"# {kind.title()}: the {rng.choice(_SYSTEMS_OWNED)} ({rng.choice(_TEAMS)}, rev {rng.randint(2, 40)})"
    ]
    sentences = max(4, target_tokens // 24)
    section = 0
    while sentences > 0:
        section += 1
        lines.append(
            f"\n## {section}. {rng.choice(('Context', 'Goals', 'Proposal', 'Risks', 'Rollout', 'Costs'))}"
        )
        for _ in range(rng.randint(1, 3)):
            take = min(sentences, rng.randint(2, 6))
            lines.append(" ".join(_sentence(rng) for _ in range(take)))
            sentences -= take
    return "\n".join(lines)


def _function(rng: random.Random) -> str:
    verb, noun, field = rng.choice(_VERBS), rng.choice(_NOUNS), rng.choice(_FIELDS)
    n = rng.randint(2, 500)
    body = [
        "    result = []",
        f"    for item in {noun}:",
        f"        if item.get({field!r}) is None:",
        "            continue",
        f"        value = item[{field!r}] * {n % 9 + 1}",
        "        if value > limit:",
        f"            log.warning('{verb} {noun}: %s over limit %s', value, limit)",
        "            value = limit",
        "        result.append(value)",
    ]
    extra = (  # blocks of lines, each whole where it goes
        ("    seen = set()", "    result = [r for r in result if not (r in seen or seen.add(r))]"),
        (f"    if len(result) > {n}:", f"        raise ValueError('too many {noun}: %d' % len(result))"),
        (f"    result.sort(reverse={rng.choice(('True', 'False'))})",),
        (f"    cache[{noun!r}] = tuple(result)",),
    )
    for block in rng.sample(extra, rng.randint(1, len(extra))):
        body += block
    return "\n".join(
        [
            f"def {verb}_{noun}({noun}, limit={n}):",
            f'    """{verb.title()} the {noun} by {field}; values above limit are clamped."""',
            *body,
            "    return result",
        ]
    )


def _code(rng: random.Random, target_tokens: int) -> str:
    """A module of functions, about ``target_tokens`` long (≈ 150 tokens a function)."""
    header = [
        f"# {rng.choice(_SYSTEMS_OWNED)}: helpers ({rng.choice(_TEAMS)} team)",
        "import logging",
        "",
        "log = logging.getLogger(__name__)",
        "cache = {}",
    ]
    functions = [_function(rng) for _ in range(max(1, target_tokens // 150))]
    return "\n".join(header) + "\n\n\n" + "\n\n\n".join(functions)


def _log(rng: random.Random, target_tokens: int) -> str:
    """Service log lines, about ``target_tokens`` long (≈ 38 tokens a line)."""
    day, hour = rng.randint(1, 28), rng.randint(0, 22)
    seconds = rng.randint(0, 3000)
    lines = []
    for _ in range(max(5, target_tokens // 38)):
        seconds += rng.randint(0, 40)
        stamp = f"2025-03-{day:02d}T{hour + seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}."
        stamp += f"{rng.randint(0, 999):03d}Z"
        service, path = rng.choice(_SERVICES), rng.choice(_PATHS)
        rid = f"{rng.getrandbits(32):08x}"
        message = rng.choice(
            (
                f"INFO  [{service}] request_id={rid} GET {path} 200 {rng.randint(3, 900)}ms",
                f"INFO  [{service}] request_id={rid} POST {path} 201 {rng.randint(5, 1500)}ms",
                f"WARN  [{service}] request_id={rid} retrying {rng.choice(_VERBS)}_{rng.choice(_NOUNS)} after "
                f"timeout (attempt {rng.randint(1, 5)}/5)",
                f"ERROR [{service}] request_id={rid} {path} 503 upstream connect error, pool exhausted: "
                f"{rng.randint(40, 64)} in use, {rng.randint(1, 300)} waiting",
                f"DEBUG [{service}] cache miss for key {rng.choice(_NOUNS)}:{rng.randint(1, 99999)}",
                f"WARN  [{service}] worker {rng.randint(0, 31)} heartbeat lag {rng.randint(200, 9000)}ms",
            )
        )
        lines.append(f"{stamp} {message}")
    return "\n".join(lines)


def _table(rng: random.Random, target_tokens: int) -> str:
    """A CSV table, about ``target_tokens`` long (≈ 22 tokens a row)."""
    lines = ["date,region,orders,revenue_eur,refunds,owner"]
    for _ in range(max(5, target_tokens // 22)):
        lines.append(
            f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d},{rng.choice(_PLACES)},{rng.randint(10, 9000)},"
            f"{rng.randint(100, 900000)}.{rng.randint(0, 99):02d},{rng.randint(0, 300)},{rng.choice(_NAMES)}"
        )
    return "\n".join(lines)


def _paste_tokens(rng: random.Random) -> int:
    """Several hundred to several thousand tokens, most pastes near the lower end (log-uniform)."""
    return int(300 * (4000 / 300) ** rng.random())


_PASTES = {"documents": _document, "coding": _code, "debugging": _log, "data": _table}


# ----- turns -------------------------------------------------------------------------------------------------------
def _opening(rng: random.Random, kind: str, paste: str) -> str:
    """A first user turn that pastes its context, made unique by the names and numbers it mentions."""
    team, system, name = rng.choice(_TEAMS), rng.choice(_SYSTEMS_OWNED), rng.choice(_NAMES)
    if kind == "coding":
        ask = rng.choice(
            (
                f"{name} says {rng.choice(_VERBS)}_{rng.choice(_NOUNS)} returns duplicates. Can you find the bug?",
                f"Please review this module from the {system} before {name} merges it.",
                f"Explain what each function here does; I inherited it from the {team} team.",
            )
        )
        return f"{ask}\n\n```python\n{paste}\n```"
    if kind == "debugging":
        return (
            f"Our {rng.choice(_SERVICES)} started failing around {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} "
            f"for the {team} team. Here is the log:\n\n```\n{paste}\n```\nWhat is going wrong, and what should we "
            "check first?"
        )
    if kind == "data":
        return f"Here is {name}'s export for the {team} review:\n\n{paste}\n\nWhich region grew fastest, and why might that be?"
    ask = rng.choice(
        (
            "Summarise it for the leadership meeting.",
            "List the open questions and the risks it does not address.",
            "Rewrite it so that a new engineer can follow it.",
        )
    )
    return f"Below is {name}'s draft of our {rng.choice(_DOC_KINDS)} for the {system}. {ask}\n\n{paste}"


def _plain_opening(rng: random.Random) -> str:
    """A first user turn without pasted context, made unique by its details."""
    name, place, hobby = rng.choice(_NAMES), rng.choice(_PLACES), rng.choice(_HOBBIES)
    ask = rng.choice(
        (
            f"I'm {name}, moving to {place} in {rng.randint(2, 11)} months to start {hobby}. Where do I begin?",
            f"Help me plan {hobby} in {place} on a budget of {rng.randint(2, 90) * 100} euros.",
            f"My friend {name} wants to start {hobby} near {place}. What mistakes do beginners make?",
            f"Write a short story about {name}, who runs {hobby} in {place}, in about {rng.randint(3, 9) * 100} words.",
        )
    )
    return f"{ask} I have {rng.randint(1, 60)} hours a week for it, from {rng.randint(1, 12)} {rng.choice(_MONTHS)}."


def _follow_up(rng: random.Random, kind: str) -> str:
    """A later user turn: a short follow-up, sometimes with more pasted context."""
    if rng.random() < 0.15 and kind in _PASTES:
        paste = _PASTES[kind](rng, _paste_tokens(rng) // 2)
        return f"Here is the next part, same question:\n\n```\n{paste}\n```"
    name, field, n = rng.choice(_NAMES), rng.choice(_FIELDS), rng.randint(2, 12)
    return rng.choice(
        (
            "Can you give a concrete example?",
            f"What about the {field} field? {name} thinks it is the cause.",
            f"Shorter, please: {n} bullet points at most.",
            f"That didn't work, I still see errors for {field}. What else could it be?",
            f"Now rewrite it in {rng.choice(_LANGS)}.",
            "Why did you choose that approach over the obvious one?",
            f"Add tests for the case where {field} is missing.",
            f"How would you explain this to {name}, who is not technical?",
            "What would you do differently if this had to scale ten times?",
            f"Turn that into a checklist for the {rng.choice(_TEAMS)} team.",
            "ok",
            "thanks! one more thing: what are the risks?",
        )
    )


def _source_answer(rng: random.Random) -> str:
    """Another model's answer, ShareGPT-style: what generate replaces with turns: all."""
    parts = [rng.choice(("Sure!", "Great question.", "Certainly.", "Here's what I found.", "Good point."))]
    parts += [_sentence(rng) for _ in range(rng.randint(2, 12))]
    text = " ".join(parts)
    if rng.random() < 0.35:
        text += f"\n\n```python\n{_function(rng)}\n```"
    if rng.random() < 0.5:
        text += "\n\nLet me know if you have any other questions."
    return text


def _turns(rng: random.Random, kind: str, first: str, users: int) -> list[dict[str, str]]:
    messages = [{"role": "user", "content": first}]
    for _ in range(users - 1):
        messages.append({"role": "assistant", "content": _source_answer(rng)})
        messages.append({"role": "user", "content": _follow_up(rng, kind)})
    return messages


# ----- rows --------------------------------------------------------------------------------------------------------
def _odd_fields(rng: random.Random, kind: str) -> dict[str, Any]:
    """Fields real sets carry that change nothing the model sees."""
    fields: dict[str, Any] = {
        "source": rng.choice(("sharegpt-export", "forum-dump", "support-chat", "wiki-bot")),
        "language": rng.choice(("en", "en", "en", "EN", "en-US")),
        "model": rng.choice(("model-a", "model-b", "legacy-bot", "unknown")),
    }
    if rng.random() < 0.92:  # the rest have only ``source`` for their category
        fields["category"] = kind
    stamp = 1_700_000_000 + rng.randint(0, 40_000_000)
    fields["timestamp"] = (
        stamp if rng.random() < 0.3 else f"2024-{stamp % 12 + 1:02d}-{stamp % 28 + 1:02d}T12:00:00Z"
    )
    if rng.random() < 0.2:
        fields["tags"] = rng.sample(["long", "code", "pasted", "split", "reviewed"], 2)
    return fields


def _row(rng: random.Random, row_id: str, messages: list[dict[str, str]], kind: str) -> dict[str, Any]:
    """ShareGPT rows (``conversations``, ending with the source's last answer) or ``messages`` rows."""
    row: dict[str, Any] = {"id": row_id, **_odd_fields(rng, kind)}
    if rng.random() < 0.75:
        speaker = {"user": "human", "assistant": "gpt", "system": "system"}
        turns = [{"from": speaker[m["role"]], "value": m["content"]} for m in messages]
        turns.append({"from": "gpt", "value": _source_answer(rng)})  # dropped and regenerated
        row["conversations"] = turns
    else:
        row["messages"] = messages
    return row


def _perturbed(rng: random.Random, text: str) -> str:
    """The same text in another case and spacing (equal once folded, ``rows.folded``), never identical."""
    for _ in range(8):
        change = rng.choice((str.lower, str.upper, lambda t: "  " + t.replace(" ", "  ") + " \n"))
        out = change(text)
        if out != text:
            return out
    return text + " "


def _reworded(rng: random.Random, text: str) -> str:
    """The first question asked another way (a near-duplicate once the rest of the conversation is the same)."""
    return rng.choice(("Quick question. ", "Hi! ", "Hello again. ", "Please help: ")) + text


def _first_user(messages: list[dict[str, str]]) -> int:
    return next(i for i, m in enumerate(messages) if m["role"] == "user")


def long_chat_conversations(n: int, seed: int = 0) -> Iterator[LongChat]:
    """``n`` long multi-turn conversations, reproducible from ``seed``, each with what was planted in it."""
    if n < 0:
        raise ValueError("n must be >= 0")
    rng = random.Random(f"long-chat-{seed}")
    first_turns: set[bytes] = set()  # digests of the folded first user turns of fresh and near rows
    conversations: set[bytes] = set()  # digests of every row's turns but the planted duplicates'
    fresh: deque[tuple[str, list[dict[str, str]], str]] = deque(maxlen=_ORIGINALS)  # (id, messages, kind)
    kinds = [*_PASTES, "chat"]
    index = 0
    while index < n:
        row_id = f"lc-{seed}-{index:07d}"
        planted, of = _plant(rng, index), None
        kind = rng.choice(kinds)
        users = rng.choices(list(_TURN_WEIGHTS), list(_TURN_WEIGHTS.values()))[0]
        if planted == "duplicate":
            of, messages, kind = rng.choice(fresh)
            yield LongChat(_row(rng, row_id, messages, kind), planted, of)
            index += 1
            continue
        if planted == "near":
            of, original, kind = rng.choice(
                [f for f in islice(reversed(fresh), 200) if len(f[1]) >= 5] or fresh
            )
            at = _first_user(original)
            messages = [*original[:at], {"role": "user", "content": _reworded(rng, original[at]["content"])}]
            messages += original[at + 1 :]
        elif planted == "shared":
            unpasted = [f for f in fresh if "\n" not in f[1][_first_user(f[1])]["content"]]
            if not unpasted:
                continue
            of, original, _ = rng.choice(unpasted)
            messages = _turns(rng, kind, _perturbed(rng, original[_first_user(original)]["content"]), users)
            if users == 1:  # more than the shared turn, else it is a copy in another case (a near-duplicate)
                more = random.Random(row_id)  # a stream of its own: the rows after it stay as they were
                messages += [
                    {"role": "assistant", "content": _source_answer(more)},
                    {"role": "user", "content": _follow_up(more, kind)},
                ]
        elif planted == "opener":
            messages = _turns(rng, kind, rng.choice(OPENERS), max(users, 2))
            messages[1]["content"] = "(continued) " + messages[1]["content"]
        else:
            pasted = kind in _PASTES and rng.random() < 0.7
            first = (
                _opening(rng, kind, _PASTES[kind](rng, _paste_tokens(rng))) if pasted else _plain_opening(rng)
            )
            messages = _turns(rng, kind, first, users)
            if rng.random() < 0.1:
                team = rng.choice(_TEAMS)
                messages.insert(
                    0, {"role": "system", "content": f"You are a helpful assistant for the {team} team."}
                )
        first = conversation_digest(folded(messages[_first_user(messages)]["content"]))
        key = conversation_digest(messages)
        if key in conversations or (planted in ("fresh", "near") and first in first_turns):
            continue  # drawn again: a copy nobody planted would make the audit's counts wrong
        conversations.add(key)
        if planted in ("fresh", "near"):
            first_turns.add(first)
        if planted == "fresh":
            fresh.append((row_id, messages, kind))
        yield LongChat(_row(rng, row_id, messages, kind), planted, of)
        index += 1


def _plant(rng: random.Random, index: int) -> str:
    """What the next conversation carries (the first few are fresh, so every copy has an original)."""
    if index < _FRESH_BEFORE_COPIES:
        return "fresh"
    draw = rng.random()
    for name, share in _PLANT_SHARES:
        if draw < share:
            return name
        draw -= share
    return "fresh"


def long_chat_rows(n: int, seed: int = 0) -> Iterator[dict[str, Any]]:
    """The rows of ``long_chat_conversations``."""
    for chat in long_chat_conversations(n, seed):
        yield chat.row
