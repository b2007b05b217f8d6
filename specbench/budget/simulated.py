"""A decode loop without a model, for the planner: drafts whose guesses are right with a set chance, drafting
seconds from a clock the caller sets (drift, spikes), the forward priced by a curve. What the planner decides,
and what the run lost, can then be asserted exactly (the planner's tests) or tabled (``bench/explore_sim.py``),
and nothing waits on the wall clock."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from specbench.budget.costs import CostModel
from specbench.budget.planner import AutoBudget
from specbench.core.draft import Draft

# a CPU-like curve: a plain step 20 ms, each guess verified 0.5-1 ms more
CPU = CostModel(qs=[1, 2, 4, 8, 16], contexts=[0], seconds=[[0.020, 0.021, 0.023, 0.027, 0.035]])


@dataclass
class Run:
    steps: int = 0
    tokens: int = 0
    caps: list[tuple] = field(default_factory=list)  # per step: (depth, top-k) drafted (0: none)
    over: list[float] = field(default_factory=list)  # per step: regret less allowance after it


def tree(right: list[int], wrong: list[int], width: int, ranks: list[int]) -> Draft:
    """A tree drafted level by level at top-k ``width``: at level k the right token sits at sibling rank
    ``ranks[k]`` among ``wrong`` ones (at ``width`` or beyond: not drafted); the right one, else the first, has
    the next level's children. ``needs``: a guess at rank r needs a top-k of r + 1."""
    tokens, parents, needs, parent = [], [], [], -1
    for k, token in enumerate(right):
        first = len(tokens)
        for r in range(width):
            tokens.append(token if r == ranks[k] else -wrong[k] - r)
            parents.append(parent)
            needs.append(r + 1)
        parent = first + (ranks[k] if ranks[k] < width else 0)
    return Draft(tokens=tokens, parents=parents, sources=["sim"] * len(tokens), tree_width=width, needs=needs)


def simulate(planner: AutoBudget, steps: int, accept: float | Callable[[int], float],
             clock: Callable[[int, int, int], float], depth: int = 5, top_k: int = 0,
             rank: Callable[[random.Random], int] | None = None, seed: int = 0) -> Run:
    """``steps`` decode steps. A chain of ``depth`` guesses (capped by the planner), each right with chance
    ``accept`` (or ``accept(step)``); or with ``top_k``, a :func:`tree` whose right token sits at the sibling
    rank ``rank(rng)`` draws. ``clock(step, depth, top_k)``: the drafting seconds of a step that drafted to ``depth`` at ``top_k``
    (0: a stopped step)."""
    rng, run = random.Random(seed), Run()
    text = [rng.randrange(1, 10**6) for _ in range(steps * (depth + 1) + 1)]  # what the target decodes
    pos = 0  # text[:pos + 1] is decoded, the root last
    for step in range(steps):
        chance = accept(step) if callable(accept) else accept
        cap = planner.cap()
        d = depth if cap is None else min(cap, depth)
        w = (planner.width_cap or top_k) if top_k and d else 0
        truth = text[pos + 1 : pos + 1 + d]
        if top_k:
            draft = tree(truth, [rng.randrange(10**6, 10**7) for _ in truth], w,
                         [rank(rng) if rng.random() < chance else top_k for _ in truth])
        else:
            draft = Draft.chain([t if rng.random() < chance else -t for t in truth], "sim")
        planned = planner.plan(draft, text[: pos + 1])
        path = []
        for i, (token, parent) in enumerate(zip(planned.tokens, planned.parents, strict=True)):
            if token == text[pos + 1 + len(path)] and parent == (path[-1] if path else -1):
                path.append(i)
        planner.record(planned, path, draft_s=clock(step, d, w))
        pos += len(path) + 1
        run.steps, run.tokens = run.steps + 1, run.tokens + len(path) + 1
        run.caps.append((d, w))
        run.over.append(planner.regret - planner.allowance())
    planner.finish(text[: pos + 1])
    return run


def level_clock(base: float = 0.0002, per_level: float = 0.002, stopped: float = 0.0001, drift: float = 0.0,
                spikes: int = 0, steps: int = 1, factor: float = 2.0):
    """Drafting seconds: ``base + per_level × depth``, growing by ``drift`` over ``steps`` steps, ``factor`` times
    that every ``spikes``-th step; ``stopped`` for a step that drafts nothing."""
    def clock(step: int, depth: int, top_k: int = 0) -> float:
        if not depth:
            return stopped
        spike = factor if spikes and step % spikes == 0 else 1.0
        return (base + per_level * depth) * (1 + drift * step / steps) * spike
    return clock


def calibrated(clock, depth=5, top_k=0, static=False, catches_up=False, cost: CostModel = CPU, **kw) -> AutoBudget:
    """A planner on ``cost`` starting from the drafting table a warm-up generation measured with ``clock`` (as a
    run's)."""
    warm = AutoBudget(cost, calibrating=True, catches_up=catches_up)
    simulate(warm, 16, 0.5, clock, depth=depth, top_k=top_k, rank=lambda rng: 0)
    return AutoBudget(cost, drafting=warm.drafting.copy(frozen=static), static=static, catches_up=catches_up, **kw)
