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

A drafter that reads the target's hidden states (EAGLE, Medusa) names the
layers it wants; the same forward then keeps them (``output_hidden_states``:
references to tensors the model computes anyway, no extra pass), and the
decode loop hands the drafter the rows of the accepted path alone.

After acceptance the cache keeps prefix + root + accepted path: those entries
are gathered to the front of the block, then the cache is cropped. Auxiliary
and rejected entries never survive a step. Drafters never see the cache.

Placement: the input ids, positions and mask go to the embedding's device (a
sharded model's hooks move them on from there), the index of the rows whose
logits are kept to the device where the final hidden states come out, and the
compaction index to each layer's cache device, once per device. The model runs
as its base model plus its LM head, not through its top-level call: accelerate
hooks that call on a sharded model and would bring every input and output to
the first GPU. On CUDA each comes from pinned host
memory without waiting for the device: a step's only host syncs are the ones
that read its logits and the timing's.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import DynamicCache

from specbench.core.draft import Draft


def runs_on(module: torch.nn.Module) -> torch.device:
    """Where ``module`` computes: its accelerate hook's execution device (an offloaded module's weights wait on
    ``meta`` between forwards), else its first weight's device."""
    device = getattr(getattr(module, "_hf_hook", None), "execution_device", None)
    return torch.device(device) if device is not None else next(module.parameters()).device


def model_devices(model: torch.nn.Module) -> list[torch.device]:
    """Every device ``model`` computes on, in the order its modules come (offloaded weights: their hook's)."""
    seen: dict[torch.device, None] = {}
    for module in model.modules():
        device = getattr(getattr(module, "_hf_hook", None), "execution_device", None)
        if device is not None:
            seen.setdefault(torch.device(device), None)
        for param in module.parameters(recurse=False):
            if param.device.type != "meta":
                seen.setdefault(param.device, None)
    return list(seen)


