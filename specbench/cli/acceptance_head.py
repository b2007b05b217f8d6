"""``specbench train-acceptance-head``: train SpecDec++'s acceptance head for a target × draft pair."""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from tqdm.auto import tqdm

from specbench import data as datasets_
from specbench.core.acceptance import SamplingParams
from specbench.core.decode import generate
from specbench.core.draft import Drafter, DrafterContext
from specbench.core.forward import Target
from specbench.drafting.acceptance_head import AcceptanceHead, head_file, save_head
from specbench.drafting.draft_model import build_draft_lm
from specbench.drafting.head_training import collect, train
from specbench.errors import ConfigError, one_line_errors
from specbench.models import load_draft, load_model
from specbench.paths import CONF_DIR
from specbench.run.config import validate


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(
        prog="specbench train-acceptance-head",
        description="Train SpecDec++'s acceptance head for a target × draft pair. Other arguments are run.py "
        "overrides (model=..., method=specdec_pp, method.self_first_layers=..., dataset=...).",
    )
    ap.add_argument("--prompts", type=int, default=60, help="prompts to answer (default 60)")
    ap.add_argument("--offset", type=int, default=10, help="first prompt (default 10: leaves the first for benchmarks)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--heldout", type=float, default=0.2, help="share of prompts held out")
    ap.add_argument("--mix", type=float, default=0.5, help="share of answer tokens kept from the target (r)")
    ap.add_argument("--w-rej", type=float, default=6.0, help="weight of the rejected class")
    ap.add_argument("--depth", type=int, default=3, help="residual blocks D")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--temperature", type=float, default=1.0,
                    help="temperature of p and q for the labels (0: greedy labels, for greedy runs)")
    ap.add_argument("--out", type=Path, default=None, help="where to save (default: the cache, by pair)")
    args, overrides = ap.parse_known_args(argv)
    if not 0 < args.heldout < 1 or not 0 <= args.mix < 1 or args.temperature < 0:
        raise ConfigError("need 0 < --heldout < 1, 0 <= --mix < 1 and --temperature >= 0")

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        chosen = any(o.startswith("method=") for o in overrides)
        cfg = compose("config", overrides=([] if chosen else ["method=specdec_pp"]) + overrides)
    settings = validate(cfg)["method"]
    settings.preflight()
    ddef = datasets_.get_dataset(cfg.dataset.name)
    datasets_.check_available(cfg.dataset)
    samples = datasets_.select(ddef.load(cfg.dataset), limit=args.prompts, offset=args.offset, shuffle=False, seed=0)
    loaded = load_model(cfg.model, cfg.hardware)
    context = DrafterContext(
        target_model=loaded.model, target_name=loaded.name, device=loaded.device,
        load_model=lambda name: load_draft(name, loaded.dtype, cfg.hardware),
    )
    draft_lm = build_draft_lm(settings, context, loaded.tokenizer, loaded.vocab_size)
    chat = bool(cfg.model.get("chat", True))
    prompts = [ddef.build_prompt(loaded.tokenizer, s, 0, [], cfg.dataset, chat) for s in samples]
    params = SamplingParams(temperature=args.temperature)
    gen = torch.Generator().manual_seed(cfg.seed)
    target = Target(loaded.model)
    responses = []
    for ids in tqdm(prompts, desc="target answers", unit="prompt", file=sys.stderr):
        rec = generate(target, Drafter(vocab_size=0), ids, max_new_tokens=args.max_new_tokens, sampling=params,
                       eos_token_ids=loaded.eos_token_ids, generator=gen)
        responses.append(rec.output_ids)
    data = collect(loaded.model, draft_lm, prompts, responses, params, args.mix, gen)
    random.Random(cfg.seed).shuffle(data)
    n_held = max(1, math.ceil(len(data) * args.heldout))
    if len(data) < 2:
        raise ConfigError("too few training sequences: raise --prompts or --max-new-tokens")
    head = AcceptanceHead(draft_lm.base.config.hidden_size, args.depth)
    labels = torch.cat([lab for _, lab in data])
    print(f"{len(labels)} draft tokens from {len(data)} answers; mean acceptance {float(labels.mean()):.3f}")
    history = train(head, data[n_held:], data[:n_held], w_rej=args.w_rej, epochs=args.epochs, lr=args.lr, seed=cfg.seed)
    best = min(range(len(history)), key=history.__getitem__)
    print(f"held-out loss: {history[0]:.4f} before training, {history[best]:.4f} after epoch {best} (kept; "
          f"{history[-1]:.4f} after the last), {n_held} held-out answers")
    path = args.out or head_file(loaded.name, settings.identity(), greedy=params.greedy)
    meta = {"target": loaded.name, "draft": settings.identity(), "w_rej": args.w_rej, "mix": args.mix,
            "temperature": args.temperature, "heldout_history": history, "dataset": ddef.name}
    save_head(path, head, meta)
    print(f"saved {path}")
    return path


def run(argv: list[str] | None = None) -> None:
    with one_line_errors():
        main(argv)
