"""The SPECTRA paper's tables from our results, beside its published numbers (read from ``paper_dir``).

The seven tables stay one module: each is a short function over the same paper lookup and cell helpers.


Every cell reads ``ours / paper (ours ÷ paper)``; ``—`` marks a missing value
(no rows, or no published number), never 0. Speedups pair each method row with
the autoregressive rows of the same job (:func:`specbench.metrics.summarize`
with ``same_job=True``). τ and acceptance rates depend on the model, data and
method only, so they compare across machines; speedups and throughputs depend on
the device, dtype and kernels, so they compare only with runs on the same
hardware.

The paper's numbers are CSV files read from ``paper_dir`` (``conf/config.yaml``,
or ``--paper-dir``); they are not part of this project.
"""
from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from specbench.errors import ConfigError
from specbench.paths import CONF_DIR
from specbench.results.metrics import BASELINE
from specbench.tables.render import (
    INTERVAL_NOTE,
    MISSING,
    Table,
    _long,
    _missing,
    _notes,
    cell,
    our_summary,
)

MODEL_CODES = {
    "codellama-7b": "CL-7B",
    "codellama-13b": "CL-13B",
    "llama2-7b": "L2-7B",
    "llama2-13b": "L2-13B",
    "llama2-70b": "L2-70B",
    "llama3-8b": "L3-8B",
    "llama3-70b": "L3-70B",
}
# Our registered methods → the paper's method names.
METHOD_NAMES = {
    "autoregressive": "Autoregressive",
    "anpd": "ANPD",
    "lookahead": "Lookahead",
    "rest": "REST",
    "spectra": "SPECTRA",
    "lookahead_rest": "Lookahead + REST",
}
TABLE1_DATASETS = ("classeval", "gsm8k", "humaneval", "mbpp", "mtbench")
TABLE2_DATASETS = ("gsm8k", "mtbench")
SUMMARY_DATASETS = ("cnn_dailymail", "xsum")
# Which experiment's results each output reads.

PAPER_FILES = {
    "table1": "table1_speedup_tau.csv",
    "table2": "table2_ablation.csv",
    "table3": "table3_gpus.csv",
    "table4": "table4_throughput.csv",
    "table6": "table6_multigpu.csv",
    "table7": "table7_rouge.csv",
}


# ----------------------------------------------------------------------------- paper numbers


def default_paper_dir() -> Path:
    """``paper_dir`` of ``conf/config.yaml`` (``$SPECBENCH_PAPER_DIR`` overrides), relative to the project."""
    from omegaconf import OmegaConf

    raw = OmegaConf.load(CONF_DIR / "config.yaml")
    path = Path(str(OmegaConf.select(raw, "paper_dir") or "paper"))
    return path if path.is_absolute() else (CONF_DIR.parent / path).resolve()


def load_paper(paper_dir: str | Path | None, *, required: bool = False) -> dict[str, pd.DataFrame]:
    """The paper's tables as DataFrames by name (``table1`` ... ``table7``); {} when the folder is absent.

    ``required``: a missing folder is a :class:`ConfigError` (a path the user gave).
    """
    path = Path(paper_dir) if paper_dir is not None else default_paper_dir()
    if not path.is_dir():
        if required:
            raise ConfigError(
                f"paper directory {path} does not exist: pass --paper-dir <folder with the paper's CSV files>"
            )
        print(f"warning: no paper figures at {path} (set --paper-dir or paper_dir): paper cells are empty",
              file=sys.stderr)
        return {}
    out = {}
    for name, file in PAPER_FILES.items():
        if (path / file).exists():
            out[name] = pd.read_csv(path / file)
    return out


def _model_code(model: str, compare: dict[str, str]) -> str | None:
    return compare.get(model) or MODEL_CODES.get(model)


def _model_label(model: str, compare: dict[str, str]) -> str:
    code = _model_code(model, compare)
    if code is None:
        return f"{model} (not in the paper)"
    return code if MODEL_CODES.get(model) == code else f"{model} (vs {code})"


# ----------------------------------------------------------------------------- tables


def _paper_lookup(paper: pd.DataFrame | None, keys: Sequence[str]) -> dict:
    if paper is None or paper.empty:
        return {}
    p = paper.copy()
    if "temperature" in p:
        p["temperature"] = p["temperature"].astype(float)
    return {tuple(r[k] for k in keys): r for _, r in p.iterrows()}


