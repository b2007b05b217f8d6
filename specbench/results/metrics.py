"""Metrics over result rows (the parquet schema of :mod:`specbench.results`).

One definition of every number, used for each row and for every table:

* τ = Σ new_tokens / Σ steps (SPECTRA's and Lookahead's count: the prefill is a
  step, so autoregressive τ = 1);
* acceptance length = 1 + accepted guesses per decode step (Spec-Bench's "mean
  accepted tokens", vLLM's "acceptance length": the prefill is not a step);
  acceptance rate = accepted guesses / drafted guesses; acceptance at depth d =
  decode steps that kept ≥ d guesses / decode steps that drafted depth d (vLLM).
  All come from the per-step lists ``accepted_per_step`` and ``step_depth``;
* Mac-TP = mean over decode steps of tokens_i / time_i (the paper's mean of
  per-step rates); Mic-TP = Σ tokens / Σ time over decode steps (a pooled
  rate). Both leave the prefill out; speedup does not;
* speedup = (Σ method new_tokens / Σ method wall_s) ÷ (Σ baseline new_tokens /
  Σ baseline wall_s) over paired samples (same prompt, turn and repeat, same
  device, dtype and sampling settings): a token-rate ratio, right also when the
  two outputs differ in length (sampling, bf16); for identical outputs it is
  Σ baseline wall_s / Σ method wall_s. Its spread: the standard deviation of
  the per-repeat ratios, and a 95% paired bootstrap interval over prompts
  (prompts resampled with their turns and repeats, the ratio recomputed).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from specbench.results import stats as spread
from specbench.results.serving import serving_stats, throughput_ratio
from specbench.results.stats import bootstrap_interval, share_interval, speedup_ratio, verdict

# The method every other one is measured against, by its registered name.
BASELINE = "autoregressive"
# The drafter that knows the answer (methods/oracle.py): every speedup is also read as a share of its speedup.
ORACLE = "oracle"
# A peer engine's rows (column ``engine``: llama.cpp) pair with its own autoregressive run, ``<engine>:ar``.
ENGINE_BASELINE = ":ar"
# A method row is compared with the baseline row that matches on all of these.
JOIN_KEYS = ("engine", "model", "dataset", "sample_id", "turn", "temperature", "top_p", "top_k", "seed",
             "max_new_tokens", "device_name", "dtype", "batch_size", "request_rate", "max_concurrency", "forward")
# One summary row per combination of these (absent columns are skipped).
GROUP_KEYS = ("engine", "model", "dataset", "preset", "method", "method_params", "temperature", "top_p", "top_k",
              "max_new_tokens", "device_name", "device", "attn_implementation", "dtype", "batch_size", "request_rate",
              "max_concurrency", "forward")
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


def _decode(series: Iterable) -> np.ndarray:
    """Per-step values of every row with each row's first entry (the prefill) left out."""
    return _concat(np.asarray(v, dtype=float)[1:] for v in series if v is not None)


