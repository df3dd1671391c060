"""A synthetic prompt set written by this project: math, code, chat, multi-turn, system-prompted and agentic rows.

Rows follow the prompt-row format of docs/design.md#prompt-rows, ``{"id", "messages": [{"role", "content"},
...]}``, agentic rows with ``tools`` and OpenAI-shaped tool calls and results. Every text here is composed from
templates in this file, so the set carries no third-party text and is reproducible from a seed.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator
from pathlib import Path

from draftgen.prompts.bundled import BUNDLED_COUNT as BUNDLED_COUNT  # where tests and scripts have found them
from draftgen.prompts.bundled import BUNDLED_PROMPTS as BUNDLED_PROMPTS
from draftgen.prompts.bundled import BUNDLED_SEED as BUNDLED_SEED
from draftgen.prompts.long_chat import long_chat_rows
from draftgen.rundir import replace_file

_NAMES = ("Ada", "Bao", "Chidi", "Dana", "Emil", "Farah", "Goran", "Hana", "Ivo", "Jun", "Kemal", "Lena")
_ITEMS = ("apples", "bolts", "tickets", "marbles", "books", "stamps", "tiles", "cups", "seeds", "coins")
_LANGS = ("Python", "Rust", "TypeScript", "Go", "C++", "SQL")
_TASKS = (
    "returns the {k} largest values of a list without sorting the whole list",
    "checks whether a string of brackets is balanced",
    "merges overlapping intervals given as pairs of integers",
    "computes the edit distance between two strings",
    "parses a duration like '3h25m10s' into seconds",
    "groups words that are anagrams of each other",
    "finds the first missing positive integer in an array",
    "rotates an N x N matrix by 90 degrees in place",
    "implements a least-recently-used cache with capacity {k}",
    "deduplicates records by a key while keeping the newest",
)
_TOPICS = (
    "how a bicycle gear ratio changes the effort of pedalling",
    "why bread dough needs time to rise",
    "the difference between weather and climate",
    "how to plan a week of meals on a budget",
    "what makes a good code review comment",
    "how tides are related to the moon",
    "ways to memorise a short speech",
    "how a refrigerator moves heat out of its box",
    "how to choose a first telescope",
    "why leaves change colour in autumn",
)
_STYLES = (
    "in three sentences",
    "as a short list",
    "for a ten-year-old",
    "in detail, with an example",
    "briefly",
)
_SYSTEMS = (
    "You are a careful assistant. Think step by step and state assumptions.",
    "You are a senior software engineer. Prefer clear, tested code.",
    "You are a patient tutor. Explain the reasoning, not only the answer.",
    "You answer concisely and precisely.",
)
_FILLER = (
    "Some background: this came up while I was preparing notes for a study group.",
    "I tried it myself first but I am not sure my approach is right.",
    "Please keep the explanation self-contained.",
    "Mention any edge cases you notice.",
    "If there is more than one way, compare them.",
)


def _math(rng: random.Random) -> list[dict]:
    a, b, c = rng.randint(3, 99), rng.randint(2, 40), rng.randint(2, 12)
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    kind = rng.randrange(4)
    if kind == 0:
        text = f"{name} has {a} {item}, gives away {b}, then buys {c} boxes of {b} each. How many {item} now?"
    elif kind == 1:
        text = f"Solve for x: {c}x + {b} = {a + b * c}. Show each step."
    elif kind == 2:
        text = (
            f"What is the sum of all integers from 1 to {a * c} that are divisible by {c} or by {b % 7 + 2}?"
        )
    else:
        text = f"A rectangle has perimeter {2 * (a + b)} and one side of length {a}. Find its area and its diagonal."
    return [{"role": "user", "content": text}]


def _code(rng: random.Random) -> list[dict]:
    task = rng.choice(_TASKS).format(k=rng.randint(2, 9))
    lang = rng.choice(_LANGS)
    text = f"Write a {lang} function that {task}. Include a few tests."
    if rng.random() < 0.4:
        text += " " + " ".join(rng.sample(_FILLER, rng.randint(1, 3)))
    return [{"role": "user", "content": text}]


def _chat(rng: random.Random) -> list[dict]:
    text = f"Explain {rng.choice(_TOPICS)} {rng.choice(_STYLES)}."
    if rng.random() < 0.5:
        text = " ".join([*rng.sample(_FILLER, rng.randint(1, 4)), text])
    return [{"role": "user", "content": text}]


_FOLLOW_UPS = (
    "Can you give a concrete example?",
    "What is the most common mistake here?",
    "How would you check that the answer is right?",
    "Summarise that in one sentence.",
)


def _multi_turn(rng: random.Random) -> list[dict]:
    """2- or 3-turn conversations whose assistant turns were written by "another model" (generate replaces
    them with turns: all); some end with an assistant turn, as ShareGPT rows do (dropped and regenerated)."""
    first = _chat(rng)[0]["content"]
    messages = [
        {"role": "user", "content": first},
        {
            "role": "assistant",
            "content": "Here is a short answer: " + rng.choice(_TOPICS) + " depends on a few factors.",
        },
        {"role": "user", "content": f"Thanks. Can you go deeper, {rng.choice(_STYLES)}?"},
    ]
    # Drawn from a stream of this row's own, so the rows after it are the same as before 3-turn rows existed.
    more = random.Random(first + messages[2]["content"])
    if more.random() < 0.4:
        messages += [
            {"role": "assistant", "content": "Going deeper: " + more.choice(_FILLER)},
            {"role": "user", "content": more.choice(_FOLLOW_UPS)},
        ]
    if more.random() < 0.3:
        messages.append({"role": "assistant", "content": "In short: " + more.choice(_TOPICS) + "."})
    return messages


def _with_system(rng: random.Random) -> list[dict]:
    inner = rng.choice((_math, _code, _chat))(rng)
    return [{"role": "system", "content": rng.choice(_SYSTEMS)}, *inner]


def _long_context(rng: random.Random) -> list[dict]:
    paragraphs = [
        " ".join(rng.choice(_FILLER) for _ in range(rng.randint(3, 8))) for _ in range(rng.randint(4, 12))
    ]
    text = "Summarise the notes below and list open questions.\n\n" + "\n\n".join(paragraphs)
    return [{"role": "user", "content": text}]


def _tool(name: str, description: str, **properties: str) -> dict:
    """A function tool in OpenAI's shape; ``properties``: each parameter's JSON type."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {key: {"type": kind} for key, kind in properties.items()},
                "required": list(properties),
            },
        },
    }


