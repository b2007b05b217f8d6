"""t(q) per forward mode: one verification step under ``forward=eager`` and ``forward=compiled``, side by side.

A verification step (``forward_draft`` of a two-chain tree of ``q - 1`` guesses, then compaction) is timed in
each mode, the two alternating within every round, for each block size and context; printed: each mode's
median milliseconds, compiled over eager with the range of the per-round ratios, and the largest logit
difference between the modes. The compiled forward compiles every width first, and says how long that took
(not part of any timing).

    python bench/forward_steps.py                          # SmolLM2-135M fp32, contexts 128 and 2048
    python bench/forward_steps.py --qs 1 2 4 8 --contexts 512 --rounds 9
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
from omegaconf import OmegaConf

from specbench.core.engine import make_target
from specbench.machine.costs import _tree, timed_step
from specbench.models import load_model
from specbench.paths import compiled_packages
from specbench.provenance import environment_info

CONF = Path(__file__).resolve().parents[1] / "conf"
MODES = ("eager", "compiled")


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--qs", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--contexts", type=int, nargs="+", default=[128, 2048])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    cfg = OmegaConf.merge(OmegaConf.load(CONF / "model" / f"{args.model}.yaml"), {"dtype": args.dtype})
    loaded = load_model(cfg, OmegaConf.load(CONF / "hardware" / "cpu.yaml"))
    targets = {mode: make_target(loaded.model, mode, ahead=compiled_packages()) for mode in MODES}
    print(f"{args.model} ({args.dtype}) on {environment_info(loaded.device)['device_name']}, "
          f"{torch.get_num_threads()} threads")
    limit = max(args.contexts) + max(args.qs) + 8
    seconds = targets["compiled"].warm(1, limit)  # on a GPU: every graph up to the longest context
    print(f"forward=compiled: every width compiled (captured) in {seconds:.1f} s (not timed)")
    print("| context | q | eager ms | compiled ms | compiled / eager (range over rounds) | max |Δlogit| |")
    print("|---|---|---|---|---|---|")
    gen = torch.Generator().manual_seed(0)
    for ctx in args.contexts:
        prompt = torch.randint(0, loaded.vocab_size, (ctx,), generator=gen).tolist()
        caches = {mode: t.new_cache(1, limit=limit) for mode, t in targets.items()}
        for mode, t in targets.items():
            t.prefill(prompt, caches[mode])
        past = ctx
        for q in args.qs:
            draft = _tree(q, loaded.vocab_size, gen)
            times: dict[str, list[float]] = {mode: [] for mode in MODES}
            logits = {}
            for r in range(args.rounds + 1):
                for mode in MODES if r % 2 == 0 else MODES[::-1]:
                    seconds, logits[mode] = timed_step(targets[mode], draft, caches[mode], prompt[-1], past)
                    if r:  # round 0 warms up
                        times[mode].append(seconds)
            ratios = [c / e for c, e in zip(times["compiled"], times["eager"], strict=True)]
            diff = float((logits["compiled"].float() - logits["eager"].float()).abs().max())
            eager, compiled = statistics.median(times["eager"]), statistics.median(times["compiled"])
            print(f"| {ctx} | {q} | {1000 * eager:.1f} | {1000 * compiled:.1f} | {compiled / eager:.2f} "
                  f"({min(ratios):.2f}–{max(ratios):.2f}) | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
