"""gpu-check's speed table: the cost curve of a model that fills the GPU, and per method τ, draft and forward ms
per step, implicit host syncs per step (torch's sync debug mode: reads of GPU values and pageable copies; the
timing's explicit synchronizes are not counted) and peak memory."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from specbench.core.decode import generate
from specbench.core.forward import Target
from specbench.run.gpu_models import drafters


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
          cost_qs=None, only: tuple[str, ...] | None = None) -> tuple[Any, list[dict[str, Any]]]:
    """The cost curve and, per method (or those ``only`` names), τ, draft and forward ms per step, host syncs per
    step, peak memory."""
    from specbench.budget.costs import QS, measure

    vocab = target.model.config.vocab_size
    curve = measure(target, vocab, qs=cost_qs or QS, context_length=target.model.config.max_position_embeddings)
    rows = []
    for name, make in drafters(target, vocab, workdir, texts, only=only).items():
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
