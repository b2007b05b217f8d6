"""One forward pass over a draft tree, and KV-cache compaction afterwards.

The block fed to the target is ``[root] + guesses + auxiliary nodes``. Every
row sees the committed prefix (the cache) and the root; a guess also sees its
ancestors; an auxiliary node sees the auxiliary nodes its visibility row names.
The mask is a float mask (0 / dtype min) of shape ``[1, 1, q, kv_len]`` with
explicit position ids: transformers adds a mask to the attention scores under
eager attention, so a bool mask would be silently wrong there.

Models with sliding-window layers (Gemma 3) get a dict of masks, one per layer
type, over a cache that keeps every position: the window is applied in the
mask, so compaction never has to reason about evicted entries.

After acceptance the cache keeps prefix + root + accepted path: those entries
are gathered to the front of the block, then the cache is cropped. Auxiliary
and rejected entries never survive a step. Drafters never see the cache.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import DynamicCache

from specbench.core.draft import Draft


def block_layout(draft: Draft) -> tuple[np.ndarray, np.ndarray]:
    """Visibility among the block's rows (bool [q, q]) and their position offsets from the root."""
    n, m = len(draft.tokens), draft.n_aux
    q = 1 + n + m
    vis = np.zeros((q, q), dtype=bool)
    vis[:, 0] = True
    offsets = np.zeros(q, dtype=np.int64)
    for i, p in enumerate(draft.parents):
        row = 1 + i
        vis[row] = vis[p + 1]
        vis[row, row] = True
        offsets[row] = offsets[p + 1] + 1
    if m:
        a = 1 + n
        vis[a:, a:] = np.asarray(draft.aux_visible, dtype=bool) | np.eye(m, dtype=bool)
        offsets[a:] = np.asarray(draft.aux_positions, dtype=np.int64)
    return vis, offsets


class Target:
    """The target model behind the verification core (batch size 1)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.layer_types = list(getattr(config, "layer_types", None) or [])
        self.sliding_window = getattr(config, "sliding_window", None)
        self.has_sliding = "sliding_attention" in self.layer_types and bool(self.sliding_window)
        self.device = model.get_input_embeddings().weight.device
        self.dtype = next(model.parameters()).dtype
        self.is_cuda = self.device.type == "cuda"

    def new_cache(self) -> DynamicCache:
        # No config on purpose: every layer keeps every position (see module docstring).
        return DynamicCache()

    def sync(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def _forward(
        self, ids: torch.Tensor, positions: torch.Tensor, mask, cache, keep_last: int = 0
    ) -> torch.Tensor:
        out = self.model(
            input_ids=ids,
            position_ids=positions,
            attention_mask=mask,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=keep_last,
        )
        return out.logits[0]

    def prefill(self, prompt_ids: list[int], cache: DynamicCache) -> torch.Tensor:
        """Run the prompt; return the logits that follow its last token."""
        ids = torch.tensor([prompt_ids], device=self.device)
        positions = torch.arange(len(prompt_ids), device=self.device)[None]
        return self._forward(ids, positions, None, cache, keep_last=1)[-1]

    def _mask(self, vis: np.ndarray, offsets: np.ndarray, past_len: int):
        q = len(offsets)
        allowed = torch.ones((q, past_len + q), dtype=torch.bool)
        allowed[:, past_len:] = torch.from_numpy(vis)
        neg = torch.finfo(self.dtype).min

        def to_float(ok: torch.Tensor) -> torch.Tensor:
            mask = torch.zeros(ok.shape, dtype=self.dtype).masked_fill(~ok, neg)
            return mask[None, None].to(self.device)

        if not self.has_sliding:
            return to_float(allowed)
        q_pos = torch.from_numpy(offsets + past_len)
        k_pos = torch.cat([torch.arange(past_len), q_pos])
        in_window = (q_pos[:, None] - k_pos[None, :]) < self.sliding_window
        return {"full_attention": to_float(allowed), "sliding_attention": to_float(allowed & in_window)}

    def forward_draft(self, root: int, draft: Draft, cache: DynamicCache) -> torch.Tensor:
        """Logits after the root, every guess and every auxiliary node (or those of
        ``draft.aux_logit_rows``): ``[1 + n + n_aux, vocab]``."""
        past_len = cache.get_seq_length()
        tokens = [root] + list(draft.tokens) + list(draft.aux_tokens)
        ids = torch.tensor([tokens], device=self.device)
        if not draft.aux_tokens and draft.is_chain():
            # A chain is plain causal attention: let the model build its own mask (fast path).
            positions = torch.arange(past_len, past_len + len(tokens), device=self.device)[None]
            return self._forward(ids, positions, None, cache)
        vis, offsets = block_layout(draft)
        positions = torch.from_numpy(offsets + past_len).to(self.device)[None]
        keep = 0
        if draft.aux_logit_rows is not None:  # the output layer only where logits are used
            first_aux = 1 + len(draft.tokens)
            rows = list(range(first_aux)) + [first_aux + j for j in draft.aux_logit_rows]
            keep = torch.tensor(rows, device=self.device)
        return self._forward(ids, positions, self._mask(vis, offsets, past_len), cache, keep_last=keep)

    @staticmethod
    def compact(cache: DynamicCache, past_len: int, accepted_nodes: list[int]) -> None:
        """Keep prefix + root + the accepted guesses (block rows 1 + i), drop the rest."""
        keep = [0] + [1 + i for i in accepted_nodes]
        if keep != list(range(len(keep))):
            for layer in cache.layers:
                idx = torch.tensor(keep, device=layer.keys.device) + past_len
                layer.keys[..., past_len : past_len + len(keep), :] = layer.keys.index_select(-2, idx)
                layer.values[..., past_len : past_len + len(keep), :] = layer.values.index_select(-2, idx)
        drop = cache.get_seq_length() - past_len - len(keep)
        if drop > 0:
            cache.crop(-drop)
