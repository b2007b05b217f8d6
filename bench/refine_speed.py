"""Perplexity scoring for store refinement: tokens per second of the scorer in use against the earlier
formulation (every batch padded and masked, the loss over logits with the class dimension in the middle,
8 pieces a batch), alternating on the same pieces of a store, perplexities compared.

    python bench/refine_speed.py                         # SmolLM2 (fp32), 64 pieces of the stdlib store
    python bench/refine_speed.py --pieces 128 --rounds 3 --store chat
"""

from __future__ import annotations

import argparse
import math
import random
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from specbench.models import load_model
from specbench.provenance import environment_info
from specbench.stores.datastore import Datastore
from specbench.stores.naming import resolve_store
from specbench.stores.refine import default_batch_size, padded_batch, pieces, sequence_perplexities

CONF = Path(__file__).resolve().parents[1] / "conf"


@torch.inference_mode()
def earlier(model: torch.nn.Module, seqs: list) -> list[float]:
    """The scorer as it was: a padded, masked batch; cross entropy over [batch, vocab, length]."""
    ids, mask = padded_batch(seqs)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    valid = mask[:, 1:].float()
    return [math.exp(v) for v in ((nll * valid).sum(1) / valid.sum(1).clamp(min=1)).tolist()]


def timed(score, model, seqs, size) -> tuple[float, list[float]]:
    t0 = time.perf_counter()
    out = []
    for b in range(0, len(seqs), size):
        out += score(model, seqs[b : b + size])
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--store", default="stdlib")
    ap.add_argument("--pieces", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    cfg = OmegaConf.load(CONF / "model" / f"{args.model}.yaml")
    loaded = load_model(cfg, {"device": "auto"})
    store = Datastore.load(resolve_store(args.store, cfg), loaded.tokenizer)
    every = pieces(store, 256, 8)
    seqs = sorted((every[i] for i in random.Random(0).sample(range(len(every)), args.pieces)), key=len)
    tokens = sum(len(s) for s in seqs)
    size = default_batch_size(loaded.model, 256)
    print(f"{args.model} ({loaded.dtype}) on {environment_info(loaded.device)['device_name']}: "
          f"{len(seqs)} pieces, {tokens} tokens of {args.store}")
    earlier(loaded.model, seqs[:2])  # warm-up
    rates: dict[str, list[float]] = {"earlier (8 a batch)": [], f"in use ({size} a batch)": []}
    for r in range(args.rounds):
        ways = [("earlier (8 a batch)", earlier, 8), (f"in use ({size} a batch)", sequence_perplexities, size)]
        for name, score, n in ways if r % 2 == 0 else ways[::-1]:
            seconds, ppl = timed(score, loaded.model, seqs, n)
            rates[name].append(tokens / seconds)
            if name.startswith("earlier"):
                before = ppl
            else:
                now = ppl
    worst = max(abs(a - b) / b for a, b in zip(now, before, strict=True))
    for name, values in rates.items():
        print(f"{name}: {np.median(values):.0f} tok/s ({min(values):.0f}–{max(values):.0f} over {args.rounds} rounds)")
    ratio = [b / a for a, b in zip(*rates.values(), strict=True)]
    print(f"in use / earlier: {np.median(ratio):.2f}× ({min(ratio):.2f}–{max(ratio):.2f}); "
          f"largest relative perplexity difference {worst:.1e}")


if __name__ == "__main__":
    main()
