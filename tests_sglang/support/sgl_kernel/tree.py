"""Draft-tree ops of speculative decoding: build the EAGLE tree, verify it greedily, rebuild NGRAM's tree links.

A verify step scores ``N = num_draft_tokens`` tokens per request at once: token 0 is the last verified ("bonus")
token, tokens 1..N-1 are drafts arranged as a tree. Three int64 ``[bs, N]`` link tables describe the tree:
``retrieve_index`` (each node's row in the flattened batch, ``b * N + i``), ``retrieve_next_token`` (first child,
-1 for none) and ``retrieve_next_sibling`` (next sibling, -1 for none). Semantics follow SGLang 0.5.23's Triton
kernels ``sgl_build_tree_kernel_efficient_triton`` and ``verify_tree_greedy_kernel_triton``
(``sglang/kernels/ops/speculative/spec_tree.py``) and the contract documented in
``sglang/kernels/ops/speculative/reconstruct_tree.py``; each function's docstring restates them.
"""

from __future__ import annotations

import torch

FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2  # SGLang's TreeMaskMode


def _find_selected(selected: list[int], token: int) -> int | None:
    """Position of the first draft in this request's ``selected_index`` row equal to ``token``."""
    for position, value in enumerate(selected):
        if value == token:
            return position
    return None


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Turn an EAGLE draft (each step's top-k) into tree links, positions and an attention mask.

    For request b, ``selected_index[b, i-1]`` is draft node i's index among all candidates of the draft steps;
    ``// topk`` of it gives its parent's slot in ``parent_list[b]``, whose value is the parent's candidate index
    (slot 0 means "child of the bonus token"). The parent's node number is one more than the first position of
    that candidate index in ``selected_index[b]``; a parent not found there is skipped.

    * links, nodes N-1 down to 1: node i becomes its parent's first child and the previous first child (if any)
      becomes i's next sibling, so siblings end up in increasing order.
    * ``positions[b*N + i]`` = seq_len + depth of node i (the walk to the root stops after ``depth`` steps).
    * tree mask row i: column of node 0 and of each ancestor of i (and i itself) set, other node columns cleared.
      FULL_MASK rows are ``seq_len + N`` wide with the request's rows after all earlier requests' (the prefix
      columns are left as the caller filled them); QLEN_ONLY rows are N wide, ``N*N`` per request.
    """
    if tree_mask_mode not in (FULL_MASK, QLEN_ONLY):
        raise NotImplementedError(
            f"build_tree_kernel_efficient_cpu: tree_mask_mode {tree_mask_mode} (bit-packed)"
        )
    n = draft_token_num
    seq_lens = verified_seq_len.tolist()
    mask_offset = 0  # FULL_MASK: where request b's rows start
    for b, seq_len in enumerate(seq_lens):
        selected = selected_index[b].tolist()
        parents = parent_list[b].tolist() if parent_list.numel() else []

        def parent_node(node: int, selected=selected, parents=parents) -> int | None:
            slot = selected[node - 1] // topk
            if slot == 0:
                return 0
            found = _find_selected(selected[: n - 1], parents[slot])
            return None if found is None else found + 1

        retrieve_index[b] = torch.arange(b * n, (b + 1) * n, dtype=retrieve_index.dtype)
        for node in range(n - 1, 0, -1):
            parent = parent_node(node)
            if parent is None:
                continue
            previous = int(retrieve_next_token[b, parent])
            retrieve_next_token[b, parent] = node
            if previous != -1:
                retrieve_next_sibling[b, node] = previous

        width = seq_len + n if tree_mask_mode == FULL_MASK else n
        first_column = seq_len if tree_mask_mode == FULL_MASK else 0
        base = mask_offset if tree_mask_mode == FULL_MASK else b * n * n
        positions[b * n] = seq_len
        for node in range(n):
            row = base + node * width + first_column
            tree_mask[row] = True
            tree_mask[row + 1 : row + n] = False
            if node == 0:
                continue
            cursor, steps = node, 0
            for _ in range(depth):
                steps += 1
                tree_mask[row + cursor] = True
                parent = parent_node(cursor)
                if parent is None or parent == 0:
                    break
                cursor = parent
            positions[b * n + node] = seq_len + steps
        mask_offset += n * (seq_len + n)


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy verification: walk down the tree while a child's draft token equals the target's own choice.

    Per request b, starting at node 0: the target's greedy token after the last accepted node (``target_predict``
    at that node's flat row) is compared with the node's children in sibling order; the first equal child is
    accepted (its flat row goes to ``accept_index[b, k]``, and ``predicts`` at the parent's row gets the token)
    and the walk continues from it, for at most ``accept_index.shape[1] - 1`` levels. It stops at the first level
    without a match. ``accept_token_num[b]`` = drafts accepted; ``predicts`` at the last accepted row gets the
    target's token there (the bonus token). Keyword names keep SGLang's ``retrive_*`` spelling: it calls by name.
    """
    bs = candidates.shape[0]
    steps = accept_index.shape[1]
    flat_target = target_predict.reshape(-1)
    for b in range(bs):
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        accepted, node = 0, 0
        for _ in range(1, steps):
            target = int(flat_target[last])
            child = int(retrive_next_token[b, node])
            while child != -1 and int(candidates[b, child]) != target:
                child = int(retrive_next_sibling[b, child])
            if child == -1:
                break
            predicts[last] = target
            accepted += 1
            last = int(retrive_index[b, child])
            accept_index[b, accepted] = last
            node = child
        accept_token_num[b] = accepted
        predicts[last] = flat_target[last]


def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,
    verified_seq_len: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    batch_size: int,
    draft_token_num: int,
) -> None:
    """NGRAM's tree links from its ``[bs, N, N]`` ancestor mask (flattened; ``mask[b, i, j]``: j is an ancestor
    of i; only j < i counts). Per request b and node i:

    * ``positions[b, i]`` = number of ancestors + ``verified_seq_len[b]``; ``retrive_index[b, i]`` = ``b*N + i``
    * parent(i) = the largest ancestor index, or none
    * ``retrive_next_token[b, i]`` = the smallest k > i having i as an ancestor, else -1 (first child)
    * ``retrive_next_sibling[b, i]`` = the smallest k > i with the same parent as i, else -1 (-1 for a root)
    """
    n = draft_token_num
    if batch_size == 0:
        return
    mask = tree_mask.reshape(-1)[: batch_size * n * n].view(batch_size, n, n).bool()
    strict = torch.tril(torch.ones(n, n, dtype=torch.bool), diagonal=-1)
    for b in range(batch_size):
        ancestors = (mask[b] & strict).tolist()
        parent = [max((j for j in range(i) if ancestors[i][j]), default=-1) for i in range(n)]
        for i in range(n):
            positions.view(batch_size, n)[b, i] = sum(ancestors[i]) + int(verified_seq_len[b])
            retrive_index.view(batch_size, n)[b, i] = b * n + i
            child = next((k for k in range(i + 1, n) if ancestors[k][i]), -1)
            sibling = (
                -1 if parent[i] < 0 else next((k for k in range(i + 1, n) if parent[k] == parent[i]), -1)
            )
            retrive_next_token.view(batch_size, n)[b, i] = child
            retrive_next_sibling.view(batch_size, n)[b, i] = sibling
