"""A DFlash drafter's forward as one CUDA graph a step, when the target's steps are graphs (``forward=compiled``).

The eager drafter (:class:`~specbench.drafting.dflash.DFlashNet`) grows its context by concatenation, a shape
that changes every step. Here the context's keys and values sit in buffers of fixed capacity
(:data:`~specbench.drafting.head_graph.GRAPHED_CONTEXT` positions a layer), written at device-held positions; a
step's new context rows (the target's states at the positions verified since the last draft) are padded to a
power of two, the padding written past the context's end (masked now, overwritten by the next step), and the
block attends over a span bucket of the buffer and over itself. :class:`DFlashGraphs` captures that once per
(buffers, padded rows, block, span bucket) and replays it; its inputs are the padded states, the block's token ids
and two device-held counts (the context's length, the real new rows). What the drafter chooses from the logits
(the chain's argmaxes, a tree, samples) and its one read follow the replay. A text past the buffers' capacity
drafts eagerly from then on (:meth:`DFlashGraphs.unpack` hands the context over).
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from specbench.core.graphs import StepGraph, span_bucket
from specbench.core.kv import upload
from specbench.drafting.dflash import Context, DFlashNet, _turn
from specbench.drafting.head_graph import GRAPHED_CONTEXT


class StaticContext:
    """A request's context in fixed buffers: each layer's keys and values ``[kv heads, capacity, dim]``, and how
    many positions they hold."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        self.keys, self.values, self.length = keys, values, 0


def rows(t: int) -> int:
    """The new context rows a step runs at: the next power of two."""
    return 1 << max(0, t - 1).bit_length()


class DFlashGraphs:
    """The step graphs of one DFlash network (shared by its drafter's spawns) and the context buffers they read:
    a request's context takes the buffers of one that has ended, so the graphs captured on them serve it too."""

    def __init__(self, net: DFlashNet, embed: torch.nn.Module, head: torch.nn.Module, capacity: int = GRAPHED_CONTEXT):
        self.net, self.embed, self.head, self.capacity = net, embed, head, capacity
        weight = net.fc.weight
        self.shape, self.dtype, self.device = (net.s.kv_heads, capacity, net.s.head_dim), weight.dtype, weight.device
        self.graphs: dict[tuple, StepGraph] = {}
        self.free: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []

    def new_context(self) -> StaticContext:
        if self.free:
            context = StaticContext(*self.free.pop())
        else:
            make = lambda: [torch.zeros(self.shape, dtype=self.dtype, device=self.device)  # noqa: E731
                            for _ in self.net.layers]
            context = StaticContext(make(), make())
        weakref.finalize(context, self.free.append, (context.keys, context.values))
        return context

    def fits(self, context: StaticContext, new: int, block: int) -> bool:
        return context.length + rows(new) + block <= self.capacity

    def unpack(self, context: StaticContext) -> Context:
        """The context as the eager network takes it (its own tensors)."""
        n = context.length
        return Context([k[:, :n].clone() for k in context.keys], [v[:, :n].clone() for v in context.values])

    def __call__(self, context: StaticContext, features: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The block's logits after its root ([block - 1, vocab]: the graph's own buffer, which the next replay
        overwrites; the drafter reads its guesses from it at once), the ``T`` rows of ``features`` joining
        ``context``."""
        t, b = features.shape[0], ids.shape[0]
        width = rows(t)
        span = span_bucket(context.length + width, self.capacity)
        padded = F.pad(features, (0, 0, 0, width - t))
        counts = upload([context.length, t], self.device)
        key = (context.keys[0].data_ptr(), width, b, span)
        if key not in self.graphs:
            keys, values = context.keys, context.values  # the buffers: an ended context's go back to the list

            def step(padded: torch.Tensor, ids: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor]:
                return (self.head(self._forward(padded, ids, counts, keys, values, span)[1:]),)

            self.graphs[key] = StepGraph(step, (padded.clone(), ids.clone(), counts.clone()))
        context.length += t
        return self.graphs[key](padded, ids, counts)[0]

    def _forward(self, padded, ids, counts, keys, values, span: int) -> torch.Tensor:
        """:meth:`DFlashNet.forward` on the static buffers: the block's final states [block, hidden]."""
        net, s = self.net, self.net.s
        width, b = padded.shape[0], ids.shape[0]
        seen, new = counts[0], counts[1]
        steps = torch.arange(width + b, device=padded.device)
        positions = torch.where(steps < width, seen + steps, seen + new + steps - width)
        cos, sin = net.rotary(positions)
        where = seen + steps[:width]
        visible = torch.cat([torch.arange(span, device=padded.device) < seen + new,  # the context so far, the block
                             torch.ones(b, dtype=torch.bool, device=padded.device)])
        context = net.hidden_norm(net.fc(padded))
        x = self.embed(ids).to(self.dtype)
        for layer, k_buf, v_buf in zip(net.layers, keys, values, strict=True):
            a = layer.self_attn
            h = layer.input_layernorm(x)
            both = torch.cat([context, h])
            q = a.q_norm(a.q_proj(h).view(b, s.heads, s.head_dim)).transpose(0, 1)
            k = a.k_norm(a.k_proj(both).view(width + b, s.kv_heads, s.head_dim)).transpose(0, 1)
            v = a.v_proj(both).view(width + b, s.kv_heads, s.head_dim).transpose(0, 1)
            q, k = _turn(q, cos[width:], sin[width:]), _turn(k, cos, sin)
            k_buf.index_copy_(1, where, k[:, :width])
            v_buf.index_copy_(1, where, v[:, :width])
            group = s.heads // s.kv_heads
            ks = torch.cat([k_buf[:, :span], k[:, width:]], 1).repeat_interleave(group, 0)
            vs = torch.cat([v_buf[:, :span], v[:, width:]], 1).repeat_interleave(group, 0)
            attn = F.scaled_dot_product_attention(q, ks, vs, attn_mask=visible[None].expand(b, -1),
                                                  scale=s.head_dim ** -0.5)
            x = x + a.o_proj(attn.transpose(0, 1).reshape(b, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return net.norm(x)
