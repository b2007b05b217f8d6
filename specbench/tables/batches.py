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
    baseline, when there is one."""
    even = next((b for b, v in points if v != "faster"), None)
    slower = next((b for b, v in points if v == "slower"), None)
    if even is None:
        return f"pays up to B = {points[-1][0]}" if points else "—"
    if slower == even:
        return f"slower from B = {slower}"
    said = f"no measurable gain from B = {even}"
    return said if slower is None else f"{said}, slower from B = {slower}"


def batch_sweep(df: pd.DataFrame, paper: dict | None = None, compare: dict[str, str] | None = None) -> Table:
    """Speedup (with its 95% interval over prompts) and throughput per method and batch size, and where each
    method stops paying."""
    s = our_summary(df)
    records, rows = [], []
    ours = s[s["method"] != BASELINE] if not s.empty else s
    sizes = sorted(int(b) for b in set(ours["batch_size"])) if not ours.empty else []
    for (model, dataset, preset), g in (ours.groupby(["model", "dataset", "preset"], sort=True) if sizes else []):
        by_size = {int(r["batch_size"]): r for _, r in g.iterrows()}
        line, points = [model, dataset, preset], []
        for b in sizes:
            r = by_size.get(b)
            if r is None:
                line.append("—")
                continue
            lo, hi = float(r["speedup_lo"]), float(r["speedup_hi"])
            cell = fmt(float(r["speedup"])) + ("" if _missing(lo) else f" [{fmt(lo)}, {fmt(hi)}]")
            line.append(cell)
            points.append((b, str(r["verdict"])))
            for metric in ("speedup", "speedup_lo", "speedup_hi", "throughput", "throughput_speedup", "tau",
                           "latency_p50_s", "latency_p90_s"):
                v = float(r[metric]) if metric in r and not _missing(r[metric]) else math.nan
                records.append(dict(model=model, dataset=dataset, preset=preset, batch_size=b, metric=metric,
                                    ours=v, paper=math.nan))
        line.append(stops_paying(points))
        rows.append(line)
    header = ["model", "dataset", "preset", *[f"B = {b}" for b in sizes], "stops paying"]
    notes = [
        "Not a paper table: every paper measures batch size 1. A cell is the speedup over autoregressive decoding "
        "at the same batch size, in the same job, on the same samples (tokens per second of each request, pooled "
        "over requests), with its 95% bootstrap interval over prompts; `throughput_speedup` in the CSV is the "
        "ratio of tokens per second over each batch's span. A method stops paying at the first batch size "
        "whose interval no longer lies above 1; the column also names the first that is measurably slower.",
        ACROSS_MACHINES,
        f"Ours measured on: {_machines(df)}.",
    ]
    return Table("batch_sweep", "Speedup against batch size", [("", header, rows)], notes, _long(records))


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


def batch_speedup(df: pd.DataFrame, out: Path) -> list[Path]:
    """Speedup (95% interval over prompts) against batch size, a line per method, a panel per dataset."""
    s = our_summary(df)

    def draw(ax, p, style, label):
        err = np.array([p["speedup"] - p["speedup_lo"], p["speedup_hi"] - p["speedup"]]).clip(min=0)
        ax.errorbar(p["batch_size"], p["speedup"], yerr=np.nan_to_num(err), marker=style[0], linestyle=style[1],
                    capsize=3, label=label)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xscale("log", base=2)

    ours = s[s["method"] != BASELINE] if not s.empty else s
    return _figure(ours, out, "batch_speedup", "Speedup against batch size",
                   ("batch size", "speedup over autoregressive"), draw)


def batch_latency(df: pd.DataFrame, out: Path) -> list[Path]:
    """Throughput against median request latency, a line per method (the baseline too), a point per batch size."""

    def draw(ax, p, style, label):
        ax.plot(p["latency_p50_s"], p["throughput"], marker=style[0], linestyle=style[1], label=label)
        for _, r in p.iterrows():
            ax.annotate(f"{int(r['batch_size'])}", (r["latency_p50_s"], r["throughput"]), fontsize=6,
                        xytext=(3, 3), textcoords="offset points")

    return _figure(our_summary(df), out, "batch_latency", "Throughput against latency",
                   ("median request latency (s)", "throughput (tokens/s)"), draw)


BATCH_FIGURES = {"batch_speedup": batch_speedup, "batch_latency": batch_latency}
