"""Host traffic per decode step of every method on simulated CUDA GPUs (tests/simgpu.py): implicit syncs (with
each step's ceiling, specbench.gpucheck.syncs),
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
)


def main() -> None:
    root = Path(tempfile.mkdtemp())
    saved = save_tiny(root / "tiny8")
    store = make_store(root / "store", saved[2])
    heads = make_heads(root / "heads", saved[2].model.config)
    models = {n: load_on(saved, n) for n in (1, 2)}
    print("| method | greedy syncs/step (max) | greedy ceilings | sampling syncs/step (max) | sampling ceilings "
          "| uploads/step (pageable) | upload bytes/step | GPU→GPU copies/step (2 GPUs) |")
    print("|---|---|---|---|---|---|---|---|")
    for case in CASES:
        cells = {}
        for gpus in (1, 2):
            for t in (0.0, 1.0):
                _, watch = step_traffic(case, models[gpus], gpus, saved, store, heads, temperature=t)
                cells[gpus, t] = watch
        g, s, two = cells[1, 0.0], cells[1, 1.0], cells[2, 0.0]

        def mean(watch, attr):
            return statistics.mean(getattr(x, attr) for x in watch.steps())

        def syncs(watch):
            return f"{mean(watch, 'syncs'):.2f} ({max(watch.counts)})"

        def limits(watch):
            return f"{min(watch.limits)}–{max(watch.limits)}" if min(watch.limits) < max(watch.limits) \
                else str(watch.limits[0])

        print(f"| {case} | {syncs(g)} | {limits(g)} | {syncs(s)} | {limits(s)} | {mean(g, 'uploads'):.1f} "
              f"({sum(x.uploads_pageable for x in g.steps())}) | {mean(g, 'upload_bytes'):.0f} "
              f"| {mean(two, 'peer_copies'):.1f} |", flush=True)


if __name__ == "__main__":
    main()
