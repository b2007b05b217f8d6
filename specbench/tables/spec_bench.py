"""Spec-Bench's leaderboard layout: speedup per task × method, mean accepted tokens, overall.

Spec-Bench (Xia et al. 2024) reports, per device × model × method, the speedup
over autoregressive decoding on each of its six tasks (MT-Bench, translation,
summarization, QA, math reasoning, RAG), the mean accepted tokens (tokens per
decoding step, 1.00 for autoregressive decoding) and the speedup over all 480
questions. This table shows ours in that layout beside its published figures
(``leaderboard.csv``, read from ``spec_bench_dir``), for the methods both have.

Ours come from :func:`specbench.results.metrics.summarize` on the rows of each task:
speedup = the ratio of token rates, method over the autoregressive rows of the
same job, with its 95% paired bootstrap interval over questions; mean accepted
tokens = the acceptance length (1 + accepted guesses per decode step). The
published row shown is the one whose model and device match ours; when none
does, the A100 row of the same model, else Vicuna-7B-v1.3 on the A100, and the
table says so: speedups compare only on the same hardware and model.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd

from specbench.data.chat import SPEC_BENCH_CATEGORIES, spec_bench_category

LEADERBOARD_FILE = "leaderboard.csv"
# Our method → Spec-Bench's name for it (methods both have). Our ``eagle`` drafts EAGLE-2's dynamic tree
# with an EAGLE-1 head, which is Spec-Bench's EAGLE2 row. SAM-Decoding is matched by preset: Spec-Bench's
# SAMD row drafts with EAGLE-2 (our sam_decoding-eagle), the plain preset with Token Recycling's tree.
SPEC_BENCH_NAMES = {
    "autoregressive": "Autoregressive",
    "pld": "PLD",
    "sps": "SpS",
    "rest": "REST",
    "lookahead": "Lookahead",
    "token_recycling": "Recycling",
    "eagle": "EAGLE2",
    "eagle3": "EAGLE3",
    "medusa": "Medusa",
}
SPEC_BENCH_PRESETS = {"sam_decoding-eagle": "SAMD[EAGLE2]"}
# The settings of the published head rows' runs, as our method parameters (Spec-Bench's evaluation scripts;
# EAGLE-2's and EAGLE-3's depth in our count of levels, their depth + 1; SAM-Decoding's n_predicts = 40
# counts the root token, so 39 guesses): each such row of ours says whether it ran them.
PUBLISHED_SETTINGS = {
    "SAMD[EAGLE2]": {"num_draft": 39, "len_threshold": 5, "len_bias": 5, "eagle_depth": 6, "eagle_top_k": 8,
                     "eagle_total_tokens": 63, "datastore": None},  # no static automaton (static_sam_path unset)
    "EAGLE2": {"depth": 6, "top_k": 10, "total_tokens": 60},
    "EAGLE3": {"depth": 6, "top_k": 10, "total_tokens": 60},
}
PUBLISHED_DTYPE = "float16"
DEFAULT_PUBLISHED = ("A100", "Vicuna-7B-v1.3")


def _norm(text: str) -> str:
    return "".join(ch for ch in str(text).lower() if ch.isalnum())


def default_spec_bench_dir() -> Path:
    """``spec_bench_dir`` of ``conf/config.yaml`` (``$SPECBENCH_SPEC_BENCH_DIR`` overrides)."""
    from omegaconf import OmegaConf

    from specbench.paths import CONF_DIR

    raw = OmegaConf.load(CONF_DIR / "config.yaml")
    path = Path(str(OmegaConf.select(raw, "spec_bench_dir") or "spec_bench"))
    return path if path.is_absolute() else (CONF_DIR.parent / path).resolve()


def load_leaderboard(folder: str | Path | None = None) -> pd.DataFrame | None:
    """Spec-Bench's published leaderboard, or None (with a line saying where it goes) when absent."""
    path = Path(folder) if folder is not None else default_spec_bench_dir()
    file = path / LEADERBOARD_FILE
    if not file.is_file():
        print(f"warning: no Spec-Bench leaderboard at {file} (set --spec-bench-dir or spec_bench_dir): "
              "published cells are empty", file=sys.stderr)
        return None
    return pd.read_csv(file)


def published_row_for(board: pd.DataFrame | None, model: str, device_name: str) -> tuple[str, str] | None:
    """(device, model) of the published rows to set beside ours: the same model on the same device, else
    the same model on the A100, else :data:`DEFAULT_PUBLISHED`."""
    if board is None or board.empty:
        return None
    pairs = list(dict.fromkeys(zip(board["device"].astype(str), board["model"].astype(str), strict=True)))
    same_model = [(d, m) for d, m in pairs if _norm(m) and _norm(m) in _norm(model)]
    for d, m in same_model:
        if _norm(d) in _norm(device_name):
            return d, m
    for d, m in same_model:
        if d == DEFAULT_PUBLISHED[0]:
            return d, m
    return DEFAULT_PUBLISHED if DEFAULT_PUBLISHED in pairs else pairs[0]


