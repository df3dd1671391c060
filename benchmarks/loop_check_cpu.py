"""Client CPU of the repetition-loop check per streamed token, against the client's own cost of reading the stream.

One SGLang-style chat stream (the role chunk, then ``reasoning_content`` deltas of ``--tokens-per-chunk`` pieces each,
as MTP's verify steps send them) is decoded the way ``ServerClient.stream_chat`` reads a stream — ``SseDecoder`` →
``ChatAccumulator`` — once without the loop check and once with it, over the same bytes; and the check alone is fed
the same deltas. The text is this repository's docs (prose, tables, code: the detector's busy case, where short
repeats make candidate periods) followed by the simulator's filler. Each figure is the best of ``--repeats`` runs,
in nanoseconds per piece (about one token), with the ratio to reading the stream measured in the same run; and the
share of one core the check takes at ``--fleet-tokens-per-s`` (seven B200s at 64 streams each read about 40,000
tokens/s).

    .venv/bin/python benchmarks/loop_check_cpu.py [--tokens-per-chunk 3] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from draftgen.client.loops import PIECES, LoopDetector, LoopRule, TextLoopCheck
from draftgen.client.sse import SseDecoder
from draftgen.client.stream import ChatAccumulator
from draftgen.sim.filler import filler_text

ROOT = Path(__file__).resolve().parent.parent


def deltas(tokens_per_chunk: int) -> list[str]:
    text = "".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md")))
    text += filler_text(7, 60_000)
    pieces = PIECES.findall(text)
    return ["".join(pieces[i : i + tokens_per_chunk]) for i in range(0, len(pieces), tokens_per_chunk)]


def sse_bytes(chunks: list[str]) -> list[bytes]:
    """The stream as it arrives: one SSE event per chunk, in SGLang 0.5.23's chunk shape."""

    def event(delta: dict, finish: str | None = None) -> bytes:
        chunk = {
            "id": "9f8e7d",
            "object": "chat.completion.chunk",
            "created": 1767225600,
            "model": "Qwen/Qwen3.6-27B",
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "matched_stop": None}
            ],
        }
        return f"data: {json.dumps(chunk)}\n\n".encode()

    events = [event({"role": "assistant", "content": "", "reasoning_content": None})]
    events += [event({"reasoning_content": text}) for text in chunks]
    events.append(event({"reasoning_content": None}, "length"))
    return [*events, b"data: [DONE]\n\n"]


def read_stream(events: list[bytes], rule: LoopRule | None) -> float:
    answer = ChatAccumulator("http://127.0.0.1:30000", stream=True, loop_rule=rule)
    decoder = SseDecoder()
    start = time.perf_counter()
    for data in events:
        for event in decoder.feed(data):
            answer.add_event(event)
    answer.result()
    return time.perf_counter() - start


def check_alone(chunks: list[str]) -> float:
    check = TextLoopCheck()
    start = time.perf_counter()
    for text in chunks:
        check.feed(text, "reasoning")
    check.finish()
    assert check.found is None, "the benchmark's text must not loop"
    return time.perf_counter() - start


def detector_alone(units: list[int], per_call: int) -> float:
    detector = LoopDetector()
    start = time.perf_counter()
    for i in range(0, len(units), per_call):
        detector.feed(units[i : i + per_call])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tokens-per-chunk", type=int, default=3, help="pieces per delta (MTP sends ~3 a step)"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--fleet-tokens-per-s", type=float, default=40_000.0)
    args = parser.parse_args()
    chunks = deltas(args.tokens_per_chunk)
    events = sse_bytes(chunks)
    pieces = sum(len(PIECES.findall(c)) for c in chunks)
    units = [hash(p) for c in chunks for p in PIECES.findall(c)]
    best = dict.fromkeys(("read", "read_checked", "check", "detector"), float("inf"))
    for _ in range(args.repeats):
        best["read"] = min(best["read"], read_stream(events, None))
        best["read_checked"] = min(best["read_checked"], read_stream(events, LoopRule()))
        best["check"] = min(best["check"], check_alone(chunks))
        best["detector"] = min(best["detector"], detector_alone(units, args.tokens_per_chunk))
    ns = {k: v / pieces * 1e9 for k, v in best.items()}
    added = ns["read_checked"] - ns["read"]
    figures = {
        "pieces": pieces,
        "chunks": len(chunks),
        "ns_per_piece": {k: round(v) for k, v in ns.items()},
        "check_over_read": round(added / ns["read"], 3),
        "core_share_at_fleet_rate": round(added * 1e-9 * args.fleet_tokens_per_s, 4),
    }
    print(
        f"{pieces:,} pieces in {len(chunks):,} deltas of {args.tokens_per_chunk}: reading the stream "
        f"{ns['read']:.0f} ns/piece, with the loop check {ns['read_checked']:.0f} (+{added:.0f}, "
        f"{figures['check_over_read']:+.0%}); the check alone {ns['check']:.0f}, its detector alone "
        f"{ns['detector']:.0f}; at {args.fleet_tokens_per_s:,.0f} tokens/s the check takes "
        f"{figures['core_share_at_fleet_rate']:.1%} of one core"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
