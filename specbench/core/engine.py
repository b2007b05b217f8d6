"""``forward=compiled``: the target's forward at static shapes, its dense parts compiled (engine-grade).

:class:`CompiledTarget` is a :class:`~specbench.core.forward.Target` (the same drafts, masks, cache and compaction;
every caller unchanged) whose forward runs the decoder itself instead of calling transformers' modules, the way
gpt-fast and serving engines do:

- **Static shapes.** A step's ``n`` rows of ``q`` tokens run as ``n × width(q)`` tokens, ``width`` rounding up to a
  power of two (:data:`~specbench.core.shapes.WIDTHS` up to 128; past it, a multiple of 128). Padded rows sit at
  their row's last position, see only themselves, are never read back, and write keys and values past the block,
  where the next block overwrites them. The LM head runs on the kept rows, padded the same way. A prompt is prefilled
  in pieces of at most 128 tokens (:func:`~specbench.core.shapes.pieces`: on a CPU, cut where padding would cost more
  than another piece), so every shape the compiler sees comes from that short list.
- **The KV store allocated once** at the request's limit (plus the widest block), so its buffers keep their addresses
  for the whole run (:meth:`~specbench.core.kv.RowCache.allocate`; entries are zeroed as forwards first read them).
- **Layers compiled in runs, one graph shared by every run.** A decoder layer (its norms, fused q/k/v and gate/up
  products, rotary embedding, keys and values written into the cache in place at the rows' positions, attention over
  the cache) is a function of its weights and cache rows, passed as arguments; :data:`~specbench.core.shapes.GROUP`
  consecutive layers run in one compiled call (:func:`~specbench.core.shapes.groups`: 30 layers as 5 runs of 6), so a
  one-token step enters compiled code 6 times instead of once or twice per layer, and one graph serves every run. The
  step's span (the entries its rows attend over) is the one dynamic size, so a width compiles once for every context
  length. Attention and the products by width: :mod:`specbench.core.decoder`.

**On a CPU, one-token steps ahead of time** (:mod:`specbench.core.aot`, when a folder for its packages is given): a
step of one row of one token runs its runs of layers and its LM head through AOTInductor packages, with none of
torch.compile's Python around each call; every other step goes through torch.compile.

**On a GPU, CUDA graphs** (:mod:`specbench.core.graphs`): each verification step is one graph per (rows, width, span
bucket of :data:`~specbench.core.graphs.SPAN_STEP` entries), its inputs (tokens, positions, the rows' lengths, the
block's visibility) copied into the graph's own buffers, the cache positions and the mask made inside it; the layers
run as their own kernels, uncompiled. The graphs read the cache buffer's address, so a request's cache takes again
the buffer of one that has ended (:meth:`new_cache`); what a caller keeps (the kept rows' logits, the features heads
read) is copied out of the graph's outputs, which the next step overwrites. A prompt is prefilled without a graph.

Models other than Llama-shaped decoders (Llama, Mistral without a sliding window, Qwen2), or split over devices, are
refused in one line. Compilation (capture) happens on a shape's first use (Inductor caches its kernels on disk across
runs); :meth:`CompiledTarget.warm` compiles every width (captures every graph up to a length) ahead of a timed run,
and :attr:`CompiledTarget.compile_s` says how long that took, reported apart from decoding.
"""

from __future__ import annotations

import functools
import time
import types
import weakref
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from specbench.core import decoder, graphs
from specbench.core.aot import AheadOfTime
from specbench.core.forward import Target
from specbench.core.graphs import SPAN_STEP, StepGraph, native, span_bucket
from specbench.core.kv import RowCache, upload
from specbench.core.shapes import EACH, PIECE, WIDTHS, groups, pieces, width
from specbench.errors import ConfigError

FORWARD_MODES = ("eager", "compiled")
FAMILIES = ("llama", "mistral", "qwen2")  # decoders whose layers this forward reproduces
ONE_DEVICE = "forward=compiled runs a model on one device: a sharded or offloaded model runs with forward=eager"


class EngineError(ConfigError):
    """A model or setting the compiled forward cannot run: the message names what to use instead."""


