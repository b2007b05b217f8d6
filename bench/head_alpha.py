"""Held-out α of trained EAGLE / EAGLE-3 heads, judged two ways on one split.

Each head is evaluated on the held-out conversations ``specbench train-head`` keeps out (the
first ``--heldout`` share of the offline data for ``--max-len``, the same whatever trained the head), with
the target's features read from the training cache (run ``make bench-heads`` first). α is the share of
depth-1 guesses equal to the target's token (per draft step with ``--steps``), judged

- at the answer's positions (the tokens EAGLE's training now counts), and
- at every position (prompt and chat template included, as training counted them before).

    python bench/head_alpha.py --head eagle=before:/path/to/head --head eagle=after:trained --steps 1
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from omegaconf import OmegaConf

from specbench.cli.eagle_head import features_file
from specbench.drafting.eagle_drafter import trained_head_dir
from specbench.drafting.eagle_head import HeadConfig
from specbench.drafting.eagle_training import answer_starts, encode, evaluate, offline_conversations
from specbench.drafting.head_formats import load_head
from specbench.models import load_model
from specbench.paths import CONF_DIR


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--head", action="append", required=True,
                    help="KIND=LABEL:DIR (DIR 'trained': the cache's head for KIND); repeatable")
    ap.add_argument("--max-len", type=int, default=384)
    ap.add_argument("--heldout", type=float, default=0.1)
    ap.add_argument("--steps", type=int, default=1, help="draft steps judged (EAGLE-3's training-time test)")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    loaded = load_model(OmegaConf.load(CONF_DIR / "model" / f"{args.model}.yaml"), {"device": "cpu", "num_threads": args.threads})
    model = loaded.model
    pairs = offline_conversations(seed=0)
    sequences = encode(loaded.tokenizer, pairs, args.max_len)
    n_held = max(1, round(len(sequences) * args.heldout))
    starts = answer_starts(loaded.tokenizer, pairs, sequences)[:n_held]
    lm_weight = model.get_output_embeddings().weight.detach().float()
    embed = model.get_input_embeddings()
    held_len = [len(s) for s in sequences[:n_held]]
    print(f"{args.model}: {n_held} held-out conversations of {len(sequences)} (at most {args.max_len} tokens); "
          f"answers hold {sum(n - a for n, a in zip(held_len, starts, strict=True)) / sum(held_len):.0%} of their positions")
    print("| kind | head | α, answer positions | α, all positions | held-out loss (answers) |")
    print("|---|---|---|---|---|")
    for spec in args.head:
        kind, _, rest = spec.partition("=")
        label, _, where = rest.partition(":")
        directory = trained_head_dir(loaded.name, kind) if where == "trained" else Path(where)
        head = load_head(directory, model.config).float()
        _, data_file = features_file(loaded.name, HeadConfig.for_target(kind, model.config), len(sequences),
                                     args.max_len)
        if not data_file.is_file():
            raise SystemExit(f"no training features at {data_file}: run make bench-heads first")
        held = [(ids, feats) for ids, feats, *_ in torch.load(data_file, weights_only=False)[:n_held]]
        loss, answers = evaluate(head, lm_weight, embed, [(*e, s) for e, s in zip(held, starts, strict=True)],
                                 steps=args.steps)
        _, everywhere = evaluate(head, lm_weight, embed, [(*e, 0) for e in held], steps=args.steps)
        fmt = lambda a: " / ".join(f"{x:.3f}" for x in a)  # noqa: E731
        print(f"| {kind} | {label} | {fmt(answers)} | {fmt(everywhere)} | {loss:.3f} |")


if __name__ == "__main__":
    main()
