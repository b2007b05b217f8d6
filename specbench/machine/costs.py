"""Measuring what one verification forward costs on this machine, and keeping it: the curve t(q, context[, batch]).

:func:`measure` times a step's verification (``Target.forward_draft``: a block of q tokens through the tree
mask, every row's logits; then the cache compacted to an accepted path of three guesses) for block sizes
:data:`QS` after a few context lengths, every device synchronised, the plain step the fastest of a few rounds and
every block that times the median of its paired ratios to it, each row made non-decreasing in q (pool adjacent
violators). :func:`measure_batch` does the same for B rows a forward
(``Target.forward_rows``). Curves are cached per machine, software, model, dtype, attention and placement under
``$SPECBENCH_CACHE/costs/``, ``budget=static``'s drafting tables beside them. ``specbench costs``
prints a curve.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import sys
from pathlib import Path
from time import perf_counter
from typing import Any

import torch

from specbench.budget.costs import STAGGERED, CostModel
from specbench.budget.drafting import DraftingCost
from specbench.core.draft import Draft

QS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)  # block sizes timed: dense where CPU kernels step (bench/README.md)
CONTEXTS = (128, 1024)  # on a CPU; GPU_CONTEXTS on a GPU (MT-Bench's second turn reaches 2-3k tokens)
GPU_CONTEXTS = (128, 1024, 2048, 4096)
COST_DIR = "costs"
BATCH_TOKENS = 1024  # most tokens (rows × block) a batched forward is timed with on a CPU; 4096 on a GPU
SMALL_Q = 8  # blocks up to this size get more rounds: their costs differ from a plain step's by a tenth or so
MEASURE_VERSION = 5  # part of the cache key: a changed measurement invalidates cached curves
COMPILED_VERSION = 2  # … and of forward=compiled's: its one-token steps now compiled ahead of time on a CPU
STALE = 1 / 3  # a cached curve off the plain step timed now by more than this (×4/3 or ×3/4) is timed again: a
# 2-core VM's own pace moves ±15% within minutes (docs/measurements/budget.md), a day's or a load's far more


def monotone(values: list[float]) -> list[float]:
    """The closest non-decreasing sequence in least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [sum, count]
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, n = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += n
    return [s / n for s, n in blocks for _ in range(n)]


def _tree(q: int, vocab: int, gen: torch.Generator) -> Draft:
    """``q - 1`` guesses as a tree the size of the block: two branches of chains."""
    n = q - 1
    tokens = torch.randint(0, vocab, (n,), generator=gen).tolist()
    parents = [-1 if i < 2 else i - 2 for i in range(n)]  # two interleaved chains: the mask path
    return Draft(tokens=tokens, parents=parents, sources=["cost"] * n)


def contexts_for(target: Any, context_length: int | None = None, qs=QS) -> tuple[int, ...]:
    """The context lengths to time: :data:`GPU_CONTEXTS` on a GPU, :data:`CONTEXTS` on a CPU, those that leave
    room for the largest block within ``context_length``."""
    wanted = GPU_CONTEXTS if target.is_cuda else CONTEXTS
    if not context_length:
        return wanted
    fit = tuple(c for c in wanted if c + max(qs) <= context_length)
    return fit or (max(1, context_length - max(qs)),)


def _path(q: int) -> list[int]:
    """An accepted path of up to three guesses down the first chain of :func:`_tree`'s block."""
    return list(range(0, q - 1, 2))[:3]


def timed_step(target: Any, draft: Draft, cache: Any, root: int, past: int) -> tuple[float, torch.Tensor]:
    """One verification as the cost curve times it: ``forward_draft`` of ``draft`` after ``root``, then the
    compaction of an accepted path (:func:`_path`), between device syncs; the cache is then cut back to its
    ``past`` entries. Returns the seconds and the logits."""
    target.sync()
    t0 = perf_counter()
    logits = target.forward_draft(root, draft, cache)
    target.compact(cache, past, _path(len(draft.tokens) + 1))
    target.sync()
    seconds = perf_counter() - t0
    cache.crop(past - cache.get_seq_length())  # back to the context (negative: tokens to drop)
    return seconds, logits