def upload(values, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Host values (a list or array) as a tensor on ``device``; on CUDA through pinned memory, asynchronously
    (a plain ``torch.tensor(..., device=cuda)`` copies from pageable memory and waits for the device)."""
    tensor = torch.as_tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


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
        self.base = model.base_model
        self.lm_head = model.get_output_embeddings()
        self.softcap = getattr(config, "final_logit_softcapping", None)
        self.device = runs_on(model.get_input_embeddings())  # ids, positions and masks go here
        # where the final hidden states come out (a sharded model's last GPU): the kept rows' index goes there
        self.head_device = runs_on(self.base.norm if hasattr(self.base, "norm") else self.lm_head)
        self.devices = model_devices(model)
        self.dtype = next(model.parameters()).dtype
        self.is_cuda = any(d.type == "cuda" for d in self.devices)
        self.features: dict[int, torch.Tensor] = {}  # the last forward's hidden states, for the layers asked for

    def new_cache(self) -> DynamicCache:
        # No config on purpose: every layer keeps every position (see module docstring).
        return DynamicCache()

    def sync(self) -> None:
        """Wait for every GPU the model is on (a sharded model's last layers run on the last one)."""
        if self.is_cuda:
            for device in self.devices:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)

    def reset_peak_memory(self) -> None:
        for device in self.devices:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)

    def peak_memory_gb(self) -> float:
        """The most GPU memory held at once since :meth:`reset_peak_memory`, summed over the model's GPUs
        (NaN on the CPU, where it is not tracked)."""
        gpus = [d for d in self.devices if d.type == "cuda"]
        if not gpus:
            return float("nan")
        return sum(torch.cuda.max_memory_allocated(d) for d in gpus) / 1e9

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head over final hidden states, as the model's own forward applies it (softcapping included)."""
        logits = self.lm_head(hidden)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def _forward(
        self, ids: torch.Tensor, positions: torch.Tensor, mask, cache, keep_last=0, features: tuple[int, ...] = ()
    ) -> torch.Tensor:
        # The base model, then the head on the rows kept: a model dispatched over GPUs carries a top-level hook
        # that moves every tensor argument to the first GPU and every output back there, where the final hidden
        # states (on the last GPU) cannot be indexed, and the heads that read them are not.
        out = self.base(
            input_ids=ids,
            position_ids=positions,
            attention_mask=mask,
            past_key_values=cache,
            use_cache=True,
            output_hidden_states=bool(features),
        )
        hidden = out.last_hidden_state[0]
        if isinstance(keep_last, torch.Tensor):
            hidden = hidden.index_select(0, keep_last)
        elif keep_last:
            hidden = hidden[-keep_last:]
        # hidden_states[0] is the embeddings' output, [i] layer i's input, [-1] the final norm's output
        self.features = {layer: out.hidden_states[layer][0] for layer in features} if features else {}
        return self.logits(hidden)

    def prefill(self, prompt_ids: list[int], cache: DynamicCache, features: tuple[int, ...] = ()) -> torch.Tensor:
        """Run the prompt; return the logits that follow its last token (and, in :attr:`features`, the hidden
        states of every prompt position for the layers ``features`` names)."""
        ids = upload([prompt_ids], self.device)
        positions = torch.arange(len(prompt_ids), device=self.device)[None]
        return self._forward(ids, positions, None, cache, keep_last=1, features=features)[-1]

    def _mask(self, vis: np.ndarray, offsets: np.ndarray, past_len: int, positions: torch.Tensor | None = None):
        """The float mask ``[1, 1, q, past_len + q]``, built on the device: only the block's visibility
        (q × q) crosses from the host; the prefix columns are zeros made there. ``positions`` (the rows'
        absolute positions, on the device) saves an upload when the caller has them."""
        q = len(offsets)
        neg = torch.finfo(self.dtype).min
        hidden = ~upload(vis, self.device)  # the block's entries a row may not see

        def full(block_hidden: torch.Tensor) -> torch.Tensor:
            mask = torch.zeros((1, 1, q, past_len + q), dtype=self.dtype, device=self.device)
            mask[0, 0, :, past_len:].masked_fill_(block_hidden, neg)
            return mask

        if not self.has_sliding:
            return full(hidden)
        q_pos = positions.reshape(-1) if positions is not None else upload(offsets + past_len, self.device)
        k_pos = torch.cat([torch.arange(past_len, device=self.device), q_pos])
        whole = full(hidden)
        sliding = whole.masked_fill((q_pos[:, None] - k_pos[None, :] >= self.sliding_window)[None, None], neg)
        return {"full_attention": whole, "sliding_attention": sliding}

    def forward_draft(self, root: int, draft: Draft, cache: DynamicCache, features: tuple[int, ...] = ()) -> torch.Tensor:
        """Logits after the root, every guess and every auxiliary node (or those of
        ``draft.aux_logit_rows``): ``[1 + n + n_aux, vocab]``. With ``features`` (hidden-state indices, as
        ``output_hidden_states`` numbers them), :attr:`features` holds those layers' states of every row of
        the block, ``{layer: [q, hidden]}``, on the device where they live: from the same forward."""
        past_len = cache.get_seq_length()
        tokens = [root] + list(draft.tokens) + list(draft.aux_tokens)
        ids = upload([tokens], self.device)
        if not draft.aux_tokens and draft.is_chain():
            # A chain is plain causal attention: let the model build its own mask (fast path).
            positions = torch.arange(past_len, past_len + len(tokens), device=self.device)[None]
            return self._forward(ids, positions, None, cache, features=features)
        vis, offsets = block_layout(draft)
        positions = upload(offsets + past_len, self.device)[None]
        keep = 0
        if draft.aux_logit_rows is not None:  # the output layer only where logits are used
            first_aux = 1 + len(draft.tokens)
            rows = list(range(first_aux)) + [first_aux + j for j in draft.aux_logit_rows]
            keep = upload(rows, self.head_device)  # it indexes the final hidden states, on the head's device
        mask = self._mask(vis, offsets, past_len, positions)
        return self._forward(ids, positions, mask, cache, keep_last=keep, features=features)

    @staticmethod
    def compact(cache: DynamicCache, past_len: int, accepted_nodes: list[int]) -> None:
        """Keep prefix + root + the accepted guesses (block rows 1 + i), drop the rest."""
        keep = [0] + [1 + i for i in accepted_nodes]
        if keep != list(range(len(keep))):
            index: dict[torch.device, torch.Tensor] = {}  # one upload per device, not one per layer
            for layer in cache.layers:
                device = layer.keys.device
                if device not in index:
                    index[device] = upload([past_len + k for k in keep], device)
                idx = index[device]
                layer.keys[..., past_len : past_len + len(keep), :] = layer.keys.index_select(-2, idx)
                layer.values[..., past_len : past_len + len(keep), :] = layer.values.index_select(-2, idx)
        drop = cache.get_seq_length() - past_len - len(keep)
        if drop > 0:
            cache.crop(-drop)
