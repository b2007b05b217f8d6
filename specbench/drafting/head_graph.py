"""An EAGLE head's tree as one CUDA graph a step, when the target's steps are graphs (``forward=compiled`` on a GPU).

After the head has caught up on the committed tokens (one eager forward, its length varying), the rest of a step
is fixed in shape: the root's log-probabilities, ``depth - 1`` head forwards of ``K`` nodes each, the selections
of :func:`~specbench.drafting.device_tree.grow_tensor`. :class:`TreeGraphs` captures that once per (cache buffer,
top-k, depth, nodes, span bucket) and replays it: its inputs are the root's predicted feature, the root's position
and where the tree's entries start in the head's cache, all on the device; the tree's keys and values are written
at device-held positions (:class:`StaticRows`) into buffers of fixed capacity, and each level's mask is built in
the graph (:func:`tree_visibility`, which the eager path uses too). The one read of the step follows the replay.

Left eager: a batch's rows (each its own cache), a head with a sliding window or ``dynamic`` rotary scaling (both
read lengths on the host), a tree that would not fit the buffer (:data:`GRAPHED_CONTEXT` entries and the tree's).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

from specbench.core.graphs import StepGraph, span_bucket
from specbench.core.kv import upload
from specbench.drafting.head_parts import HeadCache

GRAPHED_CONTEXT = 8192  # the context a head's graphed buffers hold (16 MB of keys for Llama-3-8B's EAGLE-3 head in
# fp16, not the 256 MB of its 128k positions); a longer text's steps draft eagerly


def tree_visibility(prefix, start, tree: torch.Tensor, span: int) -> torch.Tensor:
    """[K, span] bool: a level's ``K`` nodes see the committed entries before ``prefix``, and, of the tree's
    entries from ``start`` on, what ``tree`` ([K, entries]: ancestors, then the node itself) allows. ``prefix``
    and ``start``: ints, or 0-dim device tensors inside a graph."""
    col = torch.arange(span, device=tree.device)
    rel = col - start
    entries = tree.shape[-1]
    seen = tree.gather(1, rel.clamp(0, entries - 1).expand(tree.shape[0], -1)) & ((rel >= 0) & (rel < entries))
    return seen | (col < prefix)


class StaticRows:
    """The tree's levels appended to a head cache of fixed capacity at device-held positions (``start`` + level
    × ``width``), as the head's attention appends to a :class:`HeadCache`; it attends over the first ``span``
    entries, the mask hiding what is not the node's."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, start: torch.Tensor, width: int, span: int) -> None:
        self.keys, self.values, self.start, self.width, self.span, self.level = keys, values, start, width, span, 0

    def append(self, k: torch.Tensor, v: torch.Tensor, positions=None) -> tuple[torch.Tensor, torch.Tensor]:
        where = self.start + self.level * self.width + torch.arange(self.width, device=k.device)
        self.keys.index_copy_(1, where, k)
        self.values.index_copy_(1, where, v)
        self.level += 1
        return self.keys[:, : self.span], self.values[:, : self.span]


class TreeGraphs:
    """The tree steps' graphs of one head (shared by its spawns), and the cache buffers they read: a request's
    cache takes the buffers of one that has ended, so the graphs captured on them serve it too."""

    def __init__(self, kv_heads: int, head_dim: int, capacity: int, dtype: torch.dtype, device: torch.device) -> None:
        self.shape, self.capacity, self.dtype, self.device = (kv_heads, capacity, head_dim), capacity, dtype, device
        self.graphs: dict[tuple, StepGraph] = {}
        self.free: list[tuple[torch.Tensor, torch.Tensor]] = []

    def new_cache(self) -> HeadCache:
        """A head cache on buffers of the full capacity, taken again once it ends."""
        cache = HeadCache()
        if self.free:
            cache.keys, cache.values = self.free.pop()
        else:
            cache.keys = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
            cache.values = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
        weakref.finalize(cache, self.free.append, (cache.keys, cache.values))
        return cache

    def fits(self, cache: HeadCache, width: int, depth: int) -> bool:
        return cache.keys is not None and cache.keys.shape[1] == self.capacity and (
            len(cache) + depth * width <= self.capacity)

    def run(self, grow: Callable[..., torch.Tensor], cache: HeadCache, root: torch.Tensor, root_pos: int,
            key: tuple) -> torch.Tensor:
        """``grow(root, root_pos, start, rows, span)`` (the tree's device part, ``rows`` a :class:`StaticRows`
        factory) replayed from its graph for this cache buffer, ``key`` (top-k, depth, nodes) and span bucket."""
        width, depth = key[0], key[1]
        span = span_bucket(len(cache) + depth * width, self.capacity)
        full = (cache.keys.data_ptr(), span, *key)
        where = upload([root_pos, len(cache)], root.device)
        if full not in self.graphs:
            keys, values = cache.keys, cache.values  # the buffers, not the cache: an ended cache's return to the list

            def step(root: torch.Tensor, where: torch.Tensor) -> tuple[torch.Tensor]:
                return (grow(root, where[0], where[1], lambda start: StaticRows(keys, values, start, width, span),
                             span),)

            self.graphs[full] = StepGraph(step, (root.clone(), where.clone()))
        return self.graphs[full](root, where)[0]