@torch.inference_mode()
def measure(target: Any, vocab_size: int, *, qs=QS, contexts=None, repeats: int = 3, warmup: int = 2,
            seed: int = 0, progress: bool = False, context_length: int | None = None,
            small_repeats: int | None = None) -> CostModel:
    """Time a verification (``forward_draft``, then ``compact``) for every block size and context length. Each
    round times every (context, block) once, so a drift in the machine's speed (a GPU's host can halve its pace
    within a minute) spreads over the whole curve instead of skewing one context's row against another's. A
    context's first block (a plain step) costs the fastest of its rounds; every other block costs that
    times the median, over the rounds, of its time over the plain step's in the same round: the fastest of a
    few rounds cannot tell apart blocks whose typical costs differ by a tenth, the median of paired ratios can.
    Blocks up to :data:`SMALL_Q` tokens, where those differences lie, and the plain step get ``small_repeats``
    rounds (three times ``repeats`` when None), the others ``repeats``. ``contexts`` defaults to
    :func:`contexts_for`."""
    from specbench.provenance import device_name

    contexts = tuple(contexts) if contexts else contexts_for(target, context_length, qs)
    gen = torch.Generator().manual_seed(seed)
    rows = []  # per context: its cache, prompt and length
    for ctx in contexts:
        cache = target.new_cache()
        prompt = torch.randint(0, vocab_size, (max(ctx, 1),), generator=gen).tolist()
        target.prefill(prompt, cache)
        rows.append((cache, prompt, cache.get_seq_length()))
    drafts = [_tree(q, vocab_size, gen) for q in qs]
    times: list[list[list[float]]] = [[[] for _ in qs] for _ in contexts]  # per context and block: each round's
    small = max(repeats, 3 * repeats if small_repeats is None else small_repeats) if any(
        q <= SMALL_Q for q in qs[1:]) else repeats
    for r in range(warmup + small):
        for i, (cache, prompt, past) in enumerate(rows):
            for j, draft in enumerate(drafts):
                if j and r >= warmup + repeats and qs[j] > SMALL_Q:
                    continue
                took, _ = timed_step(target, draft, cache, prompt[-1], past)
                if r >= warmup:
                    times[i][j].append(took)
    seconds = [[min(row[0]) * statistics.median(t / p for t, p in zip(cell, row[0], strict=False)) if min(row[0]) > 0
                else min(cell) for cell in row] for row in times]  # the plain step's fastest × each block's median ratio
    if progress:
        for ctx, row in zip(contexts, seconds, strict=True):
            print(f"  context {ctx}: " + ", ".join(f"q {q} {1000 * s:.1f} ms" for q, s in zip(qs, row, strict=True)),
                  file=sys.stderr)
    return CostModel(list(qs), list(contexts), [monotone(row) for row in seconds],
                     device_name=device_name(target.device), forward=getattr(target, "mode", "eager"))


def batch_sizes(batch_size: int) -> list[int]:
    """The batch sizes timed for a run at ``batch_size``: 2, 4, 8, … below it, and itself."""
    sizes, b = [], 2
    while b < batch_size:
        sizes.append(b)
        b *= 2
    return sizes + ([batch_size] if batch_size > 1 else [])


