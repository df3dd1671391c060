"""generate on a real small model's real answers: SmolLM2-135M-Instruct on vLLM's CPU build, greedy, streamed.

What the simulator and the random-weight tiers cannot show: real text, real loops (a 135M model at T=0 falls into
verbatim repetition on some prompts), real stop tokens, and the server's own token ids for real words."""

from __future__ import annotations

import re

import polars as pl
from recording_proxy import vllm_ids

from draftgen.training.conversation import answer_points

IM_END = 2  # SmolLM2's <|im_end|>: its end of turn and eos


def _shards(pipeline) -> pl.DataFrame:
    return pl.concat(
        [pl.read_parquet(p) for p in sorted((pipeline.generate_dir / "shards").glob("*.parquet"))],
        how="diagonal_relaxed",
    )


def _turns(pipeline) -> list[dict]:
    """One dict per generated turn of every stored conversation."""
    out = []
    for row in _shards(pipeline).iter_rows(named=True):
        for j, reason in enumerate(row["turn_finish_reason"]):
            out.append(
                {
                    "id": row["id"],
                    "turn": j,
                    "finish": reason,
                    "content": row["turn_content"][j] or "",
                    "ids": row["turn_output_ids"][j],
                    "completion_tokens": row["turn_completion_tokens"][j],
                    "max_tokens": row["turn_max_tokens"][j],
                    "loop": row["turn_loop"][j],
                }
            )
    return out


def _counter(metrics: str, name: str) -> float:
    return sum(
        float(m.group(1))
        for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+]+)$", metrics, re.M)
    )


def test_every_prompt_and_every_turn_is_answered_once(pipeline):
    shards = _shards(pipeline)
    assert sorted(shards["id"].to_list()) == sorted(r["id"] for r in pipeline.prompts), (
        "each prompt exactly once"
    )
    by_id = {r["id"]: r for r in pipeline.prompts}
    for row in shards.iter_rows(named=True):
        asked = [m for m in by_id[row["id"]]["messages"]]
        while asked[-1]["role"] == "assistant":
            asked.pop()
        assert len(row["turn_finish_reason"]) == len(answer_points(asked, "all")), row["id"]
    multi = shards.filter(pl.col("turn_finish_reason").list.len() > 1)
    assert multi.height > 0, "the set holds multi-turn conversations, each turn regenerated"


def test_real_loops_are_ended_live_and_stored_up_to_their_first_repetition(pipeline):
    """T=0 makes a 135M model loop: the loop check ends those answers while they stream, the server stops (vLLM's
    own token counter stays far below what the loops would have cost), and what is stored holds the cycle twice."""
    loops = [t for t in _turns(pipeline) if t["finish"] == "repetition_loop"]
    assert loops, "greedy SmolLM2 loops on some of these prompts: the check must have ended at least one"
    for turn in loops:
        loop = turn["loop"]
        assert loop["live"] and turn["ids"] is None and turn["completion_tokens"] is None, turn["id"]
        text = turn["content"]
        start, period = loop["start_char"], (loop["kept_chars"] - loop["start_char"]) // 2
        assert loop["kept_chars"] == len(text), "stored up to the end of the cycle's first repetition"
        assert period > 0 and text[start : start + period] == text[start + period : start + 2 * period], turn[
            "id"
        ]
        assert loop["received"] < turn["max_tokens"], "ended before max_tokens"
    # What vLLM generated during the run: every stored turn's tokens, plus for each loop what it had generated
    # before the client left (about `received` pieces) — not the loops' max_tokens.
    generated = _counter(pipeline.metrics_after, "vllm:generation_tokens_total") - _counter(
        pipeline.metrics_before, "vllm:generation_tokens_total"
    )
    finished = sum(t["completion_tokens"] or 0 for t in _turns(pipeline))
    if_run_out = finished + sum(t["max_tokens"] for t in loops)
    assert finished < generated < if_run_out - len(loops) * 128, (finished, generated, if_run_out)


def test_finish_reasons_are_the_servers_and_agree_with_its_ids(pipeline):
    turns = _turns(pipeline)
    reasons = {t["finish"] for t in turns}
    assert reasons <= {"stop", "length", "repetition_loop"}, reasons
    stops = [t for t in turns if t["finish"] == "stop"]
    assert len(stops) > len(turns) / 2, "most answers end on their own"
    for turn in stops:
        assert turn["ids"] and turn["ids"][-1] == IM_END and len(turn["ids"]) == turn["completion_tokens"], (
            turn["id"]
        )
    for turn in (t for t in turns if t["finish"] == "length"):
        assert len(turn["ids"]) == turn["completion_tokens"] == turn["max_tokens"], turn["id"]


def test_stored_ids_are_vllms_own_from_the_wire(pipeline):
    """Each finished turn's stored output ids are exactly the ids vLLM streamed for that request (the proxy's record),
    and they decode to the stored text."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(pipeline.params["model"])
    wire = [vllm_ids(e) for e in pipeline.proxy.chats()]
    outputs = [tuple(o) for _, o in wire if o]
    finished = [t for t in _turns(pipeline) if t["ids"] is not None]
    assert finished
    for turn in finished:
        assert outputs.count(tuple(turn["ids"])) >= 1, (
            f"{turn['id']} turn {turn['turn']}: not an answer vLLM sent"
        )
        text = tokenizer.decode(turn["ids"], skip_special_tokens=True)
        assert text.strip() == turn["content"].strip(), turn["id"]
