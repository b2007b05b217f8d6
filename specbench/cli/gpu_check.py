"""``specbench gpu-check`` (``make gpu-check``): the GPU paths checked on this machine's CUDA GPU,
offline, on random-weight Llama-2-7B and Llama-3-8B shapes (:mod:`specbench.gpucheck.check`).

Runs in stages (``--list-stages``; ``--stages`` picks some), each written to ``--out`` as it finishes; prints
the checks, the speed table and the cost curves; exits 1 when a check fails and 2, in one line, when torch
sees no CUDA device. ``--device cpu --tiny`` runs the same code on small shapes on the CPU. On a machine
without network, ``./gpu_check.sh`` runs this with the wheels ``make gpu-bundle`` gathered.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

from methods.registry import method_names
from specbench.gpucheck.check import LONG_CONTEXT, Stage, plan_stages, run_checks
from specbench.gpucheck.models import DTYPES, SHAPES


def _environment() -> str:
    from specbench.provenance import device_name, driver_version

    if not torch.cuda.is_available():
        return f"{device_name('cpu')}, torch {torch.__version__}"
    return (f"{torch.cuda.device_count()} × {device_name('cuda:0')}, driver {driver_version() or '?'}, "
            f"CUDA {torch.version.cuda}, torch {torch.__version__}")


def _fmt(value: float, digits: int = 1) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _spread(row: dict, what: str, digits: int = 1) -> str:
    """``row``'s median ms per step of ``what`` and, where it was timed in rounds, their range."""
    low, high = row.get(f"{what}_range") or (None, None)
    median = _fmt(row[f"{what}_ms"], digits)
    return median if low is None else f"{median} [{_fmt(low, digits)}, {_fmt(high, digits)}]"


def render(result: dict, environment: str) -> str:
    lines = [f"# gpu-check on {environment}", "", "| check | model | dtype | result | detail |",
             "|---|---|---|---|---|"]
    for check, model, dtype, ok, detail in result["checks"]:
        lines.append(f"| {check} | {model} | {dtype} | {'ok' if ok else 'FAILED'} | {detail} |")
    if result["speed"]:
        lines += ["", "| model | layers | method | τ | draft ms/step | forward ms/step | host syncs/step | peak GB |",
                  "|---|---|---|---|---|---|---|---|"]
    for r in result["speed"]:
        lines.append(f"| {r['model']} | {r['layers']} | {r['method']} | {r['tau']:.2f} | "
                     f"{_spread(r, 'draft', 2)} | {_spread(r, 'forward')} | {_fmt(r['syncs'])} | "
                     f"{_fmt(r['peak_gb'])} |")
    if result["speed"]:
        rounds = max(r.get("rounds", 1) for r in result["speed"])
        lines += ["", f"ms per step: the median of {rounds} rounds [their least, their most]; each round decodes one "
                  "prompt with every method, in an order reversed every other round"]
    for model, curve in result["curves"].items():
        lines += ["", f"cost curve, {model} (t(q) per verification, forward and compaction):", curve.table()]
    if result.get("stages"):
        lines += ["", "stages: " + ", ".join(f"{st.name} {st.seconds:.0f} s" for st in result["stages"])]
        lines += [f"{st.name}, seconds per check: " + ", ".join(f"{c} {t:.1f}" for c, t in st.timings.items())
                  for st in result["stages"] if st.timings]
    if result.get("skipped"):
        names = " ".join(st.name for st in result["skipped"])
        lines += ["", f"not run before the deadline: {names} (run them next: `bash gpu_check.sh --stages {names}`)"]
    return "\n".join(lines)


def _as_result(stages: list[Stage]) -> dict:
    rows = [r for st in stages for r in st.rows]
    return {"checks": rows, "speed": [r for st in stages for r in st.speed],
            "curves": {k: v for st in stages for k, v in st.curves.items()}, "stages": stages}


def _stage_json(stage: Stage, environment: str) -> dict:
    return {"stage": stage.name, "environment": environment, "seconds": round(stage.seconds, 1),
            "seconds_per_check": {c: round(t, 1) for c, t in stage.timings.items()},
            "checks": [dict(zip(("check", "model", "dtype", "ok", "detail"), r, strict=True)) for r in stage.rows],
            "speed": stage.speed, "curves": {k: c.table() for k, c in stage.curves.items()}}


