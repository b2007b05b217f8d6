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
are gathered to the front of the block and the row's length moves past them
(:class:`specbench.core.kv.RowCache`). Auxiliary and rejected entries never
survive a step. Drafters never see the cache.

Several rows (a batch, :meth:`Target.forward_rows`) run in one forward: each
block is padded to the longest, sits at its row's own positions, and sees its
own committed entries and its own tree; padding sees itself alone and is never
seen, and only the rows whose logits are used reach the LM head.

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

import inspect

import numpy as np
import torch

from specbench.core.draft import Draft
from specbench.core.kv import RowCache, upload


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


class LayerInputs:
    """The inputs of the decoder layers a drafter reads (``hidden_states[i]`` is layer i's input), caught by a
    pre-hook on each of those layers alone, installed once per model and idle unless a forward asks.
    transformers' ``output_hidden_states`` instead hooks every layer, and once asked keeps those hooks on every
    later forward of the model (autoregressive decoding's too)."""

    def __init__(self, layers: torch.nn.ModuleList) -> None:
        self.layers, self.hooked, self.wanted = layers, set(), frozenset()
        self.caught: dict[int, torch.Tensor] = {}

    @classmethod
    def of(cls, base: torch.nn.Module) -> LayerInputs | None:
        if not isinstance(getattr(base, "layers", None), torch.nn.ModuleList):
            return None
        if not isinstance(getattr(base, "_specbench_layer_inputs", None), cls):
            base._specbench_layer_inputs = cls(base.layers)
        return base._specbench_layer_inputs

    def arm(self, indices: frozenset[int]) -> None:
        for i in indices - self.hooked:
            self.layers[i].register_forward_pre_hook(lambda m, args, kwargs, i=i: self._catch(i, args, kwargs),
                                                     with_kwargs=True)
            self.hooked.add(i)
        self.wanted, self.caught = indices, {}

    def _catch(self, i: int, args: tuple, kwargs: dict) -> None:
        if i in self.wanted:
            self.caught[i] = args[0] if args else kwargs["hidden_states"]


