"""``budget=auto`` and ``budget=static``: each step drafts and verifies what pays on this machine.

One rule decides every step: among no draft and the drafter's options (a depth cap, a tree's top-k, a pool
width), the best expected tokens per second, (1 + expected accepted) / (forward seconds + drafting seconds),
the forward priced by the cost curve, drafting by :class:`~specbench.budget.drafting.DraftingCost`, acceptance
by :mod:`specbench.budget.acceptance`, scaled by the run's accepted over expected guesses (:attr:`realism`).
Before the proposal it caps what the drafter drafts (0: no draft); after it, it keeps the best prefix of the
guesses and the aux columns that pay. After ``EXPLORE_EVERY`` steps, one
probes a level past the rule's choice, the wait doubled per plain step's worth probes (a first draft among them)
lost since one last paid. A stopped step is bookkeeping: one look at the cost curve, none at the guesses.
The regret (what drafting lost against plain decoding, in plain steps) stays within an allowance checked before
every step: a cap, not a target. Under ``static`` drafting is priced from a stored table, never the
clock. Outputs never change: a smaller draft is still a draft. docs/budget.md explains each part.
"""

from __future__ import annotations

import numpy as np

from specbench.budget.acceptance import AcceptanceStats, fed, node_scores
from specbench.budget.costs import CostModel
from specbench.budget.drafting import WINDOW, DraftingCost
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


