"""The GPU paths, checked on random-weight models built from configs (:mod:`specbench.gpucheck.models`): no
weights, no internet. Correctness runs on a few layers of full width, speed on all 32. Each check returns rows
``(check, model, dtype, ok, detail)``:

- ``tree``: a multi-branch draft's logits against each branch alone (fp32, fp16, bf16; short and 2k contexts);
- ``compaction``: the cache after keeping an accepted path against a fresh prefill of that path (both contexts);
- ``lossless``: every method's greedy output equals autoregressive decoding (fp32), after the short prompts and
  (the tree and head methods) after the 2k-token context;
- ``fixed point``: in fp16/bf16 (whose kernels differ with the block's shape) every output token is the
  argmax of a teacher-forced forward over the output, to within the baseline's own margin;
- ``device_map``: the same weights straight onto one GPU and through ``device_map=auto`` give identical outputs;
- sampling at T = 1, ``budget=auto``, a model split between cuda:0 and the CPU, and the 70B placement plan:
  :mod:`specbench.gpucheck.scenarios`.

:mod:`specbench.gpucheck.speed` measures the cost curve and the speed table, :mod:`specbench.gpucheck.forward`
``forward=compiled``'s CUDA graphs. Every function takes the device, so the same code runs on the CPU with tiny
shapes (``tiny=True``) in the test suite; ``specbench gpu-check`` prints the table.
"""
from __future__ import annotations

import gc
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from methods.registry import get_method
from specbench.core.decode import generate
from specbench.core.draft import Draft, Drafter
from specbench.core.forward import Target
from specbench.gpucheck import stages as gpu_stages
from specbench.gpucheck.forward import run_forward
from specbench.gpucheck.models import (
    DTYPES,
    SHAPES,
    TINY,
    Row,
    build,
    drafters,
    forget_drafters,
    margins,
    prompts,
)
from specbench.gpucheck.scenarios import check_batch, check_budget_auto, check_sampling, check_split, plan_70b
from specbench.gpucheck.speed import check_syncs, fit_layers, profile, speed
from specbench.gpucheck.stages import Stage, estimate, pace

__all__ = ["SHAPES", "TINY", "build", "check_compaction", "check_methods", "check_tree", "fit_layers", "prompts",
           "run_checks"]

# Largest tree-vs-branch logit difference allowed, in standard deviations of the logits.
TREE_TOLERANCE = {"fp32": 1e-3, "fp16": 2e-2, "bf16": 1e-1}
ULPS = 4  # a greedy choice within this many units of the logits' last place (in the model's dtype) is a tie
LONG_CONTEXT = 2048
SYNC_TOKENS = 12  # new tokens per prompt when counting host syncs (greedy and sampled, every method)
LONG_METHODS = ("autoregressive", "spectra_core", "lookahead", "eagle", "eagle3", "medusa")  # at 2k tokens


# ----------------------------------------------------------------------------- the forward and the cache

TREE = Draft(tokens=[11, 12, 13, 14, 15, 16], parents=[-1, 0, 1, -1, 3, 0], sources=["check"] * 6)


def _paths(draft: Draft) -> list[list[int]]:
    """Every root-to-leaf path of a draft, as node lists."""
    leaves = [i for i in range(len(draft.tokens)) if i not in draft.parents]
    out = []
    for leaf in leaves:
        path = [leaf]
        while draft.parents[path[-1]] >= 0:
            path.append(draft.parents[path[-1]])
        out.append(path[::-1])
    return out


@torch.inference_mode()
def check_tree(target: Target, dtype: str, model_name: str, prefix: list[int], check: str = "tree") -> Row:
    """The tree's logits against each branch run alone through a plain causal forward."""
    cache = target.new_cache()
    target.prefill(prefix[:-1], cache)
    tree = target.forward_draft(prefix[-1], TREE, cache).float()
    worst, scale = 0.0, 1.0
    for path in _paths(TREE):
        ids = torch.tensor([prefix + [TREE.tokens[i] for i in path]], device=target.device)
        plain = target.model(input_ids=ids).logits[0, len(prefix) - 1 :].float()
        scale = float(plain.std())
        rows = [0] + [1 + i for i in path]
        worst = max(worst, float((tree[rows].to(plain.device) - plain).abs().max()) / scale)
    ok = worst <= TREE_TOLERANCE[dtype]
    return (check, model_name, dtype, ok, f"max |Δlogit| {worst:.1e} σ (≤ {TREE_TOLERANCE[dtype]:.0e})")


