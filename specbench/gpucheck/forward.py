"""gpu-check's ``forward`` stage: ``forward=compiled`` on a GPU, each verification step a CUDA graph
(:mod:`specbench.core.graphs`), against the eager forward on the same random weights.

- ``graphs: logits``: a tree's logits under graphs against the eager forward's on the same inputs (fp32, a few
  layers), within the tree check's tolerance;
- ``graphs: lossless``: every method's greedy output under graphs equals autoregressive decoding under graphs,
  which equals eager autoregressive decoding (fp32, a few layers);
- ``graphs: t(q) at <context>``: one verification step (:func:`specbench.machine.costs.timed_step`), eager and
  graphed alternating, the median of :data:`ROUNDS`, at contexts 128 and 2,048 (``--long-context``), in fp16 with every layer that fits;
  the graphs' capture is timed apart;
- ``graphs: per step``: for autoregressive decoding, EAGLE-3, DFlash and sps (a self-draft) under graphs, the
  host syncs per decode step (torch's sync debug mode, against each method's ceiling), CUDA launches per step
  (kernels and graphs, from torch.profiler) and the drafting's milliseconds per step.

On a CPU (the test suite's tiny shapes) the graphs are rehearsed and neither syncs nor launches are counted.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable
from pathlib import Path

import torch

from specbench.core.decode import generate
from specbench.core.draft import Draft, Drafter
from specbench.core.engine import CompiledTarget
from specbench.core.forward import Target
from specbench.gpucheck.models import Row, build, drafters, prompts
from specbench.gpucheck.speed import fit_layers
from specbench.gpucheck.stages import Stage
from specbench.gpucheck.syncs import ceilings, judge, step_syncs
from specbench.machine.costs import _tree, timed_step

QS = (1, 2, 8, 32, 128)
SHORT = 128  # the short context t(q) is timed at; the long one is gpu-check's --long-context (2,048)
ROUNDS = 5
TOLERANCE = 1e-3  # the largest logit difference, in standard deviations of the logits (fp32)
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch")
PER_STEP = ("autoregressive", "eagle3", "dflash", "sps")  # heads and a self-draft beside each other: drafting ms a step


def graphed(model: torch.nn.Module) -> CompiledTarget:
    """``forward=compiled`` with each step a graph: captured on a GPU, rehearsed on a CPU."""
    return CompiledTarget(model, backend="eager", graphs=True)


def check_logits(eager: Target, graphs: CompiledTarget, prompt: list[int], model_name: str, dtype: str) -> Row:
    tree = Draft(tokens=[11, 12, 13, 14, 15, 16], parents=[-1, 0, 1, -1, 3, 0])
    outs: list[list[torch.Tensor]] = [[], []]
    with torch.inference_mode():
        for target, out in zip((eager, graphs), outs, strict=True):
            cache = target.new_cache(1, limit=len(prompt) + 16)
            target.prefill(prompt, cache)
            for root in prompt[-2:]:  # twice: a replay on new inputs, not only the capture's
                out.append(target.forward_draft(root, tree, cache).float())
    worst = max(float((a - b).abs().max() / a.std()) for a, b in zip(*outs, strict=True))
    return ("graphs: logits", model_name, dtype, worst <= TOLERANCE, f"max |Δ| {worst:.1e} σ (≤ {TOLERANCE:.0e})")


def check_lossless(eager: Target, graphs: CompiledTarget, texts: list[list[int]], new_tokens: int, work: Path,
                   model_name: str, dtype: str, only: tuple[str, ...] | None, heads: Path | None) -> Row:
    expected = [generate(eager, Drafter(vocab_size=0), p, max_new_tokens=new_tokens).output_ids for p in texts]
    graphs.warm(1, max(map(len, texts)) + new_tokens)
    bad = []
    for name, make in drafters(graphs, graphs.model.config.vocab_size, work, texts, only=only, heads=heads).items():
        outs = [generate(graphs, make(), p, max_new_tokens=new_tokens).output_ids for p in texts]
        if outs != expected:
            bad.append(name)
    detail = f"{len(graphs.compiled)} graphs; " + (f"differ from eager decoding: {', '.join(bad)}" if bad else
                                                    "every method's output equals eager autoregressive decoding")
    return ("graphs: lossless", model_name, dtype, not bad, detail)


def step_times(eager: Target, graphs: CompiledTarget, vocab: int, model_name: str, dtype: str,
               contexts: tuple[int, ...]) -> list[Row]:
    """t(q) eager and graphed, alternating, at each context."""
    capture = graphs.warm(1, max(contexts) + max(QS) + 8)
    rows = []
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for ctx in contexts:
            prompt = torch.randint(0, vocab, (ctx,), generator=gen).tolist()
            caches = {t: t.new_cache(1, limit=ctx + max(QS) + 8) for t in (eager, graphs)}
            for t, cache in caches.items():
                t.prefill(prompt, cache)
            parts = []
            for q in QS:
                draft = _tree(q, vocab, gen)
                times: dict[Target, list[float]] = {eager: [], graphs: []}
                for r in range(ROUNDS + 1):
                    for t in (eager, graphs) if r % 2 == 0 else (graphs, eager):
                        seconds, _ = timed_step(t, draft, caches[t], prompt[-1], ctx)
                        if r:  # round 0 warms up
                            times[t].append(seconds)
                e, g = (1000 * statistics.median(times[t]) for t in (eager, graphs))
                parts.append(f"q={q} {e:.1f} → {g:.1f} ms")
            rows.append((f"graphs: t(q) at {ctx}", model_name, dtype, True,
                         "eager → graphed: " + ", ".join(parts) + f" (capture {capture:.1f} s, apart)"))
    return rows


def per_step(graphs: CompiledTarget, texts: list[list[int]], new_tokens: int, work: Path, model_name: str,
             dtype: str, heads: Path | None) -> Row:
    """Host syncs, CUDA launches and drafting milliseconds per decode step under graphs."""
    from torch.profiler import ProfilerActivity, profile

    cuda = graphs.device.type == "cuda" and torch.cuda.is_available()
    parts, ok = [], True
    for name, make in drafters(graphs, graphs.model.config.vocab_size, work, texts, only=PER_STEP,
                               heads=heads).items():
        generate(graphs, make(), texts[0], max_new_tokens=8)  # warm-up
        drafter = make()
        watch = step_syncs(drafter) if cuda else contextlib.nullcontext([])
        with watch as counts, profile(activities=[ProfilerActivity.CPU]) as prof:
            rec = generate(graphs, drafter, texts[0], max_new_tokens=new_tokens)
        launches = sum(e.count for e in prof.key_averages() if e.key in LAUNCHES) / rec.steps
        part = f"{name}: {launches:.0f} launches"
        if cuda:
            good, detail = judge(counts, ceilings(type(drafter), drafter.config, rec))
            ok &= good
            part += f", syncs {detail}"
        parts.append(part + f", drafting {1000 * sum(rec.step_draft_s) / rec.steps:.2f} ms a step")
    note = "" if cuda else " (no CUDA: syncs not counted)"
    return ("graphs: per step", model_name, dtype, ok, "; ".join(parts) + note)


def run_forward(stage: Stage, shape: dict, device: str, work: Path, heads: Path, layers: int, speed_layers: int,
                new_tokens: int, long_context: int, only: tuple[str, ...] | None,
                guard: Callable[[str, Callable[[], Row | list[Row]]], list[Row]]) -> list[Row]:
    """``stage``'s rows: correctness in fp32 on ``layers`` layers, then the timings in fp16 (a CPU: fp32) on as
    many of ``speed_layers`` as fit, at contexts 128 and ``long_context``; ``guard`` turns a check's error into
    its failed row."""
    model_name = stage.model
    texts = prompts(shape["vocab_size"])
    work.mkdir(parents=True, exist_ok=True)
    model = build(shape, layers, torch.float32, device)
    eager, graphs = Target(model), graphed(model)
    rows = guard("graphs: logits", lambda: check_logits(eager, graphs, texts[0], model_name, "fp32"))
    rows += guard("graphs: lossless", lambda: check_lossless(eager, graphs, texts, new_tokens, work / "lossless",
                                                             model_name, "fp32", only, heads))
    del model, eager, graphs
    half = torch.float16 if device == "cuda" else torch.float32
    dtype = "fp16" if half == torch.float16 else "fp32"
    free = torch.cuda.mem_get_info()[0] if device == "cuda" else None
    model = build(shape, fit_layers(shape, speed_layers, 2 if device == "cuda" else 4, free), half, device)
    eager, graphs = Target(model), graphed(model)
    rows += guard("graphs: t(q)", lambda: step_times(eager, graphs, shape["vocab_size"], model_name, dtype,
                                                     (SHORT, long_context)))
    rows += guard("graphs: per step", lambda: per_step(graphs, texts, new_tokens, work / "steps", model_name, dtype,
                                                       heads))
    return rows
