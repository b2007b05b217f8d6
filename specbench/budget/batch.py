"""``budget=auto`` at batch size B > 1: one step's block split across the rows.

A batched step is one forward of every live row, each row's block padded to the
longest (``Target.forward_rows``), attention reading up to the longest row: it
costs t(q, ĉ, B), the measured curve of B rows of q tokens whose longest context
is ĉ, the rows at staggered lengths (:func:`specbench.budget.costs.measure_batch`).
Guesses below the longest block ride in padding that is computed anyway, and one
row's long block makes every row's step longer.

* **Each row's own planner** (:class:`~specbench.budget.planner.AutoBudget`, one
  per request, the acceptance statistics shared by all of them) scores its
  guesses and decides its aux nodes as at batch size 1, pricing a block of q
  tokens at what it adds to the batch's step when the other rows send their
  root alone (:class:`RowShare`): its share of the plain step, t(1, ĉ, B) / B,
  plus the whole rise t(q, ĉ, B) − t(1, ĉ, B), since its block pads every row.
* **The block.** With those aux nodes fixed, the step's block q is the one that
  maximises the batch's expected tokens per second, Σ_r (1 + Σ of row r's best
  q − 1 − aux_r scores) / t(q, ĉ, B): every row keeps as many of its guesses as
  fit in q, best first (parents before children). Rows whose guesses are worth
  little leave q at the aux nodes' size (1 with none): no guesses at all when
  drafting does not pay at this batch size.

At batch size 1 the rows' own plans are kept as they are, so a batch of one
plans exactly as :class:`~specbench.budget.planner.AutoBudget` alone.
"""

from __future__ import annotations

import numpy as np

from specbench.budget.costs import CostModel
from specbench.budget.planner import AutoBudget, aux_count
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
