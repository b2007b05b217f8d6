"""Whether drafting pays at all, with what drafting costs counted (``budget=auto``).

The trim (:mod:`specbench.budget.planner`) keeps the part of a draft that pays for its forward; the drafting
itself (an EAGLE head's levels, Medusa's heads, a retrieval lookup) is spent before it. So the worth of
drafting is measured over the steps that drafted: their tokens (1 + accepted) and their time, the forward's
modelled seconds plus the drafter's own measured ones (``draft_s``: its propose and the plan), as running
means (a plain mean over the first 32 steps, then over about the last 32). Against it stands plain decoding:
one token per t(1).

* **Stop.** From ``MIN_WARM`` drafting steps on, when drafting's rate falls short of plain decoding's by more
  than 1/√(steps), a tolerance that narrows with the evidence, the next steps draft nothing: the loop tells
  the drafter its deepest worthwhile guess is at depth 0 (``DecodeState.depth_cap``), and drafters skip
  their work (an EAGLE head does not even catch up until it drafts again).
* **Explore.** After ``explore_every`` steps without drafting one step drafts again; the wait doubles each
  time drafting still does not pay, and drafting resumes for good when its rate reaches plain decoding's.
* **How deep.** While drafting pays, the levels worth drafting are chosen too: the chance that a step's
  accepted path reaches depth k (counted over the steps whose kept draft reached it), the guesses kept at
  depths up to d (running means), and the drafter's seconds against the depth it drafted (a running least
  squares line, all of it per level until the depths drafted differ) give each cap d its expected tokens per
  second, (1 + Σ_{k≤d} P(reach k)) / (t(1 + guesses(d)) + drafting(d)). The best cap below the deepest
  measured is sent (``DecodeState.depth_cap``); every ``explore_every``-th drafting step drafts the method's
  own depth, so the deeper levels stay measured.
* **How wide.** A tree drafted level by level with a top-k (EAGLE-2's: each level expands the k best nodes into
  k children each, a drafting cost that grows with k) may be drafted narrower. Each of its guesses says the
  narrowest top-k that surely drafts it too (``Draft.needs``), so the steps drafted at the full top-k tell
  how often the accepted path would have reached depth k with a top-k of w, and how many guesses it would have
  kept; the drafting seconds are fitted against the depth and depth × top-k drafted (a running least squares,
  per level alone until the top-ks drafted differ: the first drafting steps alternate narrower top-ks to
  measure it, in the warm-up's calibration). Each (depth, top-k) is priced as above; the best is sent
  (``DecodeState.width_cap``); exploration steps draft the full top-k, and only full-top-k steps teach
  acceptance.
* **Calibration.** What a drafter's drafting costs is a property of the machine, not of the prompts: the
  seconds-against-depth line measured in a run's warm-up (:meth:`DraftWorth.calibration`) starts each
  measured planner (:meth:`DraftWorth.calibrate`), worth ``CALIBRATION_STEPS`` steps, then the running means
  take over. When even a draft accepted whole could not pay at any depth measured, (1 + d) tokens in
  t(1 + d) plus the drafting's seconds at depth d against plain decoding's 1 per t(1), drafting starts off,
  and an exploration is passed over while that still holds at the step's context (exploring measures
  acceptance, which cannot change it). Acceptance is never carried: the warm-up's prompts teach nothing.
* **Bounded regret.** The time drafting steps lost against plain decoding for the same tokens is summed (a
  step that paid counts negative); no step drafts while that sum exceeds the planner's allowance (a share
  of the run's modelled time plus a floor), so a drafter that never pays costs a run at most that.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from specbench.core.draft import Draft

MIN_WARM = 4  # drafting steps before drafting may be judged not to pay
CALIBRATION_STEPS = 8  # a calibration counts as this many steps of the drafting-cost line


# What let a step draft (DraftWorth.why): the first steps; drafting judged to pay, at the depth and top-k chosen;
# a narrower top-k on trial; every explore_every-th drafting step, at the method's own depth and top-k; an
# exploration while drafting was judged not to pay; every step (budget=auto without drafting's price). Or none.
WHY = ("warm-up", "chosen", "top-k trial", "full tree", "explored", "fixed", "plain")


def widths(full: int) -> list[int]:
    """The widths ``auto`` chooses from (a pool's columns, a tree's top-k): ``full``, then halved (rounded up)
    down to 1."""
    out = [full]
    while out[-1] > 1:
        out.append((out[-1] + 1) // 2)
    return out


class DraftWorth:
    """Drafting's measured rate against plain decoding's, and the decision to draft the next step."""

    def __init__(self, explore_every: int = 16, enabled: bool = True) -> None:
        """``enabled=False``: drafting is always sent (decisions then rest on the modelled forward alone, the
        same in every run; measured time varies)."""
        self.explore_every, self.enabled = explore_every, enabled
        self.steps = 0  # steps that drafted
        self.tokens = self.seconds = 0.0  # running means over them
        self.drafting = True
        self.skipped = 0  # steps without drafting since the last exploration
        self.next_explore = explore_every
        self.regret = 0.0  # plain steps' worth of time drafting lost against plain decoding
        self.capped: list[bool] = []  # per step: drafting left out
        self.why: list[str] = []  # per step: what let it draft, or "plain" (WHY)
        self.tried: Counter = Counter()  # depth k: drafting steps whose kept draft reached it
        self.reached: Counter = Counter()  # … and whose accepted path did
        self.kept: dict[int, float] = {}  # depth d: running mean of the guesses kept at depths up to d
        # drafting's seconds s against depth d and e = d × top-k (0 without a top-k): running means of
        # d, s, d², d·s, e, e², d·e, e·s
        self._line = [0.0] * 8
        self._points = 0  # steps in that line
        self._deepest = 0  # the deepest depth drafted
        self.caps: list[int | None] = []  # per drafting step: the depth cap sent (None: the method's own)
        self._drafting_steps = 0
        self.full_width = 0  # the widest top-k a tree was drafted with (0: none drafted so)
        self.width_cap: int | None = None  # this step's top-k cap (None: the method's own)
        self._trial = False  # this step drafts a narrower top-k to measure its cost
        self.width_caps: list[int | None] = []  # per drafting step
        self._full_steps = 0  # steps drafted at the full top-k (every step of a drafter without one)
        self.within: Counter = Counter()  # (k, w): … whose accepted path reached depth k, all of it drafted at top-k w
        self.kept_narrow: dict[tuple[int, int], float] = {}  # (d, w): guesses kept up to depth d drafted at top-k w

    def drafts(self, allowance: float, forward: Callable[[int], float] | None = None) -> bool:
        """Whether the next step drafts, given the regret the run allows so far (in plain steps); ``forward(q)``,
        a forward's modelled seconds now: an exploration is passed over while the measured drafting cost shows
        no depth could pay even if every guess were accepted (exploring measures acceptance, which cannot help)."""
        warm = self.steps < MIN_WARM and self.drafting  # the first steps draft whatever they cost: too few to
        # judge (unless a calibration showed no draft could pay)
        go = not self.enabled or warm or (self.drafting and self.regret <= allowance)
        why = "fixed" if not self.enabled else "warm-up" if warm else "chosen"
        if not go:
            self.skipped += 1
            if self.explore_every and self.skipped >= self.next_explore and self.regret <= allowance:
                self.skipped, self.next_explore = 0, 2 * self.next_explore
                go = forward is None or not self.cannot_pay(forward)
            why = "explored" if go else "plain"
        self.capped.append(not go)
        self.why.append(why)
        return go

    def depth(self, forward: Callable[[int], float]) -> int | None:
        """The depth cap for a step that drafts (``forward(q)``: a forward's modelled seconds), and its top-k
        cap (:attr:`width_cap`): the best pair measured, None for either that is the method's own (the full
        depth and top-k every ``explore_every``-th step, to keep them measured)."""
        self._drafting_steps += 1
        cap = self.width_cap = None
        narrower = widths(self.full_width)[1:] if self.full_width else []
        deepest = max(self.tried, default=0)
        self._trial = self.enabled and bool(narrower) and not self._width_spread() and self._drafting_steps % 2 == 0
        periodic = (self.enabled and deepest >= 2 and not self._trial  # the method's own depth and top-k
                    and self._drafting_steps % max(self.explore_every, 1) == 0)
        if self._trial:  # a narrower top-k, to measure what it costs (no acceptance, no worth judged from it)
            self.width_cap = narrower[(self._drafting_steps // 2 - 1) % len(narrower)]
        elif self.enabled and deepest >= 2 and not periodic:
            drafting, best_rate = self._drafting_seconds(), -1.0
            for w in [self.full_width or 0, *narrower]:
                gain, chance = 1.0, 1.0
                for d in range(1, deepest + 1):
                    chance = min(chance, self._reach(d, w))
                    gain += chance
                    kept = self.kept.get(d, 0.0) if w == self.full_width else self.kept_narrow.get((d, w), 0.0)
                    rate = gain / (forward(1 + round(kept)) + drafting(d, w or None))
                    if rate > best_rate:
                        best_rate, cap, self.width_cap = rate, d, w
            cap = None if cap == deepest else cap
            self.width_cap = None if self.width_cap == self.full_width else self.width_cap
        self.caps.append(cap)
        self.width_caps.append(self.width_cap)
        if self.why and self.why[-1] == "chosen" and (self._trial or periodic):
            self.why[-1] = "top-k trial" if self._trial else "full tree"
        return cap

    def _reach(self, d: int, w: int) -> float:
        """The chance a step's accepted path reaches depth d, its tree drafted at top-k w (full-top-k steps)."""
        if not self.tried[d]:
            return 0.0
        chance = self.reached[d] / self.tried[d]
        if w != self.full_width and self.reached[d]:
            chance *= self.within[(d, w)] / self.reached[d]
        return chance

    def _width_spread(self) -> bool:
        """Whether the top-ks drafted differ enough (beyond the depths) to tell their costs apart."""
        d, _, dd, _, e, ee, de, _ = self._line
        vd, ve, cde = dd - d * d, ee - e * e, de - d * e
        return ve > 1e-12 and ve - (cde * cde / vd if vd > 1e-9 else 0.0) > 1e-3 * ve

    def _drafting_seconds(self) -> Callable[..., float]:
        """The drafter's seconds for a draft of depth d at top-k w (None: the widest drafted): a + b·d + c·d·w
        through the measured steps once the top-ks drafted differ, else the line against the depth alone (all
        of it per level until the depths drafted differ)."""
        d_mean, s_mean, dd, ds, e_mean, ee, de, es = self._line
        vd = dd - d_mean * d_mean
        if self._width_spread():  # (one depth drafted: per row alone)
            ve, cde, csd, cse = ee - e_mean * e_mean, de - d_mean * e_mean, ds - d_mean * s_mean, es - e_mean * s_mean
            det = vd * ve - cde * cde
            per_level = max((csd * ve - cse * cde) / det, 0.0) if vd > 1e-9 else 0.0
            per_row = max((cse * vd - csd * cde) / det if vd > 1e-9 else cse / ve, 0.0)
            base = s_mean - per_level * d_mean - per_row * e_mean
            full = self.full_width
            return lambda d, w=None: max(base + per_level * d + per_row * d * (w or full), 0.0)
        per_level = max((ds - d_mean * s_mean) / vd, 0.0) if vd > 1e-9 else s_mean / max(d_mean, 1.0)
        base = s_mean - per_level * d_mean if vd > 1e-9 else 0.0
        return lambda d, w=None: max(base + per_level * d, 0.0)

    def predicted_seconds(self, depth: int, width: int | None = None) -> float:
        """The drafter's modelled seconds for a draft of ``depth`` at top-k ``width`` (0 before any measurement)."""
        return self._drafting_seconds()(depth, width) if self._points and depth else 0.0

    def calibration(self) -> tuple[list[float], int, int, int] | None:
        """The drafting cost measured so far, for :meth:`calibrate`: the line's means, its steps, the deepest
        depth and the widest top-k drafted (None before any drafting step)."""
        return (list(self._line), self._points, self._deepest, self.full_width) if self._points else None

    def calibrate(self, measured: tuple[list[float], int, int, int] | None, forward: Callable[[int], float]) -> None:
        """Start from drafting costs measured on this machine (``forward(q)``: a forward's modelled seconds);
        drafting starts off when no depth measured could pay even if every guess were accepted."""
        if not self.enabled or not measured:
            return
        line, points, self._deepest, self.full_width = measured
        self._line, self._points = list(line), min(points, CALIBRATION_STEPS)
        if self.cannot_pay(forward):
            self.drafting, self.skipped = False, 0

    def cannot_pay(self, forward: Callable[[int], float]) -> bool:
        """Whether, at the drafting cost measured, no depth drafted so far could pay even if every guess were
        accepted: (1 + d) tokens in t(1 + d) plus drafting(d) against plain decoding's 1 per t(1)."""
        if self._deepest < 1 or not self._points:
            return False
        drafting, plain = self._drafting_seconds(), forward(1)
        return all((1 + d) * plain < forward(1 + d) + drafting(d) for d in range(1, self._deepest + 1))

    def record(self, tokens: int, seconds: float, plain_s: float, draft: Draft | None = None,
               drafted_depth: int = 0, draft_s: float = 0.0, accepted: list[int] | None = None) -> None:
        """A step that drafted gave ``tokens`` in ``seconds`` (forward and drafting); plain decoding takes
        ``plain_s`` a token. ``draft``: the guesses it verified, ``accepted`` those on the accepted path;
        ``drafted_depth``: how deep the drafter drafted, in ``draft_s`` seconds."""
        trial, self._trial = self._trial, False
        if draft is not None:
            self.full_width = max(self.full_width, draft.tree_width)
            if draft.tree_width in (0, self.full_width):  # a narrower tree teaches no acceptance
                self._learn(draft, tokens, accepted)
            self._points += 1
            self._deepest = max(self._deepest, drafted_depth)
            d, e = drafted_depth, drafted_depth * draft.tree_width
            point = (d, draft_s, d * d, d * draft_s, e, e * e, d * e, e * draft_s)
            v = max(1 / 32, 1 / self._points)
            self._line = [m + v * (x - m) for m, x in zip(self._line, point, strict=True)]
        if trial:  # measured its cost only
            return
        self.steps += 1
        w = max(1.0 / 32, 1.0 / self.steps)
        self.tokens += w * (tokens - self.tokens)
        self.seconds += w * (seconds - self.seconds)
        self.regret += (seconds - tokens * plain_s) / plain_s
        ratio = self.tokens / self.seconds * plain_s
        if ratio >= 1.0:
            self.drafting, self.next_explore = True, self.explore_every
        elif self.steps >= MIN_WARM and ratio < 1.0 - self.steps**-0.5:
            self.drafting = False

    def _learn(self, draft: Draft, tokens: int, accepted: list[int] | None) -> None:
        """Acceptance from a step drafted at the full top-k (or without one): how deep its accepted path went,
        and for each narrower top-k, whether all of it (and which of its guesses) that top-k drafts too."""
        self._full_steps += 1
        w = max(1.0 / 32, 1.0 / self._full_steps)
        depths = draft.depths()
        needs = draft.needs or [1] * len(depths)  # guesses not from the tree (a SAM-Decoding match): any top-k
        narrower = widths(self.full_width)[1:] if self.full_width else []
        path_need = 0
        for k in range(1, max(depths, default=0) + 1):
            self.tried[k] += 1
            self.reached[k] += tokens - 1 >= k
            if accepted is not None and k <= len(accepted):
                path_need = max(path_need, needs[accepted[k - 1]])
                for n in narrower:
                    self.within[(k, n)] += path_need <= n
        for d in range(1, max(max(depths, default=0), max(self.kept, default=0)) + 1):
            self.kept[d] = self.kept.get(d, 0.0) + w * (sum(x <= d for x in depths) - self.kept.get(d, 0.0))
            for n in narrower:
                kept = sum(x <= d and y <= n for x, y in zip(depths, needs, strict=True))
                self.kept_narrow[(d, n)] = self.kept_narrow.get((d, n), 0.0) + w * (kept - self.kept_narrow.get((d, n), 0.0))
