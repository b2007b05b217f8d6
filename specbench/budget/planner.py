"""``budget=auto`` and ``budget=static``: each step drafts and verifies what pays on this machine.

One rule decides every step: among no draft and the drafter's options (a depth cap, a tree's top-k, a pool width),
the best expected tokens per second, (1 + expected accepted) / (forward seconds + drafting seconds), the forward
priced by the cost curve, drafting by :class:`~specbench.budget.drafting.DraftingCost`, acceptance by
:mod:`specbench.budget.acceptance`, scaled by the run's accepted over expected guesses (:attr:`realism`). Before the
proposal it caps what the drafter drafts (0: no draft); after it, it keeps the best prefix of the guesses and the
aux columns that pay. After ``EXPLORE_EVERY`` steps, one probes a level past the rule's choice, the wait doubled per
plain step's worth probes (a first draft among them) lost since one last paid. A stopped step is bookkeeping: one
look at the cost curve, none at the guesses. The regret (what drafting lost against plain decoding, in plain steps)
stays within an allowance checked before every step: a cap, not a target. ``static`` prices drafting from a stored
table, never the clock. Outputs never change: a smaller draft is still a draft. docs/budget.md explains each part.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from specbench.budget.acceptance import AcceptanceStats, fed, node_scores
from specbench.budget.costs import CostModel
from specbench.budget.drafting import WINDOW, DraftingCost
from specbench.budget.pools import aux_count, subdraft, widths
from specbench.core.draft import Draft

BUDGETS = ("fixed", "auto", "static", "replay")  # replay: a recorded run's decisions (specbench.budget.replay)
EXPLORE_EVERY = 16  # steps away from the method's own draft before a probe (doubled per step's worth lost)
ALLOWANCE_SHARE = 0.01  # the regret stays within this share of the run's modelled time …
ALLOWANCE_FLOOR = 2.0  # … plus this many plain steps: room for a first draft costing a step, at SPIKE
SPIKE = 2.0  # an option's worst case counts its drafting at this multiple of the modelled seconds
TRUST = 8.0  # guesses expected and accepted alike that the realism starts from: one bad draft moves it little
FADE = 1 - 1 / WINDOW  # what each step keeps of the realism's record: the last ~32 steps, so a low one recovers
WAIT_GROWTH = 2  # the wait before a probe grows this many times per plain step's worth probes lost since one
# paid: what probing loses grows as the log of the run (tests/budget/test_planner.py, 5,000 steps)
PROBE_STEP = 1  # a probe drafts this many levels past the rule's choice: the nearest depth its table does not know
FRESH_SAMPLES = 2  # an option's sample after a probe or the method's own new draft weighs at least 1/(2 + 1): a
# table entry built while it did not pay moves within a few samples once it does
STATIC_SPIKE = 1.0  # budget=static prices a forced step's drafting at its stored table's seconds: no clock, no spike
WHY = ("first", "chosen", "explored", "plain", "calibrating")  # what decided a step (AutoBudget.why)


def loss(seconds: float, plain: float, accepted: float = 0.0) -> float:
    """What a step of ``seconds`` that brings 1 + ``accepted`` tokens loses against plain steps of ``plain``
    seconds, in plain steps (below 0: it gains)."""
    return (seconds - (1 + accepted) * plain) / plain


def best_prefix(scores: list[float], cost: CostModel, fixed_q: int, context: int, extra_s: float = 0.0,
                fits: Callable[[float], bool] = lambda seconds: True) -> tuple[list[int], float]:
    """The guesses to keep (parents first) and the step's expected tokens per second, ``fixed_q`` tokens (root,
    aux nodes) and ``extra_s`` seconds of drafting beside them; no forward longer than ``fits`` allows."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    best_k, best_rate, gain = 0, 1.0 / (cost(fixed_q, context) + extra_s), 1.0
    for k, i in enumerate(order, start=1):
        seconds = cost(fixed_q + k, context)
        if scores[i] <= 0 or not fits(seconds):
            break
        gain += scores[i]
        if gain / (seconds + extra_s) > best_rate:
            best_k, best_rate = k, gain / (seconds + extra_s)
    return sorted(order[:best_k]), best_rate


