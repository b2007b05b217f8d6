"""A draft model's forward as CUDA graphs, when the target's steps are graphs (``forward=compiled`` on a GPU).

:class:`GraphedDraft` runs a Llama-shaped draft (a separate model, or the target's kept layers for a self-draft)
on :class:`~specbench.core.engine.CompiledTarget`'s static-shape forward: a block of ``q`` tokens is one graph
per (width bucket, span bucket), on a cache allocated once per request at the model's context (a later request
takes the buffer again, so the graphs captured on it replay). The layers' weights are laid out once per model:
a self-draft shares its target's. The tokens a block feeds may stay on the device: a greedy chain
(:meth:`chain`) is drafted with no host read until it is complete, then read once.

A block longer than :data:`~specbench.core.engine.PIECE` tokens (a new prompt) runs without a graph, in
pieces, as the target's prefill does; a batch's drafts run one graph a row (their caches apart). A draft the
compiled forward cannot run (:func:`~specbench.core.engine.supported`) stays on the eager forward.
"""

from __future__ import annotations

import torch

from specbench.core.engine import PIECE, CompiledTarget, supported
from specbench.core.kv import RowCache, upload


class GraphedDraft:
    """``model``'s layers ``layers`` (None: all) as graphed steps, each draft's cache a :class:`RowCache` of
    one slot (:meth:`new_cache`)."""

    def __init__(self, model: torch.nn.Module, layers: list[int] | None = None) -> None:
        self.engine = CompiledTarget(model, graphs=True, layers=layers)

    @staticmethod
    def fits(model: torch.nn.Module) -> bool:
        return supported(model) is None

    def rows(self) -> OwnRows:
        """A draft's own cache (one slot, at the model's context: every buffer alike, so one whose draft has gone
        is taken again with the graphs captured on it)."""
        return OwnRows(self.engine.new_cache(1))

    def feed(self, cache: RowCache, ids, every_position: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``ids`` (a list, or a device tensor ``[q]``) after what ``cache`` holds, committed; the logits and
        final-norm hidden states after the last token (``[1, vocab]``, ``[1, hidden]``) or after every token."""
        if len(ids) > PIECE and not every_position:  # a new prompt: in pieces, without a graph (its shape comes once)
            logits = self.engine.prefill(list(ids), cache, features=(-1,))
            return logits[None].float(), self.engine.features[-1][-1:]
        parts = [self._block(cache, ids[at : at + PIECE], every_position) for at in range(0, len(ids), PIECE)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def _block(self, cache: RowCache, ids, every_position: bool) -> tuple[torch.Tensor, torch.Tensor]:
        engine, q, past = self.engine, len(ids), cache.lengths[0]
        tokens = ids[None] if isinstance(ids, torch.Tensor) else upload([list(ids)], engine.device)
        positions = torch.arange(past, past + q, device=engine.device)[None]
        logits = engine._forward(tokens, positions, None, cache, keep=None if every_position else 1, features=(-1,))
        cache.commit(0, [list(range(q))])
        hidden = engine.features[-1][0]
        return logits.float(), hidden if every_position else hidden[-1:]

    def chain(self, cache: RowCache, logits: torch.Tensor, length: int, vocab: int) -> list[int]:
        """A greedy chain of ``length`` tokens from ``logits`` (the row after the cache's last token): each token
        chosen and fed on the device (the last one only chosen), the chain read to the host once."""
        picked = [logits[0, :vocab].argmax(-1, keepdim=True)]
        for _ in range(length - 1):
            logits, _ = self.feed(cache, picked[-1])
            picked.append(logits[0, :vocab].argmax(-1, keepdim=True))
        return torch.cat(picked).tolist()


class OwnRows:
    """A graphed draft's cache, its one slot its own (the eager drafts' :class:`DraftRows`, unshared)."""

    def __init__(self, cache: RowCache) -> None:
        self.cache = cache

    def claim(self) -> int:
        return 0

    def release(self, slot: int) -> None:
        self.cache.clear(slot)
