"""One-token steps compiled ahead of time on a CPU (AOTInductor), for ``forward=compiled``.

A step of one row of one token (autoregressive decoding, a stopped step) spends a good part of its time on a CPU in
torch.compile's own Python around each compiled call: dynamo's guard check, the wrappers, the reads of the dynamic
sizes, Inductor's buffer allocations and size checks. Here a run of layers (:func:`~specbench.core.decoder.layers`)
and the LM head (:func:`~specbench.core.decoder.head`) at that shape are exported once (``torch.export``; the span
and the cache's capacity dynamic, so one package serves every request and context) and compiled by AOTInductor
into a package whose C++ runner takes the step's tensors straight (docs/measurements/forward.md has what it cuts).

Packages are built on first use and kept in ``folder``, named by a digest of what they are built from (the torch
version, the CPU's vector instructions and threads, the decoder's code, every input's shape, dtype and strides and
the layer's constants), so a later run loads them in about a second; two jobs building one package at once each
write their own temporary file and the last rename wins. A step these packages do not take (several rows or
tokens, a batch's cache rows, which are not contiguous) runs through torch.compile as before.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import sys
import time
import uuid
from pathlib import Path

import torch
import torch.utils._pytree as pytree

from specbench.core import decoder

VERSION = 1  # of the packages' layout: a change builds them again


class _Run(torch.nn.Module):
    """A run of layers as a module of flat tensors: ``x, cos, sin, where, visible``, each layer's cache rows, then
    the layers' weight tensors in the order :func:`torch.utils._pytree.tree_flatten` gives them."""

    def __init__(self, layers: int, spec, leaves: list, eps: float, heads: int, kv_heads: int, scale: float):
        super().__init__()
        self.layers, self.spec, self.holes = layers, spec, [not isinstance(v, torch.Tensor) for v in leaves]
        self.leaves, self.constants = leaves, (eps, heads, kv_heads, scale)

    def forward(self, *tensors):
        x, cos, sin, where, visible = tensors[:5]
        kvs, flat = list(tensors[5 : 5 + self.layers]), iter(tensors[5 + self.layers :])
        weights = pytree.tree_unflatten([v if hole else next(flat) for v, hole in zip(self.leaves, self.holes,
                                                                                      strict=True)], self.spec)
        return decoder.layers(x, cos, sin, kvs, where, visible, weights, *self.constants)


class _Head(torch.nn.Module):
    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, x, norm, plain, packed=None):  # packed: None where the CPU lays out no weights
        return decoder.head(x, norm, (plain, packed), self.eps)