def _placeholder(pname: str) -> pd.DataFrame:
    """A group with no rows of ours for a paper method we did not run (every cell of ours missing)."""
    method = next((m for m, n in METHOD_NAMES.items() if n == pname), pname)
    metrics_ = ("speedup", "tau", "mac_tp", "mic_tp")
    return pd.DataFrame({"method": [method], "dataset": [None], "device_name": [MISSING],
                         **{m: [math.nan] for m in metrics_}})


def _not_run(label: str) -> str:
    return f"{MISSING} ({label} not run)"


def table1(df: pd.DataFrame, paper: dict, compare: dict[str, str] | None = None) -> Table:
    """Speedup and τ per temperature × model × preset × dataset, with the paper's Table 1 and its average."""
    compare = compare or {}
    s = our_summary(df)
    look = _paper_lookup(paper.get("table1"), ("temperature", "model", "method", "dataset"))
    datasets = [*TABLE1_DATASETS, "avg"]
    records, sections = [], []
    if s.empty:
        return Table("table1", "Table 1: speedup and compression ratio τ", [], _notes(df), _long([]))
    rows_ours = s[s["method"] != BASELINE]
    models = sorted(set(rows_ours["model"]))
    codes = {_model_code(m, compare) for m in models}
    temps = sorted(set(rows_ours["temperature"].astype(float)) | {k[0] for k in look if k[1] in codes})
    for temp in temps:
        rows = []
        mine = rows_ours[rows_ours["temperature"].astype(float) == temp]
        groups = [(m, p, g) for (m, p), g in mine.groupby(["model", "preset"], sort=True)]
        for model in models:  # the paper's methods we did not run: their row, ours missing
            code = _model_code(model, compare)
            ran = {METHOD_NAMES.get(m) for m in mine[mine["model"] == model]["method"]}
            for pname in sorted({k[2] for k in look if k[0] == temp and k[1] == code} - ran):
                groups.append((model, _not_run(pname), _placeholder(pname)))
        for model, preset, g in groups:
            code, method = _model_code(model, compare), g["method"].iloc[0]
            pname = METHOD_NAMES.get(method)
            by_ds = g.set_index("dataset") if "dataset" in g else pd.DataFrame(columns=["speedup", "tau"])
            line = [_model_label(model, compare), preset]
            for ds in datasets:
                p = look.get((temp, code, pname, ds))
                for metric in ("speedup", "tau"):
                    if ds == "avg":
                        vals = [by_ds[metric].get(d, math.nan) for d in TABLE1_DATASETS]
                        ours = float(np.mean(vals)) if all(not _missing(v) for v in vals) else math.nan
                    else:
                        ours = float(by_ds[metric][ds]) if ds in by_ds.index else math.nan
                    lo, hi = (
                        (by_ds[f"{metric}_lo"][ds], by_ds[f"{metric}_hi"][ds])
                        if ds in by_ds.index and f"{metric}_lo" in by_ds
                        else (math.nan, math.nan)
                    )
                    pv = p[metric] if p is not None else math.nan
                    suspect = p is not None and int(p.get("suspect", 0) or 0) == 1
                    records.append(
                        dict(temperature=temp, model=model, paper_model=code, preset=preset, method=method,
                             dataset=ds, metric=metric, ours=ours, paper=pv, suspect=suspect, lo=lo, hi=hi)
                    )
                    line.append(cell(ours, pv, mark="†" if suspect else "", lo=lo, hi=hi))
            rows.append(line)
        header = ["model", "preset"] + [f"{d} {m}" for d in datasets for m in ("speedup", "τ")]
        sections.append((f"temperature {temp:g}", header, rows))
    notes = _notes(df, [
        "avg: the mean over the five datasets (ours only when all five have rows).",
        INTERVAL_NOTE,
        "† the paper's sampling rows for CL-13B and CL-7B repeat its greedy L3 rows value for value: unreliable.",
    ])
    return Table("table1", "Table 1: speedup and compression ratio τ", sections, notes, _long(records))


