"""SpecDec++'s acceptance-prediction head: the model, its stopping rule, and the command that trains it.

The head reads the draft's last hidden state of a drafted token ``y_i`` (the
state after ``y_i`` was fed, which the draft computes anyway to draft
``y_{i+1}``) and predicts the probability that verification accepts ``y_i``,
i.e. ``min(1, p(y_i) / q(y_i))``. Drafting stops when the predicted chance that
at least one drafted token is rejected exceeds ``h``: ``1 - Π p̂_i > h``.

Training (``python -m specbench.acceptance_head``, or ``make train-acceptance-head``):

1. the target answers each prompt (sampled at the training temperature);
2. the draft reads prompt + answer and samples a token at every answer
   position from its ``q``;
3. token mixing: each answer position keeps the target's token with
   probability ``mix`` and takes the draft's otherwise;
4. target and draft read the mixed sequence; at every draft-taken position the
   label is ``min(1, p(y)/q(y))`` and the feature the draft's hidden state of
   ``y``; target-taken positions carry no loss;
5. weighted binary cross-entropy with soft labels,
   ``-(y log p̂ + w_rej (1 - y) log(1 - p̂))``, on whole prompts split into a
   training and a held-out set; the held-out loss is printed before and after.

At ``--temperature 0`` (greedy decoding) ``p`` and ``q`` are one-hot at their
argmaxes, so the label is 1 exactly when the draft's argmax is the target's:
what greedy verification accepts. A head trained on T = 1 labels predicts
``min(1, p/q)`` of a sampled token, which at greedy overstates acceptance, so
greedy runs read a head of their own.

The head is saved as ``$SPECBENCH_CACHE/acceptance_heads/<target>__<draft>.pt``
(``...__greedy.pt`` for greedy labels) with the identity of the target and the
draft it was trained for and its temperature.

    python -m specbench.acceptance_head model=smollm2-135m method=specdec_pp --prompts 60
    python -m specbench.acceptance_head model=smollm2-135m method=specdec_pp --temperature 0
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import random
import sys
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from specbench.config import ConfigError
from specbench.models import cache_root, private_tmp

HEAD_DIR = "acceptance_heads"


class AcceptanceHead(nn.Module):
    """A residual MLP with SiLU over a hidden state: ``depth`` blocks ``x + SiLU(W x)``, then a logit."""

    def __init__(self, hidden_size: int, depth: int = 3) -> None:
        super().__init__()
        self.hidden_size, self.depth = hidden_size, depth
        self.blocks = nn.ModuleList(nn.Linear(hidden_size, hidden_size) for _ in range(depth))
        self.out = nn.Linear(hidden_size, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of acceptance, ``[...]`` for hidden states ``[..., hidden_size]``."""
        x = hidden.float()
        for block in self.blocks:
            x = x + nn.functional.silu(block(x))
        return self.out(x)[..., 0]


def stop_length(predictions: list[float], threshold: float, cap: int) -> int:
    """How many tokens a chain keeps: the first ``i`` with ``1 - Π_{j<=i} p̂_j > threshold``, else ``cap``."""
    kept = 1.0
    for i, p in enumerate(predictions[:cap], start=1):
        kept *= p
        if 1.0 - kept > threshold:
            return i
    return min(cap, len(predictions))


def head_file(target_name: str, draft_identity: str, greedy: bool = False) -> Path:
    """Where the head for a pair lives: one trained on greedy labels for greedy runs, one for sampling."""
    return cache_root() / HEAD_DIR / f"{target_name}__{draft_identity}{'__greedy' if greedy else ''}.pt"


