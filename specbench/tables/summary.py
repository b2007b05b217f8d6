"""``summary.md`` / ``summary.csv`` / ``summary.png`` of any results folder (:mod:`specbench.results.summary`),
with the paper's figures where the paper has the model, method, dataset and temperature (its Table 1), and the
summary as the site shows it (:func:`long_form`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from specbench.results.summary import format_summary, summary_frame
from specbench.tables.paper import METHOD_NAMES, MODEL_CODES


def published_lookup(paper: dict) -> Callable[[dict], tuple[float, float]]:
    """A summary row → the paper's (speedup, τ) for its model, method, dataset and temperature (NaN: none)."""
    t1 = paper.get("table1")
    cells = {} if t1 is None else {(r.model, r.method, r.dataset, float(r.temperature)): (float(r.speedup),
                                                                                          float(r.tau))
                                   for r in t1.itertuples()}

    def look(row: dict) -> tuple[float, float]:
        key = (MODEL_CODES.get(str(row["model"])), METHOD_NAMES.get(str(row["method"])), str(row["dataset"]),
               float(row.get("temperature", 0.0)))
        return cells.get(key, (math.nan, math.nan))

    return look


def write_summary(results: str | Path, out: str | Path, paper_dir: str | Path | None = None) -> list[Path]:
    """``summary.md`` and ``summary.csv`` of every row under ``results``, written to ``out``."""
    from specbench.results.rows import load_results
    from specbench.tables.paper import load_paper

    summary = summary_frame(load_results(results, quiet=True), published_lookup(load_paper(paper_dir)))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    md, csv = out / "summary.md", out / "summary.csv"
    figure = summary_figure(summary, out) if not summary.empty else []
    md.write_text(f"# Summary of {results}\n\n" + format_summary(summary) + "\n"
                  + ("\n![summary](summary.png)\n" if figure else ""))
    summary.to_csv(csv, index=False)
    return [md, csv, *figure]


METRICS = (("speedup", "speedup", "speedup_lo", "speedup_hi"), ("limit", "limit", "limit_lo", "limit_hi"),
           ("τ", "tau", "tau_lo", "tau_hi"),
           ("tokens/s", "tokens_per_s", "tokens_per_s_lo", "tokens_per_s_hi"),
           ("acc. length", "acceptance_length", None, None), ("acc. rate", "acceptance_rate", None, None),
           ("greedy match", "greedy_match", None, None))


def long_form(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary as the site's tables take it: one record per row × dataset × metric, with the paper's
    speedup and τ beside ours and their ratio."""
    records = []
    for r in summary.to_dict("records"):
        keys = {k: r[k] for k in ("model", "preset", "method", "temperature", "batch_size") if k in r}
        if r.get("engine"):  # an external engine's row (llama.cpp): marked as such
            keys["engine"] = r["engine"]
        for label, col, lo, hi in METRICS:
            if label == "limit" and not r.get("limit", math.nan) == r.get("limit", math.nan):
                continue  # no oracle ran beside it
            paper = {"speedup": r.get("paper_speedup"), "τ": r.get("paper_tau")}.get(label, math.nan)
            ours = r[col]
            records.append({**keys, "dataset": r["dataset"], "metric": label, "ours": ours,
                            "lo": r[lo] if lo else math.nan, "hi": r[hi] if hi else math.nan, "paper": paper,
                            "ratio": ours / paper if paper == paper and paper else math.nan})
    return pd.DataFrame(records)


def summary_figure(summary: pd.DataFrame, out: str | Path) -> list[Path]:
    """Speedup (with its interval) and τ per preset, one panel pair per dataset: ``summary.png`` and ``.pdf``."""
    from specbench.tables.figures import _empty_figure, _plt, _save

    out = Path(out)
    if summary.empty:
        return _save(_empty_figure("Summary", "no results"), out, "summary")
    plt = _plt()
    datasets = list(dict.fromkeys(summary["dataset"]))
    fig, axes = plt.subplots(len(datasets), 2, figsize=(11, 0.45 * summary.groupby("dataset").size().max() + 1.6),
                             squeeze=False)
    for row, dataset in zip(axes, datasets, strict=True):
        d = summary[summary["dataset"] == dataset]
        labels = [f"{p} ({m})" if len(set(d["model"])) > 1 else str(p) for p, m in zip(d["preset"], d["model"],
                                                                                       strict=True)]
        y = range(len(d))
        err = [(d["speedup"] - d["speedup_lo"]).clip(lower=0).fillna(0), (d["speedup_hi"] - d["speedup"]).clip(
            lower=0).fillna(0)]
        row[0].barh(y, d["speedup"], xerr=err, color="#4c72b0", capsize=3)
        row[0].axvline(1.0, color="grey", lw=1, ls="--")
        row[0].set_yticks(list(y), labels)
        row[0].set_title(f"{dataset}: speedup over its own job's baseline (95% interval)", fontsize=9)
        row[1].barh(y, d["tau"], color="#55a868")
        row[1].set_yticks(list(y), [""] * len(d))
        row[1].set_title(f"{dataset}: τ (tokens per target forward)", fontsize=9)
    fig.tight_layout()
    return _save(fig, out, "summary")
