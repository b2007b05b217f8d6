"""The SPECTRA paper's tables and figures from our results, beside the published numbers.

``python -m specbench.report [what ...] --results results --out reports`` (or the
``specbench`` command) reads the parquet rows of each experiment
(``<results>/<experiment>/``) and writes, per table, Markdown, LaTeX and a long
CSV (one line per cell: ours, the paper's, their ratio), and figures as PNG and
PDF. What each table reads:

=========  ====================  ============================================
table1     results/table1        speedup and τ (Table 1)
table2     results/table2        the ablation rows (Table 2)
table3     results/table3        one run per GPU label (Table 3; A100 from Table 1)
table4/5   results/table1        Mac-TP / Mic-TP throughput (Tables 4 and 5)
table6     results/table6        Llama-2-70B placements (Table 6)
table7     results/table7        ROUGE, speedup, τ at T=1 (Table 7)
figure3    results/figure3       acceptance rate by guess source
figure4    results/figure4       attention implementation (sdpa / eager / flash_attention_2)
figure6    results/figure6       cumulative tokens against decoding step
spec_bench results/spec_bench    Spec-Bench's leaderboard layout (specbench.spec_bench_report)
=========  ====================  ============================================

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

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from specbench.config import CONF_DIR, ConfigError
from specbench.metrics import acceptance_by_source, summarize, with_preset
from specbench.results import load_results
from specbench.spec_bench_report import load_leaderboard, spec_bench_table

BASELINE = "autoregressive"
MISSING = "—"
# Our model configs → the paper's model codes.
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
SOURCES = {
    "table1": "table1",
    "table2": "table2",
    "table3": "table3",
    "table4": "table1",
    "table5": "table1",
    "table6": "table6",
    "table7": "table7",
    "figure3": "figure3",
    "figure4": "figure4",
    "figure6": "figure6",
    "memory_scopes": "memory_scopes",
    "spec_bench": "spec_bench",
}
TABLES = ("table1", "table2", "table3", "table4", "table5", "table6", "table7")
EXTRA_TABLES = ("memory_scopes", "spec_bench")  # not the paper's tables: only when asked for by name
FIGURES = ("figure3", "figure4", "figure6")
PAPER_FILES = {
    "table1": "table1_speedup_tau.csv",
    "table2": "table2_ablation.csv",
    "table3": "table3_gpus.csv",
    "table4": "table4_throughput.csv",
    "table6": "table6_multigpu.csv",
    "table7": "table7_rouge.csv",
}
ACROSS_MACHINES = (
    "τ (and acceptance rates) depend on the model, the data and the method only: they compare across "
    "machines. Speedup and throughput (Mac-TP, Mic-TP) depend on the device, dtype and kernels: compare "
    "them only with runs on the same hardware (the paper: one A100-80GB in fp16 unless the table says "
    "otherwise); their ratio to the paper says how our machine differs, not whether the method reproduces."
)
INTERVAL_NOTE = (
    "[lo, hi] after our figure: its 95% paired bootstrap interval over prompts (speedup: the ratio of token "
    "rates, method over autoregressive, recomputed on resampled prompts); a speedup whose interval contains "
    "1.00 is no measurable change."
)
CELL_LEGEND = "Each cell: ours / paper (ours ÷ paper); — = no data (never 0)."


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


# ----------------------------------------------------------------------------- cells and tables


def ratio(ours: float | None, paper: float | None) -> float:
    if _missing(ours) or _missing(paper) or paper == 0:
        return math.nan
    return float(ours) / float(paper)


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def fmt(v: Any, digits: int = 2) -> str:
    return MISSING if _missing(v) else f"{float(v):.{digits}f}"


def cell(ours: Any, paper: Any, digits: int = 2, mark: str = "", lo: Any = None, hi: Any = None) -> str:
    """``ours [lo, hi] / paper (ratio)``; ``[lo, hi]``: our interval, when there is one; a missing side is
    ``—``; both missing is ``—``."""
    if _missing(ours) and _missing(paper):
        return MISSING
    interval = "" if _missing(ours) or _missing(lo) or _missing(hi) else f" [{fmt(lo, digits)}, {fmt(hi, digits)}]"
    text = f"{fmt(ours, digits)}{interval} / {fmt(paper, digits)}{mark}"
    r = ratio(ours, paper)
    return text if math.isnan(r) else f"{text} ({r:.2f})"


@dataclass
class Table:
    """A rendered table: header, rows of cell strings, and notes; ``data`` is the long form."""

    name: str
    title: str
    sections: list[tuple[str, list[str], list[list[str]]]]  # (heading, header, rows)
    notes: list[str] = field(default_factory=list)
    data: pd.DataFrame = field(default_factory=pd.DataFrame)

    def markdown(self) -> str:
        out = [f"## {self.title}", ""]
        for heading, header, rows in self.sections:
            if heading:
                out += [f"### {heading}", ""]
            if not rows:
                out += ["(no rows)", ""]
                continue
            out.append("| " + " | ".join(header) + " |")
            out.append("|" + "|".join("---" for _ in header) + "|")
            out += ["| " + " | ".join(r) + " |" for r in rows]
            out.append("")
        out += [f"- {n}" for n in self.notes]
        return "\n".join(out) + "\n"

    def latex(self) -> str:
        out = [f"% {self.title}", "% " + CELL_LEGEND, "% needs \\usepackage{booktabs}"]
        for heading, header, rows in self.sections:
            out += [
                "\\begin{table}[t]",
                "\\centering\\small",
                f"\\caption{{{_tex(self.title + (': ' + heading if heading else ''))}}}",
                "\\begin{tabular}{" + "l" * len(header) + "}",
                "\\toprule",
                " & ".join(_tex(h) for h in header) + " \\\\",
                "\\midrule",
            ]
            out += [" & ".join(_tex(c) for c in r) + " \\\\" for r in rows]
            out += ["\\bottomrule", "\\end{tabular}", "\\end{table}", ""]
        out += [f"% {n}" for n in self.notes]
        return "\n".join(out) + "\n"


def _tex(text: str) -> str:
    text = str(text)
    for a, b in (("\\", "\\textbackslash{}"), ("&", "\\&"), ("%", "\\%"), ("_", "\\_"), ("#", "\\#")):
        text = text.replace(a, b)
    return text.replace(MISSING, "--").replace("τ", "$\\tau$").replace("÷", "$\\div$").replace("†", "$^\\dagger$")


def _long(records: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(records)
    if not df.empty:
        df["ratio"] = [ratio(o, p) for o, p in zip(df["ours"], df["paper"], strict=True)]
    return df


# ----------------------------------------------------------------------------- our numbers


def our_summary(df: pd.DataFrame) -> pd.DataFrame:
    """summarize() with same-job speedups; a ``device`` label column even for old rows."""
    if df.empty:
        return pd.DataFrame()
    s = summarize(with_preset(df), baseline_method=BASELINE, same_job="config_hash" in df.columns)
    if "device" not in s.columns:
        s["device"] = s.get("device_name", "")
    return s


def _machines(df: pd.DataFrame) -> str:
    if df.empty:
        return "no rows"
    cols = [c for c in ("device_name", "dtype") if c in df.columns]
    combos = df[cols].drop_duplicates().astype(str).agg(", ".join, axis=1)
    return "; ".join(sorted(combos))


def _model_code(model: str, compare: dict[str, str]) -> str | None:
    return compare.get(model) or MODEL_CODES.get(model)


def _model_label(model: str, compare: dict[str, str]) -> str:
    code = _model_code(model, compare)
    if code is None:
        return f"{model} (not in the paper)"
    return code if MODEL_CODES.get(model) == code else f"{model} (vs {code})"


def _notes(df: pd.DataFrame, extra: Sequence[str] = ()) -> list[str]:
    return [CELL_LEGEND, ACROSS_MACHINES, *extra, f"Ours measured on: {_machines(df)}."]


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


def _memory(params: Any) -> str:
    p = json.loads(params) if isinstance(params, str) and params else dict(params or {})
    return str(p.get("memory", MISSING))


MEMORY_ORDER = {"turn": 0, "sample": 1, "run": 2}


def memory_scopes(df: pd.DataFrame, paper: dict | None = None, compare: dict[str, str] | None = None) -> Table:
    """τ per turn and speedup of the drafters whose memory can outlive a generation, kept for one turn,
    a sample's turns, or the whole run (not a paper table: the papers fix one scope each)."""
    s = our_summary(df)
    records, rows = [], []
    ours = s[s["method"] != BASELINE] if not s.empty else s
    raw = with_preset(df[df["method"] != BASELINE]) if not df.empty else df
    turns = sorted(int(t) for t in set(raw["turn"])) if not raw.empty else []
    if not raw.empty:
        raw = raw.assign(memory=[_memory(p) for p in raw["method_params"]])
    if not ours.empty:
        ours = ours.assign(memory=[_memory(p) for p in ours["method_params"]])
        ours = ours.sort_values(["model", "dataset", "preset", "memory"],
                                key=lambda c: c.map(MEMORY_ORDER) if c.name == "memory" else c)
    for _, g in ours.iterrows():
        line = [g["model"], g["dataset"], g["preset"], g["memory"]]
        mine = raw[(raw["model"] == g["model"]) & (raw["dataset"] == g["dataset"]) & (raw["preset"] == g["preset"])
                   & (raw["memory"] == g["memory"])]
        for t in turns:
            rt = mine[mine["turn"] == t]
            tau = float(rt["new_tokens"].sum() / rt["steps"].sum()) if len(rt) and rt["steps"].sum() else math.nan
            records.append(dict(model=g["model"], dataset=g["dataset"], preset=g["preset"], memory=g["memory"],
                                metric=f"tau_turn{t + 1}", ours=tau, paper=math.nan))
            line.append(fmt(tau))
        for metric in ("tau", "speedup"):
            v = float(g[metric]) if metric in g and not _missing(g[metric]) else math.nan
            records.append(dict(model=g["model"], dataset=g["dataset"], preset=g["preset"], memory=g["memory"],
                                metric=metric, ours=v, paper=math.nan))
            line.append(fmt(v))
        rows.append(line)
    header = ["model", "dataset", "preset", "memory", *[f"τ turn {t + 1}" for t in turns], "τ", "speedup"]
    notes = [
        "Not a paper table: each paper fixes one scope (Token Recycling and SuffixDecoding keep theirs for "
        "the run, Lookahead and SPECTRA for a generation). turn = forgotten at every generation; sample = kept "
        "across a sample's turns; run = kept across samples. Speedup needs the baseline in the same job "
        "(`baseline=true`; the memory_scopes experiment leaves it out).",
        ACROSS_MACHINES,
        f"Ours measured on: {_machines(df)}.",
    ]
    return Table("memory_scopes", "Cross-request memory: τ by scope", [("", header, rows)], notes, _long(records))


