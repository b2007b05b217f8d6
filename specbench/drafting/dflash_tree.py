"""DFlash's block read as a tree, best first (DDTree's reading of a block-diffusion draft).

One forward of the DFlash drafter gives, for each position k = 1 … D after the root, log-probabilities over the
vocabulary of the token k places after it. Nothing in the block ties position k's token to position k − 1's,
so the positions are taken as independent: a path's score is the sum of its tokens' log-probabilities, each at
its own position (the log of its estimated chance of being accepted whole).

The tree grows best first. The root (score 0) is expanded first: its children are position 1's ``top_k``
best tokens, each scored by its log-probability. Then, repeatedly, the frontier node of the highest score is
taken (ties: the node made first), added to the tree, and its children made: position (its depth + 1)'s
``top_k`` best tokens, each scored the parent's score plus its log-probability, in rank order. Growth stops
at ``nodes`` nodes, or when the frontier is empty (every path reached depth D). With ``top_k = 1`` the tree is
the chain of the positions' argmaxes (the plain DFlash draft).

A child never scores above its parent, so nodes are added in descending score: parents before children, and
siblings in descending score (the order sampling tries them in), as :class:`specbench.core.draft.Draft` needs.
Each node also records the narrowest top-k that surely drafts it too (the largest rank on its path): a
narrower top-k only takes competitors away, so ``budget=auto`` can read what a narrower tree drafts off this
one (``Draft.needs``, as EAGLE-2's tree records it).

Pure: log-probabilities in (one read from the device: every position's top-k values and ids together), lists
out; no model.
"""

from __future__ import annotations

import heapq

import torch

from specbench.drafting.dynamic_tree import Tree, top_rows


def grow(lps: list[list[float]], ids: list[list[int]], nodes: int) -> Tree:
    """The best-first tree of at most ``nodes`` nodes over positions whose best tokens are ``ids[k]`` with
    log-probabilities ``lps[k]`` (best first; row k is position k + 1, its length the top-k)."""
    tree = Tree()
    frontier: list[tuple[float, int, float, int, int, int, int]] = []  # (-score, made, score, token, parent,
    made = 0  # depth, need): heapq pops the highest score, ties by the order made

    def children(parent: int, depth: int, score: float, need: int) -> None:
        nonlocal made
        if depth >= len(lps):
            return
        for rank, (lp, tok) in enumerate(zip(lps[depth], ids[depth], strict=True)):
            heapq.heappush(frontier, (-(score + lp), made, score + lp, tok, parent, depth + 1, max(need, rank + 1)))
            made += 1

    children(-1, 0, 0.0, 1)
    while frontier and len(tree.tokens) < nodes:
        _, _, score, tok, parent, depth, need = heapq.heappop(frontier)
        children(tree.add(tok, parent, score, need), depth, score, need)
    return tree


def best_first(logprobs: torch.Tensor, nodes: int, top_k: int) -> Tree:
    """The tree of :func:`grow` from ``logprobs`` [D, V] (row k - 1: position k's log-probabilities)."""
    if nodes < 1 or logprobs.shape[0] == 0:
        return Tree()
    return grow(*top_rows(logprobs.float(), top_k), nodes)
