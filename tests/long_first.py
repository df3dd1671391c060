"""The order make test's first pass runs its tests in: each long test (marked ``slow``) at the start of an xdist
worker's share, so that none starts last and decides the pass's wall time alone.

``--dist worksteal`` hands each worker a contiguous block of the collection (the first of ``n`` workers
``len // n`` tests, the next ``remaining // (n - 1)``, ...) and an idle worker steals from the end of another's block:
a block's first tests stay with its worker and run first. A module's long tests stay together (they may share a
module fixture). Without workers (``-n 0``) the long tests simply come first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def block_sizes(count: int, workers: int) -> list[int]:
    """How worksteal first splits ``count`` tests over ``workers`` idle workers."""
    sizes = []
    for i in range(workers):
        sizes.append(count // (workers - i))
        count -= sizes[-1]
    return sizes


def long_first(
    items: Sequence[T], weights: Sequence[float], module_of: Sequence[str], workers: int
) -> list[T]:
    """``items`` reordered: the long ones (weight > 0), a module's together, dealt over the workers' blocks (the
    block with the least weight so far takes the next heaviest module's) and put at each block's start; the rest
    in their order. A weight counts long runs: 1 for a test marked on its own, a share of 1 for each test of a
    module marked as a whole (such a module is one long run in parts)."""
    groups: dict[str, list[T]] = {}
    weight: dict[str, float] = {}
    rest: list[T] = []
    for item, share, module in zip(items, weights, module_of, strict=True):
        if share > 0:
            groups.setdefault(module, []).append(item)
            weight[module] = weight.get(module, 0.0) + share
        else:
            rest.append(item)
    sizes = block_sizes(len(items), max(1, workers))
    heads: list[list[T]] = [[] for _ in sizes]
    loads = [0.0] * len(sizes)
    for module in sorted(groups, key=lambda m: weight[m], reverse=True):
        group = groups[module]
        fits = [i for i, head in enumerate(heads) if len(head) + len(group) <= sizes[i]] or [0]
        chosen = min(fits, key=lambda i: loads[i])
        heads[chosen].extend(group)
        loads[chosen] += weight[module]
    ordered: list[T] = []
    for head, size in zip(heads, sizes, strict=True):
        take = max(0, size - len(head))
        ordered += head + rest[:take]
        rest = rest[take:]
    return ordered + rest