BUILDERS: dict[str, Callable[..., Table]] = {
    "table1": table1, "table2": table2, "table3": table3, "table4": table4,
    "table5": table5, "table6": table6, "table7": table7, "memory_scopes": memory_scopes,
    "spec_bench": spec_bench_table,
}


# ----------------------------------------------------------------------------- figures


def _plt():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("figures need matplotlib: pip install -e '.[report]'") from None
    return plt


SOURCE_NAMES = {
    "fwd_dict": "forward dict", "bwd_dict": "backward dict", "ngram": "n-gram table", "pool": "n-gram pool",
    "prompt": "prompt lookup", "retrieval": "retrieval", "datastore": "datastore", "draft_model": "draft model",
}
STYLES = [("o", "-"), ("s", "--"), ("^", "-."), ("D", ":"), ("v", "-"), ("P", "--"), ("X", "-."), ("*", ":")]


def _save(fig, out: Path, name: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    fig.savefig(paths[0], dpi=150, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight")
    _plt().close(fig)
    return paths


def _empty_figure(title: str, message: str):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 2.5))
    ax.axis("off")
    ax.set_title(title)
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True)
    return fig


def figure3(df: pd.DataFrame, out: Path) -> list[Path]:
    """Acceptance rate (% of drafted guesses accepted) by guess source, one bar per preset."""
    plt = _plt()
    title = "Figure 3: acceptance rate by guess source"
    if df.empty:
        return _save(_empty_figure(title, "no results"), out, "figure3")
    acc = acceptance_by_source(with_preset(df[df["method"] != BASELINE]), by=("preset",))
    acc = acc[acc["drafted"] > 0]
    if acc.empty:
        return _save(_empty_figure(title, "no drafted guesses in these results"), out, "figure3")
    sources, presets = sorted(acc["source"].unique()), sorted(acc["preset"].unique())
    colors = {p: f"C{i % 10}" for i, p in enumerate(presets)}
    hatches = {p: ["", "//", "..", "xx", "\\\\", "oo", "--", "++"][i % 8] for i, p in enumerate(presets)}
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(sources) + 2), 4.2))
    width, seen = 0.8 / max(1, acc.groupby("source").size().max()), set()
    for j, src in enumerate(sources):
        sub = acc[acc["source"] == src].sort_values("preset")
        for i, (_, r) in enumerate(sub.iterrows()):
            x = j + (i - (len(sub) - 1) / 2) * width
            label = r["preset"] if r["preset"] not in seen else None
            seen.add(r["preset"])
            ax.bar(x, 100 * r["rate"], width, color=colors[r["preset"]], hatch=hatches[r["preset"]],
                   edgecolor="black", lw=0.5, label=label)
            ax.annotate(f"{int(r['drafted'])}", (x, 100 * r["rate"]), ha="center", va="bottom", fontsize=7,
                        xytext=(0, 1), textcoords="offset points")
    ax.set_xticks(range(len(sources)), [f"{SOURCE_NAMES.get(src, src)}\n({src})" for src in sources])
    ax.set_xlabel("guess source")
    ax.set_ylabel("acceptance rate (% of drafted guesses)")
    ax.set_ylim(0, 112)
    ax.set_yticks(range(0, 101, 20))
    ax.set_title(title + "\n(number over a bar: guesses drafted; the paper's values are not transcribed)",
                 fontsize=10)
    ax.legend(title="preset", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, out, "figure3")


