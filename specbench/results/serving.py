"""Serving figures as serving engines define them (vLLM's ``bench serve``), from each request's timestamps.

A request arrives (``arrival_s``), waits for a slot, is prefilled (``started_s``), and its tokens come out at
the end of each step it shares (``step_ends_s``, the prefill's end first: its first token) until it finishes
(``finished_s``). All of them are on its batch's clock (:class:`specbench.core.clock.Clock`), which leaves
the harness's own work off. Per request:

* TTFT = first token − arrival (queueing and prefill);
* end-to-end latency (E2E) = finished − arrival;
* TPOT = (E2E − TTFT) / (tokens − 1), for requests of two tokens or more;
* ITL = the gaps between the request's successive steps (a step that yields several tokens is one gap,
  as a streamed chunk is).

Over a run (one method's requests of one repeat, sharing a clock): its span, first arrival to last finish;
request and output-token throughput over the span; occupancy, the time-weighted mean number of requests being
decoded, Σ (finished − started) / span. Rows decoded one request at a time, each on its own clock (batch size
1 outside a served run: ``request_rate`` NaN), have a span of Σ E2E, which is the same definition for a run
whose requests follow one another. Rows written before these timestamps existed are read with TTFT = the
prefill's seconds and E2E = the wall time.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from specbench.results.stats import bootstrap_interval, speedup_ratio, verdict

SERVING_COLUMNS = ("ttft_ms", "tpot_ms", "itl_p50_ms", "itl_p90_ms", "e2e_ms", "latency_p50_s", "latency_p90_s",
                   "request_throughput", "output_throughput", "occupancy")


def request_times(row) -> tuple[float, float, list[float], float]:
    """(arrival, first token, inter-token gaps, finish) of one result row, on its clock."""
    ends, prefill = getattr(row, "step_ends_s", None), _number(row, "prefill_s")
    if _has(ends):
        ends = [float(t) for t in ends]
        arrival = _number(row, "arrival_s", math.nan)
        return (ends[0] - prefill if math.isnan(arrival) else arrival), ends[0], list(np.diff(ends)), ends[-1]
    started = _number(row, "started_s")  # an older row: its own timings alone
    gaps = [float(t) for t in list(row.step_times)[1:]] if _has(getattr(row, "step_times", None)) else []
    return started, started + prefill, gaps, started + _number(row, "wall_s")


def _number(row, name: str, default: float = 0.0) -> float:
    value = getattr(row, name, default)
    return default if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _has(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value)) and len(value) > 0


def _requests(g: pd.DataFrame) -> pd.DataFrame:
    """One line per request: its run, repeat, whether it shares its run's clock (a served run; else it had
    one of its own: batch size 1 outside a served run), its timestamps, gaps and tokens."""
    times = [request_times(r) for r in g.itertuples()]
    shared = g["batch_size"].fillna(1).astype(int) > 1 if "batch_size" in g.columns else pd.Series(False, g.index)
    if "request_rate" in g.columns:
        shared = shared | g["request_rate"].notna()
    started = g["started_s"].astype(float).fillna(0.0) if "started_s" in g.columns else 0.0
    return pd.DataFrame({
        "run": g["run_id"].astype(str).to_numpy() if "run_id" in g.columns else "",
        "repeat": g["repeat"].to_numpy() if "repeat" in g.columns else 0,
        "shared": shared.to_numpy(), "arrival": [t[0] for t in times], "first": [t[1] for t in times],
        "gaps": [t[2] for t in times], "finish": [t[3] for t in times],
        "started": np.where(shared, started, [t[0] for t in times]),
        "tokens": g["new_tokens"].astype(float).to_numpy(),
    })


def run_spans(g: pd.DataFrame) -> pd.DataFrame:
    """Per run and repeat: output tokens, requests, the span (s) they were served in and the seconds requests
    were being decoded (Σ finished − started)."""
    req = _requests(g)
    out = []
    for (run, repeat, shared), part in req.groupby(["run", "repeat", "shared"], sort=True):
        span = (part["finish"].max() - part["arrival"].min()) if shared else (part["finish"] - part["arrival"]).sum()
        out.append({"run": run, "repeat": repeat, "tokens": float(part["tokens"].sum()), "requests": len(part),
                    "span": float(span), "busy": float((part["finish"] - part["started"]).sum())})
    return pd.DataFrame(out, columns=["run", "repeat", "tokens", "requests", "span", "busy"])


def serving_stats(g: pd.DataFrame) -> dict:
    """The serving figures of one summary row's requests (see the module's docstring)."""
    req = _requests(g)
    ttft, e2e = req["first"] - req["arrival"], req["finish"] - req["arrival"]
    many = req["tokens"] > 1
    tpot = ((req["finish"] - req["first"])[many] / (req["tokens"][many] - 1)).tolist()
    itl = [gap for gaps in req["gaps"] for gap in gaps]
    spans = run_spans(g)
    span = float(spans["span"].sum())

    def ms(values, q: float | None = None) -> float:
        values = list(values)
        if not values:
            return math.nan
        return 1000.0 * float(np.mean(values) if q is None else np.quantile(values, q))

    return {
        "ttft_ms": ms(ttft), "tpot_ms": ms(tpot), "itl_p50_ms": ms(itl, 0.5), "itl_p90_ms": ms(itl, 0.9),
        "e2e_ms": ms(e2e), "latency_p50_s": ms(e2e, 0.5) / 1000, "latency_p90_s": ms(e2e, 0.9) / 1000,
        "request_throughput": len(req) / span if span > 0 else math.nan,
        "output_throughput": float(spans["tokens"].sum()) / span if span > 0 else math.nan,
        "occupancy": float(spans["busy"].sum()) / span if span > 0 else math.nan,
    }


def throughput_ratio(mine: pd.DataFrame, base: pd.DataFrame) -> dict:
    """The method's output throughput over its span ÷ the baseline's, pooled over repeats, with a 95% bootstrap
    interval over repeats (each repeat's run against the baseline's of the same repeat) and its verdict."""
    a, b = run_spans(mine).groupby("repeat")[["tokens", "span"]].sum(), \
        run_spans(base).groupby("repeat")[["tokens", "span"]].sum()
    both = a.merge(b, left_index=True, right_index=True, suffixes=("_m", "_b"))
    if both.empty or not (both["span_m"] > 0).all():
        return {"throughput_speedup": math.nan, "throughput_lo": math.nan, "throughput_hi": math.nan,
                "throughput_verdict": ""}
    parts = {"m_tokens": both["tokens_m"], "m_seconds": both["span_m"], "b_tokens": both["tokens_b"],
             "b_seconds": both["span_b"]}
    lo, hi = bootstrap_interval(parts, speedup_ratio)
    return {"throughput_speedup": float(speedup_ratio(*(v.sum() for v in parts.values()))), "throughput_lo": lo,
            "throughput_hi": hi, "throughput_verdict": verdict(lo, hi)}