def supported(model: torch.nn.Module) -> str | None:
    """Why ``model`` cannot run compiled (one line), or None when it can."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    kind = getattr(config, "model_type", "?")
    hint = f"forward=compiled runs Llama-shaped decoders ({', '.join(FAMILIES)}); {kind} runs with forward=eager"
    if kind not in FAMILIES:
        return hint
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", kind == "mistral"):
        return f"{hint} (its sliding window is not reproduced)"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"{hint} (its activation {config.hidden_act} is not SiLU)"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", "default") not in ("default", "linear", "llama3"):
        return f"{hint} (its rotary scaling {rope.get('rope_type')} depends on the length)"
    if any(p.device.type == "meta" for p in model.parameters()) or len({p.device for p in model.parameters()}) > 1:
        return ONE_DEVICE
    return None


class CompiledTarget(Target):
    """The target with ``forward=compiled``; ``backend``: torch.compile's (``inductor``; ``eager`` runs the
    same static-shape path uncompiled, as the quick tests do); ``graphs``: each step a CUDA graph
    (:mod:`specbench.core.graphs`; None: on a GPU), the layers then left to their own kernels; ``layers``: the
    layers run, in order (a self-draft's; None: all), its cache holding theirs alone; ``ahead``: a folder for the
    packages of a CPU's one-token steps (:mod:`specbench.core.aot`; None: those steps through torch.compile too)."""

    mode = "compiled"

    def __init__(self, model: torch.nn.Module, backend: str = "inductor", graphs: bool | None = None,
                 layers: list[int] | None = None, ahead: Path | None = None) -> None:
        why = supported(model)
        if why:
            raise EngineError(why)
        super().__init__(model)
        kept = range(self.n_layers) if layers is None else layers  # a self-draft: the layers it keeps, in order
        self.layer_devices, self.n_layers = [self.layer_devices[i] for i in kept], len(kept)
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        first = self.base.layers[0].self_attn
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scale = float(getattr(first, "scaling", self.head_dim ** -0.5))
        self.eps = float(config.rms_norm_eps)
        self.max_positions = int(getattr(config, "max_position_embeddings", 4096))
        pack = decoder.can_pack(self.device, self.dtype)
        self.weights = [decoder.layer_weights(self.base.layers[i], pack) for i in kept]
        self.embed = model.get_input_embeddings().weight.detach()
        self.final = (self.base.norm.weight.detach(), decoder.lay_out(self.lm_head.weight, pack))
        self.cos, self.sin = self._rotary(self.max_positions + PIECE)
        self.backend = backend
        self.compile_s, self.compiled = 0.0, set()  # seconds spent compiling (capturing); the shapes so far
        self.runs = groups(self.n_layers)
        self.graphed = self.device.type == "cuda" if graphs is None else graphs
        self._graphs: dict[tuple, StepGraph] = {}  # (store address, lo, rows, width, span): its graph
        self._free: dict[int, list[torch.Tensor]] = {}  # slots: cache buffers no live cache holds (graphs read them)
        self._pool = None  # the memory pool every graph shares (on a CUDA device)
        self._direct = False  # a prefill: the layers run without a graph
        self._causal: dict[tuple, tuple] = {}  # (rows, q, width): a causal step's block and real rows
        self._views: dict[tuple, list] = {}  # (buffer, shape, first row, rows): each layer's cache rows
        self.neg, self.group = torch.finfo(self.dtype).min, self.heads // self.kv_heads  # the mask's
        fns = (("layers", decoder.layers), ("head", decoder.head))
        if self.graphed:  # a graph launches the step's kernels at once: no compiler needed to cut their cost
            self._fns = dict(fns)
        else:  # dynamic=None with automatic dynamic shapes off: every size static but the span, marked dynamic
            self._fns = {name: torch.compile(_own(fn), backend=backend, dynamic=None, fullgraph=True)
                         for name, fn in fns}
            _allow_recompiles()
        cpu = self.device.type == "cpu" and not self.graphed  # one-token steps ahead of time: a CPU's (given a folder)
        self.ahead = AheadOfTime(ahead, self._fns) if ahead is not None and cpu else None

    def _rotary(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of every position up to ``n``, from the model's own rotary module (scaling included)."""
        probe = torch.zeros(1, 1, self.head_dim, dtype=self.dtype, device=self.device)
        with torch.no_grad():
            cos, sin = self.base.rotary_emb(probe, torch.arange(n, device=self.device)[None])
        return cos[0].to(self.dtype), sin[0].to(self.dtype)

    def new_cache(self, slots: int = 1, limit: int | None = None) -> RowCache:
        """A cache allocated once: ``limit`` entries a row (the model's context when unknown) plus the widest
        block, zeroed, never regrown. With graphs, a buffer of an earlier cache that has ended is taken again
        (the graphs captured on it read its address), when it is large enough."""
        room = min(limit or self.max_positions, self.max_positions) + PIECE
        cache = RowCache(slots, self.layer_devices, limit=room)
        free = self._free.setdefault(slots, [])
        taken = next((i for i, store in enumerate(free) if store.shape[4] >= room), None) if self.graphed else None
        if taken is None:
            cache.allocate(self.kv_heads, self.head_dim, self.dtype, room)
        else:
            cache.adopt(free.pop(taken))
        if self.graphed:  # the buffer (the cache's last, if it grew) returns to the free list when the cache ends
            weakref.finalize(cache, _release, free, cache.stores, self.device)
        return cache

    def _call(self, name: str, *args):
        ahead = self.ahead is not None and self.ahead.takes(name, args)  # a one-token step: its package's runner
        fn = functools.partial(self.ahead, name) if ahead else self._fns[name]
        key = (name, ahead, *args[4].shape, len(args[3])) if name == "layers" else (name, ahead, args[0].shape[0])
        if key in self.compiled or self.graphed:
            return fn(*args)
        start = time.perf_counter()
        out = fn(*args)
        self.compile_s += time.perf_counter() - start
        self.compiled.add(key)
        return out

    def warm(self, rows: int = 1, limit: int = PIECE) -> float:
        """Compile every width for 1 to ``rows`` rows before anything is timed (with graphs: capture each, at
        every span bucket up to ``limit`` entries a row, on the buffer the requests will take again); returns
        the seconds it took."""
        before = self.compile_s
        with torch.inference_mode():  # as decoding runs: its cache's tensors are inference tensors
            cache = self.new_cache(rows, limit=limit)
            spans = sorted({span_bucket(s, cache.capacity) for s in range(SPAN_STEP, cache.capacity + SPAN_STEP,
                                                                           SPAN_STEP)}) if self.graphed else [0]
            for n in range(1, rows + 1):
                for w in WIDTHS:
                    for span in spans:
                        cache.lengths[:n] = [max(0, span - w)] * n
                        ids = torch.zeros((n, w), dtype=torch.long, device=self.device)
                        positions = torch.arange(w, device=self.device)[None].expand(n, w)
                        self._forward(ids, positions, None, cache)
        return self.compile_s - before

    # -- the forward ----------------------------------------------------------------------------------

    def prefill(self, prompt_ids: list[int], cache: RowCache, features: tuple[int, ...] = (),
                slot: int = 0) -> torch.Tensor:
        """:meth:`Target.prefill` in pieces of at most :data:`PIECE` tokens (each causal after the last); with
        graphs, the layers run without one (a prompt's shapes come once)."""
        direct, self._direct = self._direct, True
        try:
            return self._prefill(prompt_ids, cache, features, slot)
        finally:
            self._direct = direct

    def _prefill(self, prompt_ids: list[int], cache: RowCache, features: tuple[int, ...], slot: int) -> torch.Tensor:
        sizes = pieces(len(prompt_ids), PIECE if self.graphed else EACH)
        if len(sizes) == 1:
            return super().prefill(prompt_ids, cache, features, slot)
        states: dict[int, list[torch.Tensor]] = {}
        for at, k in zip(np.cumsum([0, *sizes[:-1]]).tolist(), sizes, strict=True):
            logits = super().prefill(prompt_ids[at : at + k], cache, features, slot)
            for layer, h in self.features.items():
                states.setdefault(layer, []).append(h)
        self.features = {layer: torch.cat(parts) for layer, parts in states.items()}
        return logits

    def prefill_rows(self, prompts: list[list[int]], cache: RowCache, lo: int, features: tuple[int, ...] = ()
                     ) -> torch.Tensor:
        """Each prompt prefilled in its own slot (in pieces), one after the other."""
        logits, states = [], []
        for r, prompt in enumerate(prompts):
            logits.append(self.prefill(prompt, cache, features, slot=lo + r))
            states.append(self.features)
        self.row_features = states
        return torch.stack(logits)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, mask, cache: RowCache, lo: int = 0,
                 keep=None, features: tuple[int, ...] = ()) -> torch.Tensor:
        n, q = ids.shape
        if isinstance(mask, dict):
            raise EngineError("forward=compiled has no sliding-window layers: run this model with forward=eager")
        w = width(q)
        past = torch.as_tensor(cache.lengths[lo : lo + n], dtype=torch.long)
        if w > q:  # padded rows: at the row's last position, seeing only themselves
            ids = F.pad(ids, (0, w - q))
            positions = torch.cat([positions, positions[:, -1:].expand(n, w - q)], 1)
        block, real = self._block(n, q, w, mask)
        lengths = upload(past, self.device)
        cache.begin(lo, lo + n, w)
        if not cache.stores:
            cache.allocate(self.kv_heads, self.head_dim, self.dtype, cache.capacity)
        graph = self.graphed and not self._direct
        span = max(2, int(past.max()) + w)  # never 1 nor the whole buffer: the compiler specializes on both
        if span >= cache.capacity + graph:  # (a graph may read the whole buffer)
            cache.reserve(span + 1)
        if graph:  # a graph per span bucket: the mask hides the entries past the span
            span = span_bucket(span, cache.capacity)
            cache.touch(span)
        store = cache.stores[self.device]
        index = self._kept(keep, n, q, w)
        if graph:  # the mask and the cache positions are made inside the graph, from the lengths and the block
            logits, *outs = self._replay(store, lo, n, w, span, ids, positions, lengths, block, real)
            logits = logits.index_select(0, index)  # copies out of the graph's buffers, as the features below
        else:
            where, visible = self._where_visible(lengths, block, real, span)
            torch._dynamo.maybe_mark_dynamic(visible, 3)  # one graph for every span (guards as the compiler needs)
            kvs = self._views.get(key := (store.data_ptr(), store.shape, lo, n))
            if kvs is None:  # each layer's rows of the buffer (it keeps its address), made once: not every step
                self._views = {k: v for k, v in self._views.items() if k[:2] == key[:2]}  # none of an old buffer
                kvs = self._views[key] = [store[cache._where[i][1], :, lo : lo + n] for i in range(self.n_layers)]
                for kv in kvs:  # any request's capacity: one graph
                    torch._dynamo.maybe_mark_dynamic(kv, 3)
            outs = self._layers(ids, positions, where, visible, kvs)
            rows = outs[-1].index_select(0, F.pad(index, (0, width(len(index)) - len(index))))
            logits = self._call("head", rows, *self.final, self.eps)[: len(index)]
        self.features = {}
        for layer in features:
            at = layer % (self.n_layers + 1)
            h = outs[at].view(n, w, -1)[:, :q]
            self.features[layer] = self.base.norm(h) if at == self.n_layers else graphs.copy_out(h) if graph else h
        return logits

    def _layers(self, ids, positions, where, visible, kvs) -> list[torch.Tensor]:
        """Every layer's input and the last one's output, for ``ids`` at ``positions`` (``[n, w]``), the keys and
        values written into ``kvs`` (each layer's cache rows) at ``where``."""
        x = self.embed[ids.reshape(-1)]
        flat = positions.reshape(-1)
        cos, sin = self.cos[flat], self.sin[flat]
        outs = [x]  # outs[i]: the input of layer i (before its norm)
        for run in self.runs:
            outs += self._call("layers", x, cos, sin, kvs[run.start : run.stop], where, visible,
                               self.weights[run.start : run.stop], self.eps, self.heads, self.kv_heads, self.scale)
            x = outs[-1]
        return outs

    def _replay(self, store: torch.Tensor, lo: int, n: int, w: int, span: int, *inputs) -> tuple:
        """The step as a graph (captured on its first use): the logits of all ``n × w`` rows, then every
        layer's input and the last one's output, all in the graph's own buffers."""
        key = (store.data_ptr(), lo, n, w, span)
        graph = self._graphs.get(key)
        if graph is None:
            kvs = [store[i, :, lo : lo + n] for i in range(self.n_layers)]  # fixed addresses, read by the graph

            def step(ids, positions, lengths, block, real):
                outs = self._layers(ids, positions, *self._where_visible(lengths, block, real, span), kvs)
                return (self._fns["head"](outs[-1], *self.final, self.eps), *outs)

            if self._pool is None and native(store):
                self._pool = torch.cuda.graph_pool_handle()
            graph = self._graphs[key] = StepGraph(step, tuple(t.clone() for t in inputs), self._pool)
            self.compile_s += graph.seconds
            self.compiled.add(key)
        return graph(*inputs)

    def _rows_mask(self, vis, offsets=None, lengths=None, positions=None) -> torch.Tensor:
        """Each row's block visibility alone ([n, q, q], bool, on the device): :meth:`_forward` builds the step's
        mask from it and the rows' lengths (on a GPU inside the step's graph)."""
        return vis if isinstance(vis, torch.Tensor) else upload(vis, self.device)

    def _mask(self, vis, offsets, past_len: int, positions=None) -> torch.Tensor:
        return self._rows_mask(vis)[None]  # one row's, as :meth:`_rows_mask`

    def _block(self, n: int, q: int, w: int, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """What each of the ``w`` rows sees of the block ([n, w, w]: ``mask``, causal when None, a padded row
        itself alone) and which rows are real (they see their row's past); a causal step's kept."""
        if mask is None and (n, q, w) not in self._causal:
            self._causal[n, q, w] = self._block(n, q, w, torch.ones(q, q, dtype=torch.bool, device=self.device).tril_())
        if mask is None:
            return self._causal[n, q, w]
        block = torch.eye(w, dtype=torch.bool, device=self.device).repeat(n, 1, 1)
        block[:, :q, :q] = mask
        return block, torch.arange(w, device=self.device) < q

    def _where_visible(self, lengths: torch.Tensor, block: torch.Tensor, real: torch.Tensor, span: int) -> tuple:
        """The cache positions a step writes ([n, w], after the rows' ``lengths``) and its float mask [n, 1, group ×
        w, span]: a ``real`` row sees its row's past; of the block, what ``block`` allows; nothing past it."""
        w = block.shape[-1]
        rel = torch.arange(span, device=self.device)[None, :] - lengths[:, None]  # a column's place in the block
        seen = block.gather(2, rel.clamp(0, w - 1)[:, None, :].expand(-1, w, -1)) & ((rel >= 0) & (rel < w))[:, None]
        seen |= (rel < 0)[:, None, :] & real[None, :, None]
        full = torch.zeros(seen.shape, dtype=self.dtype, device=self.device).masked_fill_(~seen, self.neg)
        return lengths[:, None] + torch.arange(w, device=self.device)[None], full.repeat(1, self.group, 1)[:, None]

    def _kept(self, keep, n: int, q: int, w: int) -> torch.Tensor:
        """The rows of the padded ``[n × w]`` block whose logits are wanted (``keep`` indexes ``[n × q]``)."""
        index = keep.to(self.device) if isinstance(keep, torch.Tensor) else torch.arange(
            n * q, device=self.device)[-(keep or 0):]  # keep: the last ``keep`` rows (0 or None: all)
        return (index // q) * w + index % q


def make_target(model: torch.nn.Module, mode: str = "eager", backend: str = "inductor", ahead: Path | None = None
                ) -> Target:
    """The target for ``forward=mode``: transformers' modules as they are, or :class:`CompiledTarget` (its one-token
    steps on a CPU compiled ahead of time into packages kept in ``ahead``, if given)."""
    if mode not in FORWARD_MODES:
        raise EngineError(f"forward must be one of {', '.join(FORWARD_MODES)}, got {mode!r}")
    from specbench.core import forward  # looked up now: a test may stand a stub in for it

    return forward.Target(model) if mode == "eager" else CompiledTarget(model, backend=backend, ahead=ahead)


def announce(target: Target, rows: int = 1, limit: int = PIECE) -> str:
    """The run's line on its forward mode; a compiled target compiles every width first (for up to ``rows``
    rows; with graphs, captures them at every span up to ``limit``), so that no timing holds a compilation,
    and says what that took."""
    if not isinstance(target, CompiledTarget):
        return ("forward=eager: transformers' modules as they are, the papers' setting (forward=compiled: static "
                "shapes, compiled, as serving engines run)")
    seconds = target.warm(rows, limit)
    if target.graphed:
        return (f"forward=compiled: {len(target.compiled)} CUDA graphs captured in {seconds:.1f} s (not part of "
                "any timing)")
    ahead = f", one-token steps ahead of time (kept in {target.ahead.folder})" if target.ahead else ""
    return (f"forward=compiled: {len(target.compiled)} shapes compiled{ahead} in {seconds:.1f} s (not part of any "
            "timing; Inductor keeps its kernels for later runs)")


def _release(free: list, stores: dict, device: torch.device) -> None:
    """An ended cache's buffer back on its target's free list."""
    if device in stores:
        free.append(stores[device])


def _own(fn):
    """A copy of ``fn`` with its own code object. torch keeps compiled graphs per code object, tries them in
    turn and caps their number: each target compiling its own copy keeps the graphs of targets of other
    shapes (a draft model, a test's models) out of its list."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def _allow_recompiles() -> None:
    """One compiled graph per rows × width × run length: allow that many entries per function (torch's default
    is 8)."""
    import torch._dynamo.config as dynamo

    dynamo.automatic_dynamic_shapes = False  # a new width compiles its own static graph, not a dynamic one
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo, name):
            setattr(dynamo, name, max(getattr(dynamo, name), 256))
