"""Our batched autoregressive decoding against transformers' ``generate`` with the same batch, side by side.

A batched speedup is only as honest as its batched baseline: ours (:func:`specbench.core.decode.decode_batch`
with empty drafts: rows at their own lengths in one buffer) must be as fast as ``generate`` on the same
prompts, left-padded into one batch. Both run greedy to ``--max-new-tokens`` or EOS, alternating which goes
first each round, after a warm-up; the figure is the ratio of generated tokens per second (ours / generate),
its median over rounds and its range, with the share of outputs that agree token for token.

    python bench/batch_generate.py                        # SmolLM2-135M, fp32, batch 8
    python bench/batch_generate.py --batch-size 4 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from bench.prompts import dataset_prompts
from specbench.core.decode import Request, decode_batch
from specbench.core.draft import Drafter
from specbench.core.forward import Target
from specbench.models import load_model
from specbench.provenance import environment_info

CONF = Path(__file__).resolve().parents[1] / "conf"


def ours(target: Target, loaded, prompts: list[list[int]], new: int) -> list[list[int]]:
    queue = [Request(p, new, Drafter(vocab_size=0), tag=i) for i, p in enumerate(prompts)][::-1]
    out = dict.fromkeys(range(len(prompts)))
    for req, rec in decode_batch(target, lambda: queue.pop() if queue else None, batch_size=len(prompts),
                                 eos_token_ids=loaded.eos_token_ids):
        out[req.tag] = rec.output_ids
    return [out[i] for i in range(len(prompts))]


def theirs(loaded, prompts: list[list[int]], new: int) -> list[list[int]]:
    """``generate`` on the prompts left-padded into one batch; each row's tokens up to its first EOS."""
    eos = loaded.eos_token_ids
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[eos[0]] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        out = loaded.model.generate(ids.to(loaded.device), attention_mask=mask.to(loaded.device), max_new_tokens=new,
                                    do_sample=False, eos_token_id=eos, pad_token_id=eos[0], top_p=None, top_k=None,
                                    temperature=None)
    rows = []
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        rows.append(row[:cut])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dataset", default="mtbench")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    cfg = OmegaConf.merge(OmegaConf.load(CONF / "model" / f"{args.model}.yaml"), {"dtype": args.dtype})
    loaded = load_model(cfg, OmegaConf.load(CONF / "hardware" / "cpu.yaml"))
    found = dataset_prompts(args.dataset, loaded.tokenizer, cfg, limit=args.batch_size)
    if found is None:
        raise SystemExit(f"{args.dataset} is not available offline: pass another --dataset")
    prompts = found[1]
    target = Target(loaded.model)
    run = {"ours": lambda: ours(target, loaded, prompts, args.max_new_tokens),
           "generate": lambda: theirs(loaded, prompts, args.max_new_tokens)}
    for fn in run.values():  # warm-up, not recorded
        fn()
    ratios, rates, agree = [], {"ours": [], "generate": []}, []
    for r in range(args.rounds):
        got, rate = {}, {}
        for who in ("ours", "generate") if r % 2 == 0 else ("generate", "ours"):
            start = time.perf_counter()
            got[who] = run[who]()
            rate[who] = sum(len(o) for o in got[who]) / (time.perf_counter() - start)
            rates[who].append(rate[who])
        ratios.append(rate["ours"] / rate["generate"])
        agree.append(sum(a == b for a, b in zip(got["ours"], got["generate"], strict=True)) / len(prompts))
    print(f"{args.model} {args.dtype} on {environment_info(loaded.device)['device_name']}, batch {len(prompts)} "
          f"{args.dataset} prompts, {args.max_new_tokens} new tokens, {args.rounds} rounds")
    print("| ours tok/s | generate tok/s | ours / generate (median, range) | outputs equal |")
    print("|---|---|---|---|")
    print(f"| {statistics.median(rates['ours']):.1f} | {statistics.median(rates['generate']):.1f} | "
          f"{statistics.median(ratios):.3f} ({min(ratios):.3f}–{max(ratios):.3f}) | {min(agree):.0%} |")


if __name__ == "__main__":
    main()