class Writer:
    """Each finished stage written at once to ``out``: ``<stage>.md`` and ``<stage>.json``, and
    ``gpu-check.md`` / ``gpu-check.json`` with every stage so far (so a command cut short keeps what finished)."""

    def __init__(self, out: Path | None, environment: str) -> None:
        self.out, self.environment, self.done = out, environment, []
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)

    def __call__(self, stage: Stage) -> None:
        self.done.append(stage)
        if self.out is None:
            return
        _write(self.out / f"{stage.name}.md", render(_as_result([stage]), self.environment))
        _write(self.out / f"{stage.name}.json", json.dumps(_stage_json(stage, self.environment), indent=1))
        for method, table in stage.profiles.items():
            _write(self.out / f"profile-{stage.model}-{method}.txt", table)
        _write(self.out / "gpu-check.md", render(_as_result(self.done), self.environment))
        _write(self.out / "gpu-check.json", json.dumps([_stage_json(st, self.environment) for st in self.done],
                                                       indent=1))


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="specbench gpu-check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--tiny", action="store_true", help="small shapes (a self-test of the code on any device)")
    ap.add_argument("--out", type=Path, help="write each stage's rows here as it finishes (markdown and JSON)")
    ap.add_argument("--stages", nargs="+", metavar="STAGE",
                    help="only these stages: plan, sdpa, <model>-<fp32|fp16|bf16|speed>, or a model, dtype or "
                         "'speed' for all of its stages (default: all)")
    ap.add_argument("--list-stages", action="store_true", help="print the stages and exit")
    ap.add_argument("--layers", type=int, default=4, help="layers of the correctness models (full width)")
    ap.add_argument("--speed-layers", type=int, default=32, help="layers of the speed models")
    ap.add_argument("--tokens", type=int, default=16, help="new tokens per prompt in the method checks")
    ap.add_argument("--speed-tokens", type=int, default=24,
                    help="new tokens per prompt in each round of the speed table")
    ap.add_argument("--long-context", type=int, default=LONG_CONTEXT, help="tokens of the long prompt's checks")
    ap.add_argument("--models", nargs="+", choices=tuple(SHAPES), help="only these shapes (default: both)")
    ap.add_argument("--dtypes", nargs="+", choices=tuple(DTYPES), help="only these dtypes (default: all three)")
    ap.add_argument("--methods", nargs="+", choices=method_names(),
                    help="only these methods beside the baseline (default: every one)")
    ap.add_argument("--deadline", type=float, default=0, metavar="SECONDS",
                    help="start no stage expected to end after this many seconds; name the skipped ones (0: none)")
    ap.add_argument("--profile", nargs="+", default=(), choices=method_names(), metavar="METHOD",
                    help="the speed stage also writes torch.profiler's table of these methods' decode "
                         "(profile-<model>-<method>.txt in --out)")
    args = ap.parse_args(argv)
    models = tuple(args.models) if args.models else None
    dtypes = tuple(args.dtypes) if args.dtypes else None
    try:
        plan = plan_stages(args.tiny, models, dtypes, tuple(args.stages) if args.stages else None)
    except ValueError as err:
        print(f"gpu-check: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.list_stages:
        print("\n".join(st.name for st in plan))
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu-check: torch {torch.__version__} sees no CUDA device (built for CUDA {torch.version.cuda}): "
              "run it on a machine with an NVIDIA GPU and a CUDA build of torch", file=sys.stderr)
        raise SystemExit(2)
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32: the lossless check compares exactly
        torch.backends.cudnn.allow_tf32 = False
    start = time.perf_counter()
    environment = _environment()
    writer = Writer(args.out, environment)
    result = run_checks(args.device, tiny=args.tiny, layers=args.layers, speed_layers=args.speed_layers,
                        new_tokens=args.tokens, speed_tokens=args.speed_tokens, long_context=args.long_context,
                        models=models, dtypes=dtypes, methods=tuple(args.methods) if args.methods else None,
                        stages=tuple(args.stages) if args.stages else None, on_stage=writer,
                        deadline=args.deadline or None, profiles=tuple(args.profile),
                        progress=lambda s: print(f"gpu-check: {s} ({time.perf_counter() - start:.0f} s)",
                                                 file=sys.stderr, flush=True))
    print(render(result, environment))
    failed = [r for r in result["checks"] if not r[3]]
    print(f"\n{len(result['checks']) - len(failed)} of {len(result['checks'])} checks passed "
          f"in {time.perf_counter() - start:.0f} s" + (f"; tables in {args.out}/" if args.out else "")
          + (f"; {len(result['skipped'])} stages not run before the deadline" if result["skipped"] else ""))
    if failed:
        raise SystemExit(1)
