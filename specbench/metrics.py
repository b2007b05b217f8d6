"""Metrics over result rows (the parquet schema of :mod:`specbench.results`).

One definition of every number, used for each row and for every table:

* τ = Σ new_tokens / Σ steps (the prefill counts as a step: autoregressive τ = 1);
* Mac-TP = mean over steps of tokens_i / time_i (a mean of per-step rates);
* Mic-TP = Σ tokens / Σ time (a pooled rate);
* speedup = Σ baseline wall_s / Σ method wall_s over the samples both have,
  measured on the same device, dtype and sampling settings.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

# A method row is compared with the baseline row that matches on all of these.
JOIN_KEYS = (
    "model",
    "dataset",
    "sample_id",
    "turn",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "max_new_tokens",
    "device_name",
    "dtype",
)
# One summary row per combination of these (absent columns are skipped).
GROUP_KEYS = (
    "model",
    "dataset",
    "preset",
    "method",
    "method_params",
    "temperature",
    "top_p",
    "top_k",
    "max_new_tokens",
    "device_name",
    "device",
    "attn_implementation",
    "dtype",
)
QUALITY_COLUMNS = ("rouge1", "rouge2", "rougeL", "accuracy", "pass")


def mac_tp(step_tokens: Sequence[float], step_times: Sequence[float]) -> float:
    """Macro throughput: mean over steps of tokens_i / time_i (tokens/s).

    Steps with a non-positive time are left out; NaN when no step remains.
    """
    tok = np.asarray(step_tokens, dtype=float)
    sec = np.asarray(step_times, dtype=float)
    keep = sec > 0
    return float(np.mean(tok[keep] / sec[keep])) if keep.any() else math.nan


def mic_tp(step_tokens: Sequence[float], step_times: Sequence[float]) -> float:
    """Micro throughput: Σ tokens_i / Σ time_i (tokens/s); NaN when Σ time is 0."""
    total = float(np.sum(np.asarray(step_times, dtype=float)))
    return float(np.sum(np.asarray(step_tokens, dtype=float))) / total if total > 0 else math.nan


def tau(new_tokens: float, steps: float) -> float:
    """Mean tokens per target forward: new_tokens / steps (NaN for 0 steps)."""
    return float(new_tokens) / float(steps) if steps else math.nan


def _concat(series: Iterable) -> np.ndarray:
    parts = [np.asarray(v, dtype=float) for v in series if v is not None]
    return np.concatenate(parts) if parts else np.zeros(0)


def _counts(series: Iterable) -> Counter:
    """Sum JSON-encoded (or dict) counters."""
    total: Counter = Counter()
    for v in series:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            continue
        total.update(json.loads(v) if isinstance(v, str) else dict(v))
    return total


def _same_ids(a, b) -> bool:
    return np.array_equal(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))


def _group_stats(g: pd.DataFrame) -> dict:
    tokens, times = _concat(g["step_tokens"]), _concat(g["step_times"])
    accepted = _concat(g["accepted_per_step"])
    decode_steps = len(accepted)
    stats = {
        "n_samples": len(g),
        "tau": tau(g["new_tokens"].sum(), g["steps"].sum()),
        "mean_accepted": float(accepted.mean()) if decode_steps else math.nan,
        "mac_tp": mac_tp(tokens, times),
        "mic_tp": mic_tp(tokens, times),
        "wall_s": float(g["wall_s"].sum()),
        "overhead_ms_per_step": (
            1000.0 * float(g["draft_overhead_s"].sum()) / decode_steps if decode_steps else math.nan
        ),
        "lookup_ms_per_step": (
            1000.0 * float(g["lookup_s"].sum()) / decode_steps
            if decode_steps and "lookup_s" in g.columns
            else math.nan
        ),
    }
    for col in QUALITY_COLUMNS:
        if col in g.columns:
            stats[col] = float(pd.to_numeric(g[col], errors="coerce").mean())
    return stats


def with_preset(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with a ``preset`` column everywhere (rows written before presets were recorded: the method)."""
    if df.empty or "method" not in df.columns:
        return df
    df = df.copy()
    if "preset" not in df.columns:
        df["preset"] = df["method"]
    else:
        df["preset"] = df["preset"].where(df["preset"].notna() & (df["preset"] != ""), df["method"])
    return df


