"""The summary of any set of results: one row per model × dataset × preset (× temperature, batch size), each
method's speedup over the baseline of its own job, every figure with its interval, the paper's where it has one.

``specbench report summary --results DIR`` (``make summary RESULTS=DIR``) writes ``summary.md`` and
``summary.csv``; a sweep prints the table when it ends; ``make report`` and ``make site`` carry it for every
results folder. The columns are defined once, in :data:`LEGEND` (printed under the table, and in the README).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from specbench.results.metrics import BASELINE, QUALITY_COLUMNS, summarize, with_preset
from specbench.results.stats import bootstrap_interval
from specbench.results.table import _fmt, format_interval

KEYS = ("model", "dataset", "preset", "temperature", "batch_size", "request_rate", "max_concurrency")
LEGEND = {
    "prompts": "distinct prompts (samples of the dataset); a multi-turn prompt's turns count once",
    "gens": "generations recorded: prompts × turns × repeats",
    "speedup": "(Σ tokens / Σ seconds) of the preset ÷ the same of the autoregressive baseline run in the same "
               "job on the same prompts; ± spread over repeats, [95% bootstrap interval over prompts]",
    "vs AR": "faster or slower when that interval lies above or below 1.00, else no measurable change",
    "limit": "share of the limit: the speedup ÷ the oracle's on the same prompts (method=oracle drafts the true "
             "continuation, as many tokens a step as pay most on the measured cost curve: the best any drafter "
             "can reach here), [95% paired bootstrap interval over prompts]; — where no oracle ran",
    "τ": "new tokens ÷ target forwards, the prefill counted as one (autoregressive τ = 1.00), [interval]",
    "acc. length": "1 + accepted guesses per decode step (Spec-Bench's and vLLM's count)",
    "acc. rate": "accepted guesses ÷ drafted guesses",
    "tokens/s": "Σ new tokens ÷ Σ wall seconds (prefill included), [interval over prompts]",
    "Mac-TP": "the paper's throughput: mean over decode steps of tokens ÷ seconds (prefill left out)",
    "Mic-TP": "Σ tokens ÷ Σ seconds over decode steps (prefill left out)",
    "greedy match": "at temperature 0, the share of generations equal to the baseline's token for token",
    "draft ms/step": "the drafter's own milliseconds per decode step (proposing and updating)",
    "paper": "the SPECTRA paper's speedup and τ for this model, method, dataset and temperature (Table 1)",
    "quality": "rouge1, rouge2, rougeL (summaries), accuracy (GSM8K), pass (code): means over generations",
    "engine rows": "llama.cpp:<type>: an external engine (llama.cpp's server, engines=) on the same weights and "
                   "prompts; its speedup is over llama.cpp:ar, its own autoregressive run; its greedy match too",
}
COLUMNS = tuple(k for k in LEGEND if k not in ("quality", "engine rows"))
# The serving table, printed under the summary for batched runs and runs at a request rate (docs/batches.md).
SERVING_LEGEND = {
    "B": "batch size; rate: requests per second arriving (inf: all at once); C: the most requests in flight",
    "out tok/s": "output tokens per second over the runs' spans (first arrival to last finish)",
    "× AR": "that throughput ÷ the autoregressive baseline's at the same load, [95% interval over repeats]; "
            "faster or slower by that interval",
    "TTFT": "mean time to first token from arrival (ms); TPOT: mean (E2E − TTFT) / (tokens − 1) (ms)",
    "ITL p50/p90": "inter-token latency percentiles: gaps between a request's successive steps (ms)",
    "E2E": "mean end-to-end latency from arrival (ms); occupancy: mean requests being decoded",
}
SERVING = ("ttft_ms", "tpot_ms", "itl_p50_ms", "itl_p90_ms", "e2e_ms", "output_throughput", "request_throughput",
           "occupancy", "throughput_speedup", "throughput_lo", "throughput_hi", "throughput_verdict")


def _rate(g: pd.DataFrame) -> tuple[float, float, float]:
    """Σ tokens / Σ wall seconds of the rows, and its bootstrap interval over prompts."""
    seconds = float(g["wall_s"].sum())
    rate = float(g["new_tokens"].sum()) / seconds if seconds > 0 else math.nan
    per = g.groupby("sample_id", sort=False)[["new_tokens", "wall_s"]].sum()
    lo, hi = bootstrap_interval({"t": per["new_tokens"], "s": per["wall_s"]}, lambda t, s: t / s)
    return rate, lo, hi


def summary_frame(df: pd.DataFrame, published: Callable[[dict], tuple[float, float]] | None = None) -> pd.DataFrame:
    """:func:`specbench.results.metrics.summarize` of ``df`` with each preset paired with its own job's baseline
    (same ``config_hash``), cut to the summary's rows and figures; ``published``: a row's (model, method,
    dataset, temperature) → the paper's (speedup, τ), NaN where it has none (the ``paper`` column)."""
    if df.empty:
        return pd.DataFrame()
    df = with_preset(df)
    same_job = "config_hash" in df.columns
    full = summarize(df, same_job=same_job)
    keys = [k for k in KEYS if k in full.columns]
    rates = {}
    df = df.assign(batch_size=df["batch_size"].fillna(1).astype(int) if "batch_size" in df else 1)
    if "max_concurrency" in keys:  # as summarize reads them: older rows ran batch_size in flight
        df = df.assign(max_concurrency=(df["max_concurrency"].fillna(df["batch_size"]) if "max_concurrency" in df
                                        else df["batch_size"]).astype(int),
                       request_rate=df["request_rate"].astype(float) if "request_rate" in df else math.nan)
    for key, g in df.groupby([k for k in keys if k in df.columns], dropna=False, sort=False):
        rates[tuple(map(str, key if isinstance(key, tuple) else (key,)))] = _rate(g)
    rows = []
    for _, r in full.iterrows():
        key = tuple(str(r[k]) for k in keys)
        rate, lo, hi = rates.get(key, (math.nan, math.nan, math.nan))
        row = {k: r[k] for k in keys}
        row.update(method=r["method"], engine=r.get("engine", ""), prompts=int(r["n_prompts"]), gens=int(r["n_samples"]),
                   speedup=r["speedup"], speedup_lo=r["speedup_lo"], speedup_hi=r["speedup_hi"],
                   speedup_std=r["speedup_std"], verdict=r["verdict"] if r["method"] != BASELINE else "",
                   limit=r["limit"], limit_lo=r["limit_lo"], limit_hi=r["limit_hi"],
                   tau=r["tau"], tau_lo=r["tau_lo"], tau_hi=r["tau_hi"], tau_std=r.get("tau_std", math.nan),
                   acceptance_length=r["acceptance_length"], acceptance_rate=r["acceptance_rate"],
                   tokens_per_s=rate, tokens_per_s_lo=lo, tokens_per_s_hi=hi, mac_tp=r["mac_tp"],
                   mic_tp=r["mic_tp"], greedy_match=r["greedy_match"], draft_ms_per_step=r["overhead_ms_per_step"])
        row.update({c: r[c] for c in QUALITY_COLUMNS if c in r})
        row.update({c: r[c] for c in SERVING if c in r})
        row["paper_speedup"], row["paper_tau"] = published(row) if published else (math.nan, math.nan)
        rows.append(row)
    out = pd.DataFrame(rows)
    order = [k for k in ("model", "dataset", "temperature", "batch_size", "request_rate", "max_concurrency")
             if k in out.columns]
    return out.sort_values(order + ["speedup"], ascending=[True] * len(order) + [False], kind="stable",
                           ignore_index=True)


