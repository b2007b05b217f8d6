"""A second language model run part by part for drafting, with a KV cache shared by every request it drafts for.

:class:`DraftLM` runs a causal LM's own parts (embedding, rotary embedding,
a chosen list of decoder layers, final norm, LM head). With every layer it is
the model itself; with some layers left out it is a *self-draft* (the target's
weights, shared, never copied or patched; the skipped layers get no room in the
cache).

Its KV entries live in one slot of a :class:`~specbench.core.kv.RowCache` that
it shares with its twins (:meth:`DraftLM.twin`: another request's draft), so
that a batch's drafts run in one forward (:meth:`DraftLM.feed`): each row's
block at its own length, padded to the longest, with the core's row masks. A
slot is claimed when a draft is made and freed when it goes.

A draft whose vocabulary is shorter than the target's (same tokenizer, a
smaller embedding) gets ``q`` padded with zeros up to the target's vocabulary,
and reads a committed token it has no embedding for as token 0 (such tokens
are unused or special ids; only the draft's guesses can suffer). A longer one
has its logits cut to the target's vocabulary before ``q`` is formed.

The cache follows the committed tokens: before each proposal a slot is cut to
the longest prefix it shares with them (rejected drafted tokens go) and the
tokens committed since are fed.

With ``graphs`` (the target's steps are CUDA graphs), a draft the compiled
forward runs is fed through :mod:`specbench.drafting.draft_graph` instead: each
draft a cache of its own, a block a graph.
"""

from __future__ import annotations

import copy
import weakref

import numpy as np
import torch
import torch.nn.functional as F

from specbench.core.acceptance import SamplingParams, target_probs
from specbench.core.forward import Target, cache_kwarg, upload
from specbench.core.kv import RowCache
from specbench.drafting.draft_graph import GraphedDraft

ALONE = 16  # a catch-up longer than this (a new prompt) is fed alone, not in the batch's forward


class DraftRows:
    """The KV entries of every request drafting with one draft model: one :class:`~specbench.core.kv.RowCache`
    over the layers it runs, a slot per drafter (claimed when a drafter is made, freed when it goes), so that a
    batch's drafts are fed in one forward."""

    def __init__(self, shape: Target, layers: list[int]) -> None:
        kept = set(layers)
        self.cache = RowCache(1, [d if i in kept else None for i, d in enumerate(shape.layer_devices)])
        self.free = [0]

    def claim(self) -> int:
        return self.free.pop() if self.free else self.cache.add_slot()

    def release(self, slot: int) -> None:
        self.cache.clear(slot)
        self.free.append(slot)


