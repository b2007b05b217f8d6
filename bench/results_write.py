"""Cost of recording a result row as a run grows: one file per row against rewriting one file.

    python bench/results_write.py [--rows 1000]

Rows are shaped like a real chat generation (512 output tokens, ~200 steps).
Prints the median and the last-100 mean seconds per append for the writer in
use (one small file per row) and for rewriting the whole run file on every
row (how results were written before), measured side by side in one run, and
the time to read the finished run back with ``load_results``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

from specbench import provenance
from specbench.core.record import GenerationRecord
from specbench.results.rows import ResultWriter, _to_table, load_results, make_row


def realistic_row(i: int, context: dict) -> dict:
    steps = 200
    rec = GenerationRecord(
        prompt_len=300,
        output_ids=[(i * 31 + t) % 49152 for t in range(512)],
        step_tokens=[1] + [2, 3, 2, 3] * 50,
        step_times=[0.2] + [0.03] * steps,
        step_drafted=[0] + [20] * steps,
        step_aux=[0] + [15] * steps,
        step_draft_s=[0.0] + [0.0005] * steps,
        step_lookup_s=[0.0] + [0.0001] * steps,
        drafted_by_source=Counter({"fwd_dict": 3000, "bwd_dict": 800, "retrieval": 900}),
        accepted_by_source=Counter({"fwd_dict": 200, "bwd_dict": 90, "retrieval": 40}),
        accepted_by_position=Counter({1: 150, 2: 90, 3: 40, 4: 10}),
        prefill_s=0.2,
        decode_s=6.0,
        finish_reason="length",
    )
    return make_row(rec, context=context, sample_id=f"q{i}", turn=i % 2, output_text="word " * 400)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1000)
    args = ap.parse_args()
    context = {
        "run_id": "bench",
        "experiment": "bench",
        "config_hash": "0" * 12,
        "provenance": provenance.environment_info("cpu"),
        "model": "m",
        "method": "spectra",
        "dataset": "d",
        "dtype": "float32",
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 0,
        "seed": 0,
        "max_new_tokens": 512,
    }
    rows = [realistic_row(i, context) for i in range(args.rows)]
    with tempfile.TemporaryDirectory() as tmp:
        writer = ResultWriter(Path(tmp) / "run")
        one_file, rewrite = [], []
        single = Path(tmp) / "single.parquet"
        for i, row in enumerate(rows):
            t0 = time.perf_counter()
            writer.append(row)
            one_file.append(time.perf_counter() - t0)
            t0 = time.perf_counter()  # the former writer: the whole run rewritten on every row
            pq.write_table(_to_table(rows[: i + 1]), single)
            rewrite.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        df = load_results(Path(tmp) / "run")
        read_s = time.perf_counter() - t0
    assert len(df) == args.rows

    def fmt(xs):
        return f"median {1e3 * statistics.median(xs):7.2f} ms, last 100 {1e3 * statistics.mean(xs[-100:]):7.2f} ms"

    print(f"{args.rows} rows, {provenance.device_name('cpu')}")
    print(f"one file per row (in use)   : {fmt(one_file)}")
    print(f"rewrite the run file per row: {fmt(rewrite)}")
    print(f"ratio at the last 100 rows  : {statistics.mean(rewrite[-100:]) / statistics.mean(one_file[-100:]):.1f}x")
    print(f"load_results of the run     : {read_s:.2f} s")


if __name__ == "__main__":
    main()