def settings_note(preset: str, name: str, params: str | dict | None, dtype: str | None) -> str | None:
    """For a head row whose published run's settings are known: the settings it ran and whether they match."""
    import json

    published = PUBLISHED_SETTINGS.get(name)
    if published is None:
        return None
    ran = params if isinstance(params, dict) else json.loads(params or "{}")
    def said(v) -> str:
        return "none" if v is None else str(v)

    differ = [f"{k} {said(ran.get(k))} (published {said(v)})" for k, v in published.items() if ran.get(k) != v]
    if dtype and str(dtype) != PUBLISHED_DTYPE:
        differ.append(f"{dtype} (published {PUBLISHED_DTYPE})")
    shown = ", ".join(f"{k} {said(ran.get(k))}" for k in published)
    verdict = "the published run's settings" if not differ else "differs from the published run: " + "; ".join(differ)
    return f"{preset} ({name}) ran {shown}, {dtype or '—'}: {verdict}."


def _get(s: pd.Series | None, col: str) -> float:
    return float(s[col]) if s is not None and col in s and s[col] is not None else math.nan


def spec_bench_table(df: pd.DataFrame, paper: dict, compare: dict[str, str] | None = None):
    """The leaderboard layout (``paper["spec_bench"]``: the published leaderboard, or absent)."""
    from specbench.results.metrics import BASELINE
    from specbench.tables.render import (
        ACROSS_MACHINES,
        INTERVAL_NOTE,
        MISSING,
        Table,
        _long,
        _machines,
        cell,
        our_summary,
    )

    board = paper.get("spec_bench")
    title = "Spec-Bench: speedup per task, mean accepted tokens, overall"
    header = ["model", "preset", *SPEC_BENCH_CATEGORIES, "mean accepted tokens", "overall"]
    legend = "Each cell: ours [95% interval over questions] / published (ours ÷ published); — = no data."
    if df.empty:
        return Table("spec_bench", title, [], [legend], _long([]))
    rows_df = df.copy()
    task = rows_df["category"].map(spec_bench_category) if "category" in rows_df else pd.Series(None, rows_df.index)
    rows_df["task"] = task
    overall = our_summary(rows_df)
    by_task = {t: our_summary(rows_df[rows_df["task"] == t]) for t in SPEC_BENCH_CATEGORIES}
    records, rows, shown, settings = [], [], set(), []
    for _, r in overall.sort_values(["model", "preset"]).iterrows():
        pick = published_row_for(board, str(r["model"]), str(r.get("device_name", "")))
        name = SPEC_BENCH_PRESETS.get(str(r["preset"])) or SPEC_BENCH_NAMES.get(str(r["method"]))
        note = settings_note(str(r["preset"]), str(name), r.get("method_params"), r.get("dtype"))
        if note and note not in settings:
            settings.append(note)
        pub = None
        if pick is not None and name is not None:
            match = board[(board["device"] == pick[0]) & (board["model"] == pick[1]) & (board["method"] == name)]
            pub = match.iloc[0] if len(match) else None
        if name == "Autoregressive" and pick is not None:  # Spec-Bench's baseline: 1.00 everywhere
            pub = pd.Series({**{t: 1.0 for t in SPEC_BENCH_CATEGORIES}, "mean_accepted_tokens": 1.0, "overall": 1.0})
        if pick is not None and pub is not None:
            shown.add(pick)
        line = [str(r["model"]), str(r["preset"])]
        cells = []
        for t in SPEC_BENCH_CATEGORIES:
            s = by_task[t]
            mine = s[(s["model"] == r["model"]) & (s["preset"] == r["preset"])] if not s.empty else s
            m = mine.iloc[0] if len(mine) else None
            cells.append((t, _get(m, "speedup"), _get(m, "speedup_lo"), _get(m, "speedup_hi"), _get(pub, t)))
        cells.append(("mean_accepted_tokens", _get(r, "acceptance_length"), math.nan, math.nan,
                      _get(pub, "mean_accepted_tokens")))
        cells.append(("overall", _get(r, "speedup"), _get(r, "speedup_lo"), _get(r, "speedup_hi"),
                      _get(pub, "overall")))
        for metric, ours, lo, hi, published in cells:
            records.append(dict(model=r["model"], preset=r["preset"], method=r["method"], metric=metric,
                                ours=ours, paper=published, lo=lo, hi=hi))
            line.append(cell(ours, published, lo=lo, hi=hi))
        rows.append(line)
    where = "; ".join(f"{d} {m}" for d, m in sorted(shown)) or MISSING
    notes = [
        legend,
        f"Published: Spec-Bench's leaderboard, {where} (greedy, FP16, batch 1, mean of 3 runs). A published "
        "row of another model or device is a reference point, not a reproduction: speedups compare only on "
        "the same hardware and model.",
        "Our speedup: the ratio of token rates, method over the autoregressive rows of the same job; mean "
        "accepted tokens: 1 + accepted guesses per decoding step (the prefill is not a step); MT-Bench's eight "
        "categories are Spec-Bench's mt_bench task.",
        *settings,
        INTERVAL_NOTE,
        ACROSS_MACHINES,
        f"Ours measured on: {_machines(df)}.",
    ]
    if board is None:
        notes.insert(1, f"Spec-Bench's published figures were not found: put {LEADERBOARD_FILE} in the folder "
                        "named by spec_bench_dir (conf/config.yaml, $SPECBENCH_SPEC_BENCH_DIR or --spec-bench-dir).")
    if not overall.empty and (overall["method"] == BASELINE).all():
        notes.insert(1, "Only autoregressive rows: run methods with baseline=true to get speedups.")
    return Table("spec_bench", title, [("", header, rows)], notes, _long(records))
