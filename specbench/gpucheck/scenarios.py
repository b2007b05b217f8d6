"""gpu-check's rows for the ways users run it beyond greedy on one GPU (:mod:`specbench.gpucheck.check` calls them):

- ``sampling T = 1``: every method samples; the tokens it emits must look like the target's own draws (their
  log-probabilities against the target's entropy, a z-test) and none may be one the target all but excludes (a
  fp16 overflow, a wrong vocabulary index or a NaN in the rule would not pass);
- ``budget=auto``: every method that plans its drafts under a cost curve measured on this device, greedy, equal
  to autoregressive decoding (fp32);
- ``cuda:0 + CPU split``: half the layers on the GPU, half in host memory, so that one GPU runs a split
  model's hooks (with a GPU present accelerate offloads the host half: its weights stream to cuda:0 for each
  forward; the placement check, which refuses that for timed runs, is bypassed: nothing is timed);
- ``70B plan``: the Llama-2-70B shape (80 layers, GQA-8) built on the ``meta`` device, its parameters counted
  against the preset, placed over 4 GPUs of this one's memory as ``device_map=auto`` places it, and refused on
  one GPU before any weight is read exactly when one GPU of this size cannot hold it with a 2k-token KV cache
  (an 80 GB H100 cannot; a 141 GB H200 can).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from methods.registry import get_method
from specbench.core.acceptance import SamplingParams
from specbench.core.decode import Request, decode_batch, generate
from specbench.core.draft import Drafter
from specbench.core.forward import Target
from specbench.errors import ModelLoadError
from specbench.gpucheck.models import DTYPES, Row, drafters
from specbench.models.shards import share_layer_inputs

LEAST_PROBABILITY = 1e-12  # below this, a sampled token is a broken rule, not chance
Z_LIMIT = 5.0  # a correct rule strays this far once in ~3.5 million checks
LLAMA2_70B = dict(vocab_size=32000, hidden_size=8192, intermediate_size=28672, num_attention_heads=64,
                  num_key_value_heads=8, num_hidden_layers=80, max_position_embeddings=4096)
H100_BYTES = 80 * 2**30  # the GPU the plan assumes where there is none
KV_TOKENS = 2048  # the context the one-GPU refusal reserves a KV cache for (fp16)


def _crash(check: str, model_name: str, dtype: str, err: Exception) -> Row:
    return (check, model_name, dtype, False, f"{type(err).__name__}: {str(err)[:160]}")


@torch.inference_mode()
def surprise(target: Target, prompt: list[int], output: list[int]) -> tuple[float, float, float]:
    """Teacher-forced at T = 1 over ``output``: Σ (log p(token) + entropy), Σ its variance under the target, and
    the smallest log p. Tokens drawn from the target make the first sum a zero-mean walk (a martingale) whose
    spread the second gives; a rule that samples anything else (greedily, flatly, from a wrong row) drifts."""
    if not output:
        return 0.0, 0.0, 0.0
    ids = torch.tensor([prompt + output], device=target.device)
    logp = target.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float().log_softmax(-1)
    chosen = logp.gather(-1, torch.tensor(output, device=logp.device)[:, None])[:, 0]
    p = logp.exp()
    plogp = torch.where(p > 0, p * logp, torch.zeros_like(p))
    entropy = -plogp.sum(-1)
    variance = (plogp * logp).sum(-1) - entropy**2
    return float((chosen + entropy).sum()), float(variance.sum()), float(chosen.min())


def check_sampling(target: Target, dtype: str, model_name: str, texts: list[list[int]], new_tokens: int,
                   workdir: Path, only: tuple[str, ...] | None = None, heads: Path | None = None) -> list[Row]:
    """Every method at T = 1: no crash, no token the target gives less than :data:`LEAST_PROBABILITY`, and the
    sampled tokens' log-probabilities where the target's own draws put them (|z| ≤ :data:`Z_LIMIT`)."""
    sampling = SamplingParams(temperature=1.0)
    vocab = target.model.config.vocab_size
    rows, found, taus = [], {}, []
    for name, make in drafters(target, vocab, workdir, texts, only=only, sampling=sampling, heads=heads).items():
        gen = torch.Generator().manual_seed(0)
        try:
            recs = [generate(target, make(), p, max_new_tokens=new_tokens, sampling=sampling, generator=gen)
                    for p in texts]
        except Exception as err:  # noqa: BLE001 - that method's failed row; the others still run
            rows.append(_crash(f"{name} samples", model_name, dtype, err))
            continue
        parts = [surprise(target, p, r.output_ids) for p, r in zip(texts, recs, strict=True)]
        drift, variance = sum(d for d, _, _ in parts), sum(v for _, v, _ in parts)
        least = min(m for _, _, m in parts)
        found[name] = (drift / math.sqrt(variance) if variance > 0 else 0.0,
                       math.exp(least) if math.isfinite(least) else 0.0)
        taus.append(sum(r.new_tokens for r in recs) / sum(r.steps for r in recs))
    bad = [f"{n} (z {z:+.1f}, least p {p:.0e})" for n, (z, p) in found.items()
           if abs(z) > Z_LIMIT or p < LEAST_PROBABILITY]
    detail = (f"{len(found)} methods; log p of the sampled tokens |z| ≤ {max(abs(z) for z, _ in found.values()):.1f}"
              f", least p {min(p for _, p in found.values()):.0e}; τ {min(taus):.2f}–{max(taus):.2f}"
              if found and not bad else f"not the target's draws: {', '.join(bad)}")
    return rows + [("sampling T = 1", model_name, dtype, bool(found) and not bad, detail)]


def check_batch(target: Target, dtype: str, model_name: str, texts: list[list[int]], new_tokens: int,
                workdir: Path, expected: list[list[int]], batch_size: int = 2, only: tuple[str, ...] | None = None,
                heads: Path | None = None) -> Row:
    """Every method decoding the prompts (each with two answer lengths) ``batch_size`` at a time, rows at their
    own lengths and finished slots refilled: each request's output is its autoregressive output."""
    lengths = (new_tokens, max(1, new_tokens // 3))
    wrong, ran = [], 0
    for name, make in drafters(target, target.model.config.vocab_size, workdir, texts, only=only, heads=heads).items():
        first = make()
        wanted = [(j, p, n) for n in lengths for j, p in enumerate(texts)]
        queue = [Request(p, n, first.spawn() if i else first, tag=(j, n)) for i, (j, p, n) in enumerate(wanted)][::-1]
        try:
            got = {req.tag: rec.output_ids for req, rec in decode_batch(
                target, lambda: queue.pop() if queue else None, batch_size=batch_size)}  # noqa: B023
        except Exception as err:  # noqa: BLE001
            wrong.append(f"{name} ({type(err).__name__}: {str(err)[:80]})")
            continue
        ran += 1
        if any(out != expected[j][:n] for (j, n), out in got.items()):
            wrong.append(name)
    detail = (f"{ran} methods, {len(texts) * len(lengths)} requests {batch_size} at a time, equal autoregressive"
              if not wrong else f"differ: {', '.join(wrong)}")
    return (f"batch of {batch_size}", model_name, dtype, not wrong, detail)


def check_budget_auto(target: Target, dtype: str, model_name: str, texts: list[list[int]], new_tokens: int,
                      workdir: Path, expected: list[list[int]], qs: tuple[int, ...] = (1, 8, 32, 64, 128),
                      only: tuple[str, ...] | None = None, heads: Path | None = None) -> Row:
    """Every method ``budget=auto`` applies to, planning under a curve measured here, gives ``expected``."""
    from specbench.budget.planner import AutoBudget
    from specbench.machine.costs import measure

    vocab = target.model.config.vocab_size
    curve = measure(target, vocab, qs=qs, contexts=(len(texts[0]), 1024))
    wrong, ran = [], 0
    for name, make in drafters(target, vocab, workdir, texts, only=only, heads=heads).items():
        cls = get_method(name)
        if not getattr(cls, "budget_auto", False) or name == "autoregressive":
            continue
        try:
            got = []
            for p in texts:
                d = make()
                planner = AutoBudget(curve, aux_feeds=cls.AUX_FEEDS, catches_up=d.catches_up)
                got.append(generate(target, d, p, max_new_tokens=new_tokens, planner=planner).output_ids)
        except Exception as err:  # noqa: BLE001
            wrong.append(f"{name} ({type(err).__name__}: {str(err)[:80]})")
            continue
        ran += 1
        if got != expected:
            wrong.append(name)
    detail = (f"{ran} methods planned under this device's curve ({len(qs)} block sizes) equal autoregressive"
              if not wrong else f"differ: {', '.join(wrong)}")
    return ("budget=auto", model_name, dtype, not wrong, detail)


def check_split(folder: Path, dtype: str, model_name: str, texts: list[list[int]], new_tokens: int, workdir: Path,
                expected: list[list[int]], heads: Path | None = None) -> Row:
    """The model split between cuda:0 and host memory (nothing is timed), so one GPU runs a split model's hooks:
    the baseline and a tree method with aux nodes give the GPU-alone outputs, and an EAGLE head drafts."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=DTYPES[dtype], attn_implementation="sdpa",
                                                 device_map=split_map(folder)).eval()
    share_layer_inputs(model)
    target, vocab = Target(model), model.config.vocab_size
    try:
        got = [generate(target, d, p, max_new_tokens=new_tokens).output_ids
               for p in texts for d in (Drafter(vocab_size=0), get_method("spectra_core")(vocab_size=vocab))]
        eagle = drafters(target, vocab, workdir / "split", texts, only=("eagle",), heads=heads)["eagle"]
        [generate(target, eagle(), p, max_new_tokens=new_tokens) for p in texts]
    except Exception as err:  # noqa: BLE001 - the row says what broke
        return _crash("cuda:0 + CPU split", model_name, dtype, err)
    return ("cuda:0 + CPU split", model_name, dtype, got == expected, "hooks between cuda:0 and the CPU: "
            + ("same outputs, EAGLE ran" if got == expected else "outputs differ"))


def split_map(folder: Path) -> dict[str, Any]:
    """Embedding and the first half of the layers on GPU 0, the rest (final norm, LM head) in host memory."""
    n = json.loads((folder / "config.json").read_text())["num_hidden_layers"]
    return {"model.embed_tokens": 0, **{f"model.layers.{i}": 0 if i < n // 2 else "cpu" for i in range(n)},
            "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}


def plan_70b(gpu_bytes: int | None = None, gpus: int = 4) -> Row:
    """Llama-2-70B's shape on ``meta``: parameters against the preset's ``params_b``, the ``device_map=auto`` plan
    over ``gpus`` GPUs of ``gpu_bytes`` (this GPU's memory; an H100's without one), the one-GPU refusal."""
    from accelerate import infer_auto_device_map, init_empty_weights
    from omegaconf import OmegaConf

    from specbench.models import model_preset
    from specbench.models.config import _memory_check

    if gpu_bytes is None:
        gpu_bytes = torch.cuda.mem_get_info(0)[1] if torch.cuda.is_available() else H100_BYTES
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(LlamaConfig(**LLAMA2_70B), dtype=torch.float16)
    params = sum(p.numel() for p in model.parameters()) / 1e9
    preset = OmegaConf.to_container(model_preset("llama2-70b"))
    quiet = logging.getLogger("accelerate.utils.modeling")  # it warns of planned GPUs this machine lacks
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        plan = infer_auto_device_map(model, max_memory={**{i: gpu_bytes for i in range(gpus)}, "cpu": 0, "disk": 0},
                                     no_split_module_classes=model._no_split_modules, dtype=torch.float16)
    finally:
        quiet.setLevel(level)
    off = sorted({str(v) for v in plan.values()} - {str(i) for i in range(gpus)})
    per_gpu = [sum(1 for k, v in plan.items() if v == i and ".layers." in f".{k}") for i in range(gpus)]
    kv_bytes = 2 * LLAMA2_70B["num_hidden_layers"] * LLAMA2_70B["num_key_value_heads"] * 128 * 2 * KV_TOKENS
    try:
        _memory_check(preset, {"device": "cuda", "device_map": None, "num_gpus": None},
                      have=(gpu_bytes, "one GPU"), reserve=kv_bytes)
        refused = ""
    except ModelLoadError as err:
        refused = str(err)
    fits = params * 1e9 * 2 + kv_bytes <= gpu_bytes  # the counted parameters: what the refusal must agree with
    ok = abs(params - preset["params_b"]) / preset["params_b"] < 0.02 and not off and bool(refused) != fits
    one = ("refused before loading" if refused else "NOT refused") if not fits else \
        ("fits, not refused" if not refused else "refused although it fits")
    detail = (f"{params:.1f}B parameters (preset {preset['params_b']}); fp16 over {gpus} × {gpu_bytes / 2**30:.0f} GiB: "
              f"layers per GPU {'/'.join(map(str, per_gpu))}" + (f", offloaded to {', '.join(off)}" if off else "")
              + f"; {KV_TOKENS // 1024}k-token KV cache {kv_bytes / 1e9:.2f} GB; one GPU of {gpu_bytes / 1e9:.0f} GB: "
              + one)
    return ("70B plan (meta)", "llama2-70b", "fp16", ok, detail)
