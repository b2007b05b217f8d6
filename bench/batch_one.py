"""Batch size 1 through the batched core against an earlier commit's core, side by side.

The same measurement (greedy decoding of a dataset's first prompts with a few methods, tokens/s) runs in the
working tree and in a git worktree of ``--against``, one process after the other, alternating which goes first
in each round (neither always runs on a warmer machine). The figure is the ratio of tokens/s (this tree /
the other), its median over rounds and its range; outputs are checked to be equal.

    python bench/batch_one.py --against <commit>                  # SmolLM2-135M, fp32, CPU
    python bench/batch_one.py --against <commit> --rounds 5 --methods autoregressive pld
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Methods as the -cpu presets size them, with fixed blocks (budget=auto would add its own planning).
PARAMS = {"spectra_core": {"ngram_size": 4, "pool_size": 5, "max_guesses": 5},
          "lookahead": {"ngram": 4, "window": 5, "guesses": 5, "pool_from_prompt": True}}

# Run in either tree (each imports its own specbench): prints {method: [tokens, seconds, outputs]}.
MEASURE = r"""
import json, sys, time
import torch
from omegaconf import OmegaConf
from methods.registry import build_method_config, get_method
from specbench.core.decode import generate
from specbench.core.draft import DrafterContext
from specbench.core.forward import Target
from specbench.models import load_model
from bench.prompts import dataset_prompts

args = json.loads(sys.argv[1])
torch.set_num_threads(args["threads"])
cfg = OmegaConf.merge(OmegaConf.load("conf/model/" + args["model"] + ".yaml"), {"dtype": "float32"})
loaded = load_model(cfg, OmegaConf.load("conf/hardware/cpu.yaml"))
_, prompts = dataset_prompts(args["dataset"], loaded.tokenizer, cfg, limit=args["prompts"])
target = Target(loaded.model)
out = {}
with torch.inference_mode():
    for name in args["methods"]:
        params = args["params"].get(name, {})
        context = DrafterContext(target_model=loaded.model, target_name=loaded.name)  # a self-draft's target
        make = lambda: get_method(name)(build_method_config(name, params), vocab_size=loaded.vocab_size,
                                        tokenizer=loaded.tokenizer, context=context)
        generate(target, make(), prompts[0], max_new_tokens=16, eos_token_ids=loaded.eos_token_ids)  # warm-up
        tokens, seconds, texts = 0, 0.0, []
        for ids in prompts:
            start = time.perf_counter()
            rec = generate(target, make(), ids, max_new_tokens=args["new"], eos_token_ids=loaded.eos_token_ids)
            seconds += time.perf_counter() - start
            tokens += rec.new_tokens
            texts.append(rec.output_ids)
        out[name] = [tokens, seconds, texts]
print("RESULT " + json.dumps(out))
"""


def measure(tree: Path, args: argparse.Namespace) -> dict:
    settings = {"model": args.model, "dataset": args.dataset, "prompts": args.prompts, "new": args.max_new_tokens,
                "methods": args.methods, "threads": args.threads, "params": PARAMS}
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", MEASURE, json.dumps(settings)], cwd=tree, env=env,
                          capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"measuring in {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", required=True, help="the commit whose core this tree's is compared with")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dataset", default="mtbench")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--methods", nargs="+", default=["autoregressive", "pld", "spectra_core"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        other = Path(tmp) / "other"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(other), args.against],
                       check=True)
        try:
            ratios: dict[str, list[float]] = {m: [] for m in args.methods}
            rates: dict[str, dict[str, list[float]]] = {m: {"this": [], "other": []} for m in args.methods}
            equal = {m: True for m in args.methods}
            for r in range(args.rounds):
                order = [("this", ROOT), ("other", other)]
                got = {who: measure(tree, args) for who, tree in (order if r % 2 == 0 else order[::-1])}
                for m in args.methods:
                    (t1, s1, o1), (t2, s2, o2) = got["this"][m], got["other"][m]
                    rates[m]["this"].append(t1 / s1)
                    rates[m]["other"].append(t2 / s2)
                    ratios[m].append((t1 / s1) / (t2 / s2))
                    equal[m] &= o1 == o2
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(other)], check=False)
    print(f"{args.model} fp32, {args.prompts} {args.dataset} prompts, {args.max_new_tokens} new tokens, "
          f"{args.rounds} rounds, {args.threads} threads; this tree against {args.against}")
    print("| method | this tree tok/s | other tok/s | this / other (median, range over rounds) | outputs equal |")
    print("|---|---|---|---|---|")
    for m in args.methods:
        lo, hi = min(ratios[m]), max(ratios[m])
        print(f"| {m} | {statistics.median(rates[m]['this']):.1f} | {statistics.median(rates[m]['other']):.1f} | "
              f"{statistics.median(ratios[m]):.3f} ({lo:.3f}–{hi:.3f}) | {equal[m]} |")


if __name__ == "__main__":
    main()