class DraftLM:
    """A causal LM run part by part over ``layers``, its KV entries in a slot of a cache it shares with its
    spawns (:class:`DraftRows`)."""

    def __init__(self, model: torch.nn.Module, layers: list[int] | None = None, vocab_size: int | None = None,
                 graphs: bool = False):
        self.model = model
        self.base = model.base_model
        self.head = model.get_output_embeddings()
        n_layers = len(self.base.layers)
        self.layers = list(range(n_layers)) if layers is None else list(layers)
        self.shape = Target(model)  # for its masks (sliding windows included) and device
        self.hidden_device = self.base.norm.weight.device  # where the last hidden states come out (a sharded
        # model's last GPU): heads that read them go there
        config = self.shape.model.config
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.softcap = getattr(config, "final_logit_softcapping", None)
        self.draft_vocab = self.head.weight.shape[0]
        self.embed_size = self.base.embed_tokens.weight.shape[0]
        self.vocab_size = vocab_size or self.draft_vocab  # the target's: q is padded (or cut) to it
        self.rows = DraftRows(self.shape, self.layers)
        self.graphed = GraphedDraft(model, layers) if graphs and GraphedDraft.fits(model) else None
        self._own_slot()

    def _own_slot(self) -> None:
        if self.graphed is not None:  # under graphs each draft has a cache of its own (see draft_graph)
            self.rows = self.graphed.rows()
        self.slot = self.rows.claim()
        weakref.finalize(self, self.rows.release, self.slot)
        self.tokens: list[int] = []  # the tokens whose keys and values the slot holds

    def twin(self) -> DraftLM:
        """The same draft (weights and shared cache) with a slot of its own, empty."""
        twin = copy.copy(self)
        twin._own_slot()
        return twin

    def reset(self) -> None:
        self.rows.cache.clear(self.slot)
        self.tokens = []

    def forward(self, ids: list[int], every_position: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed ``ids`` after the cached tokens; return the logits and last hidden state of the last
        one (``[vocab]``, ``[hidden]``), or of every one (``[q, vocab]``, ``[q, hidden]``)."""
        logits, hidden = DraftLM.feed([self], [ids], every_position)
        return (logits, hidden) if every_position else (logits[0], hidden[0])

    @staticmethod
    @torch.inference_mode()  # the shared cache is written in place, in or out of a decode loop
    def feed(lms: list[DraftLM], blocks: list[list[int]], every_position: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each draft's block after its cached tokens, every draft in one forward (drafts sharing one cache;
        blocks padded to the longest, causal within each; slots between theirs run a token that nothing sees).
        Returns the logits and last hidden states after each block's last token (``[n, vocab]``, ``[n, hidden]``),
        or, for one draft and ``every_position``, after each of its tokens."""
        first = lms[0]
        if first.graphed is not None:  # a graph a row
            parts = [first.graphed.feed(lm.rows.cache, block, every_position) for lm, block in zip(lms, blocks,
                                                                                                strict=True)]
            for lm, block in zip(lms, blocks, strict=True):
                lm.tokens.extend(block)
            return tuple(torch.cat([p[i] for p in parts]) for i in (0, 1))
        shape, cache = first.shape, first.rows.cache
        where = {lm.slot: k for k, lm in enumerate(lms)}
        lo, hi = min(where), max(where) + 1
        n = hi - lo
        sizes = [len(blocks[where[s]]) if s in where else 1 for s in range(lo, hi)]
        q = max(sizes)
        ids = np.zeros((n, q), dtype=np.int64)
        for s, k in where.items():
            ids[s - lo, : sizes[s - lo]] = blocks[k]
        lengths = np.asarray(cache.lengths[lo:hi], dtype=np.int64)
        device = shape.device
        offsets = np.broadcast_to(np.arange(q), (n, q))
        causal = np.tril(np.ones((q, q), dtype=bool))
        if n == 1:
            positions = torch.arange(int(lengths[0]), int(lengths[0]) + q, device=device)[None]
            mask = shape._mask(causal, np.arange(q), int(lengths[0])) if q > 1 or shape.has_sliding else None
        else:
            positions = upload(offsets + lengths[:, None], device)
            size = np.asarray(sizes)[:, None, None]
            vis = (causal[None] & (np.arange(q)[None, None, :] < size)) | np.eye(q, dtype=bool)[None]
            mask = shape._rows_mask(vis, offsets, lengths, positions)
        ids_t = upload(ids, device)
        if int(ids.max()) >= first.embed_size:  # a target token the draft has no embedding for: read as token 0
            ids_t = ids_t.masked_fill(ids_t >= first.embed_size, 0)
        base = first.base
        hidden = base.embed_tokens(ids_t)
        types = shape.layer_types
        if types:
            rope = {t: base.rotary_emb(hidden, positions, t) for t in set(types)}
        else:
            rope = base.rotary_emb(hidden, positions)
        cache.begin(lo, hi, q)
        for i in first.layers:
            kind = types[i] if types else None
            out = base.layers[i](
                hidden,
                attention_mask=mask[kind] if isinstance(mask, dict) else mask,
                position_embeddings=rope[kind] if types else rope,
                position_ids=positions,
                **{cache_kwarg(base.layers[i]): cache},
                use_cache=True,
            )
            hidden = out[0] if isinstance(out, tuple) else out
        for lm, block in zip(lms, blocks, strict=True):
            cache.lengths[lm.slot] += len(block)
            lm.tokens.extend(block)
        if every_position:
            hidden = hidden[0]
        elif n == 1:
            hidden = hidden[0, -1:]
        else:
            last = [(s - lo) * q + sizes[s - lo] - 1 for s in (lm.slot for lm in lms)]
            hidden = hidden.flatten(0, 1).index_select(0, upload(last, hidden.device))
        hidden = base.norm(hidden)
        logits = first.head(hidden).float()
        if first.softcap:
            logits = torch.tanh(logits / first.softcap) * first.softcap
        return logits, hidden

    def crop_to(self, committed: list[int]) -> list[int]:
        """Keep the slot's longest common prefix with ``committed``; return what is left to feed (at least the
        last token)."""
        n = min(len(self.tokens), len(committed) - 1)
        same = next((i for i in range(n) if self.tokens[i] != committed[i]), n)
        if same < len(self.tokens):
            self.rows.cache.lengths[self.slot] = same
            del self.tokens[same:]
        return committed[same:]

    def catch_up(self, committed: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Keep the cache's longest common prefix with ``committed``, feed the rest (at least its last token)."""
        return self.forward(self.crop_to(committed))

    @staticmethod
    def catch_up_rows(lms: list[DraftLM], committed: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`catch_up` of several drafts: what each has to feed in one forward, save blocks longer than
        :data:`ALONE` (a new prompt), each fed alone rather than padding every row to its length."""
        blocks = [lm.crop_to(seq) for lm, seq in zip(lms, committed, strict=True)]
        together = [k for k, b in enumerate(blocks) if len(b) <= ALONE]
        parts = {}
        if together:
            logits, hidden = DraftLM.feed([lms[k] for k in together], [blocks[k] for k in together])
            parts.update({k: (logits[j], hidden[j]) for j, k in enumerate(together)})
        for k, block in enumerate(blocks):
            if k not in parts:
                parts[k] = lms[k].forward(block)
        return torch.stack([parts[k][0] for k in range(len(lms))]), torch.stack([parts[k][1] for k in range(len(lms))])

    def q(self, logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
        """The draft distribution over the target's vocabulary (zeros past a shorter draft vocabulary), for a
        row of logits or several."""
        logits = logits[..., : self.vocab_size]
        probs = target_probs(logits, params)
        return F.pad(probs, (0, self.vocab_size - probs.shape[-1])) if probs.shape[-1] < self.vocab_size else probs