class AheadOfTime:
    """The one-token runs of layers and LM head of one model as AOTInductor packages in ``folder``;
    :attr:`build_s`: the seconds spent exporting, compiling and loading them. A call whose package cannot be built
    runs through ``fallback`` (the target's torch.compile functions, by name), said once in one line."""

    def __init__(self, folder: Path, fallback: dict) -> None:
        self.folder, self.fallback, self.build_s = Path(folder), fallback, 0.0
        self._runners: dict[tuple, object] = {}
        self._failed: set[tuple] = set()
        self._flat: dict[tuple, tuple] = {}  # a run's weights (by their tuples' ids): them, flattened

    @staticmethod
    def takes(name: str, args: tuple) -> bool:
        """Whether a compiled call is a one-token step these packages run: one row, its inputs contiguous as when
        they were built (of the cache, a one-slot cache's rows; a batch's rows are strided views)."""
        inputs = (args[0],) if name == "head" else (*args[:3], *args[3], *args[4:6])
        return args[0].shape[0] == 1 and all(t.is_contiguous() for t in inputs)

    def __call__(self, name: str, *args):
        """The compiled call ``name`` (``layers`` or ``head``, as :class:`~specbench.core.engine.CompiledTarget`
        makes it) through its package."""
        if name == "layers":
            x, cos, sin, kvs, where, visible, weights, *constants = args
            known = self._flat.get(ids := tuple(map(id, weights)))
            if known is None:  # a run's weights flattened once (the same tuples every step), kept with them
                leaves, spec = pytree.tree_flatten(weights)
                known = self._flat[ids] = (weights, leaves, spec, [v for v in leaves if isinstance(v, torch.Tensor)])
            _, leaves, spec, flat = known
            tensors = [x, cos, sin, where, visible, *kvs, *flat]
            key = (name, len(kvs), tuple(constants))
            made, dims = (lambda: _Run(len(kvs), spec, leaves, *constants)), (4, 5 + len(kvs))
        else:
            x, norm, (plain, packed), eps = args
            tensors = [t for t in (x, norm, plain, packed) if t is not None]
            key, made, dims = (name, eps, len(tensors)), (lambda: _Head(eps)), (None, 0)
        run = self._runners.get(key)
        if run is None and key not in self._failed:
            run = self._build(key, tensors, made, *dims)
        if run is None:
            return self.fallback[name](*args)
        out = run.loader.boxed_run(tensors)
        return tuple(out) if name == "layers" else out[0]

    def _build(self, key: tuple, tensors: list[torch.Tensor], module, visible: int | None, kv_end: int):
        """Export, compile and load the package for ``key`` (or load the one built before), its span (the
        ``visible`` tensor's last dimension) and the cache's capacity (the cache rows' fourth) dynamic."""
        start = time.perf_counter()
        path = self.folder / f"{key[0]}-{self._digest(key, tensors, visible, kv_end)}.pt2"
        try:
            self._runners[key] = run = self._package(path, tensors, module, visible, kv_end)
        except Exception as error:  # noqa: BLE001 (any failure: the step still runs, through torch.compile)
            self._failed.add(key)
            why = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
            print(f"forward=compiled: one-token {key[0]} steps run through torch.compile (their package was not "
                  f"built: {why})", file=sys.stderr)
            run = None
        self.build_s += time.perf_counter() - start
        return run

    def _package(self, path: Path, tensors: list[torch.Tensor], module, visible: int | None, kv_end: int):
        if not path.exists():
            span, capacity = torch.export.Dim("span", min=2), torch.export.Dim("capacity", min=2)
            dims = [None] * len(tensors)
            if visible is not None:
                dims[visible] = {3: span}
                dims[5:kv_end] = [{3: capacity}] * (kv_end - 5)
            with torch.inference_mode(False):  # export wants tensors it may trace in-place writes into
                example = [t.clone() for t in tensors]
                made = module()
                shapes = {"tensors": tuple(dims)} if isinstance(made, _Run) else tuple(dims)  # a run: *tensors
                program = torch.export.export(made, tuple(example), dynamic_shapes=shapes, strict=False)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.stem}.{os.getpid()}.{uuid.uuid4().hex[:8]}.pt2")  # then renamed
            with torch._inductor.config.patch({"aot_inductor.metadata": {}}):  # (else it stays, in every later
                torch._inductor.aoti_compile_and_package(program, package_path=str(tmp))  # compile's cache key)
            tmp.replace(path)
        return torch._inductor.aoti_load_package(str(path))

    @staticmethod
    def _digest(key: tuple, tensors: list[torch.Tensor], visible: int | None, kv_end: int) -> str:
        """What a package is built from: torch, the CPU's vector instructions and threads, the decoder's code,
        each input's shape (but the dynamic sizes), dtype and layout, and ``key`` (the call and its constants)."""
        from torch._inductor.cpu_vec_isa import pick_vec_isa

        shapes = []
        for i, t in enumerate(tensors):
            dynamic = (3,) if i == visible or 5 <= i < kv_end else ()
            shapes.append((str(t.dtype), [None if d in dynamic else s for d, s in enumerate(t.shape)],
                           t.is_contiguous(), t.stride() if i >= kv_end else None))  # a weight's layout: kept
        made = (VERSION, torch.__version__, str(pick_vec_isa()), torch.get_num_threads(),
                inspect.getsource(decoder), key, shapes)
        return hashlib.sha256(repr(made).encode()).hexdigest()[:16]