class Target:
    """The target model behind the verification core: one row (:meth:`forward_draft`) or a batch."""

    mode = "eager"  # the forward mode (``forward=``): transformers' modules as they are

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
        layers = getattr(self.base, "layers", None)
        self.layer_devices = ([runs_on(layer) for layer in layers] if layers is not None
                              else [self.device] * config.num_hidden_layers)
        self.n_layers = len(self.layer_devices)
        self.inputs = LayerInputs.of(self.base)
        self.dtype = next(model.parameters()).dtype
        self.cache_kwarg = cache_kwarg(self.base)
        self.is_cuda = any(d.type == "cuda" for d in self.devices)
        self.features: dict[int, torch.Tensor] = {}  # the last forward's hidden states, for the layers asked for
        self.row_features: list[dict[int, torch.Tensor]] = []  # forward_rows: each row's
        self.rows_logits: torch.Tensor | None = None  # forward_rows: every row's logits, one after the other

    def new_cache(self, slots: int = 1, limit: int | None = None) -> RowCache:
        """A cache for ``slots`` rows (every layer keeps every position, see the module docstring); ``limit``:
        the most entries a row will need, if known (the buffers never double past it)."""
        return RowCache(slots, self.layer_devices, limit=limit)

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

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, mask, cache: RowCache, lo: int = 0,
                 keep=None, features: tuple[int, ...] = ()) -> torch.Tensor:
        """The base model over ``ids`` ``[n, q]`` (slots ``lo..lo + n``), then the LM head on the rows ``keep``
        names (an index into the flattened ``[n × q]`` rows, on the head's device; an int: the last ones;
        None: every row). Sets :attr:`features` to the ``[n, q, hidden]`` states of the layers asked for."""
        # The base model, then the head on the rows kept: a model dispatched over GPUs carries a top-level hook
        # that moves every tensor argument to the first GPU and every output back there, where the final hidden
        # states (on the last GPU) cannot be indexed, and the heads that read them are not.
        cache.begin(lo, lo + ids.shape[0], ids.shape[1])
        # hidden_states[0] is the embeddings' output, [i] layer i's input, [-1] (or [n_layers]) the final norm's
        # output: that one is the output itself; the others come from pre-hooks on their layers alone
        wanted = {layer: layer % (self.n_layers + 1) for layer in features}
        inner = frozenset(i for i in wanted.values() if i < self.n_layers)
        every = bool(inner) and self.inputs is None
        if self.inputs is not None:
            self.inputs.arm(inner)
        try:
            out = self.base(
                input_ids=ids,
                position_ids=positions,
                attention_mask=mask,
                **{self.cache_kwarg: cache},
                use_cache=True,
                output_hidden_states=every,
            )
        finally:
            caught = self.inputs.caught if self.inputs is not None else {}
            if self.inputs is not None:
                self.inputs.arm(frozenset())
        last = out.last_hidden_state
        self.features = {layer: last if i == self.n_layers else out.hidden_states[i] if every else caught[i]
                         for layer, i in wanted.items()}
        hidden = last.flatten(0, 1)
        if isinstance(keep, torch.Tensor):
            hidden = hidden.index_select(0, keep)
        elif keep:
            hidden = hidden[-keep:]
        return self.logits(hidden)

    def prefill(self, prompt_ids: list[int], cache: RowCache, features: tuple[int, ...] = (),
                slot: int = 0) -> torch.Tensor:
        """Run the prompt after what ``slot`` holds and keep it; return the logits that follow its last token
        (and, in :attr:`features`, the hidden states of every prompt position for the layers ``features``
        names, ``{layer: [prompt_len, hidden]}``)."""
        ids = upload([prompt_ids], self.device)
        past = cache.lengths[slot]
        positions = torch.arange(past, past + len(prompt_ids), device=self.device)[None]
        logits = self._forward(ids, positions, None, cache, lo=slot, keep=1, features=features)[-1]
        self.features = {layer: h[0] for layer, h in self.features.items()}
        cache.commit(slot, [list(range(len(prompt_ids)))])
        return logits

    def prefill_rows(self, prompts: list[list[int]], cache: RowCache, lo: int, features: tuple[int, ...] = ()
                     ) -> torch.Tensor:
        """:meth:`prefill` of slots ``lo..lo + n`` in one forward (each prompt after what its slot holds, padded
        to the longest, causal within itself): ``[n, vocab]``, the logits after each prompt's last token;
        :attr:`row_features` holds each prompt's states ``{layer: [prompt_len, hidden]}``."""
        if len(prompts) == 1:
            logits = self.prefill(prompts[0], cache, features, slot=lo)
            self.row_features = [self.features]
            return logits[None]
        n, sizes = len(prompts), [len(p) for p in prompts]
        q = max(sizes)
        ids = np.zeros((n, q), dtype=np.int64)
        for r, p in enumerate(prompts):
            ids[r, : sizes[r]] = p
        lengths = np.asarray(cache.lengths[lo : lo + n], dtype=np.int64)
        offsets = np.broadcast_to(np.arange(q), (n, q))
        positions = upload(offsets + lengths[:, None], self.device)
        j = torch.arange(q, device=self.device)
        size = upload(sizes, self.device)
        # causal among a prompt's own tokens; padding sees itself alone
        vis = ((j[:, None] >= j[None, :])[None] & (j[None, None, :] < size[:, None, None])) | torch.eye(
            q, dtype=torch.bool, device=self.device)[None]
        mask = self._rows_mask(vis, offsets, lengths, positions)
        last = upload([r * q + sizes[r] - 1 for r in range(n)], self.head_device)
        logits = self._forward(upload(ids, self.device), positions, mask, cache, lo=lo, keep=last, features=features)
        self.row_features = [{layer: h[r, : sizes[r]] for layer, h in self.features.items()} for r in range(n)]
        cache.commit(lo, [list(range(k)) for k in sizes])
        return logits

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

    def _rows_mask(self, vis, offsets: np.ndarray, lengths: np.ndarray, positions: torch.Tensor):
        """The float mask ``[n, 1, q, max(lengths) + q]`` of rows at their own lengths: row ``r`` sees its own
        ``lengths[r]`` committed entries and, of its block (written at ``lengths[r]``), what ``vis[r]`` allows;
        nothing of the columns past its block. Built on the device from the blocks' visibility and the lengths."""
        n, q = offsets.shape
        span = int(lengths.max()) + q
        neg = torch.finfo(self.dtype).min
        lens = upload(lengths, self.device)
        col = torch.arange(span, device=self.device)
        rel = col[None, :] - lens[:, None]  # a column's place in the row's block ([n, span]; < 0: committed)
        at = rel.clamp(0, q - 1)
        vis = vis if isinstance(vis, torch.Tensor) else upload(vis, self.device)
        seen = vis.gather(2, at[:, None, :].expand(n, q, span))
        seen &= ((rel >= 0) & (rel < q))[:, None, :]
        seen |= (rel < 0)[:, None, :]
        whole = torch.zeros((n, 1, q, span), dtype=self.dtype, device=self.device).masked_fill_(~seen[:, None], neg)
        if not self.has_sliding:
            return whole
        k_pos = torch.where(rel < 0, col[None, :], positions.gather(1, at))
        far = positions[:, :, None] - k_pos[:, None, :] >= self.sliding_window
        return {"full_attention": whole, "sliding_attention": whole.masked_fill(far[:, None], neg)}

    def forward_draft(self, root: int, draft: Draft, cache: RowCache, features: tuple[int, ...] = (),
                      slot: int = 0) -> torch.Tensor:
        """Logits after the root, every guess and every auxiliary node (or those of
        ``draft.aux_logit_rows``): ``[1 + n + n_aux, vocab]``. With ``features`` (hidden-state indices, as
        ``output_hidden_states`` numbers them), :attr:`features` holds those layers' states of every row of
        the block, ``{layer: [q, hidden]}``, on the device where they live: from the same forward."""
        past_len = cache.lengths[slot]
        tokens = [root] + list(draft.tokens) + list(draft.aux_tokens)
        ids = upload([tokens], self.device)
        if not draft.aux_tokens and draft.is_chain():
            # A chain is plain causal attention: let the model build its own mask (fast path).
            positions = torch.arange(past_len, past_len + len(tokens), device=self.device)[None]
            logits = self._forward(ids, positions, None, cache, lo=slot, features=features)
        else:
            vis, offsets = block_layout(draft)
            positions = upload(offsets + past_len, self.device)[None]
            keep = None
            if draft.aux_logit_rows is not None:  # the output layer only where logits are used
                keep = upload(_kept_rows(draft), self.head_device)  # on the final hidden states' device
            mask = self._mask(vis, offsets, past_len, positions)
            logits = self._forward(ids, positions, mask, cache, lo=slot, keep=keep, features=features)
        self.features = {layer: h[0] for layer, h in self.features.items()}
        return logits

    def forward_rows(self, roots: list[int], drafts: list[Draft], cache: RowCache, lo: int = 0,
                     features: tuple[int, ...] = ()) -> list[torch.Tensor]:
        """:meth:`forward_draft` for slots ``lo..lo + n`` in one forward: each row's block is padded to the
        longest, sits at the row's own positions and sees its own prefix. Returns each row's logits;
        :attr:`row_features` holds each row's states ``{layer: [q_r, hidden]}``."""
        if len(drafts) == 1:
            logits = self.forward_draft(roots[0], drafts[0], cache, features, slot=lo)
            self.row_features = [self.features]
            self.rows_logits = logits
            return [logits]
        n = len(drafts)
        sizes = [1 + len(d.tokens) + d.n_aux for d in drafts]
        q = max(sizes)
        ids = np.zeros((n, q), dtype=np.int64)
        vis = np.zeros((n, q, q), dtype=bool)
        offsets = np.zeros((n, q), dtype=np.int64)
        kept, counts = [], []
        for r, (root, draft) in enumerate(zip(roots, drafts, strict=True)):
            size = sizes[r]
            ids[r, :size] = [root, *draft.tokens, *draft.aux_tokens]
            vis[r, :size, :size], offsets[r, :size] = block_layout(draft)
            vis[r, range(size, q), range(size, q)] = True  # padding sees itself alone and is never seen
            rows = _kept_rows(draft)
            kept.extend(r * q + j for j in rows)
            counts.append(len(rows))
        lengths = np.asarray(cache.lengths[lo : lo + n], dtype=np.int64)
        positions = upload(offsets + lengths[:, None], self.device)
        mask = self._rows_mask(vis, offsets, lengths, positions)
        logits = self._forward(upload(ids, self.device), positions, mask, cache, lo=lo,
                               keep=upload(kept, self.head_device), features=features)
        self.row_features = [{layer: h[r, : sizes[r]] for layer, h in self.features.items()} for r in range(n)]
        self.rows_logits = logits  # every row's, one after the other (what the list returned splits)
        return list(logits.split(counts))

    @staticmethod
    def compact(cache: RowCache, past_len: int, accepted_nodes: list[int], slot: int = 0) -> None:
        """Keep prefix + root + the accepted guesses (block rows 1 + i) of ``slot``, drop the rest."""
        if cache.lengths[slot] != past_len:
            raise ValueError(f"slot {slot} holds {cache.lengths[slot]} entries, not {past_len}")
        cache.commit(slot, [[0] + [1 + i for i in accepted_nodes]])


def _kept_rows(draft: Draft) -> list[int]:
    """The block rows whose logits are used: the root, the guesses, and the aux nodes asked for (all if None)."""
    first_aux = 1 + len(draft.tokens)
    if draft.aux_logit_rows is None:
        return list(range(first_aux + draft.n_aux))
    return list(range(first_aux)) + [first_aux + j for j in draft.aux_logit_rows]


def cache_kwarg(model: torch.nn.Module) -> str:
    """The name a transformers model's forward takes its KV cache by: ``cache`` from transformers 5.24 on
    (``past_key_values`` deprecated), ``past_key_values`` before (an unknown ``cache`` would be ignored, and a
    step would attend over its own tokens alone)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
