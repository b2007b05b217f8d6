"""How a report table is laid out: cells that read ``ours / paper (ours ÷ paper)``, a :class:`Table` that
renders as Markdown and LaTeX with a long CSV beside it, and the notes every table carries."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from specbench.results.metrics import BASELINE, summarize, with_preset
from specbench.results.table import stores_read

MISSING = "—"

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


def _stores(df: pd.DataFrame) -> list[str]:
    """One note per datastore the table's rows read (retrieval presets): name, size, refined or not."""
    return [f"{preset} read the datastore {description}." for _, preset, _, description in stores_read(df)]


def _notes(df: pd.DataFrame, extra: Sequence[str] = ()) -> list[str]:
    return [CELL_LEGEND, ACROSS_MACHINES, *extra, f"Ours measured on: {_machines(df)}.", *_stores(df)]