def _group_stats(g: pd.DataFrame) -> dict:
    tokens, times = _decode(g["step_tokens"]), _decode(g["step_times"])
    accepted = _concat(g["accepted_per_step"])
    decode_steps = len(accepted)
    drafted = float(_decode(g["step_drafted"]).sum()) if "step_drafted" in g.columns else math.nan
    per_prompt = g.groupby("sample_id", sort=False)[["new_tokens", "steps"]].sum()
    tau_lo, tau_hi = bootstrap_interval(
        {"tokens": per_prompt["new_tokens"], "steps": per_prompt["steps"]}, lambda tokens, steps: tokens / steps
    )
    repeats = g.groupby("repeat")[["new_tokens", "steps"]].sum() if "repeat" in g.columns else None
    stats = {
        "n_samples": len(g),
        "n_prompts": len(per_prompt),
        "n_repeats": len(repeats) if repeats is not None else 1,
        "tau": tau(g["new_tokens"].sum(), g["steps"].sum()),
        "tau_lo": tau_lo,
        "tau_hi": tau_hi,
        "tau_std": spread.std(list(repeats["new_tokens"] / repeats["steps"])) if repeats is not None else math.nan,
        "mean_accepted": float(accepted.mean()) if decode_steps else math.nan,
        "acceptance_length": 1 + float(accepted.mean()) if decode_steps else math.nan,
        "acceptance_rate": (float(accepted.sum()) / drafted if drafted and drafted == drafted
                            else _totals_rate(g) if "drafted_by_source" in g.columns else math.nan),
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


def _totals_rate(g: pd.DataFrame) -> float:  # rows without per-step lists (a peer engine's): their totals
    drafted = sum(_counts(g["drafted_by_source"]).values())
    return sum(_counts(g["accepted_by_source"]).values()) / drafted if drafted else math.nan


def _speedup_stats(paired: pd.DataFrame) -> dict:
    """Speedup of paired rows (method columns + ``_base_*``): pooled, per repeat, bootstrapped over prompts."""
    cols = {"m_tokens": "new_tokens", "m_seconds": "wall_s", "b_tokens": "_base_tokens", "b_seconds": "_base_wall_s"}
    nan = {"speedup": math.nan, "speedup_lo": math.nan, "speedup_hi": math.nan, "speedup_std": math.nan,
           "speedup_wall": math.nan, "verdict": ""}
    if not len(paired) or paired["wall_s"].sum() <= 0:
        return nan
    sums = {k: float(paired[c].sum()) for k, c in cols.items()}
    per_prompt = paired.groupby("sample_id", sort=False)[list(cols.values())].sum()
    lo, hi = bootstrap_interval({k: per_prompt[c] for k, c in cols.items()}, speedup_ratio)
    per_repeat = paired.groupby("repeat")[list(cols.values())].sum() if "repeat" in paired.columns else None
    std = (
        spread.std(list(speedup_ratio(*(per_repeat[c] for c in cols.values()))))
        if per_repeat is not None
        else math.nan
    )
    return {
        "speedup": float(speedup_ratio(**sums)),
        "speedup_lo": lo,
        "speedup_hi": hi,
        "speedup_std": std,
        "speedup_wall": sums["b_seconds"] / sums["m_seconds"],  # the time ratio alone: earlier versions' figure
        "verdict": verdict(lo, hi),
    }


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


def summarize(df: pd.DataFrame, baseline_method: str = BASELINE, same_job: bool = False) -> pd.DataFrame:
    """One row per (model, dataset, preset, method, method_params, sampling settings, device, dtype).

    Rows without a ``preset`` column are grouped by method; rows without a
    ``repeat`` column are repeat 0. With ``same_job`` a method row is paired
    only with baseline rows of the same job (same ``config_hash``: the same
    results file, across resumes), so that a speedup never divides times
    measured in different runs.

    Columns: ``n_samples`` (rows), ``n_prompts`` (distinct samples),
    ``n_repeats``; ``tau`` = Σ new_tokens / Σ steps, with ``tau_lo``/``tau_hi``
    (95% bootstrap interval over prompts) and ``tau_std`` (over repeats);
    ``mean_accepted`` = mean over decode steps of guesses accepted;
    ``acceptance_length`` = 1 + that; ``acceptance_rate`` = Σ accepted / Σ
    drafted guesses; ``mac_tp`` = mean over decode steps of tokens/time;
    ``mic_tp`` = Σ tokens / Σ time over decode steps; ``wall_s`` = Σ wall time;
    ``speedup`` = (Σ method new_tokens / Σ method wall_s) ÷ (Σ baseline
    new_tokens / Σ baseline wall_s) over the rows that have a baseline partner
    (same :data:`JOIN_KEYS` and repeat; several baseline rows for one key are
    averaged), 1.0 for the baseline itself, with ``speedup_lo``/``speedup_hi``
    (95% paired bootstrap interval over prompts), ``speedup_std`` (over
    repeats), ``speedup_wall`` (Σ baseline wall_s / Σ method wall_s, the
    figure of earlier versions: equal to ``speedup`` when the outputs have
    equal lengths) and ``verdict`` (faster, slower, or no measurable change:
    the interval contains 1.00); ``n_paired`` = rows in that join;
    ``greedy_match`` = at temperature 0, the fraction of paired rows whose
    output_ids equal the baseline's token for token (NaN when sampling or
    unpaired); ``overhead_ms_per_step`` = 1000 · Σ draft_overhead_s / Σ decode
    steps; plus the mean of any :data:`QUALITY_COLUMNS`. Serving figures (one ``batch_size``, ``request_rate``
    and ``max_concurrency`` per row; rows written before batches existed are batch size 1):
    :data:`specbench.results.serving.SERVING_COLUMNS` as vLLM's ``bench serve`` defines them, and
    ``throughput_speedup`` (output tokens per second over the runs' spans ÷ the baseline's at the same load)
    with ``throughput_lo``/``throughput_hi`` (95% bootstrap interval over repeats) and ``throughput_verdict``.
    """
    if df.empty:
        return pd.DataFrame()
    df = with_preset(df)
    if "repeat" not in df.columns:
        df["repeat"] = 0
    df["repeat"] = df["repeat"].fillna(0).astype(int)
    df["batch_size"] = df["batch_size"].fillna(1).astype(int) if "batch_size" in df.columns else 1
    df["engine"] = df["engine"].fillna("").astype(str) if "engine" in df.columns else ""
    df["request_rate"] = df["request_rate"].astype(float) if "request_rate" in df.columns else math.nan
    df["max_concurrency"] = (df["max_concurrency"].fillna(df["batch_size"]) if "max_concurrency" in df.columns
                             else df["batch_size"]).astype(int)
    group_keys = [k for k in GROUP_KEYS if k in df.columns]
    join_keys = [k for k in JOIN_KEYS if k in df.columns] + ["repeat"]
    if same_job:
        if "config_hash" not in df.columns:
            raise ValueError("summarize(same_job=True) needs a config_hash column")
        join_keys.append("config_hash")
    is_base = (df["method"] == baseline_method) | ((df["engine"] != "") & (df["method"] == df["engine"] + ENGINE_BASELINE))
    base = df[is_base]
    base = (
        base.groupby(join_keys, dropna=False, sort=False)
        .agg(
            _base_wall_s=("wall_s", "mean"),
            _base_tokens=("new_tokens", "mean"),
            _base_ids=("output_ids", "first"),
        )
        .reset_index()
    )
    out, per_prompt = [], []
    served = [k for k in group_keys if k not in ("preset", "method", "method_params")]
    bases = {_key(dict(zip(served, key, strict=True)), served): g
             for key, g in df[is_base].groupby(served, dropna=False, sort=False)} if served else {}
    for key, g in df.groupby(group_keys, dropna=False, sort=True):
        rec = dict(zip(group_keys, key, strict=True))
        rec.update(_group_stats(g))
        rec.update(serving_stats(g))
        paired = g.merge(base, on=join_keys, how="inner")
        per_prompt.append(paired.groupby("sample_id", sort=False)[list(_PAIR_COLUMNS.values())].sum())
        rec["n_paired"] = len(paired)
        if rec["method"] in (baseline_method, rec["engine"] + ENGINE_BASELINE):
            rec.update(speedup=1.0, speedup_lo=math.nan, speedup_hi=math.nan, speedup_std=math.nan,
                       speedup_wall=1.0, verdict="", throughput_speedup=1.0, throughput_lo=math.nan,
                       throughput_hi=math.nan, throughput_verdict="")
        else:
            rec.update(_speedup_stats(paired))
            rec.update(throughput_ratio(g, bases.get(_key(rec, served), g.iloc[:0])))
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
    first = [*group_keys, *"""n_samples n_prompts n_repeats n_paired speedup speedup_lo speedup_hi speedup_std verdict tau tau_lo
        tau_hi acceptance_length acceptance_rate mean_accepted mac_tp mic_tp greedy_match
        overhead_ms_per_step wall_s""".split()]
    res = pd.DataFrame(out)
    res = _limits(res, per_prompt, group_keys, baseline_method)
    return res[first + [c for c in res.columns if c not in first]]


def _key(rec: dict, keys: list[str]) -> tuple:
    return tuple(str(rec[k]) for k in keys)


_PAIR_COLUMNS = {"m_tokens": "new_tokens", "m_seconds": "wall_s", "b_tokens": "_base_tokens",
                 "b_seconds": "_base_wall_s"}


def _limits(res: pd.DataFrame, per_prompt: list[pd.DataFrame], group_keys: list[str], baseline_method: str
            ) -> pd.DataFrame:
    """``limit``: each row's speedup ÷ that of the :data:`ORACLE` row of the same keys (model, dataset, sampling,
    device, dtype, …), ``limit_lo``/``limit_hi`` its paired bootstrap over the prompts both ran; NaN without one."""
    keys = [k for k in group_keys if k not in ("preset", "method", "method_params", "engine")]
    res = res.assign(limit=math.nan, limit_lo=math.nan, limit_hi=math.nan)
    oracles = {tuple(str(r[k]) for k in keys): i for i, r in res.iterrows() if r["method"] == ORACLE}
    for i, r in res.iterrows():
        o = oracles.get(tuple(str(r[k]) for k in keys))
        if o is None or r["method"] in (baseline_method, r["engine"] + ENGINE_BASELINE) or not res.at[o, "speedup"] > 0:
            continue
        common = per_prompt[i].index.intersection(per_prompt[o].index)
        mine, best = ({k: p.loc[common, c] for k, c in _PAIR_COLUMNS.items()} for p in (per_prompt[i], per_prompt[o]))
        res.at[i, "limit"] = r["speedup"] / res.at[o, "speedup"]
        res.at[i, "limit_lo"], res.at[i, "limit_hi"] = share_interval(mine, best)
    return res


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
    """Per ``by`` group and draft depth d (1 = first guess): vLLM's per-position acceptance.

    ``accepted`` = decode steps that kept at least d guesses; ``drafted`` =
    decode steps whose draft reached depth d (``step_depth``; rows written
    before it was recorded count every decode step); ``rate`` = accepted /
    drafted; ``of_steps`` = accepted / all decode steps. Both come from the
    per-step lists, as the acceptance length does.
    """
    out = []
    for key, g in df.groupby(list(by), dropna=False, sort=True):
        accepted = _concat(g["accepted_per_step"]).astype(int)
        decode_steps = len(accepted)
        if "step_depth" in g.columns and g["step_depth"].notna().all():
            depth = _decode(g["step_depth"]).astype(int)
        else:
            depth = np.full(decode_steps, np.iinfo(np.int64).max)
        for d in range(1, int(accepted.max(initial=0)) + 1):
            kept, drafted = int((accepted >= d).sum()), int((depth >= d).sum())
            out.append(
                {
                    **dict(zip(by, key, strict=True)),
                    "position": d,
                    "accepted": kept,
                    "drafted": drafted,
                    "decode_steps": decode_steps,
                    "rate": kept / drafted if drafted else math.nan,
                    "of_steps": kept / decode_steps if decode_steps else math.nan,
                }
            )
    return pd.DataFrame(out, columns=[*by, "position", "accepted", "drafted", "decode_steps", "rate", "of_steps"])
