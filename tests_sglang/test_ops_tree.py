"""The stand-in's draft-tree ops: a hand-made tree, then random EAGLE drafts against a plain-Python restatement.

The restatement works from each draft node's parent (known by construction), not from the ops' link tables:
children in increasing order, depth by walking up, the ancestor mask, and greedy verification as "from the root,
take the first child whose token is the target's choice". The EAGLE builder and NGRAM's mask-to-links op must also
agree with each other on the same tree.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from sgl_kernel import build_tree_kernel_efficient_cpu, verify_tree_greedy_cpu
from sgl_kernel.speculative import reconstruct_indices_from_tree_mask

FULL_MASK, QLEN_ONLY = 0, 1


def build(parent_list, selected, seq_lens, topk, depth, n, mode=QLEN_ONLY):
    bs = len(seq_lens)
    seq_lens = torch.tensor(seq_lens, dtype=torch.int64)
    if mode == QLEN_ONLY:
        mask = torch.full((bs * n * n,), True)
    else:
        mask = torch.full((int(seq_lens.sum()) * n + n * n * bs,), True)
    links = torch.full((3, bs, n), -1, dtype=torch.long)
    positions = torch.empty(bs * n, dtype=torch.long)
    build_tree_kernel_efficient_cpu(
        torch.tensor(parent_list, dtype=torch.long),
        torch.tensor(selected, dtype=torch.long),
        seq_lens,
        mask,
        positions,
        links[0],
        links[1],
        links[2],
        topk,
        depth,
        n,
        mode,
    )
    return mask, positions, links


# A hand-made EAGLE draft: topk 2, 2 steps, 4 verify tokens. Step 0 proposes candidates 0 and 1 (children of the
# bonus token); step 1 expands both (parent_list [_, 0, 1]) into candidates 2..5, where candidate c's parent slot
# is c // 2. The best 3 are [0, 1, 3]: node 1 = cand 0, node 2 = cand 1, node 3 = cand 3 (slot 1 -> cand 0 = node 1).
HAND = {"parent_list": [[-1, 0, 1]], "selected": [[0, 1, 3]], "seq_lens": [7], "topk": 2, "depth": 2, "n": 4}
HAND_MASK = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]


def test_build_tree_hand_made():
    mask, positions, (index, next_token, next_sibling) = build(**HAND)
    assert index.tolist() == [[0, 1, 2, 3]]
    assert next_token.tolist() == [[1, 3, -1, -1]]  # 0 -> 1 first, 1 -> 3
    assert next_sibling.tolist() == [[-1, 2, -1, -1]]  # 1 then 2 under the root
    assert positions.tolist() == [7, 8, 8, 9]
    assert mask.view(4, 4).int().tolist() == HAND_MASK


def test_build_tree_full_mask_keeps_the_prefix_columns_and_places_each_request_after_the_last():
    mask, _, _ = build(
        **{
            **HAND,
            "parent_list": HAND["parent_list"] * 2,
            "selected": HAND["selected"] * 2,
            "seq_lens": [3, 5],
        },
        mode=FULL_MASK,
    )
    first = mask[: 4 * (3 + 4)].view(4, 3 + 4).int()
    second = mask[4 * (3 + 4) :].view(4, 5 + 4).int()
    for rows, prefix in ((first, 3), (second, 5)):
        assert rows[:, :prefix].eq(1).all()  # prefix columns: as the caller filled them
        assert rows[:, prefix:].tolist() == HAND_MASK


def test_build_tree_refuses_bit_packed_masks():
    with pytest.raises(NotImplementedError, match="bit-packed"):
        build(**HAND, mode=2)


@pytest.mark.parametrize(
    ("targets", "accepted", "predicted"),
    [
        ([12, 99, 98, 97], [0, 2, -1], {0: 12, 2: 98}),  # the second child of the root matches, then nothing
        ([11, 13, 98, 77], [0, 1, 3], {0: 11, 1: 13, 3: 77}),  # down the deepest branch
        ([50, 13, 98, 77], [0, -1, -1], {0: 50}),  # no draft matches: only the bonus token
    ],
)
def test_verify_tree_greedy_hand_made(targets, accepted, predicted):
    _, _, (index, next_token, next_sibling) = build(**HAND)
    candidates = torch.tensor([[10, 11, 12, 13]])  # bonus token, then nodes 1..3's draft tokens
    predicts = torch.full((4,), -5, dtype=torch.long)
    accept_index = torch.full((1, 3), -1, dtype=torch.long)
    accept_num = torch.zeros(1, dtype=torch.long)
    verify_tree_greedy_cpu(
        predicts=predicts,
        accept_index=accept_index,
        accept_token_num=accept_num,
        candidates=candidates,
        retrive_index=index,
        retrive_next_token=next_token,
        retrive_next_sibling=next_sibling,
        target_predict=torch.tensor([targets]),
    )
    assert accept_index.tolist() == [accepted]
    assert accept_num.tolist() == [sum(1 for a in accepted[1:] if a != -1)]
    assert {i: v for i, v in enumerate(predicts.tolist()) if v != -5} == predicted


# ----- random EAGLE drafts ----------------------------------------------------------------------------------------
def random_draft(rng: random.Random, topk: int, steps: int, n: int):
    """An EAGLE-shaped draft and each selected node's parent node (the restatement's ground truth).

    Candidates of step 0 are 0..topk-1 (parent: the bonus token). Step s >= 1 expands ``topk`` candidates of step
    s-1 (recorded in parent_list at slots 1 + (s-1)*topk ...), each into ``topk`` children. A candidate is only
    selected with its parent (scores multiply down the tree, so a child never outranks its parent)."""
    parent_of = {c: None for c in range(topk)}  # candidate -> parent candidate (None: the bonus token)
    parent_list = [-1]
    step_candidates = list(range(topk))
    next_id = topk
    for _ in range(1, steps):
        frontier = sorted(rng.sample(step_candidates, topk))
        parent_list += frontier
        step_candidates = []
        for parent in frontier:
            for _ in range(topk):
                parent_of[next_id] = parent
                step_candidates.append(next_id)
                next_id += 1
    selected: set[int] = set()
    while len(selected) < n - 1:
        c = rng.choice(
            [c for c in parent_of if c not in selected and (parent_of[c] is None or parent_of[c] in selected)]
        )
        selected.add(c)
    selected_sorted = sorted(selected)
    node_of = {c: i + 1 for i, c in enumerate(selected_sorted)}
    parents = [None] + [0 if parent_of[c] is None else node_of[parent_of[c]] for c in selected_sorted]
    return parent_list, selected_sorted, parents


def restated_tree(parents: list[int | None], seq_len: int):
    n = len(parents)
    children = {i: [k for k in range(n) if parents[k] == i] for i in range(n)}
    next_token = [children[i][0] if children[i] else -1 for i in range(n)]
    next_sibling = [-1] * n
    for kids in children.values():
        for a, b in itertools.pairwise(kids):
            next_sibling[a] = b

    def ancestors(i):
        out = []
        while parents[i] is not None:
            i = parents[i]
            out.append(i)
        return out

    positions = [seq_len + len(ancestors(i)) for i in range(n)]
    mask = [[j == i or j in ancestors(i) for j in range(n)] for i in range(n)]
    return next_token, next_sibling, positions, mask, children


@pytest.mark.parametrize("seed", range(12))
def test_random_drafts_against_the_restatement(seed):
    rng = random.Random(seed)
    topk, steps = rng.choice([(1, 3), (2, 2), (2, 3), (3, 3), (4, 2)])
    n = rng.randint(2, min(8, topk * steps + 1))
    bs = rng.randint(1, 3)
    drafts = [random_draft(rng, topk, steps, n) for _ in range(bs)]
    seq_lens = [rng.randint(1, 20) for _ in range(bs)]
    mask, positions, (index, next_token, next_sibling) = build(
        [d[0] for d in drafts], [d[1] for d in drafts], seq_lens, topk, steps, n
    )
    for b, ((_, _, parents), seq_len) in enumerate(zip(drafts, seq_lens, strict=True)):
        want_next, want_sibling, want_pos, want_mask, children = restated_tree(parents, seq_len)
        assert next_token[b].tolist() == want_next
        assert next_sibling[b].tolist() == want_sibling
        assert positions[b * n : (b + 1) * n].tolist() == want_pos
        assert mask[b * n * n : (b + 1) * n * n].view(n, n).tolist() == want_mask

        # NGRAM's op rebuilds the same links from the mask alone.
        links = torch.full((3, 1, n), -7, dtype=torch.long)
        rebuilt_pos = torch.empty(n, dtype=torch.long)
        reconstruct_indices_from_tree_mask(
            mask[b * n * n : (b + 1) * n * n].clone(),
            torch.tensor([seq_len]),
            rebuilt_pos,
            links[0],
            links[1],
            links[2],
            1,
            n,
        )
        assert links[0].tolist() == [list(range(n))]
        assert links[1].tolist() == [want_next] and links[2].tolist() == [want_sibling]
        assert rebuilt_pos.tolist() == want_pos

        # Greedy verification against "follow the first child whose token is the target's choice".
        tokens = [rng.randint(0, 5) for _ in range(n)]  # few values: siblings collide, choices matter
        targets = [rng.randint(0, 5) for _ in range(n)]
        path, node = [0], 0
        while len(path) < steps + 1:
            match = next((c for c in children[node] if tokens[c] == targets[node]), None)
            if match is None:
                break
            path.append(match)
            node = match
        flat = lambda i, b=b: b * n + i  # noqa: E731
        predicts = torch.full((bs * n,), -5, dtype=torch.long)
        accept_index = torch.full((bs, steps + 1), -1, dtype=torch.long)
        accept_num = torch.zeros(bs, dtype=torch.long)
        candidates = torch.zeros(bs, n, dtype=torch.long)
        candidates[b] = torch.tensor(tokens)
        target_predict = torch.full((bs, n), -9, dtype=torch.long)
        target_predict[b] = torch.tensor(targets)
        verify_tree_greedy_cpu(
            predicts=predicts,
            accept_index=accept_index,
            accept_token_num=accept_num,
            candidates=candidates,
            retrive_index=index,
            retrive_next_token=next_token,
            retrive_next_sibling=next_sibling,
            target_predict=target_predict,
        )
        assert accept_index[b].tolist() == [flat(i) for i in path] + [-1] * (steps + 1 - len(path))
        assert int(accept_num[b]) == len(path) - 1
        assert {
            i - b * n: v for i, v in enumerate(predicts.tolist()) if b * n <= i < (b + 1) * n and v != -5
        } == {i: targets[i] for i in path}


def test_reconstruct_handles_an_ngram_forest_with_unrelated_roots():
    # NGRAM trees may have nodes with no ancestor but the bonus token's column unset: parent -1, no siblings.
    n = 4
    mask = torch.tensor([[1, 0, 0, 0], [0, 1, 0, 0], [0, 1, 1, 0], [0, 1, 0, 1]], dtype=torch.bool).flatten()
    links = torch.full((3, 1, n), -7, dtype=torch.long)
    positions = torch.empty(n, dtype=torch.long)
    reconstruct_indices_from_tree_mask(mask, torch.tensor([5]), positions, links[0], links[1], links[2], 1, n)
    assert positions.tolist() == [5, 5, 6, 6]
    assert links[1].tolist() == [[-1, 2, -1, -1]]
    assert links[2].tolist() == [[-1, -1, 3, -1]]
