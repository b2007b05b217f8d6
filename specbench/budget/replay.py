"""Plans on the record, and replayed: what ``budget=auto`` decided at each decode step, kept in the result rows
(``step_plans``), and ``budget=replay``, which makes the same decisions again from those rows.

A step's plan is what the planner told the drafter before it proposed (``depth``: the deepest guess worth
drafting, 0 for none, None for the method's own; ``top_k``: the widest tree, None for the method's own) and
what it kept of the proposal (``n``: the guesses proposed; ``keep``: those verified, null for all of them;
``aux``: the auxiliary columns sent), with ``why`` the planner's reason (warm-up, chosen, explored, plain …)
and what it expected of the step (``pred_tokens``; ``pred_s``, the modelled forward and drafting) beside what
the row measured (``step_tokens``, ``step_times``). Re-applied step by step to the same drafter
on the same prompt, the same drafts are proposed and verified, so a replay yields the recorded tokens, steps
and τ exactly, greedy or sampled (the sampling streams are consumed by the same drafts), on any machine: the
clock that drove the recorded decisions plays no part. The rows are read back by
:func:`specbench.results.plans.recorded_plans`.
"""

from __future__ import annotations

from typing import Any

from specbench.budget.planner import AutoBudget
from specbench.budget.pools import subdraft
from specbench.core.draft import Draft


class ReplayMismatch(RuntimeError):
    """The drafter proposed what the recorded run's drafter did not: another code, setting or seed."""


class Recorder:
    """Wraps a planner for one generation and keeps each step's plan (:attr:`plans`); the rest is the planner's."""

    def __init__(self, planner: AutoBudget) -> None:
        self.planner, self.plans, self.depth = planner, [], None

    def cap(self) -> int | None:
        self.depth = self.planner.cap()
        return self.depth

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy and pickle look for these before the planner is set
            raise AttributeError(name)
        return getattr(self.planner, name)

    def plan(self, draft: Draft, tokens: list[int]) -> Draft:
        p = self.planner
        planned = p.plan(draft, tokens)
        step = p.step
        keep, (tokens_expected, seconds) = step.keep, step.predicted
        self.plans.append({"depth": self.depth, "top_k": p.width_cap, "n": len(draft),
                           "keep": None if len(keep) == len(draft) else list(keep),  # null: all (most steps)
                           "aux": int(step.width), "why": step.why, "pred_tokens": round(tokens_expected, 4),
                           "pred_s": round(seconds, 6)})
        return planned


class Replay:
    """A planner that makes the recorded decisions of one generation again, step by step."""

    def __init__(self, plans: list[dict[str, Any]], where: str = "") -> None:
        self.plans, self.where, self.step = plans, where, 0

    def _current(self) -> dict[str, Any]:
        if self.step >= len(self.plans):
            raise ReplayMismatch(f"{self.where}: the replay went past the {len(self.plans)} steps recorded")
        return self.plans[self.step]

    def cap(self) -> int | None:
        return self._current()["depth"]

    @property
    def width_cap(self) -> int | None:
        return self._current()["top_k"]

    def plan(self, draft: Draft, tokens: list[int]) -> Draft:
        plan = self._current()
        self.step += 1
        keep, width = plan["keep"], plan["aux"]
        keep = list(range(len(draft))) if keep is None else keep
        if len(draft) != plan.get("n", len(draft)) or any(i >= len(draft) for i in keep) or width > draft.aux_width:
            raise ReplayMismatch(f"{self.where}, step {self.step}: the drafter proposed {len(draft)} guesses and "
                                 f"{draft.aux_width} aux columns, the recorded run's {plan.get('n', '?')} guesses "
                                 f"(kept up to {max(keep, default=-1)}) and {width} columns: replay needs the "
                                 "recorded run's code, settings and seed")
        return subdraft(draft, keep, width)

    def record(self, draft: Draft, accepted_nodes: list[int], draft_s: float = 0.0) -> None:
        pass

    def finish(self, tokens: list[int]) -> None:
        if self.step != len(self.plans):
            raise ReplayMismatch(f"{self.where}: the replay ended after {self.step} of the {len(self.plans)} "
                                 "steps recorded")