_TOOLS = (
    _tool("get_weather", "The weather forecast for a city.", city="string"),
    _tool("get_local_time", "The current local time in a city.", city="string"),
    _tool(
        "search_flights",
        "Flights to a destination for a number of passengers.",
        destination="string",
        passengers="integer",
    ),
    _tool("lookup_population", "The population of a city.", city="string"),
)
_CITIES = (
    "Lisbon",
    "Nairobi",
    "Osaka",
    "Quito",
    "Tallinn",
    "Hanoi",
    "Perth",
    "Reykjavik",
    "Accra",
    "Montreal",
)
# Each question names the tools it needs by a word of their name, and ends with the city: what a model asked it calls
# (draftgen.sim.toolcalls follows the same reading, so the simulated target calls what these rows' source called).
_TOOL_QUESTIONS = (
    ((0,), "What will the weather be like in {city}?"),
    ((1,), "What local time is it right now in {city}?"),
    ((3,), "How large is the population of {city}?"),
    ((0, 1), "I land soon: what is the weather and the local time in {city}?"),
    ((2,), "Search flights for {n} passengers to {city}."),
    ((0, 3), "Compare the weather and the population of {city}."),
)
_TOOL_LEAD_INS = (
    "",
    "quick question: ",
    "before I book anything, ",
    "for a work trip, ",
    "my family is asking: ",
    "planning ahead, ",
    "one more thing, ",
    "sorry to bother you, but ",
    "for a weekend away, ",
    "help me decide: ",
    "just checking, ",
    "for my notes, ",
)
_TOOL_RESULTS = {
    "get_weather": '{{"forecast": "{sky}", "high_c": {high}, "low_c": {low}}}',
    "get_local_time": '{{"time": "{hour:02d}:{minute:02d}", "utc_offset": "+{offset:02d}:00"}}',
    "search_flights": '{{"flights": [{{"depart": "{hour:02d}:{minute:02d}", "price_eur": {price}}}]}}',
    "lookup_population": '{{"population": {people}}}',
}
_SKIES = ("sunny", "light rain", "overcast", "snow showers", "windy and clear")
_TOOL_FOLLOW_UPS = (
    "Thanks. What should I pack for that?",
    "Is that unusual for this time of year?",
    "Summarise that for a text message.",
)


