"""Host traffic per decode step of every method on simulated CUDA GPUs (tests/simgpu.py): implicit syncs,
uploads (pinned / pageable) and bytes, and copies between GPUs, greedy and sampling, the tiny 8-layer Llama of
the simulated-GPU tests on 1 and 2 GPUs (device_map=auto). Counts, not times: they are the same on any machine.

    python bench/host_traffic.py            # prints the Markdown table of bench/README.md
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore")

from tests.methods.test_simulated_gpus import (  # noqa: E402
    CASES,
    load_on,
    make_heads,
    make_store,
    save_tiny,
    step_traffic,
    sync_ceiling,
)


def main() -> None:
    root = Path(tempfile.mkdtemp())
    saved = save_tiny(root / "tiny8")
    store = make_store(root / "store", saved[2])
    heads = make_heads(root / "heads", saved[2].model.config)
    models = {n: load_on(saved, n) for n in (1, 2)}
    print("| method | greedy syncs/step (max) | ceiling | sampling syncs/step (max) | uploads/step (pageable) "
          "| upload bytes/step | GPU→GPU copies/step (2 GPUs) |")
    print("|---|---|---|---|---|---|---|")
    for case in CASES:
        cells = {}
        for gpus in (1, 2):
            for t in (0.0, 1.0):
                rec, steps = step_traffic(case, models[gpus], gpus, saved, store, heads, temperature=t)
                cells[gpus, t] = steps
        g, s, two = cells[1, 0.0], cells[1, 1.0], cells[2, 0.0]

        def mean(steps, attr):
            return statistics.mean(getattr(x, attr) for x in steps)

        print(f"| {case} | {mean(g, 'syncs'):.2f} ({max(x.syncs for x in g)}) | {sync_ceiling(case)} "
              f"| {mean(s, 'syncs'):.2f} ({max(x.syncs for x in s)}) | {mean(g, 'uploads'):.1f} "
              f"({sum(x.uploads_pageable for x in g)}) | {mean(g, 'upload_bytes'):.0f} "
              f"| {mean(two, 'peer_copies'):.1f} |", flush=True)


if __name__ == "__main__":
    main()
