"""Cross-request memory: τ by turn and speedup of drafters whose memory can outlive a generation, kept for
one turn, a sample's turns, or the whole run (not a paper table: each paper fixes one scope)."""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd

from specbench.results.metrics import BASELINE, with_preset
from specbench.tables.render import (
    ACROSS_MACHINES,
    MISSING,
    Table,
    _long,
    _machines,
    _missing,
    fmt,
    our_summary,
)


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
