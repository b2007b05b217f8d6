"""Tree attention for grouped-query models without repeating keys and values.

Under ``sdpa`` transformers hands grouped-query attention to the kernel (``enable_gqa``) only when there is
no mask, and folds the groups into the query for a single token; a masked block of q > 1 tokens (every
tree step) instead repeats K and V to every query head: K and V written 4-8× larger per layer, growing
with the context, while the q = 1 baseline pays nothing of the kind. That penalises every tree method
against the baseline for reasons unrelated to the method.

:func:`folded_sdpa` folds the group into the query length instead: the ``groups`` query heads that share
a K/V head become ``groups × q`` query rows of that head, the mask's q rows are tiled ``groups`` times,
and one SDPA call over the K/V heads as stored gives the same attention. Everything else (no mask, one
token, no groups, a per-head mask) goes to transformers' own ``sdpa``. :func:`fold_gqa` switches a model's
sdpa layers to it; ``hardware.gqa=repeat`` keeps transformers' behaviour (to measure one against the other).
:func:`grouped_sdpa` is the same fold for attention written here (the EAGLE heads' layer).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NAME = "sdpa_gqa_fold"
_GQA_KERNEL = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")  # sdpa groups K/V heads (torch ≥ 2.5)


def folded_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                is_causal: bool | None = None, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    q_len = query.shape[2]
    plain = (groups == 1 or q_len == 1 or attention_mask is None or attention_mask.dim() != 4
             or attention_mask.shape[1] != 1 or kwargs.get("position_bias") is not None or kwargs.get("cache") is not None)
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    rows = query.reshape(batch, kv_heads, groups * q_len, dim)  # query head h = kv head h // groups
    mask = attention_mask[:, :, :, : key.shape[-2]].repeat(1, 1, groups, 1)  # row g·q + i is row i
    out = F.scaled_dot_product_attention(rows, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
    return out.reshape(batch, heads, q_len, value.shape[-1]).transpose(1, 2).contiguous(), None


def grouped_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor | None) -> torch.Tensor:
    """SDPA on 4-D tensors, K and V as stored: ``q`` [heads, n, d], ``k``/``v`` [kv_heads, length, d], query
    head h reading K/V head h // groups. A mask folds each group into the query rows (the K/V head's
    ``groups × n`` rows, the mask tiled), as :func:`folded_sdpa` does for the target's layers;
    causal attention over a fresh sequence (training) hands the groups to the kernel. Returns [heads, n, d]."""
    heads, n, d = q.shape
    kv_heads = k.shape[0]
    groups = heads // kv_heads
    if visible is not None:
        rows = q.reshape(1, kv_heads, groups * n, d)  # query head h = kv head h // groups, rows g·n + i
        mask = visible.repeat(groups, 1)[None, None]
        out = F.scaled_dot_product_attention(rows, k[None], v[None], attn_mask=mask)
        return out.reshape(heads, n, v.shape[-1])
    if groups > 1 and not _GQA_KERNEL:
        k, v = k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0)
    extra = {"enable_gqa": True} if groups > 1 and _GQA_KERNEL else {}
    return F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, **extra)[0]


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, folded_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)


def fold_gqa(model: torch.nn.Module) -> bool:
    """Run ``model``'s sdpa attention through :func:`folded_sdpa` when it has grouped-query attention;
    return whether it now does."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads, kv_heads = getattr(config, "num_attention_heads", 0), getattr(config, "num_key_value_heads", None)
    if model.config._attn_implementation not in ("sdpa", NAME) or not kv_heads or kv_heads == heads:
        return False
    _register()
    model.set_attn_implementation(NAME)
    return model.config._attn_implementation == NAME
