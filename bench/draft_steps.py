"""Where a preset's drafting time goes under ``budget=auto``: its decode steps grouped by what let them draft.

Each step is counted under the planner's reason (``specbench.budget.planner.WHY``): the first draft, an option
chosen because it pays, an exploration of the method's own draft, or a plain step. Per group: steps, drafting milliseconds a step (the
drafter's propose, the plan and its update, as ``step_draft_s`` counts them), tokens a step; then the regret
drafting ran up against the allowance. The planner is warmed and calibrated as ``compare.py`` does; the
prompts run one after another with one planner, as a run does; autoregressive decoding runs beside each
prompt for the time ratio, and every output is checked against it. Run:

    python bench/draft_steps.py --method eagle-cpu --dataset spec_bench:translation+qa+rag \\
        --data ../data/spec_bench_questions.jsonl
"""

from __future__ import annotations

import time
from collections import defaultdict

from prompts import one_preset  # bench/ is on sys.path when a script here runs

from methods.registry import get_method
from specbench.budget.planner import WHY, AutoBudget
from specbench.core.decode import generate
from specbench.core.forward import Target
from specbench.machine.costs import load_or_measure
from specbench.provenance import environment_info


def main() -> None:
    args, hardware_cfg, loaded, prompts, method, drafter, plain = one_preset(__doc__.splitlines()[0], "eagle-cpu:auto")
    cost = load_or_measure(loaded, args.model, args.dtype, hardware_cfg.get("attn_implementation", "sdpa"))
    target, eos, feeds = Target(loaded.model), loaded.eos_token_ids, get_method(method).AUX_FEEDS

    warm = AutoBudget(cost, aux_feeds=feeds, calibrating=True)  # warm-up, not counted: drafting's cost
    generate(target, drafter, prompts[0], max_new_tokens=16, eos_token_ids=eos, planner=warm)
    generate(target, plain, prompts[0], max_new_tokens=16, eos_token_ids=eos)
    drafter.reset()
    planner = AutoBudget(cost, aux_feeds=feeds, drafting=warm.drafting)
    groups: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0])  # steps, drafting seconds, tokens
    seconds = {"method": 0.0, "autoregressive": 0.0}
    print(f"machine: {environment_info('cpu')['device_name']}; {args.model} {args.dtype}; {args.method} under "
          f"budget=auto on {len(prompts)} {args.dataset} prompts, up to {args.max_new_tokens} new tokens")
    for ids in prompts:
        drafter.begin_sample()
        seen = len(planner.why)
        start = time.perf_counter()
        rec = generate(target, drafter, ids, max_new_tokens=args.max_new_tokens, eos_token_ids=eos, planner=planner)
        seconds["method"] += time.perf_counter() - start
        start = time.perf_counter()
        ref = generate(target, plain, ids, max_new_tokens=args.max_new_tokens, eos_token_ids=eos)
        seconds["autoregressive"] += time.perf_counter() - start
        if rec.output_ids != ref.output_ids:
            raise SystemExit(f"{args.method}: output differs from autoregressive decoding")
        for why, draft_s, tokens in zip(planner.why[seen:], rec.step_draft_s[1:], rec.step_tokens[1:],
                                        strict=True):
            group = groups[why]
            group[0] += 1
            group[1] += draft_s
            group[2] += tokens
    print(f"{'step kind':12} {'steps':>6} {'drafting ms/step':>17} {'tokens/step':>12}")
    for why in WHY:
        if why in groups:
            n, s, k = groups[why]
            print(f"{why:12} {n:6d} {s / n * 1e3:17.2f} {k / n:12.2f}")
    print(f"regret {planner.regret:.2f} plain steps against an allowance of {planner.allowance():.2f} "
          f"(of {planner.elapsed:.0f} modelled plain steps); time ratio autoregressive / method "
          f"{seconds['autoregressive'] / seconds['method']:.3f} (one pass: see compare.py for speedups)")


if __name__ == "__main__":
    main()
