"""The results site: one static folder that opens from ``file://`` with no server (``make site``,
``specbench report site``).

``index.html`` carries everything but the figures (its data as JSON inside the page, the script and styles
inline); the figures are PNG files beside it. It shows

* **tables**: the summary of every run under the folder (each preset against its own job's baseline: a
  user's own sweep as much as the paper's experiments), then every paper table and the extra ones (Spec-Bench's leaderboard layout, memory scopes, the
  batch sweep) that have rows, built by the report's own builders, so each cell is the report's: ours with
  its 95% interval, the published figure and their ratio. The summary shows one row per preset × dataset
  (its metrics the columns), with its wide form (one column per dataset × metric) one click away; the
  paper's tables one row per model × preset (× temperature, …), one column per dataset × metric; sortable by
  any column and filtered by model, method, dataset and temperature;
* **figures**, as the report draws them;
* **runs**: each run's provenance (machine, versions, dtype, store, head, config hash, git commit);
* **generations**: for each one, its text with every token marked by the step that produced it and the
  source that drafted it (``token_sources``: a dictionary, the pool, retrieval, prompt lookup, a head, …, or
  the target's own token), τ and the accepted length of every step. Tokens are shown through the model's
  tokenizer when it loads here (offline), else as their ids.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from specbench.core.draft import SOURCE_LABELS
from specbench.core.record import TARGET_TOKEN
from specbench.results.rows import load_results
from specbench.tables.paper import load_paper
from specbench.tables.spec_bench import load_leaderboard

ASSETS = Path(__file__).with_name("site_assets")
ROW_KEYS = ("model", "paper_model", "preset", "engine", "method", "variant", "temperature", "batch_size")
COLUMN_KEYS = ("dataset", "metric")
FILTERS = ("model", "method", "dataset", "temperature")
MAX_GENERATIONS = 400  # generations shown (the first of each run, sample and turn first)
RUN_FIELDS = ("experiment", "model", "preset", "dataset", "temperature", "dtype", "device_name", "gpu_count",
              "torch_version", "transformers_version", "specbench_version", "git_commit", "config_hash",
              "budget", "datastore", "datastore_fingerprint", "head", "batch_size", "engine", "engine_command")


def _clean(value: Any) -> Any:
    """JSON-safe: NaN and None become null, numpy scalars plain numbers."""
    if value is None:
        return None
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def table_view(name: str, title: str, data: pd.DataFrame, notes: list[str], long: bool = False
               ) -> dict[str, Any] | None:
    """A report table in wide form: its rows (the row keys it has), its columns (dataset × metric) and cells
    {ours, lo, hi, paper, ratio}; ``long``: one row per dataset too (the dataset a row key after the preset,
    the metrics the columns), so a sweep over many datasets reads down instead of across. None when no cell
    has a value of ours."""
    if data.empty or "ours" not in data or data["ours"].notna().sum() == 0:
        return None
    rows_by = [k for k in ROW_KEYS if k in data.columns]
    cols_by = [k for k in COLUMN_KEYS if k in data.columns]
    if long and "dataset" in cols_by:
        cols_by.remove("dataset")
        rows_by.insert(rows_by.index("preset") + 1 if "preset" in rows_by else len(rows_by), "dataset")
    rows: dict[tuple, dict[str, Any]] = {}
    columns: dict[str, dict[str, Any]] = {}
    for rec in data.to_dict("records"):
        rkey = tuple(_clean(rec.get(k)) for k in rows_by)
        ckey = " ".join(str(rec[k]) for k in cols_by)
        columns.setdefault(ckey, {"key": ckey, **{k: _clean(rec[k]) for k in cols_by}})
        row = rows.setdefault(rkey, {"keys": dict(zip(rows_by, rkey, strict=True)), "cells": {}})
        row["cells"][ckey] = {k: _clean(rec.get(k)) for k in ("ours", "lo", "hi", "paper", "ratio")}
    kept = [r for r in rows.values() if any(c["ours"] is not None for c in r["cells"].values())]
    used = {k for r in kept for k, c in r["cells"].items() if c["ours"] is not None or c["paper"] is not None}
    return {"name": name, "title": title, "row_keys": rows_by, "rows": kept, "notes": notes,
            "columns": [c for k, c in columns.items() if k in used]}


def build_tables(results: Path, paper_dir: Any = None, spec_bench_dir: Any = None,
                 compare: dict[str, str] | None = None) -> list[dict[str, Any]]:
    from specbench.results.summary import LEGEND, summary_frame
    from specbench.tables.report import BUILDERS, EXTRA_TABLES, SOURCES, TABLES, load_experiment
    from specbench.tables.summary import long_form, published_lookup

    paper = load_paper(paper_dir, required=paper_dir is not None)
    paper["spec_bench"] = load_leaderboard(spec_bench_dir)
    frames: dict[str, pd.DataFrame] = {}
    views = []
    summary = summary_frame(load_results(results, quiet=True), published_lookup(paper))
    if not summary.empty:  # every run under the folder, whatever its experiment: a user's own sweep too
        args = ("summary", "Summary: every preset against its own job's baseline", long_form(summary),
                [f"{k}: {v}" for k, v in LEGEND.items()])
        view = table_view(*args, long=True)  # one row per preset × dataset; the wide form a click away
        if view is not None:
            views.append({**view, "wide": table_view(*args)})
    for name in (*TABLES, *EXTRA_TABLES):
        source = SOURCES[name]
        if source not in frames:
            frames[source] = load_experiment(results, source)
        if frames[source].empty:
            continue
        table = BUILDERS[name](frames[source], paper, compare)
        view = table_view(name, table.title, table.data, table.notes)
        if view is not None:
            views.append(view)
    return views


def build_figures(results: Path, out: Path) -> list[dict[str, str]]:
    from specbench.results.summary import summary_frame
    from specbench.tables.report import FIGURE_BUILDERS, SOURCES, load_experiment
    from specbench.tables.summary import summary_figure

    figures = []
    summary = summary_frame(load_results(results, quiet=True))
    if not summary.empty:
        figures.append({"name": "summary", "file": f"figures/{summary_figure(summary, out / 'figures')[0].name}"})
    for name, builder in FIGURE_BUILDERS.items():
        rows = load_experiment(results, SOURCES[name])
        if rows.empty:
            continue
        for path in builder(rows, out / "figures"):
            if path.suffix == ".png":
                figures.append({"name": name, "file": f"figures/{path.name}"})
    return figures


def _head(params: str) -> str:
    try:
        return str(json.loads(params or "{}").get("head") or "")
    except (ValueError, AttributeError):
        return ""


def build_runs(rows: pd.DataFrame) -> list[dict[str, Any]]:
    """One entry per run folder's method (run_id × preset): its provenance, its generations' count."""
    if rows.empty:
        return []
    rows = rows.assign(head=rows["method_params"].map(_head)) if "method_params" in rows else rows
    runs = []
    for (_, _), g in rows.groupby(["run_id", "preset"], sort=False):
        first = g.iloc[0]
        entry = {k: _clean(first[k]) for k in RUN_FIELDS if k in g.columns}
        entry["generations"] = len(g)
        entry["run_id"] = str(first["run_id"])
        runs.append(entry)
    return sorted(runs, key=lambda r: (str(r.get("experiment")), str(r.get("model")), str(r.get("preset"))))


class _Pieces:
    """Each output token's text through the model's tokenizer (loaded once per model), or its id."""

    def __init__(self) -> None:
        self.tokenizers: dict[str, Any] = {}

    def tokenizer(self, model: str) -> Any:
        if model not in self.tokenizers:
            from specbench.models import model_preset
            from specbench.models.load import load_tokenizer

            try:
                self.tokenizers[model] = load_tokenizer(model_preset(model))
            except Exception:  # noqa: BLE001 - any model without a tokenizer here shows ids
                self.tokenizers[model] = None
        return self.tokenizers[model]

    def __call__(self, model: str, ids: list[int]) -> tuple[list[str], bool]:
        tok = self.tokenizer(model)
        if tok is None:
            return [f"⟨{i}⟩" for i in ids], False
        pieces = []
        for j in range(len(ids)):  # the text a token adds after a few tokens of context (spaces kept)
            lo = max(0, j - 6)
            before = tok.decode(ids[lo:j], skip_special_tokens=False)
            pieces.append(tok.decode(ids[lo : j + 1], skip_special_tokens=False)[len(before):])
        return pieces, True


def build_generations(rows: pd.DataFrame, limit: int = MAX_GENERATIONS) -> list[dict[str, Any]]:
    """Up to ``limit`` generations, each with its tokens' text, step and source."""
    if rows.empty:
        return []
    keys = [k for k in ("experiment", "model", "preset", "dataset", "temperature", "sample_id", "turn", "repeat")
            if k in rows.columns]
    order = rows.sort_values(["repeat", "turn", "sample_id"] if "repeat" in rows else ["sample_id"], kind="stable")
    pieces, out = _Pieces(), []
    for rec in order.head(limit).to_dict("records"):
        ids = [int(i) for i in rec["output_ids"]]
        sources = rec.get("token_sources")
        sources = [str(s) for s in sources] if sources is not None and len(sources) == len(ids) else None
        text, decoded = pieces(str(rec["model"]), ids)
        steps = [int(n) for n in rec["step_tokens"]]
        step_of = [i for i, n in enumerate(steps) for _ in range(n)][: len(ids)]
        out.append({
            **{k: _clean(rec[k]) for k in keys},
            "tau": _clean(rec.get("tau")), "steps": len(steps), "step_tokens": steps,
            "tokens": text, "decoded": decoded, "step": step_of, "sources": sources,
        })
    return sorted(out, key=lambda g: tuple(str(g.get(k)) for k in keys))