@torch.inference_mode()
def check_compaction(target: Target, dtype: str, model_name: str, prefix: list[int],
                     check: str = "compaction") -> Row:
    """Keeping :data:`TREE`'s second branch (nodes 3 → 4, rows that must move forward past the first branch)
    leaves the cache a fresh prefill of that path would make."""
    cache = target.new_cache()
    target.prefill(prefix[:-1], cache)
    past = cache.get_seq_length()
    target.forward_draft(prefix[-1], TREE, cache)
    path = [3, 4]
    target.compact(cache, past, path)
    fresh = target.new_cache()
    target.prefill(prefix + [TREE.tokens[i] for i in path], fresh)
    worst = 0.0
    for kept, ref in zip(cache.layers, fresh.layers, strict=True):
        for a, b in ((kept.keys, ref.keys), (kept.values, ref.values)):
            if a.shape != b.shape:
                return (check, model_name, dtype, False, f"cache shape {tuple(a.shape)} vs {tuple(b.shape)}")
            worst = max(worst, float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)))
    ok = worst <= TREE_TOLERANCE[dtype]
    return (check, model_name, dtype, ok, f"max |ΔKV| {worst:.1e} of the largest entry")


def check_backends(shape: dict, model_name: str, layers: int, device: str) -> list[Row]:
    """The tree mask under each scaled-dot-product-attention backend (math, memory-efficient, flash, cuDNN), in
    fp16 and bf16: the tree's logits against each branch alone within the dtype's tolerance. A backend that
    cannot run here, or cannot take a custom mask, is named as such (and not used for trees: the default
    choice passes it over)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"math": SDPBackend.MATH, "memory-efficient": SDPBackend.EFFICIENT_ATTENTION,
                "flash": SDPBackend.FLASH_ATTENTION, "cuDNN": SDPBackend.CUDNN_ATTENTION}
    rows = []
    (prefix,) = prompts(shape["vocab_size"], n=1)
    for dtype in ("fp16", "bf16"):
        target = Target(build(shape, layers, DTYPES[dtype], device))
        for label, backend in backends.items():
            check = f"sdpa {label}"
            try:
                with sdpa_kernel(backend), torch.inference_mode():
                    target.model(input_ids=torch.tensor([prefix], device=target.device))  # causal, no mask
            except RuntimeError as err:
                rows.append((check, model_name, dtype, True, f"not available here ({str(err).splitlines()[0][:80]})"))
                continue
            try:
                with sdpa_kernel(backend):
                    row = check_tree(target, dtype, model_name, prefix, check=check)
            except RuntimeError as err:
                rows.append((check, model_name, dtype, True,
                             f"cannot take the tree's mask, not used for trees ({str(err).splitlines()[0][:80]})"))
                continue
            rows.append(row)
        del target
    return rows


# ----------------------------------------------------------------------------- every method


def check_methods(target: Target, dtype: str, model_name: str, texts: list[list[int]], new_tokens: int,
                  workdir: Path, only: tuple[str, ...] | None = None, context: str = "", heads: Path | None = None
                  ) -> list[Row]:
    """fp32: every method's (or those ``only``) output equals the baseline's; fp16/bf16: every output a greedy
    fixed point within twice the baseline's own margin (or 1% of the logits' spread, or :data:`ULPS` units in the
    last place of the largest logit, whichever is more). ``context`` names the
    prompts in the rows (" , 2k context")."""
    makers = drafters(target, target.model.config.vocab_size, workdir, texts, only=only, heads=heads)
    outputs, crashed = {}, []
    for name, make in makers.items():  # each in isolation: a crash is that method's failed row
        try:
            outputs[name] = [generate(target, make(), p, max_new_tokens=new_tokens).output_ids for p in texts]
        except Exception as err:  # noqa: BLE001 - reported, and the other methods still run
            crashed.append((f"{name} runs", model_name, dtype, False, f"{type(err).__name__}: {str(err)[:160]}"))
    base = outputs["autoregressive"]
    if dtype == "fp32":
        wrong = [n for n, outs in outputs.items() if outs != base]
        return crashed + [("lossless" + context, model_name, dtype, not wrong,
                           f"{len(outputs)} methods equal autoregressive" if not wrong else f"differ: {', '.join(wrong)}")]
    with torch.inference_mode():
        logits = target.model(input_ids=torch.tensor([texts[0]], device=target.device)).logits.float()
    spread = float(logits.std())
    ulps = ULPS * torch.finfo(target.dtype).eps * float(logits.abs().max())  # rounding of the logits themselves
    allowed = max(2 * max(margins(target, p, o) for p, o in zip(texts, base, strict=True)), 0.01 * spread, ulps)
    worst = {n: max(margins(target, p, o) for p, o in zip(texts, outs, strict=True)) for n, outs in outputs.items()}
    bad = [f"{n} {m:.2f}" for n, m in worst.items() if m > allowed]
    same = sum(outs == base for outs in outputs.values())
    detail = (f"worst margin {max(worst.values()):.2f} ≤ {allowed:.2f}; {same}/{len(outputs)} equal autoregressive"
              if not bad else f"margin over {allowed:.2f}: {', '.join(bad)}")
    return crashed + [("fixed point" + context, model_name, dtype, not bad, detail)]


def check_device_map(model: torch.nn.Module, dtype: str, model_name: str, texts: list[list[int]], new_tokens: int,
                     workdir: Path, device: str, heads: Path | None = None) -> list[Row]:
    """Save the model, load it twice through :func:`specbench.models.load_model` (one GPU directly, and
    ``device_map=auto`` on one GPU) and compare greedy outputs of the baseline and a tree method."""
    from specbench.models import build_tiny_tokenizer, load_model

    folder = workdir / "saved"
    model.save_pretrained(folder)
    build_tiny_tokenizer(model.config.vocab_size).save_pretrained(folder)
    cfg = {"name": model_name, "path": str(folder), "dtype": {"fp32": "float32", "fp16": "float16",
                                                              "bf16": "bfloat16"}[dtype], "chat": False}
    direct = load_model(cfg, {"device": device})
    mapped = load_model(cfg, {"device": device, "device_map": "auto", "num_gpus": 1} if device == "cuda"
                        else {"device": device})
    results = []
    for loaded in (direct, mapped):
        target = Target(loaded.model)
        make = get_method("spectra_core")
        results.append([generate(target, d, p, max_new_tokens=new_tokens).output_ids
                        for p in texts for d in (Drafter(vocab_size=0), make(vocab_size=loaded.vocab_size))])
    how = "device_map=auto on one GPU vs loaded straight onto it" if device == "cuda" else "two loads (CPU)"
    rows = [("device_map", model_name, dtype, results[0] == results[1], how + (": same outputs" if results[0] == results[1] else ": outputs differ"))]
    if device == "cuda":  # one GPU goes through accelerate's hooks too: half the layers on it, half on the CPU
        rows.append(check_split(folder, dtype, model_name, texts, new_tokens, workdir, results[0], heads=heads))
    return rows


# ----------------------------------------------------------------------------- all of them


def guarded(check: str, model_name: str, dtype: str, fn: Callable[[], Row | list[Row]],
            timings: dict[str, float] | None = None) -> list[Row]:
    """``fn``'s rows, or one failed row naming the error (an out-of-memory error too): a check that crashes
    never takes the others with it. Its seconds go to ``timings[check]``."""
    start = time.perf_counter()
    try:
        out = fn()
    except Exception as err:  # noqa: BLE001 - reported as the check's row
        free_memory()
        out = [(check, model_name, dtype, False, f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}")]
    if timings is not None:
        timings[check] = timings.get(check, 0.0) + time.perf_counter() - start
    return out if isinstance(out, list) else [out]


def free_memory() -> None:
    forget_drafters()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def correctness(target: Target, dtype: str, model_name: str, texts: list[list[int]], long: list[int],
                new_tokens: int, work: Path, only: tuple[str, ...] | None = None, heads: Path | None = None,
                timings: dict[str, float] | None = None) -> list[Row]:
    """The rows of one model in one dtype: tree and compaction after a short prompt and after ``long``, every
    method (or those ``only`` names) greedy, the tree and head methods after ``long``, sampling at T = 1 (not
    bf16), budget=auto and every method in a batch (fp32). Each check apart: one that crashes is its failed row; its
    seconds go to ``timings``."""

    def guard(check: str, fn: Callable[[], Row | list[Row]]) -> list[Row]:
        return guarded(check, model_name, dtype, fn, timings)

    rows = guard("tree", lambda: check_tree(target, dtype, model_name, texts[0]))
    rows += guard("compaction", lambda: check_compaction(target, dtype, model_name, texts[0]))
    lc = f"{len(long)} context"
    rows += guard(f"tree, {lc}", lambda: check_tree(target, dtype, model_name, long, check=f"tree, {lc}"))
    rows += guard(f"compaction, {lc}",
                  lambda: check_compaction(target, dtype, model_name, long, check=f"compaction, {lc}"))
    rows += guard("lossless" if dtype == "fp32" else "fixed point",
                  lambda: check_methods(target, dtype, model_name, texts, new_tokens, work, only=only, heads=heads))
    long_only = LONG_METHODS if only is None else tuple(m for m in LONG_METHODS if m in only)
    rows += guard(f"methods, {lc}", lambda: check_methods(target, dtype, model_name, [long], new_tokens // 2,
                                                          work / "long", only=long_only, context=f", {lc}",
                                                          heads=heads))
    if dtype != "bf16":
        rows += guard("sampling T = 1",
                      lambda: check_sampling(target, dtype, model_name, texts, new_tokens, work / "sampling",
                                             only=only, heads=heads))
    if dtype == "fp32":
        expected = [generate(target, Drafter(vocab_size=0), p, max_new_tokens=new_tokens).output_ids for p in texts]
        rows += guard("budget=auto",
                      lambda: check_budget_auto(target, dtype, model_name, texts, new_tokens, work / "auto", expected,
                                                only=only, heads=heads))
        rows += guard("batch of 2", lambda: check_batch(target, dtype, model_name, texts, new_tokens, work / "batch",
                                                        expected, only=only, heads=heads))
    return rows


def plan_stages(tiny: bool = False, models: tuple[str, ...] | None = None,
                dtypes: tuple[str, ...] | None = None, stages: tuple[str, ...] | None = None) -> list[Stage]:
    """The stages of these shapes in the order they run (:func:`specbench.gpucheck.stages.plan_stages`)."""
    shapes = [k for k in (TINY if tiny else SHAPES) if models is None or k in models]
    return gpu_stages.plan_stages(shapes, dtypes, stages)


def run_stage(stage: Stage, device: str, work: Path, heads: Path, *, tiny: bool = False, layers: int = 4,
              speed_layers: int = 32, new_tokens: int = 48, speed_tokens: int = 64, long_context: int = LONG_CONTEXT,
              methods: tuple[str, ...] | None = None, profiles: tuple[str, ...] = (),
              progress: Callable[[str], None] = lambda s: None) -> Stage:
    """Run ``stage`` (its rows, speed table, curves and timings filled in); any error is a failed row of the stage.
    ``profiles``: the methods whose decode the speed stage profiles."""
    start = time.perf_counter()
    only = None if methods is None else ("autoregressive", *methods)
    shapes = TINY if tiny else SHAPES
    progress(f"stage {stage.name}")
    try:
        if stage.kind == "plan":
            stage.rows += guarded("70B plan (meta)", "llama2-70b", "fp16", plan_70b)
        elif stage.kind == "sdpa":
            model = next(iter(shapes))
            stage.rows += check_backends(shapes[model], model, layers, device)
        elif stage.kind in DTYPES:
            shape = shapes[stage.model]
            texts = prompts(shape["vocab_size"])
            (long,) = prompts(shape["vocab_size"], n=1, length=long_context, seed=3)
            model = build(shape, layers, DTYPES[stage.kind], device)
            target = Target(model)
            work.mkdir(parents=True, exist_ok=True)
            stage.rows += correctness(target, stage.kind, stage.model, texts, long, new_tokens, work, only=only,
                                      heads=heads, timings=stage.timings)
            if stage.kind == "fp16" or (tiny and stage.kind == "fp32"):
                progress(f"stage {stage.name}: device_map")
                stage.rows += guarded("device_map", stage.model, stage.kind, lambda: check_device_map(
                    model, stage.kind, stage.model, texts[:1], new_tokens, work, device, heads=heads), stage.timings)
        elif stage.kind == "forward":  # forward=compiled: CUDA graphs against eager (specbench.gpucheck.forward)
            stage.rows += run_forward(stage, shapes[stage.model], device, work, heads, layers, speed_layers, new_tokens,
                                      long_context, only, lambda c, fn: guarded(c, stage.model, "fp32", fn, stage.timings))
        else:
            run_speed(stage, shapes[stage.model], device, work, heads, speed_layers, speed_tokens, tiny, only, profiles)
    except Exception as err:  # noqa: BLE001 - building the model, say: the stage's failed row
        stage.rows.append((f"stage {stage.name}", stage.model or "—", stage.kind, False,
                           f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"))
    finally:
        free_memory()
    stage.seconds = time.perf_counter() - start
    return stage


def run_speed(stage: Stage, shape: dict, device: str, work: Path, heads: Path, speed_layers: int,
              speed_tokens: int, tiny: bool, only: tuple[str, ...] | None, profiles: tuple[str, ...] = ()) -> None:
    """The speed stage: a model of as many layers as fit, its cost curve, the per-method table, the host syncs per
    step of every method, greedy and sampling, against its ceiling, and torch.profiler's table of the methods
    ``profiles`` names."""
    half = torch.float16 if device == "cuda" else torch.float32
    free = torch.cuda.mem_get_info()[0] if device == "cuda" else None
    n = fit_layers(shape, speed_layers, 2 if device == "cuda" else 4, free)
    texts = prompts(shape["vocab_size"])
    target = Target(build(shape, n, half, device))
    work.mkdir(parents=True, exist_ok=True)
    qs = (1, 8, 32) if tiny else None
    dtype = "fp16" if half == torch.float16 else "fp32"
    stage.curves[stage.model], table = speed(target, stage.model, texts, speed_tokens, work, cost_qs=qs, only=only,
                                             heads=heads)
    per_step: dict[str, float] = {}

    def syncs() -> list[Row]:  # counts: fewer tokens do
        rows, counted = check_syncs(target, dtype, stage.model, texts, min(speed_tokens, SYNC_TOKENS), work / "syncs",
                                    only=only, heads=heads)
        per_step.update(counted)
        return rows

    stage.rows += guarded("host syncs", stage.model, dtype, syncs, stage.timings)
    stage.speed += [{**r, "layers": n, "syncs": per_step.get(r["method"].split(" ")[0], r["syncs"])} for r in table]
    for method in profiles:
        stage.profiles[method] = profile(target, texts, speed_tokens, work / "profile", method, heads=heads)
    if target.model.config._attn_implementation != "sdpa":  # grouped-query: also K/V repeated per head
        from specbench.machine.costs import QS, measure

        target.model.set_attn_implementation("sdpa")
        stage.curves[f"{stage.model}, K/V repeated (hardware.gqa=repeat)"] = measure(
            target, shape["vocab_size"], qs=qs or QS, context_length=shape["max_position_embeddings"])


def run_checks(device: str, *, tiny: bool = False, layers: int = 4, speed_layers: int = 32, new_tokens: int = 48,
               speed_tokens: int = 64, long_context: int = LONG_CONTEXT, models: tuple[str, ...] | None = None,
               dtypes: tuple[str, ...] | None = None, methods: tuple[str, ...] | None = None,
               stages: tuple[str, ...] | None = None, deadline: float | None = None, profiles: tuple[str, ...] = (),
               progress: Callable[[str], None] = lambda s: None,
               on_stage: Callable[[Stage], None] = lambda st: None) -> dict[str, Any]:
    """Every stage (or those ``stages`` selects) on ``device``, each handed to ``on_stage`` as it finishes;
    ``tiny`` uses :data:`TINY` shapes (the CPU self-test); ``long_context``: the tokens of the long prompt;
    ``models``, ``dtypes`` and ``methods``: some of them (all when None; the baseline always runs). A model's
    random heads are written once, in fp16, shared by its stages and deleted after its last one. ``deadline``:
    seconds from the start after which no stage may be expected to end; a stage that would is skipped (and
    named in ``skipped``), a shorter one after it may still run. ``profiles``: methods the speed stage profiles."""
    plan = plan_stages(tiny, models, dtypes, stages)
    sync_tokens = min(speed_tokens, SYNC_TOKENS)
    expected = {st.name: estimate(st, new_tokens, speed_tokens, sync_tokens) for st in plan}
    done: list[Stage] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="specbench-gpu-check-") as tmp:
        for i, stage in enumerate(plan):
            heads = Path(tmp) / f"{stage.model or 'shared'}-heads"
            ends = time.perf_counter() - start + expected[stage.name] * pace(done, expected)
            if deadline is not None and ends > deadline:
                stage.skipped = f"expected to end at {ends:.0f} s, after the deadline ({deadline:.0f} s)"
                progress(f"stage {stage.name} not run: {stage.skipped}")
            else:
                run_stage(stage, device, Path(tmp) / stage.name, heads, tiny=tiny, layers=layers,
                          speed_layers=speed_layers, new_tokens=new_tokens, speed_tokens=speed_tokens,
                          long_context=long_context, methods=methods, profiles=profiles, progress=progress)
            shutil.rmtree(Path(tmp) / stage.name, ignore_errors=True)
            if all(later.model != stage.model for later in plan[i + 1 :]):
                shutil.rmtree(heads, ignore_errors=True)
            done.append(stage)
            if not stage.skipped:
                on_stage(stage)
    ran = [st for st in done if not st.skipped]
    rows = [r for st in ran for r in st.rows]
    return {"checks": rows, "speed": [r for st in ran for r in st.speed],
            "curves": {k: v for st in ran for k, v in st.curves.items()}, "ok": all(r[3] for r in rows),
            "stages": ran, "skipped": [st for st in done if st.skipped]}
