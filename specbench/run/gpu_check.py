"""The GPU paths, checked on random-weight models built from configs: no weights, no internet.

Two shapes stand for the paper's models: Llama-2-7B (multi-head attention, 32k vocabulary) and
Llama-3-8B (grouped-query attention, 128k vocabulary). Correctness runs on a few layers of full
width, speed on all 32. Each check returns rows ``(check, model, dtype, ok, detail)``:

- ``tree``: a multi-branch draft's logits against each branch run alone, in fp32, fp16 and bf16;
- ``compaction``: the cache after keeping an accepted path against a fresh prefill of that path;
- ``lossless``: every method's greedy output equals autoregressive decoding (fp32);
- ``fixed point``: in fp16/bf16 (whose kernels differ with the block's shape) every output token is the
  argmax of a teacher-forced forward over the output, to within the baseline's own margin;
- ``device_map``: the same weights loaded straight onto one GPU and through ``device_map=auto`` on it
  give identical outputs.

:func:`speed` measures the cost curve (q = 1 … 128 at contexts to 4k) and, per method, draft and
forward ms per step, τ, implicit host syncs per step (torch's sync debug mode: reads of GPU values and
pageable copies; the timing's explicit synchronizes are not counted) and peak memory.

Every function takes the device, so the same code runs on the CPU with tiny shapes (``tiny=True``) in
the test suite. ``python -m specbench.gpu_check`` (:mod:`specbench.cli.gpu_check`) prints the table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from methods.registry import build_method_config, get_method, method_names
from specbench.core.acceptance import SamplingParams
from specbench.core.attention import fold_gqa
from specbench.core.decode import generate
from specbench.core.draft import Draft, Drafter, DrafterContext
from specbench.core.forward import Target

SHAPES = {
    "llama2-7b": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_attention_heads=32,
                      num_key_value_heads=32, max_position_embeddings=4096, rms_norm_eps=1e-5),
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                      num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5),
}
TINY = {  # the same two kinds of attention, small enough for a CPU
    "llama2-7b": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                      num_key_value_heads=4, max_position_embeddings=4096),
    "llama3-8b": dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=8192, rope_theta=500000.0),
}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# Largest tree-vs-branch logit difference allowed, in standard deviations of the logits.
TREE_TOLERANCE = {"fp32": 1e-3, "fp16": 2e-2, "bf16": 1e-1}
SHARPEN = 4.0  # the output layer scaled up: random models then make greedy choices far from ties
TARGET_NAME = "gpu-check"

Row = tuple[str, str, str, bool, str]


def build(shape: dict, layers: int, dtype: torch.dtype, device: str | torch.device, seed: int = 0) -> torch.nn.Module:
    """A random-weight Llama of ``shape`` with ``layers`` layers, initialised on ``device`` directly."""
    config = LlamaConfig(num_hidden_layers=layers, **shape)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(SHARPEN)
    fold_gqa(model)  # as load_model does (hardware.gqa=fold)
    return model.eval()


def prompts(vocab: int, n: int = 2, length: int = 48, seed: int = 1) -> list[list[int]]:
    """Prompts with repeats in them (a phrase twice), so that copying drafters find something."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        phrase = torch.randint(3, vocab, (length // 3,), generator=gen).tolist()
        filler = torch.randint(3, vocab, (length - 2 * len(phrase),), generator=gen).tolist()
        out.append(phrase + filler + phrase)
    return out


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
def check_tree(target: Target, dtype: str, model_name: str, prefix: list[int]) -> Row:
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
    return ("tree", model_name, dtype, ok, f"max |Δlogit| {worst:.1e} σ (≤ {TREE_TOLERANCE[dtype]:.0e})")


@torch.inference_mode()
def check_compaction(target: Target, dtype: str, model_name: str, prefix: list[int]) -> Row:
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
                return ("compaction", model_name, dtype, False, f"cache shape {tuple(a.shape)} vs {tuple(b.shape)}")
            worst = max(worst, float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)))
    ok = worst <= TREE_TOLERANCE[dtype]
    return ("compaction", model_name, dtype, ok, f"max |ΔKV| {worst:.1e} of the largest entry")


# ----------------------------------------------------------------------------- every method


