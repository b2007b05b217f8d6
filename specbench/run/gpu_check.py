"""The GPU paths, checked on random-weight models built from configs (:mod:`specbench.run.gpu_models`): no
weights, no internet. Correctness runs on a few layers of full width, speed on all 32. Each check returns rows
``(check, model, dtype, ok, detail)``:

- ``tree``: a multi-branch draft's logits against each branch run alone, in fp32, fp16 and bf16, after a short
  prompt and after a 2k-token context;
- ``compaction``: the cache after keeping an accepted path against a fresh prefill of that path (both contexts);
- ``lossless``: every method's greedy output equals autoregressive decoding (fp32), after the short prompts and
  (the tree and head methods) after the 2k-token context;
- ``fixed point``: in fp16/bf16 (whose kernels differ with the block's shape) every output token is the
  argmax of a teacher-forced forward over the output, to within the baseline's own margin;
- ``device_map``: the same weights loaded straight onto one GPU and through ``device_map=auto`` on it
  give identical outputs;
- sampling at T = 1, ``budget=auto``, a model split between cuda:0 and the CPU, and the 70B placement plan:
  :mod:`specbench.run.gpu_scenarios`.

:mod:`specbench.run.gpu_speed` measures the cost curve and the per-method speed table. Every function takes
the device, so the same code runs on the CPU with tiny shapes (``tiny=True``) in the test suite.
``python -m specbench.gpu_check`` (:mod:`specbench.cli.gpu_check`) prints the table.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from methods.registry import get_method
from specbench.core.decode import generate
from specbench.core.draft import Draft, Drafter
from specbench.core.forward import Target
from specbench.run.gpu_models import DTYPES, SHAPES, TINY, Row, build, drafters, margins, prompts
from specbench.run.gpu_scenarios import check_batch, check_budget_auto, check_sampling, check_split, plan_70b
from specbench.run.gpu_speed import fit_layers, speed

__all__ = ["SHAPES", "TINY", "build", "check_compaction", "check_methods", "check_tree", "fit_layers", "prompts",
           "run_checks"]

# Largest tree-vs-branch logit difference allowed, in standard deviations of the logits.
TREE_TOLERANCE = {"fp32": 1e-3, "fp16": 2e-2, "bf16": 1e-1}
LONG_CONTEXT = 2048
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


# ----------------------------------------------------------------------------- every method


def check_methods(target: Target, dtype: str, model_name: str, texts: list[list[int]], new_tokens: int,
                  workdir: Path, only: tuple[str, ...] | None = None, context: str = "") -> list[Row]:
    """fp32: every method's (or those ``only``) output equals the baseline's; fp16/bf16: every output a greedy
    fixed point within twice the baseline's own margin (or 1% of the logits' spread). ``context`` names the
    prompts in the rows (" , 2k context")."""
    makers = drafters(target, target.model.config.vocab_size, workdir, texts, only=only)
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
        spread = float(target.model(input_ids=torch.tensor([texts[0]], device=target.device)).logits.float().std())
    allowed = max(2 * max(margins(target, p, o) for p, o in zip(texts, base, strict=True)), 0.01 * spread)
    worst = {n: max(margins(target, p, o) for p, o in zip(texts, outs, strict=True)) for n, outs in outputs.items()}
    bad = [f"{n} {m:.2f}" for n, m in worst.items() if m > allowed]
    same = sum(outs == base for outs in outputs.values())
    detail = (f"worst margin {max(worst.values()):.2f} ≤ {allowed:.2f}; {same}/{len(outputs)} equal autoregressive"
              if not bad else f"margin over {allowed:.2f}: {', '.join(bad)}")
    return crashed + [("fixed point" + context, model_name, dtype, not bad, detail)]


def check_device_map(model: torch.nn.Module, dtype: str, model_name: str, texts: list[list[int]], new_tokens: int,
                     workdir: Path, device: str) -> Row:
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
        rows.append(check_split(folder, dtype, model_name, texts, new_tokens, workdir, results[0]))
    return rows


# ----------------------------------------------------------------------------- all of them


def correctness(target: Target, dtype: str, model_name: str, texts: list[list[int]], long: list[int],
                new_tokens: int, work: Path, only: tuple[str, ...] | None = None) -> list[Row]:
    """The rows of one model in one dtype: tree and compaction after a short prompt and after ``long``, every
    method (or those ``only`` names) greedy, the tree and head methods after ``long``, sampling at T = 1 (not
    bf16), budget=auto and every method in a batch (fp32)."""
    rows = [check_tree(target, dtype, model_name, texts[0]), check_compaction(target, dtype, model_name, texts[0]),
            check_tree(target, dtype, model_name, long, check=f"tree, {len(long)} context"),
            check_compaction(target, dtype, model_name, long, check=f"compaction, {len(long)} context")]
    rows += check_methods(target, dtype, model_name, texts, new_tokens, work, only=only)
    long_only = LONG_METHODS if only is None else tuple(m for m in LONG_METHODS if m in only)
    rows += check_methods(target, dtype, model_name, [long], new_tokens // 2, work / "long", only=long_only,
                          context=f", {len(long)} context")
    if dtype != "bf16":
        rows += check_sampling(target, dtype, model_name, texts, new_tokens, work / "sampling", only=only)
    if dtype == "fp32":
        expected = [generate(target, Drafter(vocab_size=0), p, max_new_tokens=new_tokens).output_ids for p in texts]
        rows.append(check_budget_auto(target, dtype, model_name, texts, new_tokens, work / "auto", expected,
                                      only=only))
        rows.append(check_batch(target, dtype, model_name, texts, new_tokens, work / "batch", expected, only=only))
    return rows


def run_checks(device: str, *, tiny: bool = False, layers: int = 4, speed_layers: int = 32, new_tokens: int = 48,
               speed_tokens: int = 64, long_context: int = LONG_CONTEXT, models: tuple[str, ...] | None = None,
               dtypes: tuple[str, ...] | None = None, methods: tuple[str, ...] | None = None,
               progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Every check and the speed table on ``device``; ``tiny`` uses :data:`TINY` shapes (the CPU self-test);
    ``long_context``: the tokens of the long prompt; ``models``, ``dtypes`` and ``methods``: some of them (all
    when None; the baseline always runs)."""
    shapes = {k: v for k, v in (TINY if tiny else SHAPES).items() if models is None or k in models}
    rows: list[Row] = [plan_70b()]
    speeds: list[dict[str, Any]] = []
    curves: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="specbench-gpu-check-") as tmp:
        for model_name, shape in shapes.items():
            texts = prompts(shape["vocab_size"])
            (long,) = prompts(shape["vocab_size"], n=1, length=long_context, seed=3)
            base = build(shape, layers, torch.float32, device)
            for dtype, torch_dtype in DTYPES.items():
                if dtypes is not None and dtype not in dtypes:
                    continue
                progress(f"{model_name} {dtype}: tree, compaction, methods, sampling, budget=auto, long context")
                model = base if dtype == "fp32" else build(shape, layers, torch_dtype, device)
                if dtype != "fp32":
                    model.load_state_dict(base.state_dict())
                target = Target(model)
                work = Path(tmp) / f"{model_name}-{dtype}"
                work.mkdir()
                rows += correctness(target, dtype, model_name, texts, long, new_tokens, work,
                                    only=None if methods is None else ("autoregressive", *methods))
                if dtype == "fp16" or (tiny and dtype == "fp32"):
                    progress(f"{model_name} {dtype}: device_map")
                    rows += check_device_map(model, dtype, model_name, texts[:1], new_tokens, work, device)
                if model is not base:
                    del model, target
            del base
            half = torch.float16 if device == "cuda" else torch.float32
            free = torch.cuda.mem_get_info()[0] if device == "cuda" else None
            n = fit_layers(shape, speed_layers, 2 if device == "cuda" else 4, free)
            progress(f"{model_name}: speed at {n} layers" + (f" (of {speed_layers}: the GPU's free memory)"
                                                              if n < speed_layers else ""))
            target = Target(build(shape, n, half, device))
            work = Path(tmp) / f"{model_name}-speed"
            work.mkdir()
            qs = (1, 8, 32) if tiny else None
            curves[model_name], table = speed(target, model_name, texts, speed_tokens, work, cost_qs=qs,
                                              only=None if methods is None else ("autoregressive", *methods))
            speeds += [{**r, "layers": n} for r in table]
            if target.model.config._attn_implementation != "sdpa":  # grouped-query: also K/V repeated per head
                from specbench.budget.costs import QS, measure

                target.model.set_attn_implementation("sdpa")
                curves[f"{model_name}, K/V repeated (hardware.gqa=repeat)"] = measure(
                    target, shape["vocab_size"], qs=qs or QS, context_length=shape["max_position_embeddings"])
            del target
            if device == "cuda":
                torch.cuda.empty_cache()
    return {"checks": rows, "speed": speeds, "curves": curves, "ok": all(r[3] for r in rows)}
