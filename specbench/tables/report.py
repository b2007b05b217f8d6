"""Write the reports asked for: tables (Markdown, LaTeX, CSV) and figures (PNG, PDF), and an index.

``specbench report [what ...] --results results --out reports`` (or the
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
spec_bench results/spec_bench    Spec-Bench's leaderboard layout (specbench.tables.spec_bench)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from specbench.errors import ConfigError
from specbench.results.rows import load_results
from specbench.tables.batches import BATCH_FIGURES, batch_sweep
from specbench.tables.figures import FIGURE_BUILDERS as PAPER_FIGURES
from specbench.tables.memory import memory_scopes
from specbench.tables.paper import (
    load_paper,
    table1,
    table2,
    table3,
    table4,
    table5,
    table6,
    table7,
)
from specbench.tables.render import ACROSS_MACHINES, CELL_LEGEND, Table
from specbench.tables.spec_bench import load_leaderboard, spec_bench_table

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
    "batch_sweep": "batch_sweep",
    "batch_speedup": "batch_sweep",
    "batch_latency": "batch_sweep",
    "batch_load": "batch_sweep",
}
TABLES = ("table1", "table2", "table3", "table4", "table5", "table6", "table7")
EXTRA_TABLES = ("memory_scopes", "spec_bench", "batch_sweep")  # not the paper's tables: only when asked for by name
FIGURES = ("figure3", "figure4", "figure6")
FIGURE_BUILDERS = {**PAPER_FIGURES, **BATCH_FIGURES}
# A name that stands for several outputs of one experiment.
GROUPS = {"all": TABLES + FIGURES, "tables": TABLES, "figures": FIGURES,
          "batch_sweep": ("batch_sweep", *BATCH_FIGURES)}


BUILDERS: dict[str, Callable[..., Table]] = {
    "table1": table1, "table2": table2, "table3": table3, "table4": table4,
    "table5": table5, "table6": table6, "table7": table7, "memory_scopes": memory_scopes,
    "spec_bench": spec_bench_table, "batch_sweep": batch_sweep,
}


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
    if results.is_dir():  # every run under the folder, each preset against its own job's baseline
        from specbench.tables.summary import write_summary

        summary = write_summary(results, out, paper_dir)
        written += summary
        index += [summary[0].read_text().replace("# Summary of", "## Summary of", 1), ""]
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
        group = GROUPS.get(w, (w,))
        for n in group:
            if n not in SOURCES:
                from specbench.errors import suggest

                raise ConfigError(suggest("report", n, [*SOURCES, "tables", "figures", "all"]))
            if n not in names:
                names.append(n)
    return names
