"""SpecDec++'s acceptance-prediction head: the model, its stopping rule, and the command that trains it.

The head reads the draft's last hidden state of a drafted token ``y_i`` (the
state after ``y_i`` was fed, which the draft computes anyway to draft
``y_{i+1}``) and predicts the probability that verification accepts ``y_i``,
i.e. ``min(1, p(y_i) / q(y_i))``. Drafting stops when the predicted chance that
at least one drafted token is rejected exceeds ``h``: ``1 - Π p̂_i > h``.

Training (:mod:`specbench.drafting.head_training`; ``specbench train-acceptance-head``, or ``make train-acceptance-head``):

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

    specbench train-acceptance-head model=smollm2-135m method=specdec_pp --prompts 60
    specbench train-acceptance-head model=smollm2-135m method=specdec_pp --temperature 0
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch import nn

from specbench.errors import ConfigError
from specbench.paths import cache_root, private_tmp

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
    return f"specbench train-acceptance-head model={target_name} method=specdec_pp {fields}{temperature}"


def _override(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value)