class Option(NamedTuple):
    """A way to draft a step: the depth, a tree's top-k and a pool's width. As a step's caps, None is the method's
    own and depth 0 no draft; as a key of :attr:`AutoBudget.options`, what was drafted (top-k 0: a chain)."""

    depth: int | None
    top_k: int | None = None
    pool: int | None = None

    @property
    def own(self) -> bool:
        """The method's own depth and top-k (its pool width may still be capped)."""
        return self.depth is None and self.top_k is None


OWN, PLAIN = Option(None), Option(0)


@dataclass
class Seen:
    """What an option brought on the steps it was weighed on (running means): guesses accepted, guesses verified
    and aux nodes verified; ``steps``: how many (a fresh sample weighs at least 1/(FRESH_SAMPLES + 1))."""

    steps: int = 0
    accepted: float = 0.0
    guesses: float = 0.0
    aux: float = 0.0


@dataclass
class StepPlan:
    """One step's plan: its caps and why (:data:`WHY`), what the proposal drafted (depth, top-k), each guess's
    score (until the step is settled), what it kept (guesses, aux columns), and what it predicted (tokens, seconds)."""

    caps: Option
    why: str
    drafted: tuple[int, int] = (0, 0)
    scores: list[float] = field(default_factory=list)
    keep: list[int] = field(default_factory=list)
    width: int = 0
    proposed: int = 0
    predicted: tuple[float, float] = (1.0, 0.0)
    bet: float = 0.0  # the guesses the kept ones expect, unscaled by the realism: what the realism compares with


class Pending(NamedTuple):
    """A verified draft whose guesses the output has yet to judge: where its root was, the pool width it was sent
    with, its full width, and the depth counted to so far."""

    draft: Draft
    start: int
    width: int
    full: int
    counted: int = 0