def widths(full: int) -> list[int]:
    """The widths chosen from (a pool's columns, a tree's top-k): ``full``, then halved (rounded up) down to 1."""
    out = [full]
    while out[-1] > 1:
        out.append((out[-1] + 1) // 2)
    return out


def best_prefix(scores: list[float], cost: CostModel, fixed_q: int, context: int, extra_s: float = 0.0,
                most_s: float = float("inf")) -> tuple[list[int], float]:
    """The guesses to keep (parents first) and the step's expected tokens per second, ``fixed_q`` tokens (root,
    aux nodes) and ``extra_s`` seconds of drafting beside them; the forward takes at most ``most_s``."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    best_k, best_rate, gain = 0, 1.0 / (cost(fixed_q, context) + extra_s), 1.0
    for k, i in enumerate(order, start=1):
        seconds = cost(fixed_q + k, context)
        if scores[i] <= 0 or seconds > most_s:
            break
        gain += scores[i]
        if gain / (seconds + extra_s) > best_rate:
            best_k, best_rate = k, gain / (seconds + extra_s)
    return sorted(order[:best_k]), best_rate


def subdraft(draft: Draft, keep: list[int], width: int) -> Draft:
    """``draft`` restricted to the guesses ``keep`` (closed under parents) and the aux nodes of its first
    ``width`` columns (0: none; its :attr:`~Draft.aux_width` or more: all); ``draft`` itself when that is all."""
    if width >= draft.aux_width and len(keep) == len(draft):
        return draft
    out = draft.keep(keep)
    if width >= draft.aux_width:
        out.aux_tokens, out.aux_positions = draft.aux_tokens, draft.aux_positions
        out.aux_visible, out.aux_logit_rows = draft.aux_visible, draft.aux_logit_rows
        out.aux_columns = draft.aux_columns
    elif width > 0:  # the nodes of the first `width` columns, their mask and logit rows re-indexed
        cols = draft.aux_columns
        idx = [j for j, c in enumerate(cols) if c < width]
        at = {old: new for new, old in enumerate(idx)}
        out.aux_tokens = [draft.aux_tokens[j] for j in idx]
        out.aux_positions = [draft.aux_positions[j] for j in idx]
        out.aux_visible = draft.aux_visible[np.ix_(idx, idx)]
        out.aux_columns = [cols[j] for j in idx]
        if draft.aux_logit_rows is not None:
            out.aux_logit_rows = [at[j] for j in draft.aux_logit_rows if j in at]
    return out


def aux_count(draft: Draft, width: int) -> int:
    """Aux nodes of ``draft``'s first ``width`` columns."""
    if width <= 0:
        return 0
    return draft.n_aux if width >= draft.aux_width else sum(c < width for c in draft.aux_columns)


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
        # (depth, top-k, pool width): steps, expected accepted, guesses and aux nodes verified (running means)
        self.options: dict[tuple[int, int, int], list[float]] = {}
        self.deepest = self.top_k = self.pool = 0  # the method's own depth, top-k and pool width, as drafted
        self.regret = self.elapsed = 0.0  # in plain steps' worth of modelled time
        self.behind = 0  # tokens a drafter that catches up has not: the prompt (start), then plain steps' tokens
        self.skipped = 0  # steps since the method's own draft or a probe
        self.explored = 0.0  # plain steps' worth explorations lost since one paid or the rule took its own draft
        self.why: list[str] = []  # per step (WHY)
        self.widths: list[int] = []  # per step: aux columns sent
        self.kept: list[int] = []  # per step: guesses verified
        self.proposed: list[int] = []  # per step: guesses the drafter proposed
        self._pending: list[tuple] = []  # drafts waiting for their output: start, width, pool, depth counted to
        self._context, self._drafted = 0, (0, 0)
        self._caps: tuple = (0, None, None)  # this step's depth, top-k and pool width (None: the method's own)
        self._need = float("inf")  # after a plain decision: the room the best option that did not fit needs
        self._quiet = 0  # … and the steps skipped before which plain needs no second look (nothing to learn)
        self._own: Draft | None = None  # the last proposal of the method's own draft
        self.realized = [0.0, 0.0]  # guesses accepted on verified steps, and what the model expected (FADE)
        self._scores: list[float] = []  # the step's guess scores (choose), and what the kept ones expect (settle)
        self._bet = 0.0
        self.last_plan: tuple[list[int], int] = ([], 0)
        self.last_prediction: tuple[float, float] = (1.0, 0.0)

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
        self.behind, self._context = prompt_len if self.catches_up else 0, prompt_len

    def allowance(self) -> float:
        return ALLOWANCE_FLOOR + ALLOWANCE_SHARE * self.elapsed

    @property
    def realism(self) -> float:
        """Guesses accepted over guesses expected on the steps verified so far (:data:`TRUST` of each to start):
        what the acceptance model's scores are scaled by, since the steps it drafts are those whose estimates ran
        high (the winner's curse) and bring fewer tokens than expected."""
        return (self.realized[0] + TRUST) / (self.realized[1] + TRUST)

    def _fits(self, seconds: float, plain: float) -> bool:
        """Whether a step of ``seconds`` that brings one token keeps the regret within the allowance."""
        return self.regret + (seconds - plain) / plain <= self.allowance()

    def cap(self) -> int | None:
        """Before the step's proposal: the deepest guess to draft (0: none; None: the method's own)."""
        self._caps, why = self._calibration_step() if self.calibrating else self._decide()
        self.why.append(why)
        return self._caps[0]

    @property
    def width_cap(self) -> int | None:
        """After :meth:`cap`: the widest top-k to draft a tree with (None: the method's own)."""
        return self._caps[1]

    def _decide(self) -> tuple[tuple, str]:
        own, plain = (None, None, None), (0, None, None)
        if self.skipped < self._quiet and self.regret + self._need > self.allowance():
            return plain, "plain"  # nothing learned since, and no more room: plain until the next exploration
        t1, wait = self.cost(1, self._context), EXPLORE_EVERY * WAIT_GROWTH ** min(self.explored, 64)  # 2⁶⁴: never
        self._need, self._quiet = float("inf"), 0
        if not self.options:  # nothing measured: the method's own draft, if drafting it cannot break the cap
            own_cost = self.drafting(self.deepest or self.drafting.deepest or 1, self.top_k or self.drafting.widest,
                                     self.behind)
            if self._fits(t1 + SPIKE * own_cost, t1):
                return own, "first"
            self._need, self._quiet = SPIKE * own_cost / t1, float("inf")  # plain until the room is there
            return plain, "plain"
        best, top = None, (1.0 / (t1 + self.drafting.stopped),)
        for (d, w, a), (_, accepted, guesses, aux) in self.options.items():
            seconds = self.cost(1 + aux + guesses, self._context) + self.drafting(d, w, self.behind)
            rank = ((1 + accepted) / seconds, a, d, w)  # ties: the wider pool, then the deeper draft
            if rank > top:
                loss = (seconds - (1 + accepted) * t1) / t1  # expected: below 0 for an option that pays
                if self.regret + loss <= self.allowance():
                    best, top = (d, w, a), rank
                else:  # it would pay better, but the regret has no room for it yet: the room it needs
                    self._need = min(self._need, loss)
        depth = min(self.deepest, (best[0] if best else 0) + PROBE_STEP)  # the probe: past the rule's choice,
        probe = self.options.get((depth, self.top_k, self.pool))  # at the method's own top-k and pool
        if (self.skipped >= wait and best != (depth, self.top_k, self.pool) and probe and self._fits(
                self.cost(1 + probe[2] + probe[3], self._context) + SPIKE * self.drafting(depth, self.top_k,
                                                                                         self.behind), t1)):
            self.skipped = 0
            return (None if depth >= self.deepest else depth, None, None), "explored"
        if best is None:
            self._quiet = 0 if self._pending else wait  # until the next probe, or what the output shows
            return plain, "plain"
        d, w, a = best
        caps = (None if d >= self.deepest else d, None if w >= self.top_k else w, None if a >= self.pool else a)
        return caps, "chosen"

    def _calibration_step(self) -> tuple[tuple, str]:
        """The warm-up's schedule: the method's own draft first, then no draft, depth 1 and the deepest, at top-k
        1 and the full one, in turn (what the drafting fit needs)."""
        narrow = 1 if self.top_k else None
        cycle = [(None, None, None), (0, None, None), (1, narrow, None), (self.deepest, narrow, None), (1, None, None)]
        return cycle[len(self.why) % len(cycle) if self.deepest else 0], "calibrating"

    def plan(self, draft: Draft, tokens: list[int]) -> Draft:
        """The part of ``draft`` to verify after ``tokens`` (the sequence so far, its root last)."""
        if self._caps[0] != 0:
            return self.settle(draft, tokens, *self.choose(draft, tokens)[:2])
        self._resolve(tokens)  # a stopped step: bookkeeping only (a drafter that proposed anyway is not sent)
        self._context, self._drafted = len(tokens), (0, 0)
        return self.settle(draft, tokens, 0, [])

    def _spent(self) -> float:
        """The step's drafting seconds as the model prices them."""
        return self.drafting(*self._drafted, self.behind) if self._caps[0] != 0 else self.drafting.stopped

    def choose(self, draft: Draft, tokens: list[int]) -> tuple[int, list[int], list[float]]:
        """This step's pool width, the guesses to keep and their scores; :meth:`settle` closes the step. Every
        pool width is weighed (what its fed sources' guesses would bring), for the options' means; the step
        sends the width decided before the proposal, or the widest narrower one that fits the allowance."""
        self._resolve(tokens)
        self._context = len(tokens)
        depth, full = max(draft.depths(), default=0), draft.aux_width
        self._drafted = (depth, draft.tree_width)
        if self._caps[:2] == (None, None):  # the method's own draft: how deep, wide and large it is
            self.deepest, self.top_k = max(self.deepest, depth), max(self.top_k, draft.tree_width)
            self.pool = max(self.pool, full)
        if self.calibrating:
            self._scores = [0.0] * len(draft)
            return full, list(range(len(draft))), self._scores
        t1, spent = self.cost(1, self._context), self._spent()
        room = float("inf")  # the most a forced step's forward may take (drafting may reach SPIKE × the model)
        if self.why[-1] in ("first", "explored"):
            room = t1 * (1 + self.allowance() - self.regret) - (STATIC_SPIKE if self.static else SPIKE) * spent
        per = self._weigh(draft, spent, self._caps[:2])
        caps = (self._caps[0] or self.deepest, self._caps[1] or self.top_k)
        self._learn(draft, per, caps)
        if self._caps[:2] == (None, None) and len(draft):
            self._own = draft  # the method's own draft, last proposed: what deeper or wider options stand on
        elif self._own is not None and caps != (self.deepest, self.top_k):  # options past this step's caps: that
            own = self._weigh(self._own, self.drafting(self.deepest, self.top_k))  # draft at today's rates
            self._learn(self._own, own, (self.deepest, self.top_k), caps)
        wanted = full if self._caps[2] is None else min(self._caps[2], full)
        width = max((w for w in per if w <= wanted and self.cost(per[w][2], self._context) <= room), default=0)
        keep, scores, fixed = per[width]
        if self.cost(fixed + len(keep), self._context) > room:  # cut to what still fits the allowance
            keep = best_prefix(scores, self.cost, fixed, self._context, spent, room)[0]
        self._scores = scores
        return width, keep, scores

    def settle(self, draft: Draft, tokens: list[int], width: int, keep: list[int]) -> Draft:
        """The step verifies ``draft``'s guesses ``keep`` (parents first) and its first ``width`` aux columns."""
        self.last_plan = (list(keep), width)
        expected = sum(self._scores[i] for i in keep)
        self._bet = expected / self.realism
        self.last_prediction = (1.0 + expected, self.cost(1 + aux_count(draft, width) + len(keep), self._context)
                                + self._spent())
        if len(draft) and self._caps[0] != 0:
            self._pending.append((draft, len(tokens), width, draft.aux_width, 0))
        self.widths.append(width)
        self.kept.append(len(keep))
        self.proposed.append(len(draft))
        own = self._caps[:2] == (None, None) and width >= self.pool
        if own and self.why[-1] == "chosen":
            self.explored = 0.0
        self.skipped = 0 if own else self.skipped + 1
        return subdraft(draft, keep, width)

    def record(self, draft: Draft, accepted_nodes: list[int], draft_s: float = 0.0) -> None:
        """The step verified ``draft`` (as planned) and accepted ``accepted_nodes`` after ``draft_s`` seconds of
        drafting and planning: the run's time, the regret and (under ``auto``) drafting's cost."""
        t1, drafted = self.cost(1, self._context), self._caps[0] != 0
        if not drafted:  # a stopped step: a plain forward and what the drafter's check cost
            if not self.drafting.frozen:
                self.drafting.observe(0, None, draft_s)
            if self.catches_up:
                self.behind += 1 + len(accepted_nodes)
            self.elapsed += 1 + (self.drafting.stopped if self.static else draft_s) / t1
            self.realized = [FADE * self.realized[0], FADE * self.realized[1]]
            return
        forward = self.cost(1 + len(draft) + draft.n_aux, self._context)
        if not self.drafting.frozen:
            self.drafting.observe(*self._drafted, draft_s, self.behind)
        spent = self._spent() if self.static else draft_s
        self.behind, self.elapsed = 0, self.elapsed + (forward + spent) / t1
        self.realized = [FADE * self.realized[0] + len(accepted_nodes), FADE * self.realized[1] + self._bet]
        loss = (forward + spent - (1 + len(accepted_nodes)) * t1) / t1
        self.regret += loss
        if self.why[-1] in ("first", "explored"):  # a first draft is the first exploration; one that pays
            self.explored = self.explored + loss if loss > 0 else 0.0  # starts the waits over

    def _weigh(self, draft: Draft, spent: float, caps: tuple = (None, None)) -> dict[int, tuple]:
        """Each pool width of ``draft``: the guesses worth verifying beside it (none past ``caps``), their scores,
        its fixed block."""
        full, depth, real = draft.aux_width, max(draft.depths(), default=0), self.realism
        beyond = [d > (caps[0] or depth) or n > (caps[1] or n)  # drafted past its caps
                  for d, n in zip(draft.depths(), draft.needs or [1] * len(draft), strict=True)]
        per = {}
        for width in [0, *widths(full)] if full else [0]:
            scores = node_scores(draft, self.stats, lambda s, w=width: fed(s, self.aux_feeds, w, full))
            scores = [0.0 if past else x * real for x, past in zip(scores, beyond, strict=True)]
            fixed = 1 + aux_count(draft, width)
            per[width] = (best_prefix(scores, self.cost, fixed, self._context, spent)[0], scores, fixed)
        return per

    def _learn(self, draft: Draft, per: dict[int, tuple], caps: tuple, beyond: tuple | None = None) -> None:
        """What a proposal drafted within ``caps`` (depth, top-k) would verify, and expect to be accepted, at each
        option: its kept guesses up to depth d, of a tree those a top-k of w drafts too, at each pool width
        (expectations under the acceptance model). A fresh sample weighs a third, what the means held being old:
        an exploration's proposal, and past ``beyond`` (the step's own caps) the last proposal of the method's own
        draft, re-scored at today's rates."""
        depths = np.asarray(draft.depths(), dtype=int)
        needs = np.asarray(draft.needs or [1] * len(draft), dtype=int)
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
                    entry = self.options.setdefault((d, w, a), [0, 0.0, 0.0, 0.0])
                    fresh = beyond is not None or (self.why[-1] == "explored" and len(draft))
                    entry[0] = (min(entry[0], FRESH_SAMPLES) if fresh else entry[0]) + 1
                    v, at = max(1 / WINDOW, 1 / entry[0]), min(d, len(gain) - 1)
                    for j, x in ((1, gain[at]), (2, count[at]), (3, aux_count(draft, a))):
                        entry[j] += v * (x - entry[j])

    def _resolve(self, tokens: list[int], final: bool = False) -> None:
        """Count what the output shows of each pending draft, level by level; keep those not counted through."""
        waiting = []
        for draft, start, width, full, counted in self._pending:
            counted = self.stats.observe_output(draft, tokens[start:], final,
                                                lambda s, w=width, f=full: fed(s, self.aux_feeds, w, f), counted)
            if counted < max(draft.depths(), default=0):
                waiting.append((draft, start, width, full, counted))
        self._pending = waiting

    def finish(self, tokens: list[int]) -> None:
        """The generation ended with ``tokens``: count what can still be judged, forget the rest."""
        self._resolve(tokens, final=True)
        self._pending = []
        self.behind = 0  # the next generation's drafter starts from its prompt
