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

The drafters grow the same tree on the device (:mod:`specbench.drafting.device_tree`, tested equal to this one,
ties included); this module is its plain statement and the reference those tests check against.

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
    return grow_rows([root_logprobs], lambda rows, levels, trees: [expand(levels[0], trees[0])], depths=[depth],
                     top_ks=[top_k])[0]


def grow_rows(roots: list[torch.Tensor], expand: Callable[[list[int], list[list[int]], list[Tree]],
                                                           list[torch.Tensor]], *, depths: list[int],
              top_ks: list[int]) -> list[Tree]:
    """:func:`grow` for the drafts of several rows in lockstep (a batch): ``expand(rows, levels, trees)`` takes
    the rows still growing with their levels and returns each one's children's log-probabilities, so one draft
    forward serves every row's level, and the level of every row crosses from the device in one read."""
    trees, most = [Tree() for _ in roots], max(top_ks)
    lp, ids = top_rows(torch.stack([r.float() for r in roots]), most)
    levels, expanded = [], []
    for tree, row_lp, row_ids, k in zip(trees, lp, ids, top_ks, strict=True):
        level = [tree.add(t, -1, s, r + 1) for r, (t, s) in enumerate(zip(row_ids[:k], row_lp[:k], strict=True))]
        levels.append(level)
        expanded.append({i: tree.needs[i] for i in level})  # on a level: the narrowest top-k that surely expands it
    for step in range(max(depths) - 1):
        live = [r for r in range(len(trees)) if levels[r] and step + 1 < depths[r]]
        if not live:
            break
        outs = expand(live, [levels[r] for r in live], [trees[r] for r in live])
        lp, ids = top_rows(torch.cat([o.float() for o in outs]), most)  # [k, k] each, as host lists
        at = 0
        for r, out in zip(live, outs, strict=True):
            tree, k, made, cum = trees[r], top_ks[r], [], []
            for parent, row_lp, row_ids in zip(levels[r], lp[at : at + out.shape[0]], ids[at : at + out.shape[0]],
                                               strict=True):
                base = tree.scores[parent]
                for rank, (s, tok) in enumerate(zip(row_lp[:k], row_ids[:k], strict=True)):
                    cum.append(base + s)
                    made.append(tree.add(tok, parent, base + s, max(expanded[r][parent], rank + 1)))
            at += out.shape[0]
            best = sorted(range(len(made)), key=lambda j: (-cum[j], j))[:k]
            levels[r] = [made[j] for j in best]
            expanded[r] = {i: max(tree.needs[i], rank + 1) for rank, i in enumerate(levels[r])}
    return trees


def top_rows(logprobs: torch.Tensor, top_k: int) -> tuple[list[list[float]], list[list[int]]]:
    """Each row's ``top_k`` best log-probabilities and their token ids, read to the host together (one ``tolist``;
    ids are exact as float32 up to 2^24)."""
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
