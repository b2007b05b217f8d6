"""EAGLE-2's dynamic tree (:mod:`specbench.drafting.dynamic_tree`) grown on the device, read to the host once.

The same candidates, in the same order, make the same draft as :func:`~specbench.drafting.dynamic_tree.grow_rows`
followed by :func:`~specbench.drafting.dynamic_tree.rerank`; what changes is where the tree lives. Every row of a
batch grows at the widest top-k ``K`` of the batch and the deepest depth: level ``j`` keeps ``K`` nodes in fixed
slots, each level's ``K × K`` children sit in parent-major order, and a row's narrower top-k or shallower depth
masks its extra nodes out (their scores are -inf), so a level's shape never depends on the data. Ties fall as on
the host: candidates are ranked by a stable descending sort over their order of making, and scores add up in
float64 as the host's Python floats do. The last step picks each row's ``nodes`` best candidates on the device
too; one read brings back their tokens, parents, depths and needs.

``expand(j, parent_slots, tokens)`` maps level ``j``'s nodes (``tokens`` [R, K], each one's parent's slot in level
``j - 1``: [R, K]) to their children's log-probabilities [R·K, V]. :func:`ancestors` gives the mask a draft
model's level attends with: each node sees its ancestors' slots and itself.

Pure: tested against the host's tree on made-up log-probabilities, ties included.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

NEG = float("-inf")


def ancestors(previous: torch.Tensor, parent_slots: torch.Tensor, width: int) -> torch.Tensor:
    """Level ``j``'s ancestor mask [R, K, j·K] over the slots of levels 0 … j-1, from level ``j - 1``'s
    (``previous``: [R, K, (j-1)·K]) and each node's parent slot (``parent_slots``: [R, K])."""
    inherited = previous.gather(1, parent_slots[..., None].expand(-1, -1, previous.shape[-1]))
    return torch.cat([inherited, torch.nn.functional.one_hot(parent_slots, width).bool()], -1)


def grow_on_device(roots: torch.Tensor, expand: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor], *,
                   depths: list[int], top_ks: list[int], nodes: int) -> list[tuple[list[int], list[int], list[int]]]:
    """Each row's draft as (tokens, parents, needs), parents first, siblings in descending score: what
    ``rerank(grow_rows(...), nodes)`` drafts (its scores left out), from ``roots`` [R, V] log-probabilities."""
    return read_picked(grow_tensor(roots, expand, depths=depths, top_ks=top_ks, nodes=nodes))


def grow_tensor(roots: torch.Tensor, expand: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor], *,
                depths: list[int], top_ks: list[int], nodes: int) -> torch.Tensor:
    """:func:`grow_on_device`'s device part, with no host read (what a CUDA graph can hold): each row's ``nodes``
    best candidates, [6, R, nodes] (:func:`read_picked` reads it)."""
    rows, vocab = roots.shape
    width = min(max(top_ks), vocab)
    device = roots.device
    rank = torch.arange(width, device=device)
    within = torch.stack([rank < k for k in top_ks])  # [R, K]: a row's own top-k

    lp, ids = roots.float().topk(width, dim=-1)
    level_scores = torch.where(within, lp.double(), NEG)
    level_tokens, level_made = ids, rank.expand(rows, -1)  # each level node's index among the candidates made
    level_need = (rank + 1).expand(rows, -1)  # the narrowest top-k that surely expands the node
    parts = [(ids, level_scores, torch.full_like(ids, -1), level_need)]  # each level's candidates
    made, parent_slots = width, torch.zeros_like(ids)
    for j in range(1, max(depths)):
        alive = torch.stack([within[r] if j < d else torch.zeros_like(within[r]) for r, d in enumerate(depths)])
        lp, ids = expand(j - 1, parent_slots, level_tokens).float().topk(width, dim=-1)
        scores = level_scores[..., None] + lp.view(rows, width, width).double()  # [R, parent, child]
        ok = (level_scores[..., None] > NEG) & alive[:, None, :]
        scores = torch.where(ok, scores, NEG).view(rows, -1)
        need = torch.maximum(level_need[..., None], rank + 1).reshape(rows, -1)
        parent = level_made[..., None].expand(-1, -1, width).reshape(rows, -1)
        ids = ids.view(rows, -1)
        parts.append((ids, scores, parent, need))
        best = scores.sort(dim=-1, descending=True, stable=True).indices[:, :width]  # ties: the earlier made
        parent_slots = torch.div(best, width, rounding_mode="floor")
        level_scores = torch.where(within, scores.gather(1, best), NEG)
        level_tokens, level_made = ids.gather(1, best), made + best
        level_need = torch.maximum(need.gather(1, best), rank + 1)
        made += width * width
    tokens, scores, parents, needs = (torch.cat([p[i] for p in parts], -1) for i in range(4))
    depth = torch.cat([torch.full((p[0].shape[-1],), j + 1, device=tokens.device) for j, p in enumerate(parts)])
    order = scores.sort(dim=-1, descending=True, stable=True).indices[:, :nodes]
    take = [order, tokens.gather(1, order), parents.gather(1, order), needs.gather(1, order),
            depth.expand(rows, -1).gather(1, order), (scores.gather(1, order) > NEG).long()]
    return torch.stack([t.long() for t in take])


def read_picked(picked: torch.Tensor) -> list[tuple[list[int], list[int], list[int]]]:
    """The picked candidates read to the host (the step's one read), each row's ordered as ``rerank`` orders
    them: by depth, then by score."""
    rows, picked = picked.shape[1], picked.tolist()
    out = []
    for r in range(rows):
        chosen = [c for c in zip(*(field[r] for field in picked), strict=True) if c[5]]
        kept = sorted(range(len(chosen)), key=lambda i: (chosen[i][4], i))  # by depth, then by score as ranked
        at = {chosen[i][0]: new for new, i in enumerate(kept)}
        out.append(([chosen[i][1] for i in kept], [-1 if chosen[i][2] < 0 else at[chosen[i][2]] for i in kept],
                    [chosen[i][3] for i in kept]))
    return out
