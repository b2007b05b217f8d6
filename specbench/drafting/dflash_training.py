"""Training a DFlash drafter for a target here, as its authors describe the recipe (read, not copied).

The target is frozen; its states at the tapped layers are computed once per sequence (teacher forcing). From
each sequence, up to ``anchors`` positions are drawn among the answer's tokens. The block of anchor ``a`` is
token ``a`` followed by B − 1 mask tokens, at positions ``a … a + B − 1``; it sees the context strictly before
``a`` (the target's states there, which decoding has verified when it drafts after ``a``) and itself both ways,
and every block of the sequence runs in one forward under one mask (:func:`block_mask`). Block position k
(1 … B − 1) learns, by cross-entropy, the target's own choice of token ``a + k`` given the text before it (its
argmax, teacher-forced): what greedy verification accepts when the guesses before it were right, and what
DFlash's authors train on by regenerating the answers with the target (the text here is not the target's own,
so its choices stand in for them). Position k's loss may weigh ``exp(-(k - 1) / gamma)`` (``gamma`` 0: all
alike). Held-out figures: the loss, each position's top-1 agreement with the target, and the mean number of a
block's leading guesses that agree (the chain's accepted length, its root not counted).

Pure of files and models beyond their tensors: :mod:`specbench.cli.eagle_head` (``--kind dflash``) reads the
data and writes the drafter.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from specbench.drafting.dflash import DFlashNet
from specbench.drafting.eagle_training import fit, item


def anchors_of(length: int, start: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """Up to ``count`` distinct anchors, sorted, among positions ``start … length - 2`` (each has a next token
    to learn); drawn at random when there are more."""
    lo = max(start, 1)  # the first block sees at least one context position
    pool = torch.arange(lo, max(lo, length - 1))
    if pool.numel() > count:
        pool = pool[torch.randperm(pool.numel(), generator=generator)[:count]].sort().values
    return pool


def block_mask(anchors: torch.Tensor, context: int, block: int) -> torch.Tensor:
    """[len(anchors) × block, context + len(anchors) × block], True where a row may look: block i's rows see
    context positions before ``anchors[i]`` and every row of block i."""
    n = anchors.numel()
    ctx = torch.arange(context)[None, :] < anchors[:, None]  # [n, context]
    own = torch.eye(n, dtype=torch.bool).repeat_interleave(block, 0).repeat_interleave(block, 1)  # [nB, nB]
    return torch.cat([ctx.repeat_interleave(block, 0), own], 1)


def block_states(net: DFlashNet, embed, features: torch.Tensor, ids: torch.Tensor, anchors: torch.Tensor
                 ) -> torch.Tensor:
    """[len(anchors), B, hidden]: every anchor's block drafted in one forward over the sequence's context
    ``features`` [T, taps × hidden], each block seeing what decoding would show it (:func:`block_mask`)."""
    s, n, length = net.s, anchors.numel(), ids.shape[0]
    where = anchors[:, None] + torch.arange(s.block)[None, :]  # [n, B]: each block row's position
    tokens = torch.full((n, s.block), s.mask_token, dtype=torch.long)
    tokens[:, 0] = ids[anchors]
    block = embed(tokens.reshape(-1)).detach().to(net.fc.weight.dtype)
    positions = torch.cat([torch.arange(length), where.reshape(-1)])
    hidden, _ = net(features, block, positions, mask=block_mask(anchors, length, s.block))
    return hidden.view(n, s.block, -1)


@torch.no_grad()
def choices(feats: dict[int, torch.Tensor], lm_weight: torch.Tensor) -> torch.Tensor:
    """[T]: the target's own choice after each position (the argmax of its final states through its LM head)."""
    return F.linear(feats[-1], lm_weight).argmax(-1)


