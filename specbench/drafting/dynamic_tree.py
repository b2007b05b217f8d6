"""EAGLE-2's dynamic draft tree: expand by cumulative confidence, then re-rank every node to a budget.

A node's score is the sum of the draft's log-probabilities along its path (the log of its estimated chance
of being accepted). The root's top-k tokens make the first level; then, ``depth - 1`` times, the k
best-scored nodes of the newest level are expanded together (one draft forward for the k of them), each
into its k best children, and the k best of those k² go on. Every node produced (k + (depth - 1)·k²) is a
candidate; the ``nodes`` best-scored candidates are the draft. A child never scores above its parent, and
ties go to the node made first, so the chosen set is closed under parents.

``depth`` counts the draft's levels: the reference's ``depth`` is one less (its first level is not
counted), and its ``total_token`` one more (it counts the root).

A narrower top-k w drafts a subset of these candidates: a node is surely among them when its parent is surely
expanded at w and it is among its parent's w best children, and it is surely expanded when, beyond that, it
ranks among the w best of its level (a narrower level competes with a subset of the same nodes, so its rank
there is no worse). Each candidate records that narrowest w (``Tree.needs``), so what a narrower tree would
have drafted is read off the full one (``budget=auto`` prices the top-k by it).

Pure: the draft model enters through ``expand``, which maps the nodes of one level to their children's
log-probabilities; tested by hand on made-up ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class Tree:
    """Candidates in the order they were made: ``parents[i]`` is -1 (the root) or an earlier index."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    needs: list[int] = field(default_factory=list)  # the narrowest top-k that surely drafts the node too

    def add(self, token: int, parent: int, score: float, need: int = 1) -> int:
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.scores.append(float(score))
        self.needs.append(need)
        self.depths.append(1 if parent < 0 else self.depths[parent] + 1)
        return len(self.tokens) - 1


def grow(root_logprobs: torch.Tensor, expand: Callable[[list[int], Tree], torch.Tensor], *, depth: int,
         top_k: int) -> Tree:
    """Every candidate: the first level from ``root_logprobs`` [V]; ``expand(level, tree)`` returns
    [len(level), V] log-probabilities of the children of the candidates ``level``.

    Each level crosses from the device once: its top-k log-probabilities and token ids in one read (ids are
    exact as float32 up to 2^24). Scores add up on the host, where the tree lives."""
    tree = Tree()
    lp, ids = _top(root_logprobs.float()[None], top_k)
    level = [tree.add(t, -1, s, r + 1) for r, (t, s) in enumerate(zip(ids[0], lp[0], strict=True))]
    expanded = {i: tree.needs[i] for i in level}  # a node on a level expanded: the narrowest top-k that surely does
    for _ in range(depth - 1):
        if not level:
            break
        lp, ids = _top(expand(level, tree).float(), top_k)  # [k, k] each, as host lists
        made, cum = [], []
        for parent, row_lp, row_ids in zip(level, lp, ids, strict=True):
            base = tree.scores[parent]
            for r, (s, tok) in enumerate(zip(row_lp, row_ids, strict=True)):
                cum.append(base + s)
                made.append(tree.add(tok, parent, base + s, max(expanded[parent], r + 1)))
        best = sorted(range(len(made)), key=lambda j: (-cum[j], j))[:top_k]
        level = [made[j] for j in best]
        expanded = {i: max(tree.needs[i], rank + 1) for rank, i in enumerate(level)}
    return tree


def _top(logprobs: torch.Tensor, top_k: int) -> tuple[list[list[float]], list[list[int]]]:
    """Each row's ``top_k`` best log-probabilities and their token ids, read to the host together."""
    lp, ids = logprobs.topk(min(top_k, logprobs.shape[-1]), dim=-1)
    both = torch.stack([lp, ids.to(lp.dtype)]).tolist()
    return both[0], [[int(t) for t in row] for row in both[1]]


def rerank(tree: Tree, nodes: int) -> tuple[list[int], list[int], list[float], list[int]]:
    """The ``nodes`` best candidates as a draft: (tokens, parents, scores, needs), parents first, siblings in
    descending score (the order sampling tries them in)."""
    order = sorted(range(len(tree.tokens)), key=lambda i: (-tree.scores[i], i))[:nodes]
    chosen = set(order)
    for i in order:  # closed under parents (a no-op unless scores were not monotone)
        p = tree.parents[i]
        while p >= 0 and p not in chosen:
            chosen.add(p)
            p = tree.parents[p]
    kept = sorted(chosen, key=lambda i: (tree.depths[i], -tree.scores[i], i))
    at = {old: new for new, old in enumerate(kept)}
    parents = [-1 if tree.parents[i] < 0 else at[tree.parents[i]] for i in kept]
    return [tree.tokens[i] for i in kept], parents, [tree.scores[i] for i in kept], [tree.needs[i] for i in kept]
