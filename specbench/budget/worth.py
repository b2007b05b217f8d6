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
* **Bounded regret.** The time drafting steps lost against plain decoding for the same tokens is summed (a
  step that paid counts negative); no step drafts while that sum exceeds the planner's allowance (a share
  of the run's modelled time plus a floor), so a drafter that never pays costs a run at most that.
"""

from __future__ import annotations

MIN_WARM = 4  # drafting steps before drafting may be judged not to pay


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

    def drafts(self, allowance: float) -> bool:
        """Whether the next step drafts, given the regret the run allows so far (in plain steps)."""
        go = not self.enabled or (self.drafting and self.regret <= allowance)
        if not go:
            self.skipped += 1
            if self.explore_every and self.skipped >= self.next_explore and self.regret <= allowance:
                self.skipped, self.next_explore, go = 0, 2 * self.next_explore, True
        self.capped.append(not go)
        return go

    def record(self, tokens: int, seconds: float, plain_s: float) -> None:
        """A step that drafted gave ``tokens`` in ``seconds`` (forward and drafting); plain decoding takes
        ``plain_s`` a token."""
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
