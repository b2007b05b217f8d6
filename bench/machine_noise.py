"""How steady this machine's pace is: whether it can resolve a speed line at all.

Times identical autoregressive generations back to back for ``--seconds`` and prints their spread (coefficient
of variation, range) and how much the log-ratio of two of them varies with the number of runs between them (a
drift shows as a spread that grows with the lag), then what a cell of ``--cells`` paired runs (a method's and
the baseline's) reads its mean speedup to. Then it reads the machine's pace against the cached cost curve as
``budget=auto``'s check does (``specbench.machine.costs.pace``), ``--paces`` times, alongside the fastest of
three. Run:
    python bench/machine_noise.py --seconds 240
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

LAGS = (1, 2, 4, 8, 16)


def spread(times: list[float], lags=LAGS) -> dict:
    """The spread of repeated timings of the same work: mean, coefficient of variation, range, and for each lag
    the standard deviation of log(t[i + lag] / t[i])."""
    logs = [math.log(t) for t in times]
    out = {"runs": len(times), "mean": statistics.mean(times), "cv": statistics.stdev(times) / statistics.mean(times),
           "range": (min(times), max(times)), "lags": {}}
    for lag in lags:
        if len(logs) > lag + 1:
            out["lags"][lag] = statistics.stdev([logs[i + lag] - logs[i] for i in range(len(logs) - lag)])
    return out


def main() -> None:
    from omegaconf import OmegaConf

    from methods.registry import get_method
    from specbench.core.decode import generate
    from specbench.core.forward import Target
    from specbench.machine.costs import load_or_measure, measure
    from specbench.models import load_model
    from specbench.paths import CONF_DIR
    from specbench.provenance import environment_info

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--seconds", type=float, default=240.0)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--cells", type=int, default=12, help="paired runs in a cell (prompts × repeats)")
    ap.add_argument("--paces", type=int, default=8)
    args = ap.parse_args()
    hardware = OmegaConf.load(CONF_DIR / "hardware" / "cpu.yaml")
    loaded = load_model(OmegaConf.merge(OmegaConf.load(CONF_DIR / "model" / f"{args.model}.yaml"),
                                        {"dtype": args.dtype}), hardware)
    target, plain = Target(loaded.model), get_method("autoregressive")(None, vocab_size=loaded.vocab_size)
    ids = loaded.tokenizer("Write a short story about a robot learning to paint.")["input_ids"]
    times, end = [], time.time() + args.seconds
    while time.time() < end:
        start = time.perf_counter()
        generate(target, plain, ids, max_new_tokens=args.tokens, eos_token_ids=[])
        times.append(time.perf_counter() - start)
    s = spread(times)
    print(f"machine: {environment_info('cpu')['device_name']}; {args.model} {args.dtype}; {s['runs']} generations "
          f"of {args.tokens} tokens: mean {s['mean']:.2f} s, range {s['range'][0]:.2f}-{s['range'][1]:.2f} s, "
          f"coefficient of variation {100 * s['cv']:.1f}%")
    print("std of log(t[i+lag] / t[i]): " + ", ".join(f"lag {k} {100 * v:.1f}%" for k, v in s["lags"].items()))
    pair = s["lags"].get(1, math.sqrt(2) * s["cv"])
    print(f"a cell of {args.cells} paired runs reads its mean speedup to about ±{100 * pair / math.sqrt(args.cells):.1f}%"
          " (one std, neighbouring runs; more apart, more)")
    curve = load_or_measure(loaded, args.model, args.dtype, hardware.get("attn_implementation", "sdpa"))
    for name, repeats, warmup in (("fastest of 3 after 1", 3, 1), ("fastest of 10 after 3 (the check)", 10, 3)):
        reads = [measure(target, loaded.vocab_size, qs=(1,), contexts=curve.contexts[:1], repeats=repeats,
                         warmup=warmup).seconds[0][0] / curve(1, curve.contexts[0]) for _ in range(args.paces)]
        print(f"pace against the cached curve, {name}: " + " ".join(f"{r:.2f}" for r in reads))


if __name__ == "__main__":
    main()
