"""A conversation's per-turn prompt token ids, stored without repeating the history k times.

Turn k of a multi-turn conversation is sent with the whole history, so its prompt ids begin, usually, with turn
k−1's prompt ids and output ids. The stored row keeps, per turn, only how many ids it shares with that
(``turn_prompt_shared``) and the rest (``turn_prompt_ids``):

    prompt[k] = (prompt[k-1] + output[k-1])[:shared[k]] + suffix[k],   shared[0] = 0

The shared part is the longest common prefix, so a history the template re-rendered (Qwen3 drops an earlier
answer's think block) still shares what it can, and anything else is stored whole. ``None`` stands for ids the
server did not send, in either direction: an unknown prompt stays unknown, and a prompt after an unknown turn is
stored whole (``shared`` 0).
"""

from __future__ import annotations

from collections.abc import Sequence

Ids = Sequence[int]


class TokenIdsError(ValueError):
    """Stored ids that cannot be expanded (a ``shared`` past the history it refers to): the row is corrupt."""


def common_prefix(a: Ids, b: Ids) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = min(len(a), len(b))
    i = 0
    # Compare in blocks first: histories are long and mostly equal.
    step = 256
    while i + step <= n and a[i : i + step] == b[i : i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


def compact(
    prompts: Sequence[Ids | None], outputs: Sequence[Ids | None]
) -> tuple[list[int | None], list[list[int] | None]]:
    """(shared, suffixes) for each turn's prompt ids, given every turn's prompt and output ids (None: unknown)."""
    if len(prompts) != len(outputs):
        raise ValueError(f"{len(prompts)} prompts but {len(outputs)} outputs: one of each per turn")
    shared: list[int | None] = []
    suffixes: list[list[int] | None] = []
    previous: list[int] | None = None  # prompt[k-1] + output[k-1], when both are known
    for prompt, output in zip(prompts, outputs, strict=True):
        if prompt is None:
            shared.append(None)
            suffixes.append(None)
            previous = None
            continue
        keep = common_prefix(previous, prompt) if previous is not None else 0
        shared.append(keep)
        suffixes.append(list(prompt[keep:]))
        previous = list(prompt) + list(output) if output is not None else None
    return shared, suffixes


def expand(
    shared: Sequence[int | None] | None,
    suffixes: Sequence[Ids | None] | None,
    outputs: Sequence[Ids | None] | None,
) -> list[list[int] | None]:
    """Every turn's full prompt ids back from ``compact``'s output (None where unknown).

    Raises ``TokenIdsError`` naming the turn when the columns do not fit each other."""
    if shared is None or suffixes is None:
        return []
    turns = len(suffixes)
    if len(shared) != turns or (outputs is not None and len(outputs) != turns):
        raise TokenIdsError(
            f"turn_prompt_shared has {len(shared)} elements, turn_prompt_ids {turns}"
            + (f", turn_output_ids {len(outputs)}" if outputs is not None else "")
            + ": one per generated turn expected"
        )
    full: list[list[int] | None] = []
    previous: list[int] | None = None
    for k in range(turns):
        keep, suffix = shared[k], suffixes[k]
        output = outputs[k] if outputs is not None else None
        if keep is None or suffix is None:
            full.append(None)
            previous = None
            continue
        if keep < 0 or (k == 0 and keep != 0):
            raise TokenIdsError(
                f"turn {k}: turn_prompt_shared is {keep}; it must be 0 on the first turn, ≥ 0 after"
            )
        if keep:
            if previous is None:
                raise TokenIdsError(
                    f"turn {k}: shares {keep} ids with a previous turn whose prompt or output ids are unknown"
                )
            if keep > len(previous):
                raise TokenIdsError(
                    f"turn {k}: shares {keep} ids with the previous turn's prompt + output, which has only "
                    f"{len(previous)}"
                )
            prompt = previous[:keep] + list(suffix)
        else:
            prompt = list(suffix)
        full.append(prompt)
        previous = prompt + list(output) if output is not None else None
    return full