def write_site(results: str | Path = "results", out: str | Path = "reports/site", paper_dir: Any = None,
               spec_bench_dir: Any = None, compare: dict[str, str] | None = None,
               limit: int = MAX_GENERATIONS) -> Path:
    """Write the site for the results folder ``results`` into ``out``; return its ``index.html``."""
    results, out = Path(results), Path(out)
    if not results.is_dir():
        from specbench.errors import ConfigError

        raise ConfigError(f"no results folder at {results}: run a sweep first, or point --results at one")
    out.mkdir(parents=True, exist_ok=True)
    rows = load_results(results, quiet=True)
    data = {
        "results": str(results),
        "tables": build_tables(results, paper_dir, spec_bench_dir, compare),
        "figures": build_figures(results, out),
        "runs": build_runs(rows),
        "generations": build_generations(rows, limit),
        "filters": list(FILTERS),
        "source_labels": {**SOURCE_LABELS, TARGET_TOKEN: "the target's own token"},
        "total_generations": len(rows),
    }
    page = (ASSETS / "index.html").read_text()
    payload = json.dumps(data, ensure_ascii=False).replace("</", "<\\/")  # safe inside <script>
    page = (page.replace("/*STYLE*/", (ASSETS / "site.css").read_text())
                .replace("/*SCRIPT*/", (ASSETS / "site.js").read_text())
                .replace("/*DATA*/", payload)
                .replace("{{title}}", html.escape(f"specbench results: {results.name}")))
    index = out / "index.html"
    index.write_text(page)
    return index
