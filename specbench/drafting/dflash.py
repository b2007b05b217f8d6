"""DFlash's drafter network (z-lab, 2026): a few decoder layers that draft a whole block in one forward.

As its authors' code and vLLM's and SGLang's builds describe it (read, not copied):

- **Context from the target.** The target's hidden states after a few of its layers (:func:`tapped_layers`:
  evenly spaced between layer 1 and layer L − 3, the middle layer for a one-layer drafter) are concatenated,
  projected to the hidden size by ``fc`` and normed (``hidden_norm``): one context vector per position the
  target has verified.
- **A block in one forward.** The block is the last verified token followed by B − 1 mask tokens, embedded with
  the target's own embedding (the drafter has none, nor an LM head: its final norm's output goes through the
  target's). In every draft layer the queries come from the block alone; the keys and values from [context ;
  block], so the context enters each layer as keys and values, not as inputs; attention is bidirectional
  (every block position sees the whole context and the whole block). Queries and keys are normed per head
  (Qwen3's layout) before the rotary embedding, at the positions the tokens will take.
- **A cache of the context.** Each layer keeps the keys and values of the context it has seen
  (:class:`Context`); a step adds the newly verified positions' and drops the block's.

Position k of the block's output (k = 1 … B − 1) is the draft of the token k places after the verified one.
This module is the network alone, pure: :mod:`methods.dflash` drafts with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


def tapped_layers(target_layers: int, draft_layers: int) -> list[int]:
    """The target layers whose outputs make the context, one per draft layer (DFlash's default): the middle
    one for a single draft layer, else spread evenly from layer 1 to layer ``target_layers - 3`` (Python's
    rounding, as the published checkpoints were built)."""
    if draft_layers < 1:
        raise ValueError(f"a DFlash drafter has at least one layer, got {draft_layers}")
    if draft_layers == 1:
        return [target_layers // 2]
    first, last = 1, target_layers - 3
    return [int(round(first + i * (last - first) / (draft_layers - 1))) for i in range(draft_layers)]


@dataclass(frozen=True)
class DFlashShape:
    """The drafter's sizes: the target's ``hidden`` size, its own heads and layers, the target layers it reads,
    the block size and the mask token's id."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    layers: int
    taps: tuple[int, ...]
    block: int = 16
    mask_token: int = 0
    eps: float = 1e-6
    rope_theta: float = 1_000_000.0


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _turn(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding of ``x`` [..., T, dim] at the positions ``cos``/``sin`` [T, dim] stand for."""
    a, b = x.chunk(2, -1)
    return x * cos + torch.cat((-b, a), -1) * sin


@dataclass
class Context:
    """Every draft layer's keys and values of the context seen so far: ``[kv heads, T, dim]`` each."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @property
    def length(self) -> int:
        return self.keys[0].shape[1] if self.keys else 0


class Norm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(size)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _rms(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, s: DFlashShape) -> None:
        super().__init__()
        self.q_proj = nn.Linear(s.hidden, s.heads * s.head_dim, bias=False)
        self.k_proj = nn.Linear(s.hidden, s.kv_heads * s.head_dim, bias=False)
        self.v_proj = nn.Linear(s.hidden, s.kv_heads * s.head_dim, bias=False)
        self.o_proj = nn.Linear(s.heads * s.head_dim, s.hidden, bias=False)
        self.q_norm, self.k_norm = Norm(s.head_dim, s.eps), Norm(s.head_dim, s.eps)


class MLP(nn.Module):
    def __init__(self, s: DFlashShape) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(s.hidden, s.intermediate, bias=False)
        self.up_proj = nn.Linear(s.hidden, s.intermediate, bias=False)
        self.down_proj = nn.Linear(s.intermediate, s.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    """One draft layer, its weights named as the published checkpoints name them (Qwen3's layout)."""

    def __init__(self, s: DFlashShape) -> None:
        super().__init__()
        self.s = s
        self.input_layernorm, self.post_attention_layernorm = Norm(s.hidden, s.eps), Norm(s.hidden, s.eps)
        self.self_attn, self.mlp = Attention(s), MLP(s)

    def forward(self, x: torch.Tensor, context: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                past: tuple[torch.Tensor, torch.Tensor] | None, mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x`` [B, hidden] (the block), ``context`` [T, hidden] (new context vectors), ``cos``/``sin`` [T + B,
        dim] (their positions, then the block's); returns the block's new states and the layer's context keys
        and values, ``past``'s followed by the new positions'. ``mask`` ([B, keys], True where a row may look;
        None: every row sees every key) lets several blocks share a forward, as training does."""
        s, a, b, t = self.s, self.self_attn, x.shape[0], context.shape[0]
        h = self.input_layernorm(x)
        both = torch.cat([context, h])  # the context enters as keys and values only
        q = a.q_norm(a.q_proj(h).view(b, s.heads, s.head_dim)).transpose(0, 1)
        k = a.k_norm(a.k_proj(both).view(t + b, s.kv_heads, s.head_dim)).transpose(0, 1)
        v = a.v_proj(both).view(t + b, s.kv_heads, s.head_dim).transpose(0, 1)
        q, k = _turn(q, cos[t:], sin[t:]), _turn(k, cos, sin)
        if past is not None:
            k, v = torch.cat([past[0], k], 1), torch.cat([past[1], v], 1)
        group = s.heads // s.kv_heads
        keys, values = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=s.head_dim ** -0.5)
        x = x + a.o_proj(attn.transpose(0, 1).reshape(b, -1))
        return x + self.mlp(self.post_attention_layernorm(x)), k[:, :-b], v[:, :-b]


class DFlashNet(nn.Module):
    """The drafter: ``fc`` and ``hidden_norm`` over the tapped target states, the draft layers, a final norm."""

    def __init__(self, s: DFlashShape) -> None:
        super().__init__()
        if len(s.taps) < 1 or s.heads % s.kv_heads or s.head_dim % 2:
            raise ValueError(f"not a DFlash shape: {s}")
        self.s = s
        self.fc = nn.Linear(len(s.taps) * s.hidden, s.hidden, bias=False)
        self.hidden_norm = Norm(s.hidden, s.eps)
        self.layers = nn.ModuleList(DraftLayer(s) for _ in range(s.layers))
        self.norm = Norm(s.hidden, s.eps)
        inv = 1.0 / (s.rope_theta ** (torch.arange(0, s.head_dim, 2, dtype=torch.float64) / s.head_dim))
        self.register_buffer("inv_freq", inv.float(), persistent=False)

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions.float()[:, None] * self.inv_freq[None]
        angles = torch.cat([angles, angles], -1)
        dtype = self.fc.weight.dtype
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def forward(self, features: torch.Tensor, block: torch.Tensor, positions: torch.Tensor,
                past: Context | None = None, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, Context]:
        """``features`` [T, taps × hidden]: the target's tapped states at the T positions verified since
        ``past``; ``block`` [B, hidden]: the block's embeddings; ``positions`` [T + B]: those positions, then
        the block's. Returns the block's final states [B, hidden] (normed: the target's LM head reads them)
        and the context with the T positions added. ``mask`` [B, T + B]: which keys each block row sees (several
        blocks in one forward, each over its own context: :mod:`specbench.drafting.dflash_training`)."""
        context = self.hidden_norm(self.fc(features))
        cos, sin = self.rotary(positions)
        x, keys, values = block, [], []
        for i, layer in enumerate(self.layers):
            x, k, v = layer(x, context, cos, sin, None if past is None else (past.keys[i], past.values[i]), mask)
            keys.append(k)
            values.append(v)
        return self.norm(x), Context(keys, values)
