"""Serving figures as vLLM's bench serve defines them, worked by hand on rows with known timestamps."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from specbench.results.serving import run_spans, serving_stats, throughput_ratio
from specbench.tables.batches import stops_paying


def row(arrival, started, ends, tokens, run="r", repeat=0, batch=2, rate=math.inf, prefill=0.1):
    return {"run_id": run, "repeat": repeat, "batch_size": batch, "request_rate": rate, "arrival_s": arrival,
            "started_s": started, "step_ends_s": ends, "finished_s": ends[-1], "new_tokens": tokens,
            "prefill_s": prefill, "wall_s": ends[-1] - started, "step_times": [0.0] * len(ends)}


def test_ttft_tpot_itl_e2e_and_the_span_by_hand():
    g = pd.DataFrame([
        row(0.0, 0.0, [0.5, 1.0, 1.5], tokens=5),  # TTFT 0.5, E2E 1.5, TPOT (1.5 − 0.5) / 4, gaps 0.5 0.5
        row(0.0, 1.5, [2.0, 4.0], tokens=2),  # waited 1.5 s for a slot: TTFT 2.0, E2E 4.0, TPOT 2.0, gap 2.0
    ])
    s = serving_stats(g)
    assert s["ttft_ms"] == pytest.approx(1000 * (0.5 + 2.0) / 2)
    assert s["e2e_ms"] == pytest.approx(1000 * (1.5 + 4.0) / 2)
    assert s["tpot_ms"] == pytest.approx(1000 * (0.25 + 2.0) / 2)
    assert s["itl_p50_ms"] == pytest.approx(500.0) and s["itl_p90_ms"] == pytest.approx(1000 * (0.5 + 0.8 * 1.5))
    assert s["output_throughput"] == pytest.approx(7 / 4.0) and s["request_throughput"] == pytest.approx(2 / 4.0)
    assert s["occupancy"] == pytest.approx((1.5 + 2.5) / 4.0)


def test_requests_one_at_a_time_each_on_its_own_clock_add_their_latencies():
    """Batch size 1 outside a served run: every row's clock starts at its own prefill; the span is Σ E2E."""
    g = pd.DataFrame([row(0.0, 0.0, [0.2, 0.4], 2, batch=1, rate=math.nan),
                      row(0.0, 0.0, [0.3, 0.9], 2, batch=1, rate=math.nan)])
    assert run_spans(g).span.sum() == pytest.approx(1.3)
    assert serving_stats(g)["occupancy"] == pytest.approx(1.0)


def test_the_throughput_ratio_is_over_spans_not_over_each_request_s_own_time():
    """A method whose requests are each faster while they decode but that leaves a long drain tail: its
    per-request rate is higher, its throughput over the span lower, and the verdict follows the span."""
    base = pd.DataFrame([row(0, 0, [1.0, 2.0], 10, repeat=k) for k in range(3)]
                        + [row(0, 0, [1.0, 2.0], 10, repeat=k) for k in range(3)])
    mine = pd.DataFrame([row(0, 0, [0.5, 1.0], 10, repeat=k) for k in range(3)]
                        + [row(0, 2.5, [3.0, 3.0 + 0.01 * k], 10, repeat=k) for k in range(3)])
    out = throughput_ratio(mine, base)
    assert out["throughput_speedup"] == pytest.approx((60 / sum(3.0 + 0.01 * k for k in range(3))) / (60 / 6.0))
    assert out["throughput_hi"] < 1 and out["throughput_verdict"] == "slower"
    one = throughput_ratio(mine[mine.repeat == 0], base[base.repeat == 0])
    assert math.isnan(one["throughput_lo"]) and one["throughput_verdict"] == ""  # one repeat: no interval


def test_older_rows_without_timestamps_read_their_own_timings():
    g = pd.DataFrame([{"run_id": "r", "repeat": 0, "batch_size": 1, "started_s": 0.0, "new_tokens": 3,
                       "prefill_s": 0.2, "wall_s": 1.0, "step_times": [0.2, 0.4, 0.4]}])
    s = serving_stats(g)
    assert s["ttft_ms"] == pytest.approx(200.0) and s["e2e_ms"] == pytest.approx(1000.0)
    assert s["tpot_ms"] == pytest.approx(400.0) and s["itl_p50_ms"] == pytest.approx(400.0)


def test_a_point_without_a_verdict_decides_nothing():
    assert stops_paying([(1, "faster"), (2, ""), (4, "slower")]) == "slower from B = 4"
    assert stops_paying([(1, ""), (2, "")]).startswith("— (repeats=1")
