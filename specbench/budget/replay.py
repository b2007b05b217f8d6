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
clock that drove the recorded decisions plays no part.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from specbench.budget.planner import subdraft
from specbench.core.draft import Draft
from specbench.errors import ConfigError


class ReplayMismatch(RuntimeError):
    """The drafter proposed what the recorded run's drafter did not: another code, setting or seed."""


class Recorder:
    """Wraps a planner for one generation and keeps each step's plan (:attr:`plans`)."""

    def __init__(self, planner: Any) -> None:
        self.planner, self.plans = planner, []
        self._step: dict[str, Any] = {}

    def cap(self) -> int | None:
        cap = getattr(self.planner, "cap", None)
        depth = cap() if cap is not None else None
        self._step = {"depth": depth, "top_k": None}
        return depth

    @property
    def width_cap(self) -> int | None:
        top_k = getattr(self.planner, "width_cap", None)
        self._step["top_k"] = top_k
        return top_k

    def plan(self, draft: Draft, tokens: list[int]) -> Draft:
        planned = self.planner.plan(draft, tokens)
        keep, width = getattr(self.planner, "last_plan", (list(range(len(draft))), draft.aux_width))
        why = (getattr(self.planner, "why", None) or [""])[-1]
        whole = len(keep) == len(draft)  # every guess kept: recorded as null (most steps on a flat curve)
        expected = getattr(self.planner, "last_prediction", None)
        self.plans.append({**{"depth": None, "top_k": None}, **self._step, "n": len(draft),
                           "keep": None if whole else list(keep), "aux": int(width), "why": why,
                           **({"pred_tokens": round(expected[0], 4), "pred_s": round(expected[1], 6)}
                              if expected else {})})
        self._step = {}
        return planned

    def start(self, prompt_len: int) -> None:
        begin = getattr(self.planner, "start", None)
        if begin is not None:
            begin(prompt_len)

    def record(self, draft: Draft, accepted_nodes: list[int], draft_s: float = 0.0) -> None:
        self.planner.record(draft, accepted_nodes, draft_s=draft_s)

    def finish(self, tokens: list[int]) -> None:
        self.planner.finish(tokens)


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
        if width >= draft.aux_width and len(keep) == len(draft):
            return draft
        return subdraft(draft, keep, width)

    def record(self, draft: Draft, accepted_nodes: list[int], draft_s: float = 0.0) -> None:
        pass

    def finish(self, tokens: list[int]) -> None:
        if self.step != len(self.plans):
            raise ReplayMismatch(f"{self.where}: the replay ended after {self.step} of the {len(self.plans)} "
                                 "steps recorded")


def load_plans(rows: Any, method: str) -> dict[tuple, list[dict[str, Any]]]:
    """The recorded plans of ``method``'s rows, by (sample_id, turn, repeat)."""
    if rows.empty or "step_plans" not in rows.columns:
        return {}
    mine = rows[(rows["method"] == method) & rows["step_plans"].notna() & (rows["step_plans"] != "")]
    return {(str(r.sample_id), int(r.turn), int(r.repeat)): json.loads(r.step_plans) for r in mine.itertuples()}


def recorded_plans(folder: str | Path, method: str, keys: Iterable[tuple] = ()) -> dict[tuple, list[dict]]:
    """The plans ``budget=replay`` re-applies: ``method``'s rows under ``folder`` (a run's folder or any folder
    above it), checked to cover ``keys`` (sample_id, turn, repeat); a one-line error naming what is missing."""
    from specbench.results.rows import load_results

    path = Path(folder).expanduser()
    if not path.exists():
        raise ConfigError(f"replay={folder}: no such folder: point it at the results of a budget=auto run")
    plans = load_plans(load_results(path, quiet=True), method)
    if not plans:
        raise ConfigError(f"replay={folder}: no {method} rows with recorded plans there: record them with "
                          f"budget=auto first (rows of earlier versions carry none)")
    missing = [k for k in keys if k not in plans]
    if missing:
        sample, turn, repeat = missing[0]
        raise ConfigError(f"replay={folder}: {len(missing)} generations were not recorded there (e.g. sample "
                          f"{sample}, turn {turn}, repeat {repeat}): replay the recorded run's limit, offset and "
                          "repeats")
    return plans
