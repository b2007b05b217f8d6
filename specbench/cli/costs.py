"""``python -m specbench.costs``: measure (or read the cached) verification cost curve t(q, context).

    python -m specbench.costs                        # SmolLM2, its config's dtype, measured or cached
    python -m specbench.costs model.dtype=bfloat16 --remeasure
"""

from __future__ import annotations

import argparse

from omegaconf import OmegaConf

from specbench.budget.costs import load_or_measure
from specbench.errors import one_line_errors
from specbench.models import load_model
from specbench.paths import CONF_DIR


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m specbench.costs", description="What one verification forward costs on this machine: t(q, context).")
    ap.add_argument("overrides", nargs="*", help="model=<name>, model.dtype=..., hardware=<name>, hardware.x=...")
    ap.add_argument("--remeasure", action="store_true", help="measure even when a cached curve exists")
    args = ap.parse_args(argv)
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
        model = load_or_measure(loaded, str(cfg.model.name), dtype, attn, remeasure=args.remeasure, progress=True)
    print(f"{cfg.model.name} ({dtype}, {attn}) on {model.device_name}")
    print(model.table())
