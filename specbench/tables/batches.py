"""Batch sizes: where each method stops paying as requests are decoded together (not a paper table: every
paper measures batch size 1): the table, speedup against batch size, and throughput against latency."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from specbench.results.metrics import BASELINE
from specbench.tables.figures import STYLES, _empty_figure, _plt, _save
from specbench.tables.render import ACROSS_MACHINES, Table, _long, _machines, _missing, fmt, our_summary


def stops_paying(points: list[tuple[int, str]]) -> str:
    """Where a method stops paying, from its (batch size, verdict) points in ascending batch size: the first
    batch size whose interval no longer lies above 1, and the first that is measurably slower than the
    baseline, when there is one. A point without a verdict (one repeat: no interval) decides nothing."""
    known = [(b, v) for b, v in points if v]
    even = next((b for b, v in known if v != "faster"), None)
    slower = next((b for b, v in known if v == "slower"), None)
    if not known:
        return "— (repeats=1: no interval over repeats)" if points else "—"
    if even is None:
        return f"pays up to B = {known[-1][0]}"
    if slower == even:
        return f"slower from B = {slower}"
    said = f"no measurable gain from B = {even}"
    return said if slower is None else f"{said}, slower from B = {slower}"


def _cell(r, value: str, lo: str, hi: str) -> str:
    low, high = float(r[lo]), float(r[hi])
    return fmt(float(r[value])) + ("" if _missing(low) else f" [{fmt(low)}, {fmt(high)}]")


METRICS = ("throughput_speedup", "throughput_lo", "throughput_hi", "speedup", "speedup_lo", "speedup_hi",
           "output_throughput", "request_throughput", "ttft_ms", "tpot_ms", "itl_p50_ms", "itl_p90_ms", "e2e_ms",
           "latency_p50_s", "latency_p90_s", "occupancy", "tau")


def batch_sweep(df: pd.DataFrame, paper: dict | None = None, compare: dict[str, str] | None = None) -> Table:
    """Per method and batch size: the throughput ratio over the runs' spans (with its 95% interval over
    repeats), which decides where each method stops paying, and the per-request speedup beside it."""
    s = our_summary(df)
    records, rows = [], []
    ours = s[s["method"] != BASELINE] if not s.empty else s
    if not ours.empty and "request_rate" in ours.columns:  # the batch-size sweep: requests all at once
        ours = ours[ours["request_rate"].isna() | np.isinf(ours["request_rate"].astype(float))]
    sizes = sorted(int(b) for b in set(ours["batch_size"])) if not ours.empty else []
    for (model, dataset, preset), g in (ours.groupby(["model", "dataset", "preset"], sort=True) if sizes else []):
        by_size = {int(r["batch_size"]): r for _, r in g.iterrows()}
        line, per_request, points = [model, dataset, preset], [], []
        for b in sizes:
            r = by_size.get(b)
            if r is None:
                line.append("—")
                per_request.append("—")
                continue
            line.append(_cell(r, "throughput_speedup", "throughput_lo", "throughput_hi"))
            per_request.append(_cell(r, "speedup", "speedup_lo", "speedup_hi"))
            points.append((b, str(r.get("throughput_verdict") or "")))
            for metric in METRICS:
                v = float(r[metric]) if metric in r and not _missing(r[metric]) else math.nan
                records.append(dict(model=model, dataset=dataset, preset=preset, batch_size=b, metric=metric,
                                    ours=v, paper=math.nan))
        rows.append([*line, stops_paying(points), " · ".join(per_request)])
    header = ["model", "dataset", "preset", *[f"B = {b}" for b in sizes], "stops paying",
              "per-request speedup (B = " + ", ".join(map(str, sizes)) + ")"]
    notes = [
        "Not a paper table: every paper measures batch size 1. A cell is the throughput ratio: output tokens per "
        "second over the runs' spans (first arrival to last finish, requests all at once, the harness's own "
        "writing off the clock) ÷ the autoregressive baseline's at the same batch size, in the same job, on the "
        "same samples, pooled over repeats, with its 95% bootstrap interval over repeats. A method stops paying at "
        "the first batch size whose interval no longer lies above 1; the column also names the first that is "
        "measurably slower. The last column is each request's own speedup (its tokens per second while it "
        "decoded, pooled), which leaves out the time it waits while others prefill and the drain tail.",
        ACROSS_MACHINES,
        f"Ours measured on: {_machines(df)}.",
    ]
    return Table("batch_sweep", "Throughput against batch size", [("", header, rows)], notes, _long(records))


def _panels(summary: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    return [(f"{model}, {dataset}", g) for (model, dataset), g in summary.groupby(["model", "dataset"], sort=True)]


def _figure(summary: pd.DataFrame, out: Path, name: str, title: str, axes_labels: tuple[str, str], draw) -> list[Path]:
    """A panel per model and dataset, a line per preset (``draw(ax, rows by batch size, style, label)``)."""
    if summary.empty:
        return _save(_empty_figure(title, "no batched results yet: make batch_sweep"), out, name)
    plt = _plt()
    panels = _panels(summary)
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    for ax, (panel, g) in zip(axes[0], panels, strict=True):
        for i, (preset, p) in enumerate(g.groupby("preset", sort=True)):
            draw(ax, p.sort_values("batch_size"), STYLES[i % len(STYLES)], preset)
        ax.set_xlabel(axes_labels[0])
        ax.set_ylabel(axes_labels[1])
        ax.set_title(panel)
        ax.legend(fontsize=7)
    return _save(fig, out, name)


def _all_at_once(s: pd.DataFrame) -> pd.DataFrame:
    if s.empty or "request_rate" not in s.columns:
        return s
    rate = s["request_rate"].astype(float)
    return s[rate.isna() | np.isinf(rate)]


def batch_speedup(df: pd.DataFrame, out: Path) -> list[Path]:
    """The throughput ratio (95% interval over repeats) against batch size, a line per method, a panel per
    dataset."""
    s = _all_at_once(our_summary(df))

    def draw(ax, p, style, label):
        err = np.array([p["throughput_speedup"] - p["throughput_lo"],
                        p["throughput_hi"] - p["throughput_speedup"]]).clip(min=0)
        ax.errorbar(p["batch_size"], p["throughput_speedup"], yerr=np.nan_to_num(err), marker=style[0],
                    linestyle=style[1], capsize=3, label=label)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xscale("log", base=2)

    ours = s[s["method"] != BASELINE] if not s.empty else s
    return _figure(ours, out, "batch_speedup", "Throughput ratio against batch size",
                   ("batch size", "throughput ÷ autoregressive's"), draw)


def batch_latency(df: pd.DataFrame, out: Path) -> list[Path]:
    """Throughput against median request latency, a line per method (the baseline too), a point per batch size."""

    def draw(ax, p, style, label):
        ax.plot(p["latency_p50_s"], p["output_throughput"], marker=style[0], linestyle=style[1], label=label)
        for _, r in p.iterrows():
            ax.annotate(f"{int(r['batch_size'])}", (r["latency_p50_s"], r["output_throughput"]), fontsize=6,
                        xytext=(3, 3), textcoords="offset points")

    return _figure(_all_at_once(our_summary(df)), out, "batch_latency", "Throughput against latency",
                   ("median end-to-end latency (s)", "output throughput (tokens/s)"), draw)


def batch_load(df: pd.DataFrame, out: Path) -> list[Path]:
    """Median end-to-end latency against the request rate offered (requests arriving at a rate), a line per
    method (the baseline too) and batch size."""
    s = our_summary(df)
    if not s.empty and "request_rate" in s.columns:
        rate = s["request_rate"].astype(float)
        s = s[rate.notna() & ~np.isinf(rate)].assign(preset=lambda f: f["preset"] + " B=" + f["batch_size"].astype(str))
    else:
        s = s.iloc[:0]

    def draw(ax, p, style, label):
        p = p.sort_values("request_rate")
        ax.plot(p["request_rate"], p["latency_p50_s"], marker=style[0], linestyle=style[1], label=label)

    return _figure(s, out, "batch_load", "Latency against load", ("request rate (requests/s)",
                                                                   "median end-to-end latency (s)"), draw)


BATCH_FIGURES = {"batch_speedup": batch_speedup, "batch_latency": batch_latency, "batch_load": batch_load}
