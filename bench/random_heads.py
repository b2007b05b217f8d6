"""Untrained EAGLE, EAGLE-3 and Medusa heads for a model preset: the worst case for ``budget=auto``, heads whose
guesses are never right, so drafting never pays. Written in their published layouts under ``--out``; a preset
reads one with ``,head=<out>/<kind>`` (``compare.py``) or ``method.head=<out>/<kind>`` (``run.py``). Run:

    python bench/random_heads.py --out <dir>
"""

from __future__ import annotations

import argparse
from pathlib import Path

from omegaconf import OmegaConf

from specbench.drafting.eagle_drafter import random_head
from specbench.models import load_model
from specbench.paths import CONF_DIR


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--out", required=True, help="the directory to write <kind>/ head folders into")
    args = ap.parse_args()
    loaded = load_model(OmegaConf.load(CONF_DIR / "model" / f"{args.model}.yaml"),
                        OmegaConf.load(CONF_DIR / "hardware" / "cpu.yaml"))
    for kind in ("eagle", "eagle3", "medusa"):
        print(random_head(kind, loaded.model.config, Path(args.out) / kind))


if __name__ == "__main__":
    main()
