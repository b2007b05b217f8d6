"""What ``budget=auto``'s exploration costs and buys, on the simulated decode loop (no model, no clock): the
modelled speed over plain decoding of drafters that never pay, pay a little, pay well, or start paying after a
long stretch that did not, under settings of the planner's exploration and allowance constants.

The loop is the planner tests' (:mod:`specbench.budget.simulated`): a chain of guesses each right with a set chance, drafting
seconds from a clock the run sets (a head-like drafter: 8 ms a draft plus 2 ms a level; a cheap one: 0.2 ms plus
2 ms), forwards priced by a CPU-like curve (a plain step 20 ms). Each cell is the mean over ``--seeds`` texts of
tokens ÷ modelled time in plain steps: 1.000 is plain decoding's speed. Deterministic: a reviewer gets the same
table. ``--losses``: where nothing pays, what each kind of step (the first draft, chosen, explored) lost in plain
steps, for a cheap, a head-like and a dear drafter over runs of growing length. Run:
    python bench/explore_sim.py --set EXPLORE_EVERY=16,32,64 --set ALLOWANCE_SHARE=0.01,0.003
    python bench/explore_sim.py --losses --set SPIKE=1,2 --spikes 7 --factor 1.5
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from collections import Counter

import specbench.budget.acceptance as acceptance
import specbench.budget.drafting as drafting
import specbench.budget.planner as planner
from specbench.budget.simulated import calibrated, level_clock, simulate

HEAD, CHEAP, DEAR = (0.008, 0.002), (0.0002, 0.002), (0.02, 0.004)  # drafting seconds: a draft's fixed part,
# each level's
# (name, chance a guess is right (or of the step), steps, drafting costs, steps of never-right guesses before)
CASES = [
    ("never pays, head-like, 512 steps", 0.0, 512, HEAD, 0),
    ("never pays, cheap, 512 steps", 0.0, 512, CHEAP, 0),
    ("never pays, head-like, 4,000 steps", 0.0, 4000, HEAD, 0),
    ("right 30%, 512 steps", 0.3, 512, (0.002, 0.002), 0),
    ("right 50%, 4 ms a level, 512 steps", 0.5, 512, (0.002, 0.004), 0),
    ("right 50%, head-like, 512 steps", 0.5, 512, HEAD, 0),
    ("right 60%, head-like, 512 steps", 0.6, 512, HEAD, 0),
    ("right 80%, 512 steps", 0.8, 512, (0.002, 0.002), 0),
    ("right 90% after 300 that never are", 0.9, 400, (0.002, 0.002), 300),
    ("right 90% after 400 that never are", 0.9, 400, (0.002, 0.002), 400),
    ("right 90% after 500 that never are", 0.9, 400, (0.002, 0.002), 500),
    ("right 60% after 400 that never are", 0.6, 400, (0.002, 0.004), 400),
    ("right 90% after 2,000 that never are", 0.9, 1000, (0.002, 0.002), 2000),
]


def speed(chance: float, steps: int, costs: tuple[float, float], before: int, seeds: int) -> float:
    """Tokens ÷ modelled time in plain steps, over the ``steps`` after ``before`` (mean over seeds)."""
    out = []
    for seed in range(seeds):
        clock = level_clock(base=costs[0], per_level=costs[1], stopped=0.0)
        budget = calibrated(clock)
        if before:
            simulate(budget, before, 0.0, clock, seed=seed)
        start = budget.elapsed
        run = simulate(budget, steps, chance, clock, seed=seed + 100 * bool(before))
        out.append(run.tokens / (budget.elapsed - start))
    return statistics.mean(out)


class Tally:
    """A planner's stand-in that keeps what each kind of step lost against plain decoding, in plain steps."""

    def __init__(self, inner: planner.AutoBudget) -> None:
        self.inner, self.lost, self.steps = inner, Counter(), Counter()
        self.over = float("-inf")  # the most the regret stood above the allowance after a step (≤ 0: within)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def record(self, draft, accepted_nodes, draft_s: float = 0.0) -> None:
        before = self.inner.elapsed
        self.inner.record(draft, accepted_nodes, draft_s=draft_s)
        why = self.inner.step.why
        self.steps[why] += 1
        self.lost[why] += self.inner.elapsed - before - (1 + len(accepted_nodes))
        self.over = max(self.over, self.inner.regret - self.inner.allowance())


