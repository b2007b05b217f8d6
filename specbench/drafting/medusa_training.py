"""Training Medusa's heads on the target's teacher-forced features (the data of :mod:`eagle_training`).

Head i at position t predicts the token at t + 2 + i. Its label is the target's own distribution there,
teacher-forced (Medusa-2's self-distillation: the soft cross-entropy against the target's next-token
distribution at t + 1 + i), weighted 0.8^i (Medusa's λ). Each epoch reads a random ``positions`` of each
sequence's positions (the K projections over every position cost K LM-head passes a sequence).

Held-out: each head's top-10 accuracy by rank (how often its r-th token is the target's token), which
:func:`specbench.drafting.medusa_head.best_paths` turns into the tree, and the held-out loss.
"""

from __future__ import annotations

import torch

from specbench.drafting.eagle_training import fit
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
        for entry in data:
            feats = entry[1]
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
    """Fit the heads' residual blocks (and projections, untied) with the shared loop
    (:func:`specbench.drafting.eagle_training.fit`); the state's history holds loss and accuracies per epoch."""
    k = len(heads)

    def step_loss(i, rng):
        feats = train_set[i][1]
        m = usable_rows(feats[-1].shape[0], k)
        if not m:
            return None
        rows = torch.tensor(sorted(rng.sample(range(m), min(positions, m))))
        return medusa_loss(heads, lm_head, lm_weight, feats, rows)

    def evaluate_now():
        loss, acc = evaluate(heads, lm_head, lm_weight, heldout_set)
        return {"heldout_loss": loss, "accuracy": acc}

    return fit(heads, len(train_set), step_loss, evaluate_now, epochs=epochs, lr=lr, seed=seed, state=state,
               on_epoch=on_epoch, desc="medusa heads", progress=progress)
