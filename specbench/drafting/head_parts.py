"""The parts of an EAGLE head's layer that are not the layer itself: its RMSNorm, its rotary position embedding
(any ``rope_scaling`` transformers knows), and its KV cache over the committed positions and a draft tree's."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(size)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def reference_scaling(rope: dict) -> dict:
    """``rope_scaling`` as EAGLE's loader reads it (linear, dynamic: {type, factor}), else transformers' (README)."""
    ok = rope["rope_type"] in ("linear", "dynamic") and set(rope) == {"rope_type", "factor"}
    out = {"type": rope["rope_type"], "factor": rope["factor"]} if ok else dict(rope)
    return {**out, "factor": float(out["factor"])} if "factor" in out else out  # its loader reads a float


def scaling_of(rope: dict | None) -> dict | None:
    """A config's RoPE scaling with its type under ``rope_type`` (old configs say ``type``), or None for plain RoPE."""
    rope = {k: v for k, v in (rope or {}).items() if k != "rope_theta"}
    kind = rope.pop("rope_type", None) or rope.pop("type", None)
    rope.pop("type", None)
    return None if kind in (None, "default") else {"rope_type": kind, **rope}


class Rotary(nn.Module):
    """Rotary position embedding (Llama's half-split layout) as a head's config gives it."""

    def __init__(self, c: Any) -> None:
        super().__init__()
        self.c = c
        self.scale = 1.0  # transformers' attention factor (yarn, longrope)
        self.inv: torch.Tensor | None = None
        self.inv_len = 0  # the positions ``dynamic`` scaling computed ``inv`` for

    def frequencies(self, device, length: int) -> torch.Tensor:
        c = self.c
        dynamic = c.rope_scaling is not None and c.rope_scaling["rope_type"] == "dynamic"
        if self.inv is None or self.inv.device != device or (dynamic and length > self.inv_len):
            if c.rope_scaling is None:
                d = c.head_dim
                self.inv = 1.0 / c.rope_theta ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)
            else:
                from transformers import LlamaConfig
                from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

                cfg = LlamaConfig(hidden_size=c.hidden_size, num_attention_heads=c.num_attention_heads,
                                  head_dim=c.head_dim, rope_theta=c.rope_theta, rope_scaling=dict(c.rope_scaling),
                                  max_position_embeddings=max(c.max_position_embeddings,
                                                              c.rope_scaling.get("original_max_position_embeddings", 0)))
                inv, self.scale = ROPE_INIT_FUNCTIONS[c.rope_scaling["rope_type"]](
                    cfg, device, **({"seq_len": max(length, c.max_position_embeddings)} if dynamic else {}))
                self.inv = inv.float()
            self.inv_len = max(length, c.max_position_embeddings)
        return self.inv

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``x`` [heads, n, d] rotated to ``positions`` [n]."""
        d = x.shape[-1]
        dynamic = self.c.rope_scaling is not None and self.c.rope_scaling["rope_type"] == "dynamic"
        # only dynamic scaling depends on how far positions reach: reading that is a host sync
        inv = self.frequencies(x.device, int(positions.max()) + 1 if dynamic and positions.numel() else 0)
        ang = positions.to(torch.float32)[:, None] * inv[None]
        ang = torch.cat([ang, ang], -1)
        cos, sin = (ang.cos() * self.scale).to(x.dtype), (ang.sin() * self.scale).to(x.dtype)
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return x * cos + torch.cat([-x2, x1], -1) * sin


class HeadCache:
    """The head's keys and values ([kv_heads, length, head_dim]): the committed positions first.

    Drafting appends into buffers that grow by doubling (one copy per doubling, not one per tree level) and
    crops by moving the length back; under autograd (training), whose graph must not see in-place writes,
    it concatenates instead."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None  # each entry's position, kept for a sliding window
        self.length = 0

    def __len__(self) -> int:
        return self.length

    def append(self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + k.shape[1]
        if positions is not None:
            kept = self.positions[: self.length] if self.positions is not None else positions[:0]
            self.positions = torch.cat([kept, positions])
        if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
            if self.keys is None or self.length == 0:
                self.keys, self.values = k, v
            else:
                self.keys = torch.cat([self.keys[:, : self.length], k], 1)
                self.values = torch.cat([self.values[:, : self.length], v], 1)
        else:
            if self.keys is None or end > self.keys.shape[1] or self.keys.requires_grad:
                capacity = max(64, 2 * end)
                keys = k.new_empty(k.shape[0], capacity, k.shape[2])
                values = v.new_empty(v.shape[0], capacity, v.shape[2])
                if self.keys is not None and self.length:
                    keys[:, : self.length] = self.keys[:, : self.length]
                    values[:, : self.length] = self.values[:, : self.length]
                self.keys, self.values = keys, values
            self.keys[:, self.length : end] = k
            self.values[:, self.length : end] = v
        self.length = end
        return self.keys[:, :end], self.values[:, :end]

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)