def method_settings(name: str, store: Path | None, head_dir: Path, hidden: int, layers: int,
                    model_config: Any = None) -> dict[str, Any]:
    """What a method needs beyond its defaults to run here: the check's store, a self-draft of the
    target's first layers, an acceptance head (random: it only decides where a draft stops), an EAGLE or
    Medusa head (random: verification keeps the target's tokens whatever it proposes)."""
    from specbench.drafting.acceptance_head import AcceptanceHead, save_head
    from specbench.drafting.eagle_drafter import random_head

    config_cls = get_method(name).Config
    fields = {f.name for f in dataclasses.fields(config_cls)} if dataclasses.is_dataclass(config_cls) else set()
    params: dict[str, Any] = {}
    if "datastore" in fields and store is not None:
        params["datastore"] = str(store)
    if "refine" in fields:
        params["refine"] = False
    if "draft_model" in fields:
        params.update(draft_model="self", self_first_layers=max(1, layers // 4), self_skip_layers=None)
    if "head_path" in fields:
        config = build_method_config(name, params)
        path = head_dir / f"{name}.pt"
        torch.manual_seed(0)
        save_head(path, AcceptanceHead(hidden, 2), {"target": TARGET_NAME, "draft": config.identity(),
                                                     "temperature": 0.0})
        params["head_path"] = str(path)
    kind = getattr(get_method(name), "KIND", None)
    if "head" in fields and kind and model_config is not None:
        params["head"] = str(random_head(kind, model_config, head_dir / f"{name}-head"))
    return params


def build_store(folder: Path, vocab: int, texts: list[list[int]]) -> Path:
    """A small retrieval store over the prompts' tokens and random documents of this vocabulary."""
    from specbench.stores.datastore import write_store

    gen = torch.Generator().manual_seed(2)
    docs = [list(t) for t in texts] + [torch.randint(3, vocab, (64,), generator=gen).tolist() for _ in range(32)]
    ident = {"name": TARGET_NAME, "vocab_size": vocab, "vocab_sha256": "0" * 64}
    return write_store(folder / "store", docs, tokenizer=ident, source={}, progress=False).path


def drafters(target: Target, vocab: int, workdir: Path, texts: list[list[int]],
             only: tuple[str, ...] | None = None) -> dict[str, Callable[[], Drafter]]:
    """A fresh drafter per call, for every registered method (the baseline included), or those ``only`` names."""
    workdir.mkdir(parents=True, exist_ok=True)
    store = build_store(workdir, vocab, texts)
    hidden = target.model.config.hidden_size
    layers = target.model.config.num_hidden_layers
    context = DrafterContext(sampling=SamplingParams(), device=target.device, dtype=target.dtype,
                             target_model=target.model, target_name=TARGET_NAME)
    out = {}
    for name in only or method_names():
        config = build_method_config(name, method_settings(name, store, workdir, hidden, layers, target.model.config))
        cls = get_method(name)
        out[name] = lambda cls=cls, config=config: cls(config, vocab_size=vocab, seed=0, context=context)
    return out


@torch.inference_mode()
def margins(target: Target, prompt: list[int], output: list[int]) -> float:
    """The largest teacher-forced argmax margin of ``output``: max over tokens of (best logit − its logit)."""
    ids = torch.tensor([prompt + output], device=target.device)
    logits = target.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    chosen = logits.gather(-1, torch.tensor(output, device=logits.device)[:, None])[:, 0]
    return float((logits.max(-1).values - chosen).max()) if output else 0.0


def check_methods(target: Target, dtype: str, model_name: str, texts: list[list[int]], new_tokens: int,
                  workdir: Path) -> list[Row]:
    """fp32: every method's output equals the baseline's; fp16/bf16: every output a greedy fixed point
    within twice the baseline's own margin (or 1% of the logits' spread)."""
    makers = drafters(target, target.model.config.vocab_size, workdir, texts)
    outputs, crashed = {}, []
    for name, make in makers.items():  # each in isolation: a crash is that method's failed row
        try:
            outputs[name] = [generate(target, make(), p, max_new_tokens=new_tokens).output_ids for p in texts]
        except Exception as err:  # noqa: BLE001 - reported, and the other methods still run
            crashed.append((f"{name} runs", model_name, dtype, False, f"{type(err).__name__}: {str(err)[:160]}"))
    base = outputs["autoregressive"]
    if dtype == "fp32":
        wrong = [n for n, outs in outputs.items() if outs != base]
        return crashed + [("lossless", model_name, dtype, not wrong,
                           f"{len(outputs)} methods equal autoregressive" if not wrong else f"differ: {', '.join(wrong)}")]
    with torch.inference_mode():
        spread = float(target.model(input_ids=torch.tensor([texts[0]], device=target.device)).logits.float().std())
    allowed = max(2 * max(margins(target, p, o) for p, o in zip(texts, base, strict=True)), 0.01 * spread)
    worst = {n: max(margins(target, p, o) for p, o in zip(texts, outs, strict=True)) for n, outs in outputs.items()}
    bad = [f"{n} {m:.2f}" for n, m in worst.items() if m > allowed]
    same = sum(outs == base for outs in outputs.values())
    detail = (f"worst margin {max(worst.values()):.2f} ≤ {allowed:.2f}; {same}/{len(outputs)} equal autoregressive"
              if not bad else f"margin over {allowed:.2f}: {', '.join(bad)}")
    return crashed + [("fixed point", model_name, dtype, not bad, detail)]


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


def check_split(folder: Path, dtype: str, model_name: str, texts: list[list[int]], new_tokens: int, workdir: Path,
                expected: list[list[int]]) -> Row:
    """The model split between cuda:0 and the CPU (nothing is timed), so one GPU runs a sharded model's hooks: the
    baseline and a tree method with aux nodes give the GPU-alone outputs, and an EAGLE head drafts."""
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype={"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype],
        attn_implementation="sdpa", device_map=split_map(folder)).eval()
    target, vocab = Target(model), model.config.vocab_size
    try:
        got = [generate(target, d, p, max_new_tokens=new_tokens).output_ids
               for p in texts for d in (Drafter(vocab_size=0), get_method("spectra_core")(vocab_size=vocab))]
        eagle = drafters(target, vocab, workdir / "split", texts, only=("eagle",))["eagle"]
        [generate(target, eagle(), p, max_new_tokens=new_tokens) for p in texts]
    except Exception as err:  # noqa: BLE001 - the row says what broke
        return ("cuda:0 + CPU split", model_name, dtype, False, f"{type(err).__name__}: {str(err)[:160]}")
    return ("cuda:0 + CPU split", model_name, dtype, got == expected, "hooks between cuda:0 and the CPU: "
            + ("same outputs, EAGLE ran" if got == expected else "outputs differ"))


def split_map(folder: Path) -> dict[str, Any]:
    """Embedding and the first half of the layers on GPU 0, the rest (final norm, LM head) on the CPU."""
    n = json.loads((folder / "config.json").read_text())["num_hidden_layers"]
    return {"model.embed_tokens": 0, **{f"model.layers.{i}": 0 if i < n // 2 else "cpu" for i in range(n)},
            "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}


# ----------------------------------------------------------------------------- speed


@contextlib.contextmanager
def count_syncs() -> Iterator[list]:
    """Count implicit host syncs (torch.cuda's sync debug mode) inside the block; [] off CUDA."""
    caught: list = []
    if not torch.cuda.is_available():
        yield caught
        return
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            yield caught
        caught.extend(w for w in seen if "synchroniz" in str(w.message))
    finally:
        torch.cuda.set_sync_debug_mode("default")


def speed(target: Target, model_name: str, texts: list[list[int]], new_tokens: int, workdir: Path,
          cost_qs=None) -> tuple[Any, list[dict[str, Any]]]:
    """The cost curve and, per method, τ, draft and forward ms per step, host syncs per step, peak memory."""
    from specbench.budget.costs import QS, measure

    vocab = target.model.config.vocab_size
    curve = measure(target, vocab, qs=cost_qs or QS, context_length=target.model.config.max_position_embeddings)
    rows = []
    for name, make in drafters(target, vocab, workdir, texts).items():
        generate(target, make(), texts[0], max_new_tokens=8)  # warm-up
        target.reset_peak_memory()
        steps = tokens = 0
        draft_s = forward_s = 0.0
        with count_syncs() as syncs:
            for prompt in texts:
                rec = generate(target, make(), prompt, max_new_tokens=new_tokens)
                steps += rec.steps
                tokens += rec.new_tokens
                draft_s += sum(rec.step_draft_s[1:])
                forward_s += sum(rec.step_times[1:]) - sum(rec.step_draft_s[1:])
        decode_steps = max(steps - len(texts), 1)
        rows.append({"model": model_name, "method": name, "tau": tokens / steps,
                     "draft_ms": 1000 * draft_s / decode_steps, "forward_ms": 1000 * forward_s / decode_steps,
                     "syncs": len(syncs) / decode_steps if torch.cuda.is_available() else float("nan"),
                     "peak_gb": target.peak_memory_gb()})
    return curve, rows


def fit_layers(shape: dict, layers: int, bytes_per_param: int, free_bytes: int | None) -> int:
    """As many of ``layers`` as fit in 80% of ``free_bytes`` (all of them when it is None)."""
    h, v, f = shape["hidden_size"], shape["vocab_size"], shape["intermediate_size"]
    kv = h * shape["num_key_value_heads"] // shape["num_attention_heads"]
    per_layer = (2 * h * h + 2 * h * kv + 3 * h * f) * bytes_per_param
    fixed = 2 * v * h * bytes_per_param
    if free_bytes is None:
        return layers
    return max(1, min(layers, int((0.8 * free_bytes - fixed) // per_layer)))


def run_checks(device: str, *, tiny: bool = False, layers: int = 4, speed_layers: int = 32, new_tokens: int = 48,
               speed_tokens: int = 64, progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Every check and the speed table on ``device``; ``tiny`` uses :data:`TINY` shapes (the CPU self-test)."""
    shapes = TINY if tiny else SHAPES
    rows: list[Row] = []
    speeds: list[dict[str, Any]] = []
    curves: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="specbench-gpu-check-") as tmp:
        for model_name, shape in shapes.items():
            texts = prompts(shape["vocab_size"])
            base = build(shape, layers, torch.float32, device)
            for dtype, torch_dtype in DTYPES.items():
                progress(f"{model_name} {dtype}: tree, compaction, methods")
                model = base if dtype == "fp32" else build(shape, layers, torch_dtype, device)
                if dtype != "fp32":
                    model.load_state_dict(base.state_dict())
                target = Target(model)
                work = Path(tmp) / f"{model_name}-{dtype}"
                work.mkdir()
                rows.append(check_tree(target, dtype, model_name, texts[0]))
                rows.append(check_compaction(target, dtype, model_name, texts[0]))
                rows += check_methods(target, dtype, model_name, texts, new_tokens, work)
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
            curves[model_name], table = speed(target, model_name, texts, speed_tokens, work, cost_qs=qs)
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
