"""SPECTRA-CORE's coverage rule read three ways: τ (tokens per step) and speedup, side by side.

The paper: draw r ~ U(0,1); if r > τ take the most probable token "not yet
present in S_fwd", else the argmax (τ = 0.1). Readings (``coverage_reading``):

* ``epsilon``: explore when r < τ; "present" = a key of S_fwd;
* ``literal_key``: explore when r > τ; "present" = a key of S_fwd;
* ``literal_ngram``: explore when r > τ; "present" = the n-gram the token
  would complete is already stored under its first token in S_fwd;
* ``argmax`` (reference): the coverage rule off (``coverage: false``).

For each dtype, dataset and budget (``paper`` = spectra_core.yaml, ``cpu`` =
spectra_core-cpu.yaml), every prompt is decoded by the autoregressive baseline
and by each reading in one process (order rotating from prompt to prompt,
after an un-recorded warm-up). τ does not depend on the machine; speedup does
(Σ baseline time / Σ method time, per token, same prompts, same process).

    python bench/coverage_readings.py --data gsm8k=/path/gsm8k_test.jsonl
    python bench/coverage_readings.py --dtypes float32 --datasets mtbench --prompts 1 --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch
from omegaconf import OmegaConf
from prompts import dataset_prompts  # bench/ is on sys.path when a script here runs

from methods.registry import build_method_config, get_method
from specbench.core.decode import generate
from specbench.core.draft import Drafter
from specbench.core.forward import Target
from specbench.models import load_model
from specbench.paths import CONF_DIR
from specbench.provenance import environment_info

BUDGETS = {"paper": "spectra_core", "cpu": "spectra_core-cpu"}
VARIANTS = ["epsilon", "literal_key", "literal_ngram", "argmax"]


def drafter(budget: str, variant: str, vocab: int) -> Drafter:
    cfg = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "method" / f"{BUDGETS[budget]}.yaml"))
    method = cfg.pop("name")
    settings = build_method_config(method, cfg)
    if variant == "argmax":
        settings = dataclasses.replace(settings, coverage=False)
    else:
        settings = dataclasses.replace(settings, coverage=True, coverage_reading=variant)
    return get_method(method)(settings, vocab_size=vocab, seed=0)


def run(loaded, prompts, budgets, variants, max_new, baseline=True):
    """{(budget, variant) or 'autoregressive': [tokens, steps, seconds, same-as-AR count, n]}."""
    target, eos = Target(loaded.model), loaded.eos_token_ids
    drafters = {"autoregressive": Drafter(vocab_size=loaded.vocab_size)} if baseline else {}
    for b in budgets:
        for v in variants:
            drafters[(b, v)] = drafter(b, v, loaded.vocab_size)
    for d in drafters.values():  # warm-up, not recorded
        generate(target, d, prompts[0], max_new_tokens=16, eos_token_ids=eos)
    names = list(drafters)
    tally = {k: [0, 0, 0.0, 0, 0] for k in names}
    for i, ids in enumerate(prompts):
        outs = {}
        for name in names[i % len(names) :] + names[: i % len(names)]:
            start = time.perf_counter()
            rec = generate(target, drafters[name], ids, max_new_tokens=max_new, eos_token_ids=eos)
            outs[name] = (rec, time.perf_counter() - start)
        ref = outs["autoregressive"][0].output_ids if baseline else None
        for name, (rec, seconds) in outs.items():
            t = tally[name]
            t[0] += rec.new_tokens
            t[1] += rec.steps
            t[2] += seconds
            t[3] += rec.output_ids == ref
            t[4] += 1
    return tally


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--datasets", nargs="+", default=["mtbench", "gsm8k", "humaneval"])
    ap.add_argument("--data", action="append", default=[], help="NAME=PATH: a local copy of a dataset")
    ap.add_argument("--budgets", nargs="+", default=list(BUDGETS), choices=list(BUDGETS))
    ap.add_argument("--readings", nargs="+", default=VARIANTS, choices=VARIANTS)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--offset", type=int, default=0, help="skip this many samples of each dataset")
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--no-baseline", action="store_true", help="τ only: no autoregressive runs, no speedup")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    paths = dict(item.split("=", 1) for item in args.data)
    hardware_cfg = OmegaConf.load(CONF_DIR / "hardware" / "cpu.yaml")
    model_cfg = OmegaConf.load(CONF_DIR / "model" / f"{args.model}.yaml")
    print(
        f"machine: {environment_info('cpu')['device_name']}; model {args.model}; {args.prompts} prompts per "
        f"dataset, up to {args.max_new_tokens} new tokens, greedy, τ = new tokens / steps (prefill counts)"
    )
    print(f"{'dtype':9} {'dataset':10} {'budget':6} {'reading':14} {'τ':>5} {'speedup':>7}  same as AR  tokens/steps")
    for dtype in args.dtypes:
        loaded = load_model(OmegaConf.merge(model_cfg, {"dtype": dtype}), hardware_cfg)
        for name in args.datasets:
            found = dataset_prompts(name, loaded.tokenizer, model_cfg, limit=args.prompts, offset=args.offset,
                                    path=paths.get(name))
            if found is None:
                continue
            _, prompts = found
            tally = run(loaded, prompts, args.budgets, args.readings, args.max_new_tokens, not args.no_baseline)
            base = tally.pop("autoregressive", None)
            for (budget, variant), (tokens, steps, seconds, same, n) in tally.items():
                speedup = f"{(base[2] / base[0]) / (seconds / tokens):6.2f}x" if base else "      -"
                match = f"{same}/{n}" if base else "-"
                print(
                    f"{dtype:9} {name:10} {budget:6} {variant:14} {tokens / steps:5.2f} {speedup}  {match:10}  "
                    f"{tokens}/{steps}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