def format_summary(summary: pd.DataFrame, legend: bool = True) -> str:
    """The summary as a Markdown table (key columns shown when they vary), with :data:`LEGEND` under it."""
    if summary.empty:
        return "(no results)"
    varying = [k for k in ("model", "dataset", "temperature", "batch_size", "request_rate", "max_concurrency")
               if k in summary.columns and summary[k].astype(str).nunique() > 1]
    paper = summary["paper_speedup"].notna().any()
    quality = [c for c in QUALITY_COLUMNS if c in summary.columns and summary[c].notna().any()]
    header = [*varying, "preset", *[c for c in COLUMNS if c != "paper" or paper], *quality]
    lines = []
    for _, r in summary.iterrows():
        cells = [str(r[k]) for k in varying] + [
            str(r["preset"]), str(r["prompts"]), str(r["gens"]),
            format_interval(r["speedup"], r["speedup_lo"], r["speedup_hi"], r["speedup_std"], suffix="×"),
            str(r["verdict"] or "—"),
            format_interval(r["limit"], r["limit_lo"], r["limit_hi"], spec=".0%"),
            format_interval(r["tau"], r["tau_lo"], r["tau_hi"], r["tau_std"]),
            _fmt(r["acceptance_length"], ".2f"), _fmt(r["acceptance_rate"], ".0%"),
            format_interval(r["tokens_per_s"], r["tokens_per_s_lo"], r["tokens_per_s_hi"], spec=".1f"),
            _fmt(r["mac_tp"], ".1f"), _fmt(r["mic_tp"], ".1f"),
            _fmt(r["greedy_match"], ".0%"), _fmt(r["draft_ms_per_step"], ".2f"),
        ]
        if paper:
            cells.append("—" if np.isnan(r["paper_speedup"]) else f"{r['paper_speedup']:.2f}× τ {r['paper_tau']:.2f}")
        cells += [_fmt(r[c], ".3f") for c in quality]
        lines.append(cells)
    widths = [max(len(h), *(len(row[i]) for row in lines)) for i, h in enumerate(header)]

    def render(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    text = "\n".join([render(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(render, lines)])
    engines = "engine" in summary.columns and (summary["engine"].fillna("") != "").any()
    named = [h for h in header if h in LEGEND] + (["quality"] if quality else []) + (["engine rows"] if engines else [])
    text += "\n\n" + format_legend(named) if legend else ""
    served = format_serving(summary, legend)
    return text + ("\n\n" + served if served else "")


def format_serving(summary: pd.DataFrame, legend: bool = True) -> str:
    """The serving figures of the batched and rate-driven rows (none: ""), with :data:`SERVING_LEGEND`."""
    if "output_throughput" not in summary.columns:
        return ""
    rate = summary["request_rate"].astype(float) if "request_rate" in summary.columns else None
    served = summary[(summary["batch_size"].astype(int) > 1) | (rate.notna() if rate is not None else False)]
    if served.empty:
        return ""
    header = ["preset", "B", "rate", "C", "out tok/s", "× AR", "vs AR", "TTFT", "TPOT", "ITL p50/p90", "E2E",
              "occupancy"]
    lines = []
    for _, r in served.iterrows():
        base = r["method"] == BASELINE
        lines.append([str(r["preset"]), str(int(r["batch_size"])), _fmt(r.get("request_rate"), "g"),
                      str(int(r["max_concurrency"])) if not pd.isna(r.get("max_concurrency")) else "—",
                      _fmt(r["output_throughput"], ".1f"),
                      "—" if base else format_interval(r["throughput_speedup"], r["throughput_lo"], r["throughput_hi"],
                                                       suffix="×"),
                      "—" if base else (r["throughput_verdict"] or "—"), _fmt(r["ttft_ms"], ".0f"),
                      _fmt(r["tpot_ms"], ".1f"), f"{_fmt(r['itl_p50_ms'], '.1f')} / {_fmt(r['itl_p90_ms'], '.1f')}",
                      _fmt(r["e2e_ms"], ".0f"), _fmt(r["occupancy"], ".2f")])
    widths = [max(len(h), *(len(row[i]) for row in lines)) for i, h in enumerate(header)]

    def render(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    text = "\n".join([render(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(render, lines)])
    return text + ("\n\n" + "\n".join(f"- {k}: {v}" for k, v in SERVING_LEGEND.items()) if legend else "")


def format_legend(columns: list[str] | None = None) -> str:
    """One line per column: what it counts."""
    return "\n".join(f"- {c}: {LEGEND[c]}" for c in (columns or COLUMNS))