def losses(spikes: int = 0, factor: float = 2.0) -> None:
    """Where nothing pays (deterministic: no guess is ever right, whatever the seed); with ``spikes``, every
    ``spikes``-th step's drafting takes ``factor`` times its usual seconds (the calibration's steps none). The
    last column: the most the regret stood above the allowance after any step (≤ 0: the cap held)."""
    print(f"{'drafter (drafting s: fixed, a level)':38} {'steps':>6}  plain steps lost by kind (steps of that kind)"
          "; worst regret - allowance")
    for label, costs in (("cheap", CHEAP), ("head-like", HEAD), ("dear", DEAR)):
        for steps in (512, 1024, 2048, 4096):
            tally = Tally(calibrated(level_clock(base=costs[0], per_level=costs[1], stopped=0.0)))
            simulate(tally, steps, 0.0, level_clock(base=costs[0], per_level=costs[1], stopped=0.0, spikes=spikes,
                                                    factor=factor))
            kinds = ", ".join(f"{why} {tally.lost[why]:.2f} ({tally.steps[why]})" for why in planner.WHY
                              if tally.steps[why] and why != "plain")
            print(f"{label + ' ' + str(costs):38} {steps:6d}  {sum(tally.lost.values()):.2f}: {kinds}; "
                  f"{tally.over:+.2f}")


def homes(name: str) -> list:
    """The planner's modules that read constant ``name`` (WINDOW: the drafting fit's, the acceptance counts', the
    options table's and, through FADE, the realism's)."""
    return [m for m in (planner, acceptance, drafting) if hasattr(m, name)]


def put(name: str, value) -> None:
    """``name`` set to ``value`` wherever the planner reads it (FADE follows WINDOW)."""
    for module in homes(name):
        setattr(module, name, value)
    if name == "WINDOW":
        planner.FADE = 1 - 1 / value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", action="append", default=[], metavar="NAME=V1,V2",
                    help="a constant of the planner or the acceptance model (PRIOR, BASE_RATE) and the values to "
                    "try (every combination is a column)")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--losses", action="store_true", help="where nothing pays: what each kind of step lost, in "
                    "plain steps, by drafting cost and run length (each --set combination in turn)")
    ap.add_argument("--spikes", type=int, default=0, help="--losses: every N-th step's drafting takes --factor "
                    "times its usual seconds")
    ap.add_argument("--factor", type=float, default=2.0)
    args = ap.parse_args()
    grid = {}
    for item in args.set:
        name, _, values = item.partition("=")
        if not (name.isupper() and homes(name)) or not values:
            raise SystemExit(f"--set {item}: name a constant of specbench/budget/planner.py, acceptance.py or "
                             "drafting.py and its values, e.g. EXPLORE_EVERY=16,32")
        grid[name] = [type(getattr(homes(name)[0], name))(v) for v in values.split(",")]
    columns = [dict(zip(grid, combo, strict=True)) for combo in itertools.product(*grid.values())] or [{}]
    saved = {name: getattr(homes(name)[0], name) for name in grid}
    labels = [" ".join(f"{k}={v}" for k, v in c.items()) or "as shipped" for c in columns]
    if args.losses:
        try:
            for column, label in zip(columns, labels, strict=True):
                for k, v in column.items():
                    put(k, v)
                print(label)
                losses(args.spikes, args.factor)
        finally:
            for k, v in saved.items():
                put(k, v)
        return
    width = [max(9, len(label)) for label in labels]
    print(f"{'case':38} " + " ".join(f"{label:>{w}}" for label, w in zip(labels, width, strict=True)))
    try:
        for name, chance, steps, costs, before in CASES:
            cells = []
            for column in columns:
                for k, v in column.items():
                    put(k, v)
                cells.append(speed(chance, steps, costs, before, args.seeds))
            print(f"{name:38} " + " ".join(f"{x:{w}.4f}" for x, w in zip(cells, width, strict=True)), flush=True)
    finally:
        for k, v in saved.items():
            put(k, v)


if __name__ == "__main__":
    main()
