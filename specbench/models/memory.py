"""Whether a batch fits the device, checked before any weights load.

A batch of B requests holds the weights, whatever the method adds (a head, a draft model) and a KV cache of
B × (prompt + answer) tokens: 2 (keys and values) × layers × KV heads × head size × bytes per value for each
token. A multi-turn request's last turn carries the earlier turns and their answers, so a request of ``turns``
turns is counted as ``turns`` × (its first prompt + ``max_new_tokens``). Only :data:`HEADROOM` of the device's
memory is counted on: the step's activations and logits, the CUDA context and the allocator's slack take
the rest. Over it, the run is refused in one line naming the largest batch size that fits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specbench.errors import ModelLoadError

HEADROOM = 0.9  # the share of the device's memory weights and KV cache may fill


@dataclass(frozen=True)
class Shape:
    """What sizes a model's memory: its layers, widths, KV heads and vocabulary."""

    layers: int
    hidden: int
    intermediate: int
    vocab: int
    kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, config: Any) -> Shape:
        """From a transformers config (a multimodal one's text part)."""
        text = getattr(config, "text_config", None) or config
        heads = int(text.num_attention_heads)
        return cls(layers=int(text.num_hidden_layers), hidden=int(text.hidden_size),
                   intermediate=int(getattr(text, "intermediate_size", 4 * text.hidden_size)),
                   vocab=int(text.vocab_size), kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
                   head_dim=int(getattr(text, "head_dim", None) or text.hidden_size // heads))

    def kv_bytes_per_token(self, itemsize: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * itemsize

    def layer_params(self) -> int:
        """One decoder layer: attention (queries and output full width, keys and values at the KV width) and a
        gated MLP."""
        kv = self.kv_heads * self.head_dim
        return 2 * self.hidden * self.hidden + 2 * self.hidden * kv + 3 * self.hidden * self.intermediate

    def params(self) -> int:
        """Every layer, the embedding and an untied LM head: for a model whose preset gives no ``params_b``."""
        return self.layers * self.layer_params() + 2 * self.vocab * self.hidden


def check_batch_memory(name: str, weights: float, kv_per_request: float, batch: int, have: float, where: str) -> None:
    """Refuse, in one line, a batch whose weights (and heads or drafts) and KV cache exceed :data:`HEADROOM` of
    ``have`` bytes; the line names the largest batch size that fits (or says the weights alone do not)."""
    room = HEADROOM * have
    need = weights + batch * kv_per_request
    if need <= room:
        return
    fits = math.floor((room - weights) / kv_per_request) if kv_per_request > 0 and room > weights else 0
    hint = (f"use batch_size={fits} or less, fewer tokens (max_new_tokens, dataset.max_input_tokens)"
            if fits >= 1 else "the weights alone leave no room for a batch: use a GPU with more memory")
    raise ModelLoadError(
        f"{name} at batch_size={batch} needs ~{need / 1e9:.1f} GB ({weights / 1e9:.1f} GB of weights and heads, "
        f"{batch * kv_per_request / 1e9:.1f} GB of KV cache) but {where} has {have / 1e9:.1f} GB, of which "
        f"{HEADROOM:.0%} is counted on: {hint}")
