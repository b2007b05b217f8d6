"""``specbench costs``: measure (or read the cached) verification cost curve t(q, context).

    specbench costs                        # SmolLM2, its config's dtype, measured or cached
    specbench costs model.dtype=bfloat16 --remeasure
    specbench costs hardware.linear=plain  # PyTorch's own linear layers (default on a CPU: packed)
    specbench costs --batch-size 8         # and t(q, context) of batches of 2, 4 and 8 rows

On a CPU it also prints the floor: the weights' bytes over the measured memory read bandwidth.
"""

from __future__ import annotations

import argparse

from omegaconf import OmegaConf

from specbench.errors import one_line_errors
from specbench.machine.costs import load_or_measure
from specbench.models import load_model
from specbench.paths import CONF_DIR


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="specbench costs", description="What one verification forward costs on this machine: t(q, context).")
    ap.add_argument("overrides", nargs="*", help="model=<name>, model.dtype=..., hardware=<name>, hardware.x=...")
    ap.add_argument("--remeasure", action="store_true", help="measure even when a cached curve exists")
    ap.add_argument("--batch-size", type=int, default=1, help="also measure batches of 2, 4, … up to this many rows")
    args = ap.parse_args(argv)
    if args.batch_size < 1:
        ap.error(f"--batch-size must be >= 1, got {args.batch_size}")
    with one_line_errors():
        picks = {"model": "smollm2-135m", "hardware": "cpu"}
        dotted = []
        for item in args.overrides:
            k, _, v = item.partition("=")
            (picks.__setitem__(k, v) if k in picks else dotted.append(item))
        cfg = OmegaConf.create({k: OmegaConf.load(CONF_DIR / k / f"{v}.yaml") for k, v in picks.items()})
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(dotted))
        loaded = load_model(cfg.model, cfg.hardware)
        dtype = str(cfg.model.get("dtype", "float32"))
        attn = str(cfg.hardware.get("attn_implementation", "sdpa"))
        model = load_or_measure(loaded, str(cfg.model.name), dtype, attn, remeasure=args.remeasure, progress=True,
                                batch_size=args.batch_size)
    linear = f", {loaded.linear} linear layers" if loaded.device.type == "cpu" else ""
    print(f"{cfg.model.name} ({dtype}, {attn}{linear}) on {model.device_name}")
    print(model.table())
    if loaded.device.type == "cpu":
        from specbench.machine.floor import floor

        bound = floor(loaded.model)
        t1 = model.seconds[0][0]
        print(f"{bound.describe()}; t(1) at context {model.contexts[0]} is {1000 * t1:.1f} ms, "
              f"{t1 / bound.seconds:.2f} × the floor")
