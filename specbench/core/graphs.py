"""CUDA graphs of ``forward=compiled``'s steps on a GPU, and their rehearsal where no CUDA runs.

A :class:`StepGraph` holds one step's static inputs (buffers each call copies its values into) and the outputs
its capture made. On a CUDA device of torch's own, the step runs twice on a side stream (as torch asks before a
capture), is captured once into a graph that shares one memory pool with the target's other graphs, and each
call copies the inputs in and replays it: one launch for every kernel of the step. Elsewhere (a CPU, the
simulated GPUs of the tests) the same object *rehearses* a graph: its capture runs the step with host reads
made errors (torch's sync debug mode, where the device is a GPU: a real capture fails on any), and each call
runs the step again on the same buffers and copies the results into the same output tensors. Either way a
caller sees what a replayed graph gives it: the same input and output tensors at every step, overwritten by
the next call, so what it keeps it copies out (:meth:`StepGraph.poison` lets a test check that it does).

The step itself may close over tensors whose addresses never change (weights, the cache's rows) and over
Python values fixed at its capture (rows, width, span), nothing else: a graph replays what it captured.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import torch

SPAN_STEP = 256  # a graph attends over a span rounded up to a multiple of this (its mask hides the rest)


def span_bucket(span: int, capacity: int) -> int:
    """The span a graph for ``span`` entries runs at: the next multiple of :data:`SPAN_STEP`, at most the
    cache's ``capacity``."""
    return min(-(-span // SPAN_STEP) * SPAN_STEP, capacity)


def copy_out(t: torch.Tensor) -> torch.Tensor:
    """A graph's output as a tensor of its own, which the next replay leaves alone."""
    return t.clone()


def native(t: torch.Tensor) -> bool:
    """Whether ``t`` is a tensor CUDA graphs can capture: a CUDA tensor of torch's own class."""
    return t.is_cuda and type(t) is torch.Tensor


@contextlib.contextmanager
def no_host_reads(device: torch.device) -> Iterator[None]:
    """Any device→host read in the block raises, on a GPU (what a capture would fail on)."""
    if device.type != "cuda":
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


class StepGraph:
    """``step(*inputs)`` captured (or rehearsed) on the buffers ``inputs``; :attr:`seconds`: what capturing
    took."""

    def __init__(self, step: Callable[..., tuple[torch.Tensor, ...]], inputs: tuple[torch.Tensor, ...],
                 pool=None) -> None:
        start = time.perf_counter()
        self.step, self.inputs = step, tuple(inputs)
        self.native = native(self.inputs[0])
        self.device = self.inputs[0].device
        if self.native:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    step(*self.inputs)
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, pool=pool):
                self.outputs = tuple(step(*self.inputs))
        else:
            with no_host_reads(self.device):
                self.outputs = tuple(step(*self.inputs))
        self.seconds = time.perf_counter() - start

    def __call__(self, *values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The step on ``values`` (copied into the static inputs); returns the static outputs."""
        for buffer, value in zip(self.inputs, values, strict=True):
            buffer.copy_(value)
        if self.native:
            self.graph.replay()
        else:
            with no_host_reads(self.device):
                for out, new in zip(self.outputs, self.step(*self.inputs), strict=True):
                    out.copy_(new)
        return self.outputs

    def poison(self) -> None:
        """Fill the outputs with NaN, as the next replay would overwrite them (tests: nothing kept may change)."""
        for out in self.outputs:
            if out.is_floating_point():
                out.fill_(float("nan"))

    def addresses(self) -> list[int]:
        """The inputs' and outputs' addresses (a replay reads and writes exactly these)."""
        return [t.data_ptr() for t in (*self.inputs, *self.outputs)]