def _agentic(rng: random.Random) -> dict:
    """A question answered with one or two tool calls (parallel), their results, the answer, and often a follow-up
    question. The source's call is what a model asked the question calls; in about one row in eight it passes the
    city with its country, as another model might, so the target's call differs and the conversation ends there."""
    wanted, question = rng.choice(_TOOL_QUESTIONS)
    city, n = rng.choice(_CITIES), rng.randint(1, 4)
    tools = [_TOOLS[i] for i in sorted({*wanted, rng.randrange(len(_TOOLS))})]
    lead = rng.choice(_TOOL_LEAD_INS)
    text = question.format(city=city, n=n)
    text = lead + text[0].lower() + text[1:] if lead else text
    other = rng.random() < 0.125
    calls, results = [], []
    for number, index in enumerate(wanted):
        function = _TOOLS[index]["function"]
        arguments = {"city": city} if "city" in function["parameters"]["properties"] else {}
        if function["name"] == "search_flights":
            arguments = {"destination": city, "passengers": n}
        if other and number == 0:
            arguments = {
                key: f"{value}, the capital" if isinstance(value, str) else value
                for key, value in arguments.items()
            }
        call_id = f"call_{rng.getrandbits(48):012x}"
        calls.append(
            {
                "id": call_id,
                "type": "function",
                "function": {"name": function["name"], "arguments": json.dumps(arguments)},
            }
        )
        result = _TOOL_RESULTS[function["name"]].format(
            sky=rng.choice(_SKIES),
            high=rng.randint(5, 34),
            low=rng.randint(-5, 20),
            hour=rng.randint(0, 23),
            minute=rng.randint(0, 59),
            offset=rng.randint(0, 11),
            price=rng.randint(60, 900),
            people=rng.randint(200_000, 9_000_000),
        )
        results.append({"role": "tool", "tool_call_id": call_id, "content": result})
    messages: list[dict] = []
    if rng.random() < 0.3:
        messages.append(
            {"role": "system", "content": "You are a travel assistant. Use the tools; do not guess."}
        )
    messages += [
        {"role": "user", "content": text},
        {"role": "assistant", "content": "", "tool_calls": calls},
        *results,
        {"role": "assistant", "content": f"Here is what I found for {city}."},
    ]
    if rng.random() < 0.6:
        messages.append({"role": "user", "content": rng.choice(_TOOL_FOLLOW_UPS)})
    return {"messages": messages, "tools": tools}


LONG_CHAT = "long_chat"
_KINDS = (
    ("math", _math, 0.25),
    ("code", _code, 0.25),
    ("chat", _chat, 0.2),
    ("multi_turn", _multi_turn, 0.1),
    ("system", _with_system, 0.12),
    ("long", _long_context, 0.08),
    ("agentic", _agentic, 0.06),
    # Real chat sets' shape (draftgen.prompts.long_chat): up to 15 user turns with pasted documents, and the copies
    # such sets hold (duplicates, shared first turns, "continue" openers), so the demo meets the trainer's max_length
    # cap, the floor under a turn's budget and the prompt audit under the production parameters.
    (LONG_CHAT, None, 0.03),
)
CATEGORIES = tuple(name for name, _, _ in _KINDS)
SINGLE_TURN = ("math", "code", "chat", "system", "long")  # the kinds that ask one question, without tools


def _first_request(fields: dict) -> dict:
    """A row's messages up to its first user message, and its tools."""
    roles = [m["role"] for m in fields["messages"]]
    return {"messages": fields["messages"][: roles.index("user") + 1], "tools": fields.get("tools")}


def synthetic_rows(n: int, seed: int = 0, kinds: Iterable[str] = CATEGORIES) -> Iterator[dict]:
    """``n`` distinct prompt rows of ``kinds`` (CATEGORIES: the bundled set's mix), reproducible from ``seed``; ids
    are ``syn-<seed>-<index>``."""
    if n < 0:
        raise ValueError("n must be >= 0")
    wanted = set(kinds)
    if not wanted or wanted - set(CATEGORIES):
        raise ValueError(f"kinds must be some of {', '.join(CATEGORIES)}, got {sorted(wanted)}")
    rng = random.Random(seed)
    names = [k[0] for k in _KINDS if k[0] in wanted]
    weights = [k[2] for k in _KINDS if k[0] in wanted]
    builders = {k[0]: k[1] for k in _KINDS}
    seen: set[str] = set()
    long_chats = long_chat_rows(n, seed)  # a stream of its own, drawn from only where a long chat is picked
    index = 0
    while index < n:
        kind = rng.choices(names, weights)[0]
        if kind == LONG_CHAT:  # its copies are planted on purpose: not told apart by their first request
            yield {**next(long_chats), "id": f"syn-{seed}-{index:07d}", "category": kind}
            index += 1
            continue
        built = builders[kind](rng)
        fields = built if isinstance(built, dict) else {"messages": built}  # agentic rows: messages and tools
        # rows are told apart by their first request (the messages up to the first question, and the tools): two rows
        # asking the same first (a chat question that opens a multi-turn row too) would send one request twice
        key = json.dumps(_first_request(fields), sort_keys=True)
        if key in seen:  # a prompt set with repeats would make "duplicate answer" checks meaningless
            continue
        seen.add(key)
        yield {"id": f"syn-{seed}-{index:07d}", "category": kind, **fields}
        index += 1


def write_rows(path: Path, rows: Iterable[dict]) -> int:
    """Write prompt rows as JSONL (one atomic write); returns how many."""
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0

    def write(temporary: Path) -> None:
        nonlocal count
        with open(temporary, "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
                count += 1

    replace_file(path, write)
    return count


def write_synthetic(path: Path, n: int, seed: int = 0) -> int:
    return write_rows(path, synthetic_rows(n, seed))
