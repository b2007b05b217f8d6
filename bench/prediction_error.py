"""How well ``budget=auto`` / ``static`` predicted its steps: each recorded plan's expected tokens and seconds
(``pred_tokens``, ``pred_s`` in the rows' ``step_plans``) against what the step measured (``step_tokens``,
``step_times``), per decision kind and over all steps: median and mean ratio measured / predicted, and the
median absolute relative error. The prediction is made from the run's cost curve (cached per machine, so
normally measured in an earlier session) and its drafting table; the curve's measurement time is printed when
its cache file is found. Run on a results folder:

    python bench/prediction_error.py results/<run folder>
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict

import numpy as np

from specbench.budget.costs import CostModel
from specbench.machine.costs import cost_path
from specbench.results.rows import load_results


def ratios(rows) -> dict[str, list[tuple[float, float]]]:
    """Per decision kind: (measured / predicted seconds, measured / predicted tokens) of every decode step."""
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for row in rows.itertuples():
        plans = json.loads(row.step_plans)
        times, tokens = list(row.step_times)[1:], list(row.step_tokens)[1:]  # the prefill is no decode step
        for plan, seconds, got in zip(plans, times, tokens, strict=False):
            if plan.get("pred_s"):
                out[plan["why"]].append((seconds / plan["pred_s"], got / plan["pred_tokens"]))
    return out


def describe(name: str, pairs: list[tuple[float, float]]) -> str:
    s, t = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    return (f"{name:10} {len(pairs):6d}  seconds ×{statistics.median(s):.3f} (mean {s.mean():.3f}, |err| "
            f"{np.median(np.abs(s - 1)):.3f})  tokens ×{statistics.median(t):.3f} (mean {t.mean():.3f}, |err| "
            f"{np.median(np.abs(t - 1)):.3f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", help="a results folder (a run's, or any folder above runs)")
    args = ap.parse_args()
    rows = load_results(args.folder, quiet=True)
    rows = rows[rows.get("step_plans").notna() & (rows.get("step_plans") != "")] if "step_plans" in rows else rows[:0]
    if rows.empty:
        raise SystemExit(f"{args.folder}: no rows with recorded plans (run a preset under budget=auto or static)")
    for preset, mine in rows.groupby("preset"):
        curve = CostModel.from_dict(json.loads(mine.cost_curve.iloc[0]))
        path = cost_path(curve.key, mine.model.iloc[0], mine.dtype.iloc[0]) if curve.key else None
        when = (time.strftime("%Y-%m-%d %H:%M", time.localtime(path.stat().st_mtime))
                if path is not None and path.exists() else "unknown")
        print(f"{preset}: {len(mine)} generations; cost curve {curve.key or '?'}, cached {when}")
        groups = ratios(mine)
        for why, pairs in sorted(groups.items()):
            print("  " + describe(why, pairs))
        print("  " + describe("all", [p for pairs in groups.values() for p in pairs]))


if __name__ == "__main__":
    main()