def figure4(df: pd.DataFrame, out: Path) -> list[Path]:
    """Speedup and τ per preset under each attention implementation; which ran with which is written out."""
    plt = _plt()
    title = "Figure 4: attention implementation"
    s = our_summary(df)
    if s.empty or "attn_implementation" not in s.columns:
        return _save(_empty_figure(title, "no results with an attention implementation recorded"), out, "figure4")
    s = s[s["method"] != BASELINE]
    impls = [i for i in ("sdpa", "eager", "flash_attention_2") if i in set(s["attn_implementation"])]
    impls += sorted(set(s["attn_implementation"]) - set(impls))
    presets = sorted(s["preset"].unique())
    fig, axes = plt.subplots(1, 2, figsize=(max(9, 2.4 * len(presets) + 4), 4.4), layout="constrained")
    width = 0.8 / max(1, len(impls))
    hatches = ["", "//", ".."]
    for ax, metric, label in zip(axes, ("speedup", "tau"),
                                 ("speedup over autoregressive (×, same job)", "τ (tokens per target forward)"),
                                 strict=True):
        for i, impl in enumerate(impls):
            sub = s[s["attn_implementation"] == impl].groupby("preset")[metric].mean()
            xs = [j + (i - (len(impls) - 1) / 2) * width for j in range(len(presets))]
            ax.bar(xs, [sub.get(p, np.nan) for p in presets], width, label=impl,
                   hatch=hatches[i % len(hatches)], edgecolor="black", lw=0.5)
            for x, p in zip(xs, presets, strict=True):
                if p not in sub.index:
                    ax.text(x, 0.02, "not run", rotation=90, ha="center", va="bottom", fontsize=7,
                            transform=ax.get_xaxis_transform())
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_xlim(-0.5, len(presets) - 0.5)
        ax.set_xticks(range(len(presets)), presets, rotation=20, ha="right")
        ax.set_xlabel("method preset")
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(title="attention", fontsize=8)
    fig.suptitle(f"{title}\n{which_ran(s)}\n(tree drafts cannot run under flash_attention_2; "
                 "the paper's values are not transcribed)", fontsize=9)
    return _save(fig, out, "figure4")


