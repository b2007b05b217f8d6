"""Where a preset's drafting time goes under ``budget=auto``: its decode steps grouped by what let them draft.

Each step is counted under the planner's reason (``specbench.budget.planner.WHY``): the first draft, an option
chosen because it pays, an exploration of the method's own draft, or a plain step. Per group: steps, drafting
milliseconds a step (the drafter's propose, the plan and its update, as ``step_draft_s`` counts them), tokens a
step, the step's measured milliseconds and what the group cost beyond autoregressive decoding's steps at the same
positions (the outputs are equal, so step i of each decodes after the same tokens while neither has accepted a
guess), in milliseconds and as a share of autoregressive decoding's time; then the regret drafting ran up
against the allowance. The planner is warmed and calibrated as ``compare.py`` does; each pass runs the prompts
one after another with one fresh planner, as a run does (``--passes``: as ``compare.py``'s repeats);
autoregressive decoding runs beside each prompt, before it or after in turn, and every output is checked
against it. Run:

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
    args, hardware_cfg, loaded, prompts, method, drafter, plain = one_preset(
        __doc__.splitlines()[0], "eagle-cpu:auto", extra=[("--passes", int, 1)])
    cost = load_or_measure(loaded, args.model, args.dtype, hardware_cfg.get("attn_implementation", "sdpa"),
                           check=True)
    target, eos, feeds = Target(loaded.model), loaded.eos_token_ids, get_method(method).AUX_FEEDS

    warm = AutoBudget(cost, aux_feeds=feeds, calibrating=True, catches_up=drafter.catches_up)  # warm-up: drafting's cost
    generate(target, drafter, prompts[0], max_new_tokens=16, eos_token_ids=eos, planner=warm)
    generate(target, plain, prompts[0], max_new_tokens=16, eos_token_ids=eos)
    # per kind: steps, drafting seconds, tokens, seconds, seconds beyond autoregressive decoding's same steps
    groups: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0, 0.0, 0.0])
    seconds = {"method": 0.0, "autoregressive": 0.0}
    print(f"machine: {environment_info('cpu')['device_name']}; {args.model} {args.dtype}; {args.method} under "
          f"budget=auto on {len(prompts)} {args.dataset} prompts, up to {args.max_new_tokens} new tokens, "
          f"{args.passes} pass(es)")
    for n_pass in range(args.passes):
        drafter.reset()
        planner = AutoBudget(cost, aux_feeds=feeds, drafting=warm.drafting.copy(), catches_up=drafter.catches_up)
        for i, ids in enumerate(prompts):
            drafter.begin_sample()
            seen, runs = len(planner.why), {}
            for name in ("method", "autoregressive") if (i + n_pass) % 2 == 0 else ("autoregressive", "method"):
                start = time.perf_counter()
                runs[name] = generate(target, drafter if name == "method" else plain, ids,
                                      max_new_tokens=args.max_new_tokens, eos_token_ids=eos,
                                      planner=planner if name == "method" else None)
                seconds[name] += time.perf_counter() - start
            rec, ref = runs["method"], runs["autoregressive"]
            if rec.output_ids != ref.output_ids:
                raise SystemExit(f"{args.method}: output differs from autoregressive decoding")
            plain_s = ref.step_times[1:]  # as many steps as the method's or more (each step brings a token or more)
            for k, (why, draft_s, tokens, step_s) in enumerate(zip(
                    planner.why[seen:], rec.step_draft_s[1:], rec.step_tokens[1:], rec.step_times[1:], strict=True)):
                for j, x in enumerate((1, draft_s, tokens, step_s, step_s - plain_s[k])):
                    groups[why][j] += x
    total = seconds["autoregressive"]
    print(f"{'step kind':12} {'steps':>6} {'drafting ms/step':>17} {'tokens/step':>12} {'ms/step':>8} "
          f"{'beyond AR, ms':>14} {'share of AR':>12}")
    for why in WHY:
        if why in groups:
            n, s, k, t, over = groups[why]
            print(f"{why:12} {n:6d} {s / n * 1e3:17.2f} {k / n:12.2f} {t / n * 1e3:8.2f} {over * 1e3:14.1f} "
                  f"{100 * over / total:11.2f}%")
    print(f"in all, beyond autoregressive decoding: {1e3 * (seconds['method'] - total):.1f} ms "
          f"({100 * (seconds['method'] - total) / total:.2f}%)")
    print(f"regret {planner.regret:.2f} plain steps against an allowance of {planner.allowance():.2f} "
          f"(of {planner.elapsed:.0f} modelled plain steps, the last pass); time ratio autoregressive / method "
          f"{seconds['autoregressive'] / seconds['method']:.3f} (see compare.py for speedups)")


if __name__ == "__main__":
    main()