def summarize(df: pd.DataFrame, baseline_method: str = "autoregressive", same_job: bool = False) -> pd.DataFrame:
    """One row per (model, dataset, preset, method, method_params, sampling settings, device, dtype).

    Rows without a ``preset`` column are grouped by method. With ``same_job``
    a method row is paired only with baseline rows of the same job (same
    ``config_hash``: the same results file, across resumes), so that a speedup
    never divides times measured in different runs.

    Columns: ``n_samples`` (rows); ``tau`` = Σ new_tokens / Σ steps;
    ``mean_accepted`` = mean over decode steps of draft tokens accepted;
    ``mac_tp`` = mean over all steps of all rows of tokens/time; ``mic_tp`` =
    Σ tokens / Σ time; ``wall_s`` = Σ wall time; ``speedup`` = Σ baseline wall_s
    / Σ method wall_s over the rows that have a baseline partner (same
    :data:`JOIN_KEYS`; several baseline rows for one key are averaged), 1.0 for
    the baseline itself; ``n_paired`` = rows in that join; ``greedy_match`` =
    at temperature 0, the fraction of paired rows whose output_ids equal the
    baseline's token for token (NaN when sampling or unpaired);
    ``overhead_ms_per_step`` = 1000 · Σ draft_overhead_s / Σ decode steps
    (steps after the prefill); plus the mean of any :data:`QUALITY_COLUMNS`.
    """
    if df.empty:
        return pd.DataFrame()
    df = with_preset(df)
    group_keys = [k for k in GROUP_KEYS if k in df.columns]
    join_keys = [k for k in JOIN_KEYS if k in df.columns]
    if same_job:
        if "config_hash" not in df.columns:
            raise ValueError("summarize(same_job=True) needs a config_hash column")
        join_keys.append("config_hash")
    base = df[df["method"] == baseline_method]
    base = (
        base.groupby(join_keys, dropna=False, sort=False)
        .agg(_base_wall_s=("wall_s", "mean"), _base_ids=("output_ids", "first"))
        .reset_index()
    )
    out = []
    for key, g in df.groupby(group_keys, dropna=False, sort=True):
        rec = dict(zip(group_keys, key, strict=True))
        rec.update(_group_stats(g))
        paired = g.merge(base, on=join_keys, how="inner")
        rec["n_paired"] = len(paired)
        if rec["method"] == baseline_method:
            rec["speedup"] = 1.0
        elif len(paired) and paired["wall_s"].sum() > 0:
            rec["speedup"] = float(paired["_base_wall_s"].sum() / paired["wall_s"].sum())
        else:
            rec["speedup"] = math.nan
        greedy = "temperature" in rec and rec["temperature"] == 0 and len(paired)
        rec["greedy_match"] = (
            float(
                np.mean(
                    [_same_ids(a, b) for a, b in zip(paired["output_ids"], paired["_base_ids"], strict=True)]
                )
            )
            if greedy
            else math.nan
        )
        out.append(rec)
    first = [
        *group_keys,
        "n_samples",
        "n_paired",
        "speedup",
        "tau",
        "mean_accepted",
        "mac_tp",
        "mic_tp",
        "greedy_match",
        "overhead_ms_per_step",
        "wall_s",
    ]
    res = pd.DataFrame(out)
    return res[first + [c for c in res.columns if c not in first]]


def acceptance_by_source(df: pd.DataFrame, by: Sequence[str] = ("method",)) -> pd.DataFrame:
    """Per ``by`` group and draft source: guesses drafted, accepted, and rate = accepted / drafted."""
    out = []
    for key, g in df.groupby(list(by), dropna=False, sort=True):
        drafted, accepted = _counts(g["drafted_by_source"]), _counts(g["accepted_by_source"])
        for src in sorted(set(drafted) | set(accepted)):
            d, a = drafted.get(src, 0), accepted.get(src, 0)
            out.append(
                {
                    **dict(zip(by, key, strict=True)),
                    "source": src,
                    "drafted": d,
                    "accepted": a,
                    "rate": a / d if d else math.nan,
                }
            )
    return pd.DataFrame(out, columns=[*by, "source", "drafted", "accepted", "rate"])


def acceptance_by_position(df: pd.DataFrame, by: Sequence[str] = ("method",)) -> pd.DataFrame:
    """Per ``by`` group and draft depth k (1 = first guess): accepted count and rate.

    rate = accepted at depth k / decode steps, i.e. the fraction of decode
    steps that accepted at least k guesses (accepted paths start at depth 1).
    """
    out = []
    for key, g in df.groupby(list(by), dropna=False, sort=True):
        counts = _counts(g["accepted_by_position"])
        decode_steps = len(_concat(g["accepted_per_step"]))
        for pos in sorted(counts, key=int):
            out.append(
                {
                    **dict(zip(by, key, strict=True)),
                    "position": int(pos),
                    "accepted": counts[pos],
                    "decode_steps": decode_steps,
                    "rate": counts[pos] / decode_steps if decode_steps else math.nan,
                }
            )
    return pd.DataFrame(out, columns=[*by, "position", "accepted", "decode_steps", "rate"])


def _fmt(value, spec: str, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:{spec}}{suffix}"


def format_table(summary: pd.DataFrame) -> str:
    """A Markdown table of a :func:`summarize` result, padded to fixed width.

    Key columns (model, dataset, temperature, device, dtype) are shown only
    when they vary; a method run with several parameter sets is labelled with
    its parameters. Throughputs are tokens/s.
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
        "τ",
        "Mac-TP",
        "Mic-TP",
        "mean accepted",
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
                _fmt(r["speedup"], ".2f", "×"),
                _fmt(r["tau"], ".2f"),
                _fmt(r["mac_tp"], ".1f"),
                _fmt(r["mic_tp"], ".1f"),
                _fmt(r["mean_accepted"], ".2f"),
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