class AutoBudget:
    """Decides each step's draft under a cost curve; learns acceptance from every step it planned.
    ``static``: drafting priced by ``drafting`` alone, never by the clock; ``calibrating``: a warm-up that
    drafts at several depths and top-ks to measure what drafting costs (``drafting``), deciding nothing;
    ``catches_up``: the drafter's (:attr:`~specbench.core.draft.Drafter.catches_up`): a draft after a pause is
    priced by the tokens committed since (else that column of the fit stays zero)."""

    def __init__(self, cost: CostModel, aux_feeds: tuple[str, ...] = (), drafting: DraftingCost | None = None,
                 static: bool = False, stats: AcceptanceStats | None = None, calibrating: bool = False,
                 catches_up: bool = False) -> None:
        self.cost, self.aux_feeds, self.static, self.calibrating = cost, tuple(aux_feeds), static, calibrating
        self.catches_up = catches_up
        self.drafting = drafting if drafting is not None else DraftingCost(frozen=static and not calibrating)
        self.stats = stats if stats is not None else AcceptanceStats()
        self.options: dict[Option, Seen] = {}  # what each option drafted brought (depth, top-k, pool width)
        self.deepest = self.top_k = self.pool = 0  # the method's own depth, top-k and pool width, as drafted
        self.regret = self.elapsed = 0.0  # in plain steps' worth of modelled time
        self.behind = 0  # tokens a drafter that catches up has not: the prompt (start), then plain steps' tokens
        self.context = 0  # tokens of the text so far
        self.skipped = 0  # steps since the method's own draft or a probe
        self.explored = 0.0  # plain steps' worth explorations lost since one paid or the rule took its own draft
        self.step = StepPlan(PLAIN, "")  # this step's plan (before the first: none)
        self.history: list[StepPlan] = []  # every step's
        self._pending: list[Pending] = []
        self._need = float("inf")  # after a plain decision: the loss the best option that did not fit needs
        self._quiet = 0  # … and the steps skipped before which plain needs no second look (nothing to learn)
        self._own: Draft | None = None  # the last proposal of the method's own draft
        self.realized = [0.0, 0.0]  # guesses accepted on verified steps, and what the model expected (FADE)

    why = property(lambda self: [s.why for s in self.history], doc="per step: what decided it (WHY)")
    widths = property(lambda self: [s.width for s in self.history], doc="per step: aux columns sent")
    kept = property(lambda self: [len(s.keep) for s in self.history], doc="per step: guesses verified")
    proposed = property(lambda self: [s.proposed for s in self.history], doc="per step: guesses proposed")

    def spawn(self) -> AutoBudget:
        """A planner for a request decoded beside this one: the same costs and acceptance counts."""
        return AutoBudget(self.cost, self.aux_feeds, self.drafting, self.static, self.stats, self.calibrating,
                          self.catches_up)

    def new_category(self) -> None:
        """A new dataset category: acceptance is learned afresh (a category's figures never depend on the order)."""
        self.stats.clear()
        self.options.clear()
        self.realized = [0.0, 0.0]
        self.skipped, self.explored, self._quiet, self._need = 0, 0.0, 0, float("inf")

    def start(self, prompt_len: int) -> None:
        """A generation begins: the drafter has yet to catch up on its prompt, which its first draft pays for."""
        self.behind, self.context = prompt_len if self.catches_up else 0, prompt_len

    def finish(self, tokens: list[int]) -> None:
        """The generation ended with ``tokens``: count what can still be judged, forget the rest."""
        self._resolve(tokens, final=True)
        self._pending = []
        self.behind = 0  # the next generation's drafter starts from its prompt

    # -- observe: what the output shows of the drafts verified, and what each option would have brought --------

    def _resolve(self, tokens: list[int], final: bool = False) -> None:
        """Count what the output shows of each pending draft, level by level; keep those not counted through."""
        waiting = []
        for p in self._pending:
            counted = self.stats.observe_output(p.draft, tokens[p.start:], final,
                                                lambda s, w=p.width, f=p.full: fed(s, self.aux_feeds, w, f), p.counted)
            if counted < max(p.draft.depths(), default=0):
                waiting.append(p._replace(counted=counted))
        self._pending = waiting

    def _learn(self, draft: Draft, per: dict[int, tuple], caps: tuple, beyond: tuple | None = None) -> None:
        """What a proposal drafted within ``caps`` (depth, top-k) would verify, and expect to be accepted, at each
        option: its kept guesses up to depth d, of a tree those a top-k of w drafts too, at each pool width
        (expectations under the acceptance model). A fresh sample weighs a third, what the means held being old:
        an exploration's proposal, and past ``beyond`` (the step's own caps) the last proposal of the method's own
        draft, re-scored at today's rates."""
        depths = np.asarray(draft.depths(), dtype=int)
        needs = np.asarray(draft.needs or [1] * len(draft), dtype=int)
        fresh = beyond is not None or (self.step.why == "explored" and len(draft))
        for a, (keep, scores, _) in per.items():
            kept, chance = depths[keep], np.asarray(scores, dtype=float)[keep] if keep else np.zeros(0)
            for w in widths(self.top_k) if self.top_k else [0]:
                if w > caps[1]:
                    continue
                within = needs[keep] <= w if w else np.ones(len(keep), bool)
                gain = np.cumsum(np.bincount(kept[within], weights=chance[within], minlength=caps[0] + 1))
                count = np.cumsum(np.bincount(kept[within], minlength=caps[0] + 1))
                for d in range(1, caps[0] + 1):
                    if beyond is not None and d <= beyond[0] and w <= beyond[1]:
                        continue
                    seen, at = self.options.setdefault(Option(d, w, a), Seen()), min(d, len(gain) - 1)
                    seen.steps = (min(seen.steps, FRESH_SAMPLES) if fresh else seen.steps) + 1
                    v = max(1 / WINDOW, 1 / seen.steps)
                    seen.accepted += v * (gain[at] - seen.accepted)
                    seen.guesses += v * (count[at] - seen.guesses)
                    seen.aux += v * (aux_count(draft, a) - seen.aux)

    # -- price: what a draft's guesses and its drafting are worth ----------------------------------------------

    @property
    def realism(self) -> float:
        """Guesses accepted over guesses expected on the steps verified so far (:data:`TRUST` of each to start):
        what the acceptance model's scores are scaled by, since the steps it drafts are those whose estimates ran
        high (the winner's curse) and bring fewer tokens than expected."""
        return (self.realized[0] + TRUST) / (self.realized[1] + TRUST)

    def _spent(self) -> float:
        """The step's drafting seconds as the model prices them."""
        return self.drafting(*self.step.drafted, self.behind) if self.step.caps.depth != 0 else self.drafting.stopped

    def _weigh(self, draft: Draft, spent: float, caps: Option = OWN) -> dict[int, tuple]:
        """Each pool width of ``draft``: the guesses worth verifying beside it (none past ``caps``), their scores,
        its fixed block."""
        full, depth, real = draft.aux_width, max(draft.depths(), default=0), self.realism
        beyond = [d > (caps.depth or depth) or n > (caps.top_k or n)  # drafted past its caps
                  for d, n in zip(draft.depths(), draft.needs or [1] * len(draft), strict=True)]
        per = {}
        for width in [0, *widths(full)] if full else [0]:
            scores = node_scores(draft, self.stats, lambda s, w=width: fed(s, self.aux_feeds, w, full))
            scores = [0.0 if past else x * real for x, past in zip(scores, beyond, strict=True)]
            fixed = 1 + aux_count(draft, width)
            per[width] = (best_prefix(scores, self.cost, fixed, self.context, spent)[0], scores, fixed)
        return per

    # -- choose: the step's caps before its proposal, then what of it to verify --------------------------------

    def cap(self) -> int | None:
        """Before the step's proposal: the deepest guess to draft (0: none; None: the method's own)."""
        self.step = StepPlan(*(self._calibration_step() if self.calibrating else self._decide()))
        self.history.append(self.step)
        return self.step.caps.depth

    @property
    def width_cap(self) -> int | None:
        """After :meth:`cap`: the widest top-k to draft a tree with (None: the method's own)."""
        return self.step.caps.top_k

    def _decide(self) -> tuple[Option, str]:
        """The rule, before the step's proposal: with nothing measured, the method's own draft if its worst case
        fits; else the option of the best expected tokens per second that fits, against no draft; once the wait is
        up, a probe one level past that choice if its worst case fits; after a plain decision, plain again without
        a second look until a probe is due, a pending draft may teach something, or the room grows to what the
        best refused option needed."""
        if self.skipped < self._quiet and not self._fits(self._need):
            return PLAIN, "plain"  # nothing learned since, and no more room: plain until the next exploration
        t1, wait = self.cost(1, self.context), EXPLORE_EVERY * WAIT_GROWTH ** min(self.explored, 64)  # 2⁶⁴: never
        self._need, self._quiet = float("inf"), 0
        if not self.options:  # nothing measured: the method's own draft, if drafting it cannot break the cap
            first = self._worst(t1, self.drafting(self.deepest or self.drafting.deepest or 1,
                                                  self.top_k or self.drafting.widest, self.behind), t1)
            if self._fits(first):
                return OWN, "first"
            self._need, self._quiet = first, float("inf")  # plain until there is room
            return PLAIN, "plain"
        best, top = None, (1.0 / (t1 + self.drafting.stopped),)
        for option, seen in self.options.items():
            forward, drafting = self.cost(1 + seen.aux + seen.guesses, self.context), self.drafting(
                option.depth, option.top_k, self.behind)
            rank = ((1 + seen.accepted) / (forward + drafting), option.pool, option.depth, option.top_k)  # ties:
            if rank > top:  # the wider pool, then the deeper draft
                expected = loss(forward + drafting, t1, seen.accepted)  # below 0 for one that pays
                if self._fits(expected):
                    best, top = option, rank
                else:  # it would pay better, but the regret has no room for it yet: the room it needs
                    self._need = min(self._need, expected)
        probe = Option(min(self.deepest, (best.depth if best else 0) + PROBE_STEP), self.top_k, self.pool)
        seen = self.options.get(probe)  # the probe: past the rule's choice, at the method's own top-k and pool
        if self.skipped >= wait and best != probe and seen and self._fits(self._worst(
                self.cost(1 + seen.guesses + seen.aux, self.context), self.drafting(*probe[:2], self.behind), t1)):
            self.skipped = 0
            return self._caps(probe), "explored"
        if best is None:
            self._quiet = 0 if self._pending else wait  # until the next probe, or what the output shows
            return PLAIN, "plain"
        return self._caps(best), "chosen"

    def _caps(self, option: Option) -> Option:
        """``option`` as a step's caps: None where it reaches the method's own depth, top-k or pool width."""
        return Option(*(None if mine >= own else mine for mine, own in zip(option, (self.deepest, self.top_k,
                                                                                      self.pool), strict=True)))

    def _calibration_step(self) -> tuple[Option, str]:
        """The warm-up's schedule: the method's own draft first, then no draft, depth 1 and the deepest, at top-k
        1 and the full one, in turn (what the drafting fit needs)."""
        narrow = 1 if self.top_k else None
        cycle = [OWN, PLAIN, Option(1, narrow), Option(self.deepest, narrow), Option(1)]
        return cycle[len(self.history) % len(cycle) if self.deepest else 0], "calibrating"

    def plan(self, draft: Draft, tokens: list[int]) -> Draft:
        """The part of ``draft`` to verify after ``tokens`` (the sequence so far, its root last)."""
        if self.step.caps.depth != 0:
            return self.settle(draft, tokens, *self.choose(draft, tokens)[:2])
        self._resolve(tokens)  # a stopped step: bookkeeping only (a drafter that proposed anyway is not sent)
        self.context = len(tokens)
        return self.settle(draft, tokens, 0, [])

    def choose(self, draft: Draft, tokens: list[int]) -> tuple[int, list[int], list[float]]:
        """This step's pool width, the guesses to keep and their scores; :meth:`settle` closes the step. Every
        pool width is weighed (what its fed sources' guesses would bring), for the options' means; the step
        sends the width decided before the proposal, or the widest narrower one that fits the allowance."""
        self._resolve(tokens)
        step, self.context = self.step, len(tokens)
        full = draft.aux_width
        step.drafted = (max(draft.depths(), default=0), draft.tree_width)
        if step.caps.own:  # the method's own draft: how deep, wide and large it is
            self.deepest, self.top_k = max(self.deepest, step.drafted[0]), max(self.top_k, draft.tree_width)
            self.pool = max(self.pool, full)
        if self.calibrating:
            step.scores = [0.0] * len(draft)
            return full, list(range(len(draft))), step.scores
        t1, spent = self.cost(1, self.context), self._spent()

        def fits(forward: float) -> bool:  # a forced step (a first draft, a probe) is checked at its worst case
            return step.why not in ("first", "explored") or self._fits(self._worst(forward, spent, t1))

        per = self._weigh(draft, spent, step.caps)
        caps = (step.caps.depth or self.deepest, step.caps.top_k or self.top_k)
        self._learn(draft, per, caps)
        if step.caps.own and len(draft):
            self._own = draft  # the method's own draft, last proposed: what deeper or wider options stand on
        elif self._own is not None and caps != (self.deepest, self.top_k):  # options past this step's caps: that
            own = self._weigh(self._own, self.drafting(self.deepest, self.top_k))  # draft at today's rates
            self._learn(self._own, own, (self.deepest, self.top_k), caps)
        wanted = full if step.caps.pool is None else min(step.caps.pool, full)
        width = max((w for w in per if w <= wanted and fits(self.cost(per[w][2], self.context))), default=0)
        keep, step.scores, fixed = per[width]
        if not fits(self.cost(fixed + len(keep), self.context)):  # cut to what still fits the allowance
            keep = best_prefix(step.scores, self.cost, fixed, self.context, spent, fits)[0]
        return width, keep, step.scores

    # -- check: the one allowance check every kind of step passes ----------------------------------------------

    def allowance(self) -> float:
        return ALLOWANCE_FLOOR + ALLOWANCE_SHARE * self.elapsed

    def _fits(self, loss: float) -> bool:
        """The allowance check, for every kind of step: the regret after losing ``loss`` stays within it."""
        return self.regret + loss <= self.allowance()

    def _worst(self, forward: float, drafting: float, t1: float) -> float:
        """What a forced step (a first draft, a probe) loses at worst, in plain steps of ``t1`` seconds: nothing
        accepted, a forward of ``forward`` seconds and its ``drafting`` at SPIKE × the model (under ``static``, whose
        regret counts the table's seconds and never the clock's, at STATIC_SPIKE × it)."""
        return loss(forward + (STATIC_SPIKE if self.static else SPIKE) * drafting, t1)

    # -- record: the step's plan, then what it spent and brought -----------------------------------------------

    def settle(self, draft: Draft, tokens: list[int], width: int, keep: list[int]) -> Draft:
        """The step verifies ``draft``'s guesses ``keep`` (parents first) and its first ``width`` aux columns."""
        step = self.step
        step.keep, step.width, step.proposed = list(keep), width, len(draft)
        expected = sum(step.scores[i] for i in keep)
        step.scores = []  # settled: the history keeps a step's plan, not every guess's score (long runs)
        step.bet = expected / self.realism
        step.predicted = (1.0 + expected, self.cost(1 + aux_count(draft, width) + len(keep), self.context)
                          + self._spent())
        if len(draft) and step.caps.depth != 0:
            self._pending.append(Pending(draft, len(tokens), width, draft.aux_width))
        own = step.caps.own and width >= self.pool
        if own and step.why == "chosen":
            self.explored = 0.0
        self.skipped = 0 if own else self.skipped + 1
        return subdraft(draft, keep, width)

    def record(self, draft: Draft, accepted_nodes: list[int], draft_s: float = 0.0) -> None:
        """The step verified ``draft`` (as planned) and accepted ``accepted_nodes`` after ``draft_s`` seconds of
        drafting and planning: the run's time, the regret and (under ``auto``) drafting's cost."""
        step, stopped = self.step, self.step.caps.depth == 0  # stopped: a plain forward and the drafter's check
        if not self.drafting.frozen:
            self.drafting.observe(*((0, None) if stopped else step.drafted), draft_s, self.behind)
        t1, spent = self.cost(1, self.context), self._spent() if self.static else draft_s
        forward = t1 if stopped else self.cost(1 + len(draft) + draft.n_aux, self.context)
        self.elapsed += (forward + spent) / t1
        self.realized = [FADE * self.realized[0] + len(accepted_nodes), FADE * self.realized[1] + step.bet]
        if stopped:
            self.behind += (1 + len(accepted_nodes)) * self.catches_up
            return
        self.behind, lost = 0, loss(forward + spent, t1, len(accepted_nodes))
        self.regret += lost
        if step.why in ("first", "explored"):  # a first draft is the first exploration; one that pays
            self.explored = self.explored + lost if lost > 0 else 0.0  # starts the waits over
