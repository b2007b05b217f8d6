"""``specbench train-head``: train an EAGLE, EAGLE-3 or Medusa head for a target, resumably.

The data (:func:`specbench.drafting.eagle_training.offline_conversations`) is text every Python carries and
no evaluation set holds. The target's features are computed once and kept beside the head's checkpoint
(``<model>.features/``, shared by heads that read the same layers), with the optimizer's state after every
epoch (``<head dir>.work/``): an interrupted run resumes where
it stopped. The head is written in EAGLE's published format (``config.json``, ``model.safetensors``) with
``training.json`` (data, tokens, held-out loss and α per epoch, minutes).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from specbench.drafting.dflash import DFlashNet, DFlashShape
from specbench.drafting.dflash_files import save_dflash, shape_for
from specbench.drafting.dflash_training import train as dflash_train
from specbench.drafting.eagle_drafter import trained_head_dir
from specbench.drafting.eagle_head import KINDS, EagleHead, HeadConfig, save_head
from specbench.drafting.eagle_training import (
    TTT_STEPS,
    answer_starts,
    answers_vocabulary,
    encode,
    features_of,
    offline_conversations,
    train,
)
from specbench.drafting.medusa_head import MedusaHeads, save_medusa
from specbench.drafting.medusa_training import train as medusa_train
from specbench.errors import ConfigError, one_line_errors
from specbench.models import load_model
from specbench.paths import atomic_publish, private_tmp


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(
        prog="specbench train-head",
        description="Train an EAGLE head for a target on offline text. Other arguments are run.py overrides "
        "(model=..., hardware=...).")
    ap.add_argument("--kind", choices=(*KINDS, "medusa", "dflash"), default="eagle")
    ap.add_argument("--conversations", type=int, default=0,
                    help="conversations to train on (default 0: all); the held-out ones are the same whatever it is")
    ap.add_argument("--max-len", type=int, default=512, help="tokens per conversation")
    ap.add_argument("--heldout", type=float, default=0.1, help="share of conversations held out")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--draft-vocab", type=int, default=8192, help="EAGLE-3's draft vocabulary (most frequent tokens)")
    ap.add_argument("--ttt-steps", type=int, default=TTT_STEPS,
                    help=f"EAGLE-3's training-time test: draft steps unrolled per position (default {TTT_STEPS}, "
                    "the reference's; 1 trains the first step only)")
    ap.add_argument("--medusa-heads", type=int, default=4, help="Medusa's heads K (tied to the target's LM head)")
    ap.add_argument("--positions", type=int, default=128, help="Medusa: positions per sequence and epoch")
    ap.add_argument("--draft-layers", type=int, default=1, help="DFlash: the drafter's decoder layers")
    ap.add_argument("--block", type=int, default=8, help="DFlash: tokens a block holds, its root included")
    ap.add_argument("--anchors", type=int, default=64, help="DFlash: blocks drawn per sequence and epoch")
    ap.add_argument("--gamma", type=float, default=0.0,
                    help="DFlash: block position k's loss weighs exp(-(k-1)/gamma) (0: every position alike)")
    ap.add_argument("--out", type=Path, default=None, help="the head's directory (default: the cache's, by model)")
    args, overrides = ap.parse_known_args(argv)
    if not 0 < args.heldout < 1 or args.epochs < 1 or args.max_len < 8 or args.ttt_steps < 1:
        raise ConfigError("need 0 < --heldout < 1, --epochs >= 1, --max-len >= 8 and --ttt-steps >= 1")
    from hydra import compose, initialize_config_dir

    from specbench.paths import CONF_DIR
    from specbench.run.config import validate

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    validate(cfg)
    started = time.time()
    loaded = load_model(cfg.model, cfg.hardware)
    model = loaded.model
    out = args.out or trained_head_dir(loaded.name, args.kind)
    work = out.with_name(out.name + ".work")
    work.mkdir(parents=True, exist_ok=True)
    pairs = offline_conversations(seed=int(cfg.seed))
    sequences = encode(loaded.tokenizer, pairs, args.max_len)
    medusa = args.kind == "medusa"
    if args.kind == "dflash":
        shape = shape_for(model.config, args.draft_layers, args.block)
        layers = tuple(dict.fromkeys((*(t + 1 for t in shape.taps), -1)))  # layer t's output: states t + 1
        data_file = features_path(loaded.name, "dflash", layers, len(sequences), args.max_len)
    else:
        kind_cfg = HeadConfig.for_target("eagle" if medusa else args.kind, model.config)
        layers, data_file = features_file(loaded.name, kind_cfg, len(sequences), args.max_len)
    data_file.parent.mkdir(parents=True, exist_ok=True)
    if data_file.is_file():
        data = torch.load(data_file, weights_only=False)
    else:
        data = features_of(model, sequences, layers)
        tmp = private_tmp(data_file)
        torch.save(data, tmp)
        atomic_publish(tmp, data_file)
    data = [(ids, feats, start) for (ids, feats, *_), start in
            zip(data, answer_starts(loaded.tokenizer, pairs, sequences), strict=True)]  # EAGLE's loss: the answers
    n_held = max(1, round(len(data) * args.heldout))
    heldout, train_set = data[:n_held], data[n_held:][: args.conversations or None]
    if not train_set:
        raise ConfigError("too few conversations to train on: raise --conversations or lower --heldout")
    if args.kind == "eagle3":  # the reference's: the answers' tokens of the training split alone
        d2t = answers_vocabulary(train_set, args.draft_vocab)
        kind_cfg.draft_vocab_size = d2t.numel()
    torch.manual_seed(int(cfg.seed))
    if args.kind == "dflash":
        return _train_dflash(args, loaded, shape, layers[:-1], train_set, heldout, work, out, started)
    if medusa:
        return _train_medusa(args, loaded, data, train_set, heldout, work, out, started)
    head = EagleHead(kind_cfg)
    if args.kind == "eagle3":
        head.d2t.copy_(d2t)
    lm_weight = model.get_output_embeddings().weight.detach().float()
    embed = model.get_input_embeddings()
    steps = args.ttt_steps if args.kind == "eagle3" else 1
    ttt = f"-ttt{steps}" if steps > 1 else ""
    state, keep = _checkpointing(work / f"checkpoint-{args.kind}-{len(train_set)}x{args.max_len}{ttt}.pt")

    tokens = sum(int(entry[0].numel()) for entry in train_set)
    print(f"{len(train_set)} conversations ({tokens} tokens) to train on, {n_held} held out; "
          f"head of {sum(p.numel() for p in head.parameters()) / 1e6:.1f}M parameters")
    state = train(head, lm_weight, embed, train_set, heldout, epochs=args.epochs, lr=args.lr, seed=int(cfg.seed),
                  state=state, on_epoch=keep, steps=steps)
    best = min(state["history"], key=lambda h: h["heldout_loss"])
    meta = {"target": loaded.name, "kind": args.kind, "data": "pydoc_data topics + stdlib module docstrings",
            "conversations": len(train_set), "train_tokens": tokens, "heldout_conversations": n_held,
            "max_len": args.max_len, "epochs": args.epochs, "lr": args.lr, "ttt_steps": steps,
            "history": state["history"],
            "kept_epoch": best["epoch"], "minutes": round((time.time() - started) / 60, 1)}
    save_head(head, out)
    (out / "training.json").write_text(json.dumps(meta, indent=2))
    by_step = " / ".join(f"{a:.3f}" for a in best.get("alpha_by_step", [best["alpha"]]))
    print(f"held-out α {state['history'][0]['alpha']:.3f} before training, {best['alpha']:.3f} after epoch "
          f"{best['epoch']} (kept{'; by draft step ' + by_step if steps > 1 else ''}); saved {out}")
    return out


def features_file(target: str, kind_cfg: HeadConfig, n_sequences: int, max_len: int) -> tuple[tuple[int, ...], Path]:
    """The target layers a head of ``kind_cfg`` trains on, and the cache file that keeps their features (in the
    cache's head folder wherever ``--out`` puts the head; EAGLE and Medusa read the same layer: one file)."""
    layers = tuple(dict.fromkeys((*kind_cfg.feature_layers(), -1)))
    return layers, features_path(target, kind_cfg.kind, layers, n_sequences, max_len)


def features_path(target: str, kind: str, layers: tuple[int, ...], n_sequences: int, max_len: int) -> Path:
    """The cache file of the target's states ``layers`` over the training text (heads reading the same layers
    share it)."""
    names = "_".join(str(i) for i in layers)
    return trained_head_dir(target, kind).parent / f"{target}.features" / f"layers{names}-{n_sequences}x{max_len}.pt"


def _train_dflash(args, loaded, shape: DFlashShape, layers: tuple[int, ...], train_set, heldout, work: Path,
                  out: Path, started: float) -> Path:
    model = loaded.model
    net = DFlashNet(shape)
    lm_weight = model.get_output_embeddings().weight.detach().float()
    embed = model.get_input_embeddings()
    name = f"checkpoint-dflash-{shape.layers}x{shape.block}-{len(train_set)}x{args.max_len}.pt"
    state, keep = _checkpointing(work / name)
    tokens = sum(int(entry[0].numel()) for entry in train_set)
    print(f"{len(train_set)} conversations ({tokens} tokens) to train on, {len(heldout)} held out; drafter of "
          f"{sum(p.numel() for p in net.parameters()) / 1e6:.1f}M parameters reading target layers {list(shape.taps)}")
    state = dflash_train(net, lm_weight, embed, train_set, heldout, layers, epochs=args.epochs, lr=args.lr,
                         anchors=args.anchors, gamma=args.gamma, state=state, on_epoch=keep)
    best = min(state["history"], key=lambda h: h["heldout_loss"])
    meta = {"target": loaded.name, "kind": "dflash", "data": "pydoc_data topics + stdlib docstrings",
            "conversations": len(train_set), "train_tokens": tokens, "heldout_conversations": len(heldout),
            "max_len": args.max_len, "epochs": args.epochs, "lr": args.lr, "anchors": args.anchors,
            "gamma": args.gamma, "history": state["history"], "kept_epoch": best["epoch"],
            "minutes": round((time.time() - started) / 60, 1)}
    c = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    save_dflash(net, out, c.vocab_size, verifier=loaded.name)
    (out / "training.json").write_text(json.dumps(meta, indent=2))
    print(f"held-out accepted guesses a block {state['history'][0]['accepted']:.2f} before training, "
          f"{best['accepted']:.2f} after epoch {best['epoch']} (kept; top-1 agreement by position "
          f"{' / '.join(f'{a:.2f}' for a in best['agree_by_position'])}); saved {out}")
    return out


def _checkpointing(path: Path):
    state = torch.load(path, weights_only=False) if path.is_file() else None
    if state is not None:
        print(f"resuming after epoch {state['epoch']} ({path})")

    def keep(s: dict) -> None:
        tmp = private_tmp(path)
        torch.save(s, tmp)
        atomic_publish(tmp, path)

    return state, keep


def _train_medusa(args, loaded, data, train_set, heldout, work: Path, out: Path, started: float) -> Path:
    model = loaded.model
    c = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = MedusaHeads(c.hidden_size, c.vocab_size, args.medusa_heads, tied=True)
    lm_weight = model.get_output_embeddings().weight.detach().float()
    lm_head = lambda x: F.linear(x, lm_weight)  # noqa: E731 - the target's, frozen, with autograd
    state, keep = _checkpointing(work / f"checkpoint-medusa-{len(train_set)}x{args.max_len}.pt")
    tokens = sum(int(entry[0].numel()) for entry in train_set)
    print(f"{len(train_set)} conversations ({tokens} tokens) to train on, {len(heldout)} held out; "
          f"{args.medusa_heads} heads of {sum(p.numel() for p in heads.parameters()) / 1e6:.1f}M parameters in all")
    state = medusa_train(heads, lm_head, lm_weight, train_set, heldout, epochs=args.epochs, lr=args.lr,
                         positions=args.positions, state=state, on_epoch=keep)
    best = min(state["history"], key=lambda h: h["heldout_loss"])
    meta = {"target": loaded.name, "kind": "medusa", "data": "pydoc_data topics + stdlib docstrings",
            "conversations": len(train_set), "train_tokens": tokens, "heldout_conversations": len(heldout),
            "max_len": args.max_len, "epochs": args.epochs, "lr": args.lr, "positions": args.positions,
            "history": state["history"], "kept_epoch": best["epoch"],
            "minutes": round((time.time() - started) / 60, 1)}
    save_medusa(heads, out, {"accuracy": best["accuracy"], "target": loaded.name})
    (out / "training.json").write_text(json.dumps(meta, indent=2))
    first = state["history"][0]["accuracy"]
    print("held-out top-1 accuracy per head: " + ", ".join(
        f"{a[0]:.3f} (from {f[0]:.3f})" for a, f in zip(best["accuracy"], first, strict=True)) +
        f" after epoch {best['epoch']} (kept); saved {out}")
    return out


def run(argv: list[str] | None = None) -> None:
    with one_line_errors():
        main(argv)
