"""Linear layers with their weights prepacked for oneDNN: the CPU forward near its floor for small blocks.

A CPU forward of a few tokens should cost about what streaming the weights once costs. PyTorch's plain
``F.linear`` re-lays the weight matrix out for its small-M kernels on every call, so a forward of two tokens
costs far more than one (bench/README.md has the curves). :class:`PackedLinear` lays each weight out once, at load, in
oneDNN's blocked format (``torch.ops.mkldnn._reorder_linear_weight``) and multiplies with
``torch.ops.mkldnn._linear_pointwise``. Every caller (the autoregressive baseline, drafts, verification)
runs the same forward, so ratios stay fair; ``hardware.linear=plain`` keeps PyTorch's.

The module keeps its ``weight`` (tied embeddings, code that reads the shape) and repacks when the weight
is changed in place. It is inference only: no gradient flows through the packed product.
"""

from __future__ import annotations

import torch
from torch import nn

from specbench.models.config import LINEAR_MODES


def packing_available() -> bool:
    """Whether this torch build has oneDNN's prepacked linear."""
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def packs(dtype: torch.dtype) -> bool:
    """Whether oneDNN can pack weights of ``dtype`` on this CPU (bf16 needs AVX-512 or AVX-NE-CONVERT)."""
    if not packing_available():
        return False
    return dtype != torch.bfloat16 or bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def wants_packed(mode: str, device: str, dtype: torch.dtype) -> bool:
    """``hardware.linear``: ``auto`` packs fp32 and bf16 weights on a CPU (where both measured faster at every
    block size); ``packed`` packs on a CPU whatever the dtype; ``plain`` never. GPUs keep cuBLAS. A dtype this
    CPU cannot pack (bf16 without AVX-512) stays plain."""
    if mode not in LINEAR_MODES:
        raise ValueError(f"hardware.linear must be one of {', '.join(LINEAR_MODES)}, got {mode!r}")
    if mode == "plain" or torch.device(device).type != "cpu" or not packs(dtype):
        return False
    return mode == "packed" or dtype in (torch.float32, torch.bfloat16)


class PackedLinear(nn.Module):
    """``nn.Linear``'s forward on a weight laid out once for oneDNN (inference only)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias  # the same parameters (tied weights stay tied)
        self._pack()

    def _pack(self) -> None:
        self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None)
        self._version = self.weight._version

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight._version != self._version:  # changed in place since it was packed
            self._pack()
        shape = x.shape
        flat = x.reshape(-1, self.in_features)
        if not flat.is_contiguous():
            flat = flat.contiguous()
        out = torch.ops.mkldnn._linear_pointwise(flat, self._packed, self.bias, "none", [], "")
        return out.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed for oneDNN"


def pack_linears(model: nn.Module) -> int:
    """Replace every ``nn.Linear`` of ``model`` by a :class:`PackedLinear` (those of a dtype this CPU packs);
    returns how many."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and packs(child.weight.dtype):
                setattr(parent, name, PackedLinear(child))
                count += 1
    return count
