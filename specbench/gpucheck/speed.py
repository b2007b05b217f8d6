"""gpu-check's speed stage and the checks that go with it: the cost curve of a model that fills the GPU; per method
τ, draft and forward ms per step, implicit host syncs per step (torch's sync debug mode, :mod:`specbench.gpucheck.syncs`:
reads of GPU values and blocking copies; the timing's explicit synchronizes are not counted) and peak memory; every
step's syncs against its method's ceiling, greedy and at T = 1."""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

import torch

from specbench.core.acceptance import SamplingParams
from specbench.core.decode import generate
from specbench.core.forward import Target
from specbench.gpucheck.models import Row, drafters
from specbench.gpucheck.stages import ROUNDS
from specbench.gpucheck.syncs import ceilings, judge, step_syncs


def speed(target: Target, model_name: str, texts: list[list[int]], new_tokens: int, workdir: Path,
          cost_qs=None, only: tuple[str, ...] | None = None, heads: Path | None = None,
          rounds: int = ROUNDS) -> tuple[Any, list[dict[str, Any]]]:
    """The cost curve and, per method (or those ``only`` names), τ, draft and forward ms per step and peak memory,
    timed with nothing else on (host syncs are counted apart, in :func:`check_syncs`). Timed in ``rounds``: each
    round decodes one prompt (in turn) with every method, in an order reversed every other round, so that a drift
    of the machine (its clocks, a neighbour, a first use) falls on every method alike; each row holds the median of
    its rounds' ms per step and their range."""
    from specbench.machine.costs import QS, measure

    vocab = target.model.config.vocab_size
    makers = drafters(target, vocab, workdir, texts, only=only, heads=heads)  # writes the random heads (GBs) ...
    os.sync()  # ... and flushes them, so that no disk writeback competes with the timing below
    curve = measure(target, vocab, qs=cost_qs or QS, context_length=target.model.config.max_position_embeddings)
    names = ["autoregressive", *[n for n in makers if n != "autoregressive"]]
    for name in names:
        generate(target, makers[name](), texts[0], max_new_tokens=8)  # warm-up
    runs: dict[str, list[tuple[int, int, float, float, float]]] = {n: [] for n in names}
    for r in range(rounds):
        prompt = texts[r % len(texts)]
        for name in names if r % 2 == 0 else names[::-1]:
            target.reset_peak_memory()
            rec = generate(target, makers[name](), prompt, max_new_tokens=new_tokens)
            draft = sum(rec.step_draft_s[1:])  # the first step is the prefill's
            steps = max(rec.steps - 1, 1)
            runs[name].append((rec.new_tokens, rec.steps, 1000 * draft / steps,
                               1000 * (sum(rec.step_times[1:]) - draft) / steps, target.peak_memory_gb()))
    rows = []
    for name in names:
        tokens, steps, draft_ms, forward_ms, peak = zip(*runs[name], strict=True)
        rows.append({"model": model_name, "method": name, "tau": sum(tokens) / sum(steps),
                     "draft_ms": statistics.median(draft_ms), "forward_ms": statistics.median(forward_ms),
                     "draft_range": [min(draft_ms), max(draft_ms)], "forward_range": [min(forward_ms), max(forward_ms)],
                     "rounds": len(forward_ms), "syncs": float("nan"), "peak_gb": max(peak)})
    return curve, rows


def profile(target: Target, texts: list[list[int]], new_tokens: int, workdir: Path, method: str,
            heads: Path | None = None, top: int = 30) -> str:
    """torch.profiler's table of one method's decode of the first prompt (after a warm-up): the ``top`` operators
    by their own host time, and by their own device time where there is a GPU."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    make = drafters(target, target.model.config.vocab_size, workdir, texts, only=(method,), heads=heads)[method]
    generate(target, make(), texts[0], max_new_tokens=8)
    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=activities) as prof:
        rec = generate(target, make(), texts[0], max_new_tokens=new_tokens)
    stats = prof.key_averages()
    parts = [f"{method}: {rec.steps} steps, {rec.new_tokens} tokens, {1000 * sum(rec.step_times) / rec.steps:.1f} ms "
             f"a step ({1000 * sum(rec.step_draft_s) / rec.steps:.1f} drafting)",
             stats.table(sort_by="self_cpu_time_total", row_limit=top)]
    if cuda:
        parts.append(stats.table(sort_by="self_cuda_time_total", row_limit=top))
    return "\n\n".join(parts)


def fit_layers(shape: dict, layers: int, bytes_per_param: int, free_bytes: int | None) -> int:
    """As many of ``layers`` as fit in 80% of ``free_bytes`` (all of them when it is None)."""
    h, v, f = shape["hidden_size"], shape["vocab_size"], shape["intermediate_size"]
    kv = h * shape["num_key_value_heads"] // shape["num_attention_heads"]
    per_layer = (2 * h * h + 2 * h * kv + 3 * h * f) * bytes_per_param
    fixed = 2 * v * h * bytes_per_param
    if free_bytes is None:
        return layers
    return max(1, min(layers, int((0.8 * free_bytes - fixed) // per_layer)))


def check_syncs(target: Target, dtype: str, model_name: str, texts: list[list[int]], new_tokens: int, workdir: Path,
                only: tuple[str, ...] | None = None, heads: Path | None = None
                ) -> tuple[list[Row], dict[str, float]]:
    """Every method (or those ``only`` names), greedy and at T = 1: each decode step's host syncs, counted from
    torch's sync debug mode, within [1, its ceiling] (:func:`specbench.gpucheck.syncs.ceilings`); and each method's
    greedy syncs per step. Off CUDA nothing is counted and the rows say so."""
    if not torch.cuda.is_available():
        return [("host syncs", model_name, dtype, True, "not counted: no CUDA device")], {}
    rows, per_step = [], {}
    for sampling in (SamplingParams(), SamplingParams(temperature=1.0)):
        bad, seen, ran = [], [], 0
        for name, make in drafters(target, target.model.config.vocab_size, workdir, texts, only=only,
                                   sampling=sampling, heads=heads).items():
            gen = torch.Generator().manual_seed(0)
            mine: list[int] = []
            try:
                for prompt in texts:
                    drafter = make()
                    with step_syncs(drafter) as counts:
                        rec = generate(target, drafter, prompt, max_new_tokens=new_tokens, sampling=sampling,
                                       generator=gen)
                    ok, detail = judge(counts, ceilings(type(drafter), drafter.config, rec))
                    if not ok:
                        bad.append(f"{name} {detail}")
                        break
                    mine += counts
                seen += mine
                ran += 1
                if sampling.greedy and mine:
                    per_step[name] = sum(mine) / len(mine)
            except Exception as err:  # noqa: BLE001 - that method's failure; the others still run
                bad.append(f"{name} ({type(err).__name__}: {str(err)[:80]})")
        label = "host syncs, " + ("greedy" if sampling.greedy else "T = 1")
        detail = (f"{ran} methods, {min(seen)}–{max(seen)} a step, each within its ceiling" if not bad and seen
                  else "; ".join(bad) or "no step counted")
        rows.append((label, model_name, dtype, not bad and bool(seen), detail))
    return rows, per_step
