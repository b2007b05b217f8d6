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
        self.tried: Counter = Counter()  # depth k: drafting steps whose kept draft reached it
        self.reached: Counter = Counter()  # … and whose accepted path did
        self.kept: dict[int, float] = {}  # depth d: running mean of the guesses kept at depths up to d
        self._line = [0.0] * 4  # running means of depth, seconds, depth², depth × seconds (drafting)
        self._points = 0  # steps in that line
        self._deepest = 0  # the deepest depth drafted
        self.caps: list[int | None] = []  # per drafting step: the depth cap sent (None: the method's own)
        self._drafting_steps = 0

    def drafts(self, allowance: float, forward: Callable[[int], float] | None = None) -> bool:
        """Whether the next step drafts, given the regret the run allows so far (in plain steps); ``forward(q)``,
        a forward's modelled seconds now: an exploration is passed over while the measured drafting cost shows
        no depth could pay even if every guess were accepted (exploring measures acceptance, which cannot help)."""
        warm = self.steps < MIN_WARM and self.drafting  # the first steps draft whatever they cost: too few to
        # judge (unless a calibration showed no draft could pay)
        go = not self.enabled or warm or (self.drafting and self.regret <= allowance)
        if not go:
            self.skipped += 1
            if self.explore_every and self.skipped >= self.next_explore and self.regret <= allowance:
                self.skipped, self.next_explore = 0, 2 * self.next_explore
                go = forward is None or not self.cannot_pay(forward)
        self.capped.append(not go)
        return go

    def depth(self, forward: Callable[[int], float]) -> int | None:
        """The depth cap for a step that drafts (``forward(q)``: a forward's modelled seconds): the best one
        below the deepest measured, or None (the method's own) when that is best or to keep it measured."""
        self._drafting_steps += 1
        deepest = max(self.tried, default=0)
        if not self.enabled or deepest < 2 or self._drafting_steps % max(self.explore_every, 1) == 0:
            self.caps.append(None)
            return None
        drafting = self._drafting_seconds()
        best, best_rate, gain, chance = None, -1.0, 1.0, 1.0
        for d in range(1, deepest + 1):
            chance = min(chance, self.reached[d] / self.tried[d]) if self.tried[d] else 0.0
            gain += chance
            rate = gain / (forward(1 + round(self.kept.get(d, 0.0))) + drafting(d))
            if rate > best_rate:
                best, best_rate = d, rate
        cap = None if best == deepest else best
        self.caps.append(cap)
        return cap

    def _drafting_seconds(self) -> Callable[[int], float]:
        """The drafter's seconds for a draft of depth d: the line through the measured steps (all of it per
        level until the depths drafted differ)."""
        d_mean, s_mean, dd, ds = self._line
        spread = dd - d_mean * d_mean
        per_level = max((ds - d_mean * s_mean) / spread, 0.0) if spread > 1e-9 else s_mean / max(d_mean, 1.0)
        base = s_mean - per_level * d_mean if spread > 1e-9 else 0.0
        return lambda d: max(base + per_level * d, 0.0)

    def calibration(self) -> tuple[list[float], int, int] | None:
        """The drafting cost measured so far, for :meth:`calibrate`: the line's means, its steps and the deepest
        depth drafted (None before any drafting step)."""
        return (list(self._line), self._points, self._deepest) if self._points else None

    def calibrate(self, measured: tuple[list[float], int, int] | None, forward: Callable[[int], float]) -> None:
        """Start from drafting costs measured on this machine (``forward(q)``: a forward's modelled seconds);
        drafting starts off when no depth measured could pay even if every guess were accepted."""
        if not self.enabled or not measured:
            return
        line, points, deepest = measured
        self._line, self._points, self._deepest = list(line), min(points, CALIBRATION_STEPS), deepest
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
               drafted_depth: int = 0, draft_s: float = 0.0) -> None:
        """A step that drafted gave ``tokens`` in ``seconds`` (forward and drafting); plain decoding takes
        ``plain_s`` a token. ``draft``: the guesses it verified; ``drafted_depth``: how deep the drafter drafted,
        in ``draft_s`` seconds."""
        self.steps += 1
        w = max(1.0 / 32, 1.0 / self.steps)
        if draft is not None:
            depths = draft.depths()
            for k in range(1, max(depths, default=0) + 1):
                self.tried[k] += 1
                self.reached[k] += tokens - 1 >= k
            for d in range(1, max(max(depths, default=0), max(self.kept, default=0)) + 1):
                self.kept[d] = self.kept.get(d, 0.0) + w * (sum(x <= d for x in depths) - self.kept.get(d, 0.0))
            self._points += 1
            self._deepest = max(self._deepest, drafted_depth)
            point, v = (drafted_depth, draft_s, drafted_depth**2, drafted_depth * draft_s), max(1 / 32, 1 / self._points)
            self._line = [m + v * (x - m) for m, x in zip(self._line, point, strict=True)]
        self.tokens += w * (tokens - self.tokens)
        self.seconds += w * (seconds - self.seconds)
        self.regret += (seconds - tokens * plain_s) / plain_s
        ratio = self.tokens / self.seconds * plain_s
        if ratio >= 1.0:
            self.drafting, self.next_explore = True, self.explore_every
        elif self.steps >= MIN_WARM and ratio < 1.0 - self.steps**-0.5:
            self.drafting = False