def which_ran(summary: pd.DataFrame) -> str:
    """``sdpa: a, b; eager: a; flash_attention_2: none`` from a summary with attn_implementation."""
    parts = []
    impls = ["sdpa", "eager", "flash_attention_2"]
    impls += sorted(set(summary["attn_implementation"]) - set(impls))
    for impl in impls:
        presets = sorted(summary[summary["attn_implementation"] == impl]["preset"].unique())
        parts.append(f"{impl}: {', '.join(presets) if presets else 'none'}")
    return "ran with " + "; ".join(parts)


def cumulative_tokens(df: pd.DataFrame) -> pd.DataFrame:
    """Per preset and dataset: mean cumulative tokens committed after step k (k = 1 is the prefill).

    A generation that has finished keeps its total in the mean, so curves end flat.
    """
    out = []
    for (preset, ds), g in with_preset(df).groupby(["preset", "dataset"], sort=True):
        curves = [np.cumsum(np.asarray(v, dtype=float)) for v in g["step_tokens"] if v is not None and len(v)]
        if not curves:
            continue
        n = max(len(c) for c in curves)
        padded = np.stack([np.pad(c, (0, n - len(c)), mode="edge") for c in curves])
        mean = padded.mean(axis=0)
        out += [dict(preset=preset, dataset=ds, step=k + 1, tokens=float(t), n=len(curves))
                for k, t in enumerate(mean)]
    return pd.DataFrame(out, columns=["preset", "dataset", "step", "tokens", "n"])