def ablation_variant(method: str, params: Any) -> str:
    """The Table 2 row a result belongs to, from its method and settings."""
    p = json.loads(params) if isinstance(params, str) and params else dict(params or {})
    if method == "spectra_core":
        off = [k for k in ("use_forward_dict", "use_backward_dict", "sub_ngrams") if p.get(k) is False]
        names = {"use_forward_dict": "Forward Dict", "use_backward_dict": "Backward Dict", "sub_ngrams": "Sub-Ngram"}
        if p.get("coverage") is False:
            return "CORE w/o coverage rule"
        if not off:
            return "CORE Module"
        return "CORE w/o " + " + ".join(names[k] for k in off)
    if method == "spectra_retrieval":
        return "RETRIEVAL w/o PPL refine" if p.get("refine") is False else "RETRIEVAL Module"
    return METHOD_NAMES.get(method, method)


TABLE2_ORDER = (
    "REST", "Lookahead", "Lookahead + REST", "CORE Module", "CORE w/o Forward Dict", "CORE w/o Backward Dict",
    "CORE w/o Sub-Ngram", "RETRIEVAL Module", "RETRIEVAL w/o PPL refine", "SPECTRA",
)


def table2(df: pd.DataFrame, paper: dict, compare: dict[str, str] | None = None) -> Table:
    """The ablation rows (greedy), GSM8K and MT-Bench speedup and τ, in the paper's row order."""
    compare = compare or {}
    s = our_summary(df)
    look = _paper_lookup(paper.get("table2"), ("model", "variant"))
    records, rows = [], []
    ours_rows = s[s["method"] != BASELINE] if not s.empty else s
    keyed: dict[tuple, pd.DataFrame] = {}
    if not ours_rows.empty:
        ours_rows = ours_rows.assign(
            variant=[ablation_variant(m, p) for m, p in zip(ours_rows["method"], ours_rows["method_params"],
                                                             strict=True)]
        )
        for key, g in ours_rows.groupby(["model", "variant", "preset"], sort=False):
            keyed[key] = g
    models = sorted({k[0] for k in keyed}) or ["llama2-7b"]
    order = {v: i for i, v in enumerate(TABLE2_ORDER)}
    for model in models:
        code = _model_code(model, compare)
        present = {k[1] for k in keyed if k[0] == model}
        lines = [(v, p) for (m, v, p) in keyed if m == model]
        lines += [(v, None) for v in TABLE2_ORDER if v not in present and (code, v) in look]
        for variant, preset in sorted(lines, key=lambda x: (order.get(x[0], 99), x[1] or "")):
            g = keyed.get((model, variant, preset))
            p = look.get((code, variant))
            line = [_model_label(model, compare), variant, preset or MISSING]
            for ds in TABLE2_DATASETS:
                for metric in ("speedup", "tau"):
                    ours = math.nan
                    if g is not None and ds in set(g["dataset"]):
                        ours = float(g[g["dataset"] == ds][metric].iloc[0])
                    pv = p[f"{ds}_{metric}"] if p is not None else math.nan
                    records.append(dict(model=model, paper_model=code, variant=variant, preset=preset,
                                        dataset=ds, metric=metric, ours=ours, paper=pv))
                    line.append(cell(ours, pv))
            rows.append(line)
    header = ["model", "variant", "preset"] + [f"{d} {m}" for d in TABLE2_DATASETS for m in ("speedup", "τ")]
    notes = _notes(df, ["Greedy decoding (T=0). Rows are named from each run's method and settings."])
    return Table("table2", "Table 2: ablation of SPECTRA's parts", [("", header, rows)], notes, _long(records))