def save_head(path: Path, head: AcceptanceHead, meta: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = private_tmp(path)
    torch.save({"state_dict": head.state_dict(), "hidden_size": head.hidden_size, "depth": head.depth, **meta}, tmp)
    tmp.replace(path)


def load_head(path: Path, target_name: str, draft_identity: str, hidden_size: int,
              greedy: bool | None = None) -> AcceptanceHead:
    """A saved head, checked against the pair, the hidden size and (unless None) the decoding it is used with."""
    saved = torch.load(path, map_location="cpu", weights_only=True)
    if (saved.get("target"), saved.get("draft")) != (target_name, draft_identity):
        raise ConfigError(
            f"acceptance head {path} was trained for target '{saved.get('target')}' with draft "
            f"'{saved.get('draft')}', not '{target_name}' with '{draft_identity}': train one for this pair"
        )
    trained_greedy = saved.get("temperature", 1.0) == 0
    if greedy is not None and trained_greedy != greedy:
        raise ConfigError(
            f"acceptance head {path} was trained on {'greedy' if trained_greedy else 'sampled'} labels, this run "
            f"{'decodes greedily' if greedy else 'samples'}: train one with --temperature "
            f"{'0' if greedy else 'T (the run temperature)'}"
        )
    if saved["hidden_size"] != hidden_size:
        raise ConfigError(f"acceptance head {path} expects hidden size {saved['hidden_size']}, the draft has {hidden_size}")
    head = AcceptanceHead(saved["hidden_size"], saved["depth"])
    head.load_state_dict(saved["state_dict"])
    return head.eval()


def train_command(target_name: str, settings, greedy: bool = False) -> str:
    """The command that trains a head for this pair (named in the error when one is missing)."""
    fields = " ".join(
        f"method.{f.name}={_override(getattr(settings, f.name))}"
        for f in dataclasses.fields(settings)
        if f.name in ("draft_model", "self_first_layers", "self_skip_layers")
    )
    temperature = " --temperature 0" if greedy else ""
    return f"python -m specbench.acceptance_head model={target_name} method=specdec_pp {fields}{temperature}"


def _override(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value)


# ----------------------------------------------------------------------------- training data


@torch.inference_mode()
def collect(target_model, draft_lm, prompts: list[list[int]], responses: list[list[int]], params, mix: float,
            generator: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per prompt: (draft hidden states, true acceptance probabilities) at the draft-taken positions."""
    from specbench.sampling import sample, target_probs

    out = []
    for prompt, answer in zip(prompts, responses, strict=True):
        if not answer:
            continue
        n, seq = len(prompt), prompt + answer
        draft_lm.reset()
        logits, _ = draft_lm.forward(seq[:-1], every_position=True)
        q_rows = draft_lm.q(logits[n - 1 :], params)  # q before each answer token
        mixed, from_draft = list(prompt), []
        for i, tok in enumerate(answer):
            take_draft = float(torch.rand((), generator=generator)) >= mix
            mixed.append(sample(q_rows[i], generator) if take_draft else tok)
            from_draft.append(take_draft)
        if not any(from_draft):
            continue
        draft_lm.reset()
        logits, hidden = draft_lm.forward(mixed, every_position=True)
        q = draft_lm.q(logits[n - 1 : -1], params)
        p = target_probs(target_model(input_ids=torch.tensor([mixed], device=hidden.device)).logits[0, n - 1 : -1], params)
        toks = torch.tensor(mixed[n:], device=hidden.device)[:, None]
        label = torch.clamp(p.gather(-1, toks) / q.gather(-1, toks).clamp_min(1e-30), max=1.0)[:, 0]
        keep = torch.tensor(from_draft, device=hidden.device)
        out.append((hidden[n:][keep].float().cpu(), label[keep].float().cpu()))
    return out


def weighted_bce(logits: torch.Tensor, labels: torch.Tensor, w_rej: float) -> torch.Tensor:
    logp, log1mp = nn.functional.logsigmoid(logits), nn.functional.logsigmoid(-logits)
    return -(labels * logp + w_rej * (1 - labels) * log1mp).mean()


def train(head: AcceptanceHead, train_set, heldout_set, *, w_rej: float = 6.0, epochs: int = 20, lr: float = 1e-3,
          batch: int = 256, seed: int = 0, progress: bool = True) -> list[float]:
    """Fit ``head``; return the held-out loss before training and after each epoch. The head keeps the
    weights of its best epoch on the held-out set (early stopping: with hard 0/1 labels, as greedy ones
    are, a few thousand tokens are overfit within a few epochs)."""
    torch.manual_seed(seed)
    x = torch.cat([h for h, _ in train_set])
    y = torch.cat([lab for _, lab in train_set])
    hx = torch.cat([h for h, _ in heldout_set])
    hy = torch.cat([lab for _, lab in heldout_set])
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=1e-4)

    def heldout() -> float:
        with torch.no_grad():
            return float(weighted_bce(head(hx), hy, w_rej))

    history = [heldout()]
    best = (history[0], copy.deepcopy(head.state_dict()))
    bar = tqdm(range(epochs), desc="acceptance head", unit="epoch", disable=not progress, file=sys.stderr)
    for _ in bar:
        order = torch.randperm(len(x))
        for i in range(0, len(x), batch):
            idx = order[i : i + batch]
            loss = weighted_bce(head(x[idx]), y[idx], w_rej)
            opt.zero_grad()
            loss.backward()
            opt.step()
        history.append(heldout())
        bar.set_postfix(heldout=f"{history[-1]:.4f}")
        if history[-1] < best[0]:
            best = (history[-1], copy.deepcopy(head.state_dict()))
    head.load_state_dict(best[1])
    return history


# ----------------------------------------------------------------------------- command


def main(argv: list[str] | None = None) -> Path:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from specbench import data as datasets_
    from specbench.config import CONF_DIR, model_preset, validate
    from specbench.decode import generate
    from specbench.draft import Drafter, DrafterContext
    from specbench.draft_model import build_draft_lm
    from specbench.models import load_model
    from specbench.sampling import SamplingParams
    from specbench.verify import Target

    ap = argparse.ArgumentParser(
        prog="python -m specbench.acceptance_head",
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
        load_model=lambda name: load_model(OmegaConf.merge(model_preset(name), {"dtype": loaded.dtype}), cfg.hardware),
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


if __name__ == "__main__":
    from specbench.errors import one_line_errors

    with one_line_errors():
        main()
