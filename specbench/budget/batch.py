"""``budget=auto`` at batch size B > 1: one step's block split across the rows (docs/batches.md).

A batched step is one forward of every live row, each row's block padded to the longest, attention reading up
to the longest row: t(q, ĉ, B). Each row's own planner (acceptance shared by all) scores its guesses and picks
its aux nodes, pricing its block at what it adds to the step (:class:`RowShare`); then one block q for every
row maximises the batch's expected tokens per second (:func:`best_block`). At batch size 1 the row's own plan
is kept, exactly as :class:`~specbench.budget.planner.AutoBudget` alone plans it.
"""

from __future__ import annotations

import numpy as np

from specbench.budget.costs import CostModel
from specbench.budget.planner import AutoBudget
from specbench.budget.pools import aux_count
from specbench.core.draft import Draft


class RowShare:
    """What a row's block of q tokens costs this step's batched forward (the batch set by :meth:`at`): its share
    of the plain step and the whole rise its block makes, t(1, ĉ, B) / B + t(q, ĉ, B) − t(1, ĉ, B)."""

    def __init__(self, curve: CostModel) -> None:
        self.curve, self.batch, self.context = curve, 1, None

    def at(self, batch: int, context: float) -> None:
        self.batch, self.context = batch, context

    def __call__(self, q: float, context: float = 0) -> float:
        """At batch size 1 the row's own context; in a batch, the batch's longest row's."""
        if self.batch == 1:
            return self.curve(q, context)
        plain = self.curve(1, self.context, self.batch)
        return plain / self.batch + self.curve(q, self.context, self.batch) - plain


class BatchBudget:
    """Plans every row's draft of a batched step under one cost curve."""

    def __init__(self, curve: CostModel, aux_feeds: tuple[str, ...] = (), **planner_kw) -> None:
        self.curve, self.share = curve, RowShare(curve)
        self.first = AutoBudget(self.share, aux_feeds=aux_feeds, **planner_kw)
        self.blocks: list[tuple[int, int]] = []  # (batch size, block) of every batched step

    def planner(self) -> AutoBudget:
        """The first request's planner; others :meth:`~AutoBudget.spawn` from it."""
        return self.first

    def __call__(self, planners: list[AutoBudget], drafts: list[Draft], seqs: list[list[int]]) -> list[Draft]:
        """The part of each row's draft to verify in this step (``seqs``: each row's tokens, its root last)."""
        batch = len(drafts)
        context = max(len(s) for s in seqs)  # attention reads up to the longest row
        self.share.at(batch, context)
        choices = [p.choose(d, s) for p, d, s in zip(planners, drafts, seqs, strict=True)]
        if batch > 1:
            sizes = [1 + aux_count(d, width) for d, (width, _, _) in zip(drafts, choices, strict=True)]
            orders = [best_first(scores) for _, _, scores in choices]
            q = best_block(sizes, [[scores[i] for i in order] for order, (_, _, scores) in
                                   zip(orders, choices, strict=True)], lambda q: self.curve(q, context, batch))
            self.blocks.append((batch, q))
            choices = [(width, sorted(order[: q - size]), scores)
                       for (width, _, scores), order, size in zip(choices, orders, sizes, strict=True)]
        return [p.settle(d, s, width, keep)
                for p, d, s, (width, keep, _) in zip(planners, drafts, seqs, choices, strict=True)]


def best_first(scores: list[float]) -> list[int]:
    """The guesses worth anything, best first; ties by position, so parents come before their children."""
    return sorted((i for i, x in enumerate(scores) if x > 0), key=lambda i: (-scores[i], i))


def best_block(sizes: list[int], ranked: list[list[float]], seconds) -> int:
    """The block (tokens per row) that maximises the batch's expected tokens per second: row ``r`` sends its
    ``sizes[r]`` fixed tokens (root, aux nodes) and then as many of its ``ranked[r]`` guess scores (best first)
    as fit; ``seconds(q)`` prices a step of q tokens in every row."""
    floor = max(sizes)
    top = max(size + len(r) for size, r in zip(sizes, ranked, strict=True))
    sums = [np.concatenate([[0.0], np.cumsum(r)]) for r in ranked]  # a row's gain from its best k guesses
    best_q, best_rate = floor, -1.0
    for q in range(floor, top + 1):
        gain = sum(1 + s[min(q - size, len(s) - 1)] for size, s in zip(sizes, sums, strict=True))
        rate = gain / seconds(q)
        if rate > best_rate:
            best_q, best_rate = q, rate
    return best_q
