"""What the hardware allows a forward of a few tokens: every weight read once from memory.

A decoding forward of q small tokens multiplies each weight matrix by q vectors, so its time is bounded
below by the weights' bytes over the memory's read bandwidth, whatever q is (until the arithmetic of q
tokens outweighs the reads). :func:`floor` measures the bandwidth the way a forward reads, a reduction
over a buffer larger than the caches with torch's threads, and gives that bound beside the cost curve
(``specbench costs``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Floor:
    weight_bytes: int
    bandwidth: float  # bytes/s read
    threads: int

    @property
    def seconds(self) -> float:
        return self.weight_bytes / self.bandwidth

    def describe(self) -> str:
        return (f"floor: {self.weight_bytes / 1e6:,.0f} MB of weights read at {self.bandwidth / 1e9:.1f} GB/s "
                f"({self.threads} threads) = {1000 * self.seconds:.1f} ms a forward")


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers, each tensor once (tied embeddings count once)."""
    seen: set[int] = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def read_bandwidth(nbytes: int = 512 * 2**20, repeats: int = 5) -> float:
    """Bytes/s of reading an fp32 buffer of ``nbytes`` (a sum over it; the fastest of ``repeats``)."""
    buf = torch.ones(nbytes // 4, dtype=torch.float32)
    buf.sum()  # pages in, warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - t0)
    return nbytes / best


def floor(model: torch.nn.Module) -> Floor:
    return Floor(weight_bytes(model), read_bandwidth(), torch.get_num_threads())