def figure6(df: pd.DataFrame, out: Path) -> list[Path]:
    """Cumulative tokens committed against decoding step, one line per preset, one panel per dataset."""
    plt = _plt()
    title = "Figure 6: cumulative tokens against decoding step"
    cum = cumulative_tokens(df) if not df.empty else pd.DataFrame()
    if cum.empty:
        return _save(_empty_figure(title, "no results"), out, "figure6")
    datasets = sorted(cum["dataset"].unique())
    fig, axes = plt.subplots(1, len(datasets), figsize=(max(6.5, 5.5 * len(datasets)), 4.6), squeeze=False,
                             layout="constrained")
    for ax, ds in zip(axes[0], datasets, strict=True):
        sub = cum[cum["dataset"] == ds]
        for i, preset in enumerate(sorted(sub["preset"].unique())):
            c = sub[sub["preset"] == preset]
            marker, ls = STYLES[i % len(STYLES)]
            ax.plot(c["step"], c["tokens"], ls=ls, marker=marker, markevery=max(1, len(c) // 8), ms=5,
                    label=f"{preset} (n={int(c['n'].iloc[0])})")
        ax.set_xlabel("decoding step (target forward passes, prefill = 1)")
        ax.set_ylabel("cumulative tokens committed (tokens)")
        ax.set_title(ds, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{title}\n(mean over generations; the paper's values are not transcribed)", fontsize=10)
    return _save(fig, out, "figure6")


FIGURE_BUILDERS = {"figure3": figure3, "figure4": figure4, "figure6": figure6}


# ----------------------------------------------------------------------------- command line


def load_experiment(results: Path, experiment: str) -> pd.DataFrame:
    path = results / experiment
    return load_results(path) if path.is_dir() else pd.DataFrame()


def write_report(
    what: Sequence[str],
    results: str | Path = "results",
    out: str | Path = "reports",
    paper_dir: str | Path | None = None,
    compare: dict[str, str] | None = None,
    spec_bench_dir: str | Path | None = None,
) -> list[Path]:
    """Write the tables (``.md``, ``.tex``, ``.csv``) and figures (``.png``, ``.pdf``) asked for; return the paths."""
    results, out = Path(results), Path(out)
    names = _expand(what)
    paper = load_paper(paper_dir, required=paper_dir is not None) if any(n in TABLES for n in names) else {}
    if "spec_bench" in names:
        paper["spec_bench"] = load_leaderboard(spec_bench_dir)
    out.mkdir(parents=True, exist_ok=True)
    cache: dict[str, pd.DataFrame] = {}
    written: list[Path] = []
    index = ["# Reproduction report", "", CELL_LEGEND, "", ACROSS_MACHINES, ""]
    for name in names:
        source = SOURCES[name]
        if source not in cache:
            cache[source] = load_experiment(results, source)
        df = cache[source]
        if name in BUILDERS:
            table = BUILDERS[name](df, paper, compare)
            if df.empty:
                table.notes.insert(0, f"No results under {results / source}: run `make {source}` first.")
            for suffix, text in ((".md", table.markdown()), (".tex", table.latex())):
                (out / f"{name}{suffix}").write_text(text)
                written.append(out / f"{name}{suffix}")
            table.data.to_csv(out / f"{name}.csv", index=False)
            written.append(out / f"{name}.csv")
            index.append(table.markdown())
        else:
            paths = FIGURE_BUILDERS[name](df, out)
            written += paths
            index += [f"## {name}", "", f"![{name}]({paths[0].name})", ""]
    (out / "report.md").write_text("\n".join(index) + "\n")
    written.append(out / "report.md")
    return written


def _expand(what: Sequence[str]) -> list[str]:
    names: list[str] = []
    for w in what or ["all"]:
        group = {"all": TABLES + FIGURES, "tables": TABLES, "figures": FIGURES}.get(w, (w,))
        for n in group:
            if n not in SOURCES:
                from specbench.registry import suggest

                raise ConfigError(suggest("report", n, [*SOURCES, "tables", "figures", "all"]))
            if n not in names:
                names.append(n)
    return names


def _compare(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        model, sep, code = item.partition("=")
        if not sep or code not in MODEL_CODES.values():
            raise ConfigError(
                f"--compare-model {item!r}: write <our model>=<paper code>, code one of "
                f"{', '.join(sorted(set(MODEL_CODES.values())))}"
            )
        out[model] = code
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="specbench",
        description="Tables and figures of the SPECTRA paper from results/, beside the published numbers.",
    )
    parser.add_argument("what", nargs="*", default=["all"],
                        help="table1 … table7, figure3, figure4, figure6, tables, figures or all (default); "
                             "memory_scopes, spec_bench (Spec-Bench's leaderboard layout; not paper tables)")
    parser.add_argument("--results", default="results", help="results folder (default: results)")
    parser.add_argument("--out", default="reports", help="output folder (default: reports)")
    parser.add_argument("--paper-dir", default=None,
                        help="folder of the paper's CSV files (default: paper_dir in conf/config.yaml)")
    parser.add_argument("--spec-bench-dir", default=None,
                        help="folder of Spec-Bench's leaderboard.csv (default: spec_bench_dir in conf/config.yaml)")
    parser.add_argument("--compare-model", action="append", default=[], metavar="MODEL=CODE",
                        help="set a model of ours beside a paper model, e.g. smollm2-135m=L2-7B")
    args = parser.parse_args(argv)
    from specbench.errors import one_line_errors

    with one_line_errors():
        paths = write_report(args.what, args.results, args.out, args.paper_dir, _compare(args.compare_model),
                             args.spec_bench_dir)
    for p in paths:
        print(p)


if __name__ == "__main__":
    main()