def block_loss(net: DFlashNet, lm_weight: torch.Tensor, embed, ids: torch.Tensor, feats: dict[int, torch.Tensor],
               layers: tuple[int, ...], anchors: torch.Tensor, gamma: float = 0.0, chosen: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The loss of one sequence's blocks at ``anchors``, then per block position k = 1 … B − 1 (columns) and
    anchor (rows): whether the drafter's argmax equals the target's, and whether the position is judged (its
    token exists). ``feats[i]``: the target's hidden states ``i`` (``layers``: the tapped ones, in order; the
    output of layer t is states t + 1) and ``feats[-1]`` its final states (the labels' source; ``chosen``: the
    labels already read from them, :func:`choices`)."""
    b, length = net.s.block, ids.shape[0]
    features = torch.cat([feats[i] for i in layers], -1).to(net.fc.weight.dtype)
    hidden = block_states(net, embed, features, ids, anchors)[:, 1:]  # position k predicts token a + k
    offsets = torch.arange(b)
    where = anchors[:, None] + offsets[None, :]
    n = anchors.numel()
    judged = where[:, 1:] < length
    source = where[:, 1:].clamp(max=length - 1) - 1  # the target's row that predicts token a + k
    truth = (chosen if chosen is not None else choices(feats, lm_weight))[source]
    logits = F.linear(hidden.reshape(n * (b - 1), -1).float(), lm_weight).view(n, b - 1, -1)  # 2-D: one product
    ce = F.cross_entropy(logits.flatten(0, 1), truth.flatten(), reduction="none").view(n, b - 1)
    weight = torch.ones(b - 1) if not gamma else torch.exp(-(offsets[1:] - 1).float() / gamma)
    weight = weight[None, :] * judged
    loss = (ce * weight).sum() / weight.sum().clamp_min(1e-9)
    right = (logits.argmax(-1) == truth) & judged
    return loss, right, judged


def accepted(right: torch.Tensor, judged: torch.Tensor) -> torch.Tensor:
    """Per block: how many leading guesses agree with the target (a greedy chain's accepted guesses)."""
    ok = (right | ~judged).int().cumprod(-1) * judged
    return ok.sum(-1)


def evaluate(net: DFlashNet, lm_weight, embed, data, layers, anchors: int, gamma: float = 0.0, labels=None) -> dict:
    """Held-out figures on the same anchors every time (seeded per sequence); ``labels(i)``: sequence i's
    :func:`choices`, kept across epochs."""
    total, rights, judged_all, accepts = 0.0, [], [], []
    with torch.no_grad():
        for i, entry in enumerate(data):
            ids, feats, start = item(entry)
            at = anchors_of(ids.shape[0], start, anchors, torch.Generator().manual_seed(i))
            if at.numel() == 0:
                continue
            loss, right, judged = block_loss(net, lm_weight, embed, ids, feats, layers, at, gamma,
                                             labels(i) if labels else None)
            total += float(loss)
            rights.append(right.sum(0))
            judged_all.append(judged.sum(0))
            accepts.append(accepted(right, judged).float())
    if not accepts:
        return {"heldout_loss": math.inf, "agree_by_position": [], "accepted": 0.0}
    by_pos = torch.stack(rights).sum(0) / torch.stack(judged_all).sum(0).clamp_min(1)
    return {"heldout_loss": total / len(accepts), "agree_by_position": [round(float(x), 4) for x in by_pos],
            "accepted": float(torch.cat(accepts).mean())}


def train(net: DFlashNet, lm_weight: torch.Tensor, embed, train_set, heldout_set, layers: tuple[int, ...], *,
          epochs: int, lr: float, anchors: int = 64, gamma: float = 0.0, seed: int = 0, state: dict | None = None,
          on_epoch=None, progress: bool = True) -> dict:
    """Fit ``net`` (the shared loop: :func:`specbench.drafting.eagle_training.fit`); the state's history holds the
    held-out loss, each block position's agreement and the mean accepted guesses per epoch."""
    gen = torch.Generator().manual_seed(seed)
    kept: dict[tuple[int, int], torch.Tensor] = {}  # (split, sequence): the target's choices, read once

    def labels(split: int, data):
        def of(i: int) -> torch.Tensor:
            if (split, i) not in kept:
                kept[split, i] = choices(item(data[i])[1], lm_weight)
            return kept[split, i]
        return of

    train_labels, heldout_labels = labels(0, train_set), labels(1, heldout_set)

    def step_loss(i, _rng):
        ids, feats, start = item(train_set[i])
        at = anchors_of(ids.shape[0], start, anchors, gen)
        if at.numel() == 0:
            return None
        return block_loss(net, lm_weight, embed, ids, feats, layers, at, gamma, train_labels(i))[0]

    def evaluate_now():
        return evaluate(net, lm_weight, embed, heldout_set, layers, anchors, gamma, heldout_labels)

    return fit(net, len(train_set), step_loss, evaluate_now, epochs=epochs, lr=lr, seed=seed, state=state,
               on_epoch=on_epoch, desc="dflash drafter", progress=progress)
