"""The runner's summary table: one Markdown line per preset with each figure's spread."""

from __future__ import annotations

import math

import pandas as pd

from specbench.results.metrics import BASELINE, QUALITY_COLUMNS, with_preset


def _fmt(value, spec: str, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:{spec}}{suffix}"


def format_interval(value: float, lo: float = math.nan, hi: float = math.nan, std: float = math.nan,
                    spec: str = ".2f", suffix: str = "") -> str:
    """``1.54× ±0.03 [1.38, 1.71]``: the value, its spread over repeats (when there are several) and its
    interval (when there is one)."""
    text = _fmt(value, spec, suffix)
    if text == "—":
        return text
    if not _missing(std):
        text += f" ±{std:{spec}}"
    if not _missing(lo) and not _missing(hi):
        text += f" [{lo:{spec}}, {hi:{spec}}]"
    return text


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def format_table(summary: pd.DataFrame) -> str:
    """A Markdown table of a :func:`summarize` result, padded to fixed width.

    Key columns (model, dataset, temperature, device, dtype) are shown only
    when they vary; a method run with several parameter sets is labelled with
    its parameters. Throughputs are tokens/s. Speedup and τ carry ``±`` their
    standard deviation over repeats (with several repeats) and ``[lo, hi]``
    their 95% bootstrap interval over prompts (with several prompts); "vs AR"
    says whether the speedup's interval lies above 1.00 (faster), below it
    (slower) or contains it (no measurable change).
    """
    if summary.empty:
        return "(no results)"
    keys = [
        k
        for k in ("model", "dataset", "temperature", "device_name", "dtype")
        if k in summary.columns and summary[k].astype(str).nunique() > 1
    ]
    summary = with_preset(summary)
    variants = summary.groupby("preset")["method_params"].nunique() if "method_params" in summary else None
    header = [
        *keys,
        "preset",
        "n",
        "speedup",
        "vs AR",
        "τ",
        "acc. length",
        "acc. rate",
        "Mac-TP",
        "Mic-TP",
        "greedy match",
        "overhead ms/step",
    ]
    quality = [c for c in QUALITY_COLUMNS if c in summary.columns]
    header += quality
    lines = []
    for _, r in summary.iterrows():
        method = str(r["preset"])
        if variants is not None and variants.get(method, 1) > 1:
            method += f" {r['method_params']}"
        cells = (
            [str(r[k]) for k in keys]
            + [
                method,
                str(int(r["n_samples"])),
                format_interval(r["speedup"], r.get("speedup_lo"), r.get("speedup_hi"), r.get("speedup_std"),
                                suffix="×"),
                str(r.get("verdict") or "—") if r["method"] != BASELINE else "—",
                format_interval(r["tau"], r.get("tau_lo"), r.get("tau_hi"), r.get("tau_std")),
                _fmt(r.get("acceptance_length"), ".2f"),
                _fmt(r.get("acceptance_rate"), ".0%"),
                _fmt(r["mac_tp"], ".1f"),
                _fmt(r["mic_tp"], ".1f"),
                _fmt(r["greedy_match"], ".0%"),
                _fmt(r["overhead_ms_per_step"], ".2f"),
            ]
            + [_fmt(r[c], ".3f") for c in quality]
        )
        lines.append(cells)
    widths = [max(len(h), *(len(row[i]) for row in lines)) for i, h in enumerate(header)]

    def render(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([render(header), sep, *(render(c) for c in lines)])


STORE_COLUMNS = ["datastore", "datastore_tokens", "datastore_kind", "datastore_fingerprint"]


def stores_read(rows: pd.DataFrame) -> list[tuple[str, str, str, str]]:
    """``(method, preset, fingerprint, description)`` of each datastore the rows read, as the rows record it:
    name, size, refined or not, fingerprint, and how ``datastore: auto`` chose it (a fallback says so)."""
    if rows.empty or "datastore_fingerprint" not in rows.columns:
        return []
    rows = with_preset(rows.dropna(subset=["datastore_fingerprint"]))
    cols = ["method", "preset", *STORE_COLUMNS] + (["datastore_choice"] if "datastore_choice" in rows.columns else [])
    out = []
    for s in rows[cols].drop_duplicates().itertuples():
        choice = getattr(s, "datastore_choice", None)
        choice = f"; {choice}" if isinstance(choice, str) and choice else ""
        out.append((s.method, s.preset, s.datastore_fingerprint, f"{s.datastore} ({int(s.datastore_tokens):,} tokens, "
                    f"{s.datastore_kind}, fingerprint {s.datastore_fingerprint}{choice})"))
    return out
