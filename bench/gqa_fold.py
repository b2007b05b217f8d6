"""Grouped-query tree attention: K/V repeated per query head (transformers' masked sdpa) against the group
folded into the query length (``specbench.core.attention``), side by side on one model.

A verification step (``forward_draft`` of a two-chain tree, then compaction) is timed under each, the
two alternating within every round, for several block sizes and contexts; the figure is the ratio of the
median times with the range of the per-round ratios, and the logits are checked to agree.

    python bench/gqa_fold.py                              # SmolLM2-135M (9 query heads, 3 K/V heads), fp32
    python bench/gqa_fold.py --dtype bfloat16 --rounds 9
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
from omegaconf import OmegaConf

from specbench.core.attention import NAME, fold_gqa
from specbench.core.forward import Target
from specbench.machine.costs import _tree, timed_step
from specbench.models import load_model
from specbench.provenance import environment_info

CONF = Path(__file__).resolve().parents[1] / "conf"


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--qs", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument("--contexts", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    cfg = OmegaConf.merge(OmegaConf.load(CONF / "model" / f"{args.model}.yaml"), {"dtype": args.dtype})
    loaded = load_model(cfg, {"device": "auto", "gqa": "repeat"})
    target = Target(loaded.model)
    if not fold_gqa(loaded.model):
        raise SystemExit(f"{args.model} has no grouped-query attention: nothing to compare")
    print(f"{args.model} ({args.dtype}) on {environment_info(loaded.device)['device_name']}")
    print("| context | q | repeat K/V ms | folded ms | folded / repeat (range over rounds) | max |Δlogit| |")
    print("|---|---|---|---|---|---|")
    gen = torch.Generator().manual_seed(0)
    for ctx in args.contexts:
        cache = target.new_cache()
        prompt = torch.randint(0, loaded.vocab_size, (ctx,), generator=gen).tolist()
        target.prefill(prompt, cache)
        past = cache.get_seq_length()
        for q in args.qs:
            draft = _tree(q, loaded.vocab_size, gen)
            times: dict[str, list[float]] = {"sdpa": [], NAME: []}
            logits = {}
            for r in range(args.rounds + 1):
                order = ["sdpa", NAME] if r % 2 == 0 else [NAME, "sdpa"]
                for impl in order:
                    loaded.model.set_attn_implementation(impl)
                    seconds, logits[impl] = timed_step(target, draft, cache, prompt[-1], past)
                    if r:  # round 0 warms up
                        times[impl].append(seconds)
            ratios = [f / s for f, s in zip(times[NAME], times["sdpa"], strict=True)]
            diff = float((logits[NAME].float() - logits["sdpa"].float()).abs().max())
            rep, fold = statistics.median(times["sdpa"]), statistics.median(times[NAME])
            print(f"| {ctx} | {q} | {1000 * rep:.1f} | {1000 * fold:.1f} | {fold / rep:.2f} "
                  f"({min(ratios):.2f}–{max(ratios):.2f}) | {diff:.1e} |")


if __name__ == "__main__":
    main()