def table3(df: pd.DataFrame, paper: dict, compare: dict[str, str] | None = None) -> Table:
    """Speedup and τ per hardware label: the paper's Table 3 GPUs, and the A100 from its Table 1."""
    compare = compare or {}
    s = our_summary(df)
    look = _paper_lookup(paper.get("table3"), ("model", "gpu", "method"))
    t1 = _paper_lookup(paper.get("table1"), ("temperature", "model", "method", "dataset"))
    records, rows = [], []
    ours_rows = s[s["method"] != BASELINE] if not s.empty else s
    groups = [(d, m, p, g) for (d, m, p), g in (ours_rows.groupby(["device", "model", "preset"], sort=True)
                                                 if not ours_rows.empty else [])]
    for device, model in sorted({(d, m) for d, m, _, _ in groups}):
        code, gpu = _model_code(model, compare), str(device).split("-")[0].upper()
        ran = {METHOD_NAMES.get(g["method"].iloc[0]) for d, m, _, g in groups if (d, m) == (device, model)}
        for pname in sorted({k[2] for k in look if k[0] == code and k[1] == gpu} - ran):
            groups.append((device, model, _not_run(pname), _placeholder(pname)))
    for device, model, preset, g in groups:
        code, pname = _model_code(model, compare), METHOD_NAMES.get(g["method"].iloc[0])
        gpu = str(device).split("-")[0].upper()
        line = [str(device), ", ".join(sorted(set(g["device_name"].astype(str)))), _model_label(model, compare),
                preset]
        for ds in TABLE2_DATASETS:
            for metric in ("speedup", "tau"):
                ours = float(g[g["dataset"] == ds][metric].iloc[0]) if ds in set(g["dataset"]) else math.nan
                p = look.get((code, gpu, pname))
                pv = p[f"{ds}_{metric}"] if p is not None else math.nan
                if p is None and gpu == "A100":
                    q = t1.get((0.0, code, pname, ds))
                    pv = q[metric] if q is not None else math.nan
                records.append(dict(device=device, model=model, paper_model=code, preset=preset, dataset=ds,
                                    metric=metric, ours=ours, paper=pv))
                line.append(cell(ours, pv))
        rows.append(line)
    header = ["hardware", "device seen", "model", "preset"] + [
        f"{d} {m}" for d in TABLE2_DATASETS for m in ("speedup", "τ")
    ]
    notes = _notes(df, ["Rows are filed by hardware label; 'device seen' is what torch reported.",
                        "The paper's A100-80GB values come from its Table 1 (L2-7B, T=0)."])
    return Table("table3", "Table 3: speedup and τ across GPUs", [("", header, rows)], notes, _long(records))


def _throughput(df: pd.DataFrame, paper: dict, compare: dict[str, str] | None, metric: str, name: str) -> Table:
    compare = compare or {}
    s = our_summary(df)
    look = _paper_lookup(paper.get("table4"), ("temperature", "model", "method", "dataset"))
    records, sections = [], []
    models = sorted(set(s["model"])) if not s.empty else []
    codes = {_model_code(m, compare) for m in models}
    temps = sorted(set(s["temperature"].astype(float)) | {k[0] for k in look if k[1] in codes}) if models else []
    for temp in temps:
        rows = []
        mine = s[s["temperature"].astype(float) == temp]
        groups = [(m, p, g) for (m, p), g in mine.groupby(["model", "preset"], sort=True)]
        for model in models:
            code = _model_code(model, compare)
            ran = {METHOD_NAMES.get(m) for m in mine[mine["model"] == model]["method"]}
            for pname in sorted({k[2] for k in look if k[0] == temp and k[1] == code} - ran):
                groups.append((model, _not_run(pname), _placeholder(pname)))
        for model, preset, g in groups:
            code, pname = _model_code(model, compare), METHOD_NAMES.get(g["method"].iloc[0])
            line = [_model_label(model, compare), preset]
            for ds in TABLE1_DATASETS:
                ours = float(g[g["dataset"] == ds][metric].iloc[0]) if ds in set(g["dataset"]) else math.nan
                p = look.get((temp, code, pname, ds))
                pv = p[metric] if p is not None else math.nan
                records.append(dict(temperature=temp, model=model, paper_model=code, preset=preset, dataset=ds,
                                    metric=metric, ours=ours, paper=pv))
                line.append(cell(ours, pv, digits=1))
            rows.append(line)
        sections.append((f"temperature {temp:g}", ["model", "preset", *TABLE1_DATASETS], rows))
    label = {"mac_tp": "Mac-TP (mean over steps of tokens/s)", "mic_tp": "Mic-TP (Σ tokens / Σ seconds)"}[metric]
    notes = _notes(df, [f"{label}, tokens/s, from Table 1's runs; autoregressive rows included."])
    title = f"Table {name[-1]}: throughput {label.split(' ')[0]}"
    return Table(name, title, sections, notes, _long(records))


def table4(df, paper, compare=None) -> Table:
    return _throughput(df, paper, compare, "mac_tp", "table4")


def table5(df, paper, compare=None) -> Table:
    return _throughput(df, paper, compare, "mic_tp", "table5")


