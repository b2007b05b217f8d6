"""Training Medusa's heads on the target's teacher-forced features (the data of :mod:`eagle_training`).

Head i at position t predicts the token at t + 2 + i. Its label is the target's own distribution there,
teacher-forced (Medusa-2's self-distillation: the soft cross-entropy against the target's next-token
distribution at t + 1 + i), weighted 0.8^i (Medusa's λ). Each epoch reads a random ``positions`` of each
sequence's positions (the K projections over every position cost K LM-head passes a sequence).

Held-out: each head's top-10 accuracy by rank (how often its r-th token is the target's token), which
:func:`specbench.drafting.medusa_head.best_paths` turns into the tree, and the held-out loss.
"""

from __future__ import annotations

import copy
import random
import sys

import torch
from tqdm.auto import tqdm

from specbench.drafting.medusa_head import MedusaHeads

DECAY = 0.8  # Medusa's per-head loss weight: 0.8^i
RANKS = 10  # ranks whose accuracy is measured


def _targets(feats: dict[int, torch.Tensor], lm_weight: torch.Tensor, rows: torch.Tensor, k: int
             ) -> list[torch.Tensor]:
    """The target's next-token logits at rows + 1 + i, for head i."""
    h = feats[-1]
    return [torch.nn.functional.linear(h[rows + 1 + i], lm_weight) for i in range(k)]


def medusa_loss(heads: MedusaHeads, lm_head, lm_weight, feats, rows: torch.Tensor) -> torch.Tensor:
    """The weighted soft cross-entropy of every head at positions ``rows`` (each with 1 + K positions after it)."""
    k = len(heads)
    logits = heads.logits(feats[-1][rows], lm_head)
    with torch.no_grad():
        targets = _targets(feats, lm_weight, rows, k)
    loss = 0.0
    for i in range(k):
        ce = -(targets[i].softmax(-1) * logits[i].log_softmax(-1)).sum(-1).mean()
        loss = loss + DECAY**i * ce
    return loss


def usable_rows(n: int, k: int) -> int:
    return max(n - 1 - k, 0)


def evaluate(heads: MedusaHeads, lm_head, lm_weight, data) -> tuple[float, list[list[float]]]:
    """Held-out (loss, accuracy[head][rank])."""
    k = len(heads)
    hits = torch.zeros(k, RANKS)
    total, judged, losses = 0, 0, 0.0
    with torch.no_grad():
        for _ids, feats in data:
            m = usable_rows(feats[-1].shape[0], k)
            if not m:
                continue
            rows = torch.arange(m)
            losses += float(medusa_loss(heads, lm_head, lm_weight, feats, rows))
            judged += 1
            logits = heads.logits(feats[-1][rows], lm_head)
            truth = [t.argmax(-1) for t in _targets(feats, lm_weight, rows, k)]
            for i in range(k):
                top = logits[i].topk(RANKS, -1).indices
                hits[i] += (top == truth[i][:, None]).float().sum(0)
            total += m
    return losses / max(judged, 1), (hits / max(total, 1)).tolist()


def train(heads: MedusaHeads, lm_head, lm_weight, train_set, heldout_set, *, epochs: int, lr: float,
          positions: int = 128, seed: int = 0, state: dict | None = None, on_epoch=None, progress: bool = True) -> dict:
    """Fit the heads' residual blocks (and projections, untied); resumable like the EAGLE trainer. The heads
    end with the best held-out epoch's weights; the state's history holds loss and accuracies per epoch."""
    params = [p for p in heads.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95))
    if state is None:
        loss, acc = evaluate(heads, lm_head, lm_weight, heldout_set)
        state = {"epoch": 0, "history": [{"epoch": 0, "heldout_loss": loss, "accuracy": acc}],
                 "best": copy.deepcopy(heads.state_dict())}
    else:
        heads.load_state_dict(state["head"])
        opt.load_state_dict(state["optimizer"])
    k = len(heads)
    bar = tqdm(range(state["epoch"], epochs), desc="medusa heads", unit="epoch", disable=not progress, file=sys.stderr)
    for epoch in bar:
        rng = random.Random(seed + epoch)
        order = list(range(len(train_set)))
        rng.shuffle(order)
        for i in tqdm(order, desc=f"epoch {epoch + 1}", unit="seq", leave=False, disable=not progress, file=sys.stderr):
            _ids, feats = train_set[i]
            m = usable_rows(feats[-1].shape[0], k)
            if not m:
                continue
            rows = torch.tensor(sorted(rng.sample(range(m), min(positions, m))))
            loss = medusa_loss(heads, lm_head, lm_weight, feats, rows)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_value_(params, 0.5)
            opt.step()
        loss, acc = evaluate(heads, lm_head, lm_weight, heldout_set)
        state["history"].append({"epoch": epoch + 1, "heldout_loss": loss, "accuracy": acc})
        if loss <= min(h["heldout_loss"] for h in state["history"]):
            state["best"] = copy.deepcopy(heads.state_dict())
        state.update(epoch=epoch + 1, head=heads.state_dict(), optimizer=opt.state_dict())
        bar.set_postfix(heldout=f"{loss:.4f}", top1=" ".join(f"{a[0]:.2f}" for a in acc))
        if on_epoch:
            on_epoch(state)
    heads.load_state_dict(state["best"])
    heads.eval()
    return state
