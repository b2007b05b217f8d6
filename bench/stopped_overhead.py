"""What a stopped drafter costs a decode step: a preset whose planner never lets it draft, against plain
autoregressive decoding, on the same prompts, interleaved.

Under ``budget=auto`` a drafter that does not pay is stopped: the planner sends a depth cap of 0 and the step
is a plain one. What it still costs (the drafter's update, features the target returns for a head, the
loop's and the planner's bookkeeping) is the per-step overhead the planner prices as the plain option's.
Each round decodes every prompt with autoregressive decoding, with the preset held at depth 0 by a planner
that does nothing else (:class:`Stopped`: the drafter's and the loop's share), and with the preset under
``budget=auto``'s planner holding it at depth 0 as a run does (its plans recorded: the planner's share too);
the table gives milliseconds per step for each and the overheads, median and range over the rounds (the order
rotates each round). Run:

    python bench/stopped_overhead.py --method eagle3-cpu --rounds 5
    python bench/stopped_overhead.py --method sps --rounds 5
"""

from __future__ import annotations

import statistics
import time

from prompts import one_preset  # bench/ is on sys.path when a script here runs

from methods.registry import get_method
from specbench.budget.drafting import DraftingCost
from specbench.budget.planner import AutoBudget
from specbench.budget.replay import Recorder
from specbench.core.decode import generate
from specbench.core.draft import Draft
from specbench.core.forward import Target
from specbench.machine.costs import load_or_measure
from specbench.provenance import environment_info


class Stopped:
    """A planner that never lets the drafter draft: every step is a plain one."""

    def cap(self) -> int:
        return 0

    width_cap = None

    def plan(self, draft: Draft, tokens: list[int]) -> Draft:
        return draft

    def record(self, draft: Draft, path: list[int], draft_s: float = 0.0) -> None:
        pass

    def finish(self, tokens: list[int]) -> None:
        pass


def main() -> None:
    args, hardware_cfg, loaded, prompts, method, drafter, plain = one_preset(
        __doc__.splitlines()[0], "eagle3-cpu", extra=[("--rounds", int, 5)])
    target, eos = Target(loaded.model), loaded.eos_token_ids

    def per_step(d, planner) -> float:
        steps, seconds = 0, 0.0
        for ids in prompts:
            d.begin_sample()
            start = time.perf_counter()
            rec = generate(target, d, ids, max_new_tokens=args.max_new_tokens, eos_token_ids=eos, planner=planner)
            seconds += time.perf_counter() - start
            steps += len(rec.step_times)
        return seconds / steps

    cost = load_or_measure(loaded, args.model, args.dtype, hardware_cfg.get("attn_implementation", "sdpa"))
    never = DraftingCost.from_dict({"coef": [10.0, 0.0, 0.0], "stopped": 0.0}, frozen=True)  # drafting never fits

    def held():
        return Recorder(AutoBudget(cost, aux_feeds=get_method(method).AUX_FEEDS, drafting=never, static=True,
                                   catches_up=drafter.catches_up))

    runs = {"autoregressive": lambda: per_step(plain, None), "stopped": lambda: per_step(drafter, Stopped()),
            "planner": lambda: per_step(drafter, held())}
    for run in runs.values():  # warm-up
        run()
    ms: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(args.rounds):  # which goes first rotates each round
        for name in names[r % len(names):] + names[: r % len(names)]:
            ms[name].append(1000 * runs[name]())
    print(f"machine: {environment_info('cpu')['device_name']}; {args.model} {args.dtype}; {args.method} held at "
          f"depth 0 on {len(prompts)} {args.dataset} prompts, {args.max_new_tokens} new tokens, {args.rounds} rounds")
    for name, values in ms.items():
        print(f"{name:15} {statistics.median(values):7.2f} ms/step [{min(values):.2f}, {max(values):.2f}]")
    med = statistics.median(ms["autoregressive"])
    for name in ("stopped", "planner"):
        over = [s - a for s, a in zip(ms[name], ms["autoregressive"], strict=True)]
        print(f"{name + ' overhead':22} {statistics.median(over):7.3f} ms/step [{min(over):.3f}, {max(over):.3f}] "
              f"({100 * statistics.median(over) / med:.1f}% of a plain step)")


if __name__ == "__main__":
    main()