def table6(df: pd.DataFrame, paper: dict, compare: dict[str, str] | None = None) -> Table:
    """MT-Bench Mac-TP, Mic-TP, speedup and τ per placement label (1xH100 int8, 2/4/8xH100 fp16)."""
    compare = compare or {}
    s = our_summary(df)
    look = _paper_lookup(paper.get("table6"), ("model", "setting", "method"))
    metrics_ = ("mac_tp", "mic_tp", "speedup", "tau")
    records, rows = [], []
    groups = [(d, m, p, g) for (d, m, p), g in (s.groupby(["device", "model", "preset"], sort=True)
                                                 if not s.empty else [])]
    for model in sorted({m for _, m, _, _ in groups}):
        code = _model_code(model, compare)
        ran = {(d, METHOD_NAMES.get(g["method"].iloc[0])) for d, m, _, g in groups if m == model}
        for setting, pname in sorted({(k[1], k[2]) for k in look if k[0] == code} - ran):
            groups.append((setting, model, _not_run(pname), _placeholder(pname)))
    for device, model, preset, g in groups:
        code, pname = _model_code(model, compare), METHOD_NAMES.get(g["method"].iloc[0])
        g = g[g["dataset"] == "mtbench"]
        p = look.get((code, str(device), pname))
        line = [str(device), _model_label(model, compare), preset]
        for metric in metrics_:
            ours = float(g[metric].iloc[0]) if len(g) else math.nan
            pv = p[f"mtbench_{metric}"] if p is not None else math.nan
            records.append(dict(device=device, model=model, paper_model=code, preset=preset, dataset="mtbench",
                                metric=metric, ours=ours, paper=pv))
            line.append(cell(ours, pv, digits=1 if "tp" in metric else 2))
        rows.append(line)
    header = ["setting", "model", "preset", "Mac-TP", "Mic-TP", "speedup", "τ"]
    notes = _notes(df, ["MT-Bench, greedy. Settings are hardware labels (conf/placement/)."])
    return Table("table6", "Table 6: Llama-2-70B on one to eight GPUs", [("MT-Bench", header, rows)], notes,
                 _long(records))


def table7(df: pd.DataFrame, paper: dict, compare: dict[str, str] | None = None) -> Table:
    """ROUGE-1/2/L (×100), speedup and τ on CNN/DailyMail and XSum."""
    compare = compare or {}
    s = our_summary(df)
    look = _paper_lookup(paper.get("table7"), ("model", "dataset", "method"))
    metrics_ = ("rouge1", "rouge2", "rougeL", "speedup", "tau")
    records, rows = [], []
    groups = [(d, m, p, g) for (d, m, p), g in (s.groupby(["dataset", "model", "preset"], sort=True)
                                                 if not s.empty else [])]
    for model in sorted({m for _, m, _, _ in groups}):
        code = _model_code(model, compare)
        ran = {(d, METHOD_NAMES.get(g["method"].iloc[0])) for d, m, _, g in groups if m == model}
        for ds, pname in sorted({(k[1], k[2]) for k in look if k[0] == code} - ran):
            groups.append((ds, model, _not_run(pname), _placeholder(pname).assign(temperature=math.nan)))
    for ds, model, preset, g in sorted(groups, key=lambda x: (x[0], x[1])):
        code, pname = _model_code(model, compare), METHOD_NAMES.get(g["method"].iloc[0])
        p = look.get((code, ds, pname))
        temps = sorted(t for t in set(g["temperature"]) if not _missing(t))
        line = [ds, _model_label(model, compare), preset, ", ".join(f"{t:g}" for t in temps) or MISSING]
        for metric in metrics_:
            ours = float(g[metric].mean()) if metric in g.columns else math.nan
            pv = p[metric] if p is not None else math.nan
            records.append(dict(dataset=ds, model=model, paper_model=code, preset=preset, metric=metric,
                                ours=ours, paper=pv))
            line.append(cell(ours, pv))
        rows.append(line)
    header = ["dataset", "model", "preset", "T", "ROUGE-1", "ROUGE-2", "ROUGE-L", "speedup", "τ"]
    notes = _notes(df, ["ROUGE F-measures ×100 (stemmed), mean over samples; the paper's at T=1.",
                        "ROUGE depends on the model and the sampling only: it compares across machines."])
    return Table("table7", "Table 7: summary quality, speedup and τ", [("", header, rows)], notes, _long(records))