@torch.inference_mode()
def measure_batch(target: Any, vocab_size: int, batch: int, *, qs=QS, contexts=None, repeats: int = 2,
                  warmup: int = 1, seed: int = 0, progress: bool = False, context_length: int | None = None,
                  most_tokens: int | None = None) -> CostModel:
    """Time a batched verification (``forward_rows`` with a block of q tokens in each of ``batch`` rows, then
    every row compacted) for the block sizes whose total stays within ``most_tokens`` (:data:`BATCH_TOKENS`,
    four times that on a GPU); larger blocks extend the last slope. The rows sit at staggered lengths, from the
    context down to half of it, as a batch's requests do (attention reads up to the longest row): the curve is
    keyed by the longest row's context."""
    from specbench.provenance import device_name

    contexts = tuple(contexts) if contexts else contexts_for(target, context_length, qs)[:2]
    most = most_tokens or (4 if target.is_cuda else 1) * BATCH_TOKENS
    timed = [q for q in qs if q * batch <= most] or [qs[0]]
    gen = torch.Generator().manual_seed(seed)
    seconds: list[list[float]] = []
    for ctx in contexts:
        cache = target.new_cache(batch, limit=ctx + max(qs) + 1)
        lengths = [max(1, ctx - (ctx * r) // (2 * batch)) for r in range(batch)]
        prompts = [torch.randint(0, vocab_size, (n,), generator=gen).tolist() for n in lengths]
        for slot, prompt in enumerate(prompts):
            target.prefill(prompt, cache, slot=slot)
        row = []
        for q in timed:
            drafts = [_tree(q, vocab_size, gen)] * batch
            keeps = [[0] + [1 + i for i in _path(q)]] * batch
            times = []
            for r in range(warmup + repeats):
                target.sync()
                t0 = perf_counter()
                target.forward_rows([p[-1] for p in prompts], drafts, cache, 0)
                cache.commit(0, keeps)
                target.sync()
                if r >= warmup:
                    times.append(perf_counter() - t0)
                cache.crop(-len(keeps[0]))
            row.append(min(times))
            if progress:
                print(f"  batch {batch}, context {ctx}, q {q}: {1000 * row[-1]:.1f} ms", file=sys.stderr)
        row = monotone(row)
        seconds.append(row + _extend(timed, row, qs[len(timed):]))
    return CostModel(list(qs), list(contexts), seconds, device_name=device_name(target.device), rows=STAGGERED,
                     forward=getattr(target, "mode", "eager"))


def _extend(qs: list[int], row: list[float], beyond) -> list[float]:
    """``row`` (timed at ``qs``) carried on to the block sizes ``beyond`` along its last slope."""
    if len(qs) < 2:
        return [row[-1] * q / qs[-1] for q in beyond]
    slope = (row[-1] - row[-2]) / (qs[-1] - qs[-2])
    return [row[-1] + slope * (q - qs[-1]) for q in beyond]


def cost_key(model_name: str, dtype: str, attn: str, device: Any, *, devices: list | None = None,
             quantization: str = "", device_map: str = "", linear: str = "plain", forward: str = "eager") -> str:
    """Which machine, software, model and placement a curve belongs to: int8 on one GPU and fp16 over
    two, four or eight never share one, nor do packed and plain CPU linear layers, nor the forward modes."""
    import transformers

    from specbench.provenance import device_name

    gpus = sorted({str(d) for d in (devices or [device]) if torch.device(d).type == "cuda"})
    ident = [MEASURE_VERSION, model_name, dtype, attn, device_name(device), torch.__version__,
             transformers.__version__, quantization, device_map, [device_name(g) for g in gpus],
             (torch.version.cuda or "") if gpus else ""] + ([] if linear == "plain" else [linear]) + (
                 [] if forward == "eager" else [f"forward={forward}", COMPILED_VERSION])
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:16]


def cost_path(key: str, model_name: str, dtype: str) -> Path:
    from specbench.paths import cache_root

    return cache_root() / COST_DIR / f"{model_name}-{dtype}-{key}.json"


def pace(target: Any, vocab_size: int, curve: CostModel) -> float:
    """This machine's plain step now over ``curve``'s: t(1) after the curve's first context, timed as
    :func:`measure` times it, the fastest of ten after three (under a second on a CPU)."""
    now = measure(target, vocab_size, qs=(1,), contexts=curve.contexts[:1], repeats=10, warmup=3)
    return now.seconds[0][0] / curve(1, curve.contexts[0])


def load_or_measure(loaded: Any, model_name: str, dtype: str, attn: str, *, remeasure: bool = False,
                    progress: bool = False, batch_size: int = 1, check: bool = False, target: Any = None,
                    **measure_kw) -> CostModel:
    """The cached curve for this machine and model, or a new measurement (saved for next time); with
    ``batch_size`` > 1, with the batch sizes :func:`batch_sizes` names (those missing are measured and added).
    ``check``: a cached curve's plain step is timed again first (:func:`pace`, kept as the returned curve's
    ``checked``), and a curve off by more than :data:`STALE` (a machine under another load, a cache from another
    day) is measured again, so drafting timed live is never set against a forward priced at another pace."""
    from specbench.core.engine import make_target
    from specbench.paths import compiled_packages, exclusive

    mode = getattr(loaded, "forward", "eager")  # each mode its own curve, timed through its own forward
    target = target if target is not None else make_target(loaded.model, mode, ahead=compiled_packages())
    key = cost_key(model_name, dtype, attn, target.device, devices=target.devices,
                   quantization=getattr(loaded, "quantization", ""), device_map=getattr(loaded, "device_map", ""),
                   linear=getattr(loaded, "linear", "plain"), forward=mode)
    path = cost_path(key, model_name, dtype)
    wanted = batch_sizes(batch_size)

    stale = None  # the seconds of a cached curve found off this machine's pace: measured again

    def read() -> CostModel | None:
        found = None if remeasure else _read_curve(path)
        if found is not None:
            same_mode(found, mode, path.name)
        return None if found is None or found.seconds == stale else found

    def ready() -> CostModel | None:
        cached = read()
        return cached if cached is not None and all(b in cached.batches for b in wanted) else None

    cached, checked = ready(), 0.0
    if cached is not None and check:
        cached.checked = checked = round(pace(target, loaded.vocab_size, cached), 4)
        if abs(math.log(checked)) > math.log(1 + STALE):
            print(f"cost curve: a plain step takes {checked:.2f}x the cached curve's ({path.name}): "
                  "timing the curve again", file=sys.stderr)
            stale, cached = cached.seconds, None
    if cached is not None:
        return cached
    with exclusive(path):  # jobs of a sweep that start together: one measures, the others read its curve
        cached = ready()
        if cached is not None:
            return cached
        measure_kw.setdefault("context_length", getattr(loaded, "context_length", None))
        model = read()
        if model is None:
            model = measure(target, loaded.vocab_size, progress=progress, **measure_kw)
            model.key = key
        for b in wanted:
            if b not in model.batches:
                model.batches[b] = measure_batch(target, loaded.vocab_size, b, progress=progress, **{
                    k: v for k, v in measure_kw.items() if k in ("qs", "contexts", "context_length", "seed")})
        _write_curve(path, model)
    model.checked = checked  # re-timed: the pace that set it off (the stored curve keeps none)
    return model


def same_mode(curve: CostModel, mode: str, name: str = "the cost curve") -> None:
    """Refuse, in one line, a curve timed in another forward mode than the run's (its prices are another
    forward's)."""
    if curve.forward != mode:
        from specbench.errors import ConfigError

        raise ConfigError(f"{name} was timed with forward={curve.forward}, and this run is forward={mode}: each mode "
                          f"plans on its own curve (delete the file, or run with forward={curve.forward})")


def _write_curve(path: Path, model: CostModel) -> None:
    from specbench.paths import write_json

    write_json(path, model.to_dict())


def _read_curve(path: Path) -> CostModel | None:
    """The curve saved at ``path``; None when there is none or it is unreadable (then measured again)."""
    if not path.exists():
        return None
    try:
        return CostModel.from_dict(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError):
        return None


def table_path(curve_path: Path, preset: str, params: dict) -> Path:
    """Where ``budget=static`` keeps a preset's drafting table: beside the cost curve it was measured with, one
    per preset and settings (a changed setting is another drafter)."""
    digest = hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return curve_path.with_suffix("") / f"drafting-{preset.replace(':', '_')}-{digest}.json"


def read_table(path: Path) -> DraftingCost | None:
    """The stored table (frozen), or None when there is none or it is unreadable (then measured again)."""
    try:
        return DraftingCost.from_dict(json.loads(path.read_text()), frozen=True)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_table(path: Path, cost: DraftingCost) -> None:
    from specbench.paths import write_json

    write_json(path, cost.to_dict())
