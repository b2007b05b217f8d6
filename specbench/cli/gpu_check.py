"""``python -m specbench.gpu_check`` (``make gpu-check``): the GPU paths checked on this machine's CUDA GPU,
offline, on random-weight Llama-2-7B and Llama-3-8B shapes (:mod:`specbench.run.gpu_check`).

Prints the checks, the speed table and the cost curves; exits 1 when a check fails and 2, in one line,
when torch sees no CUDA device. ``--device cpu --tiny`` runs the same code on small shapes on the CPU.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch

from methods.registry import method_names
from specbench.run.gpu_check import LONG_CONTEXT, run_checks
from specbench.run.gpu_models import DTYPES, SHAPES


def _environment() -> str:
    from specbench.provenance import device_name, driver_version

    if not torch.cuda.is_available():
        return f"{device_name('cpu')}, torch {torch.__version__}"
    return (f"{torch.cuda.device_count()} × {device_name('cuda:0')}, driver {driver_version() or '?'}, "
            f"CUDA {torch.version.cuda}, torch {torch.__version__}")


def _fmt(value: float, digits: int = 1) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def render(result: dict, environment: str) -> str:
    lines = [f"# gpu-check on {environment}", "", "| check | model | dtype | result | detail |",
             "|---|---|---|---|---|"]
    for check, model, dtype, ok, detail in result["checks"]:
        lines.append(f"| {check} | {model} | {dtype} | {'ok' if ok else 'FAILED'} | {detail} |")
    lines += ["", "| model | layers | method | τ | draft ms/step | forward ms/step | host syncs/step | peak GB |",
              "|---|---|---|---|---|---|---|---|"]
    for r in result["speed"]:
        lines.append(f"| {r['model']} | {r['layers']} | {r['method']} | {r['tau']:.2f} | {_fmt(r['draft_ms'], 2)} | "
                     f"{_fmt(r['forward_ms'])} | {_fmt(r['syncs'])} | {_fmt(r['peak_gb'])} |")
    for model, curve in result["curves"].items():
        lines += ["", f"cost curve, {model} (t(q) per verification, forward and compaction):", curve.table()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m specbench.gpu_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--tiny", action="store_true", help="small shapes (a self-test of the code on any device)")
    ap.add_argument("--layers", type=int, default=4, help="layers of the correctness models (full width)")
    ap.add_argument("--speed-layers", type=int, default=32, help="layers of the speed models")
    ap.add_argument("--tokens", type=int, default=48, help="new tokens per prompt in the method checks")
    ap.add_argument("--long-context", type=int, default=LONG_CONTEXT, help="tokens of the long prompt's checks")
    ap.add_argument("--models", nargs="+", choices=tuple(SHAPES), help="only these shapes (default: both)")
    ap.add_argument("--dtypes", nargs="+", choices=tuple(DTYPES), help="only these dtypes (default: all three)")
    ap.add_argument("--methods", nargs="+", choices=method_names(),
                    help="only these methods beside the baseline (default: every one)")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu-check: torch {torch.__version__} sees no CUDA device (built for CUDA {torch.version.cuda}): "
              "run it on a machine with an NVIDIA GPU and a CUDA build of torch", file=sys.stderr)
        raise SystemExit(2)
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32: the lossless check compares exactly
        torch.backends.cudnn.allow_tf32 = False
    start = time.perf_counter()
    result = run_checks(args.device, tiny=args.tiny, layers=args.layers, speed_layers=args.speed_layers,
                        new_tokens=args.tokens, long_context=args.long_context,
                        models=tuple(args.models) if args.models else None,
                        dtypes=tuple(args.dtypes) if args.dtypes else None,
                        methods=tuple(args.methods) if args.methods else None,
                        progress=lambda s: print(f"gpu-check: {s}", file=sys.stderr))
    print(render(result, _environment()))
    failed = [r for r in result["checks"] if not r[3]]
    print(f"\n{len(result['checks']) - len(failed)} of {len(result['checks'])} checks passed "
          f"in {time.perf_counter() - start:.0f} s")
    if failed:
        raise SystemExit(1)
