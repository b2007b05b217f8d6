"""Training SpecDec++'s acceptance head: labelled draft states from token-mixed answers, then a weighted
binary cross-entropy with early stopping on held-out prompts (the recipe: :mod:`specbench.drafting.acceptance_head`)."""

from __future__ import annotations

import copy
import sys

import torch
from torch import nn
from tqdm.auto import tqdm

from specbench.core.acceptance import sample, target_probs
from specbench.drafting.acceptance_head import AcceptanceHead


@torch.inference_mode()
def collect(target_model, draft_lm, prompts: list[list[int]], responses: list[list[int]], params, mix: float,
            generator: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per prompt: (draft hidden states, true acceptance probabilities) at the draft-taken positions."""
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


