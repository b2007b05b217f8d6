"""The decoder layer of a Llama-shaped model as pure functions of its weights, for ``forward=compiled``.

Every function here takes tensors (the layer's weights among them) and returns tensors, so that one compiled
graph serves every layer (:mod:`specbench.core.engine` compiles :func:`layers` and :func:`head`). Weights come
as :func:`lay_out` lays them out: q/k/v fused into one matrix and gate/up into another by the caller, each with
its oneDNN layout where the CPU has one.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

NARROW = 8  # on a CPU, blocks up to this width attend with fused sums; wider ones (and a GPU's) with products


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS norm as Llama computes it: in fp32, scaled by the weight in the input's dtype."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


@torch.library.custom_op("specbench::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """``x @ W.T`` with ``W`` laid out once for oneDNN (``torch.ops.mkldnn._reorder_linear_weight``): an opaque
    call to the compiler, which would otherwise want the weight as a constant of the graph."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, None, "none", [], "")


@packed_linear.register_fake
def _(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], out_features))


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether blocks of several rows multiply with prepacked oneDNN weights here (CPUs, fp32 and bf16)."""
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16) or not torch.backends.mkldnn.is_available():
        return False
    if not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return False
    return dtype == torch.float32 or bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())  # bf16: AVX-512 or NE


def lay_out(w: torch.Tensor, pack: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A weight as the forward takes it: itself (one row), and laid out for oneDNN (several rows) where it can."""
    w = w.detach().contiguous()
    return w, (torch.ops.mkldnn._reorder_linear_weight(w, None) if pack else None)


_LAID_OUT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # a layer's weights as laid out, by packing


def layer_weights(layer: torch.nn.Module, pack: bool) -> tuple:
    """A Llama-shaped layer's weights as the compiled pieces take them: q/k/v fused in one matrix, gate and up in
    another, each as :func:`lay_out` gives it. Made once per layer: every forward of the model (its target's,
    a self-draft's) shares them."""
    done = _LAID_OUT.setdefault(layer, {})
    if pack not in done:
        a, m = layer.self_attn, layer.mlp
        parts = (a.q_proj, a.k_proj, a.v_proj)
        qkv = lay_out(torch.cat([p.weight.detach() for p in parts]), pack)
        bias = torch.cat([p.bias.detach() for p in parts]) if parts[0].bias is not None else None
        gate_up = lay_out(torch.cat([m.gate_proj.weight.detach(), m.up_proj.weight.detach()]), pack)
        done[pack] = (layer.input_layernorm.weight.detach(), qkv, bias, lay_out(a.o_proj.weight, pack),
                      layer.post_attention_layernorm.weight.detach(), gate_up, lay_out(m.down_proj.weight, pack))
    return done[pack]


def product(x: torch.Tensor, weight: tuple, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` for ``weight`` = (W, W packed or None). One row on a CPU: a multiply-and-sum, which
    compiles to one streaming pass over W (on a 2-core CPU faster than any library call for one row); several:
    oneDNN's product on the packed weight (it lays nothing out per call), else (a GPU) ``F.linear``."""
    plain, packed = weight
    if x.shape[0] == 1 and plain.device.type == "cpu":
        out = (x[:, None, :] * plain[None]).sum(-1)
    elif packed is not None:
        out = packed_linear(x, packed, plain.shape[0])
    else:
        out = F.linear(x, plain)
    return out if bias is None else out + bias


def half_turn(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, -1)
    return torch.cat((-b, a), -1)


def before(x, cos, sin, norm, qkv, qkv_bias, eps: float, heads: int, kv_heads: int):
    """Norm, q/k/v and rotary embedding of ``x`` [T, hidden]: q as [kv heads, group, T, dim] (the rows of each
    K/V head's query heads, in the order the folded attention wants them), k and v as [kv heads, T, dim]."""
    t = x.shape[0]
    dim = cos.shape[-1]
    out = product(rms_norm(x, norm, eps), qkv, qkv_bias)
    q = out[:, : heads * dim].view(t, heads, dim)
    k = out[:, heads * dim : (heads + kv_heads) * dim].view(t, kv_heads, dim)
    v = out[:, (heads + kv_heads) * dim :].view(t, kv_heads, dim)
    cos, sin = cos[:, None], sin[:, None]
    q = q * cos + half_turn(q) * sin
    k = k * cos + half_turn(k) * sin
    q = q.view(t, kv_heads, heads // kv_heads, dim).permute(1, 2, 0, 3).contiguous()
    return q, k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()


def after(x, attn, o, norm, gate_up, down, eps: float):
    """The rest of a layer: ``attn`` [kv heads, group, T, dim] through the output product and the MLP."""
    t = x.shape[0]
    x = x + product(attn.permute(2, 0, 1, 3).reshape(t, -1), o)
    gate, up = product(rms_norm(x, norm, eps), gate_up).chunk(2, -1)
    return x + product(F.silu(gate) * up, down)


def attend(x, cos, sin, kv, where, visible, norm1, qkv, qkv_bias, o, norm2, gate_up, down, eps: float,
            heads: int, kv_heads: int, scale: float):
    """One decoder layer on ``x`` [n × w, hidden]: its keys and values written into ``kv`` (the layer's cache
    rows, [2, n, kv heads, capacity, dim]) at ``where`` [n, w] (in place), attention over the first
    ``visible.shape[-1]`` entries under ``visible`` (additive, [n, 1, group × w, span]), then the MLP."""
    n, w = where.shape
    q, k, v = before(x, cos, sin, norm1, qkv, qkv_bias, eps, heads, kv_heads)
    dim, span, group = k.shape[-1], visible.shape[-1], heads // kv_heads
    slot = torch.arange(n, device=x.device)[:, None]
    kv[:, slot, :, where] = torch.stack([k, v]).view(2, kv_heads, n, w, dim).permute(2, 3, 0, 1, 4)
    keys, values = kv[0, :, :, :span], kv[1, :, :, :span]  # [n, kv heads, span, dim]
    rows = q.view(kv_heads, group, n, w, dim).permute(2, 0, 1, 3, 4).reshape(n, kv_heads, group * w, dim)
    narrow = w <= NARROW and x.device.type == "cpu"  # a few rows: sums the compiler fuses; else a library product
    scores = (rows[:, :, :, None] * keys[:, :, None]).sum(-1) if narrow else rows @ keys.transpose(-1, -2)
    weights = torch.softmax((scores * scale + visible).float(), -1).to(x.dtype)
    attn = (weights[..., None] * values[:, :, None]).sum(-2) if narrow else weights @ values
    attn = attn.view(n, kv_heads, group, w, dim).permute(1, 2, 0, 3, 4).reshape(kv_heads, group, n * w, dim)
    return after(x, attn, o, norm2, gate_up, down, eps)


def layers(x, cos, sin, kvs, where, visible, weights, eps: float, heads: int, kv_heads: int, scale: float):
    """A run of consecutive layers (``weights[i]`` and cache rows ``kvs[i]`` each) in one compiled call;
    returns every layer's output (the hidden states a head may want)."""
    outs = []
    for kv, layer in zip(kvs, weights, strict=True):
        x = attend(x, cos, sin, kv, where, visible, *layer, eps, heads, kv_heads, scale)
        outs.append(x)
    return tuple(outs)


def head(x, norm, weight, eps: float):
    return product(rms_norm(x, norm, eps), weight)
