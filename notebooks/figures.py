# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Figures from results/
#
# Draws the paper's figures 3, 4 and 6 from the parquet rows under `RESULTS`
# (one folder per experiment: `figure3/`, `figure4/`, `figure6/`), with the
# same functions as `specbench report figures`, and shows the numbers
# behind them. Set `SPECBENCH_RESULTS` to read another folder (for example
# `results/smoke` after `make smoke-experiments`, or `results/reproduce-cpu`).
#
# τ and acceptance rates compare across machines; speedups do not (they are
# measured against the autoregressive baseline of the same job, on one device).

# %%
import os
from pathlib import Path

import pandas as pd
from IPython.display import Image, display

from specbench.results import metrics
from specbench.results.metrics import acceptance_by_source
from specbench.tables import figures, render, report

ROOT = Path.cwd() if (Path.cwd() / "conf").is_dir() else Path.cwd().parent
RESULTS = Path(os.environ.get("SPECBENCH_RESULTS", ROOT / "results"))
OUT = Path(os.environ.get("SPECBENCH_FIGURES", ROOT / "reports" / "notebook"))
print("results:", RESULTS, "| figures:", OUT)

# %% [markdown]
# ## Figure 3: acceptance rate by guess source

# %%
fig3 = report.load_experiment(RESULTS, "figure3")
if len(fig3):
    rates = acceptance_by_source(metrics.with_preset(fig3[fig3["method"] != "autoregressive"]), by=("preset",))
    display(rates)
paths3 = figures.figure3(fig3, OUT)
display(Image(filename=str(paths3[0])))

# %% [markdown]
# ## Figure 4: attention implementation
# Tree drafts need a custom 4-D attention mask, which flash_attention_2 cannot
# take: only chain methods run with it. The title lists which ran with which.

# %%
fig4 = report.load_experiment(RESULTS, "figure4")
summary4 = render.our_summary(fig4)
if len(summary4):
    print(figures.which_ran(summary4[summary4["method"] != "autoregressive"]))
    display(summary4[["preset", "attn_implementation", "speedup", "tau", "n_paired"]])
paths4 = figures.figure4(fig4, OUT)
display(Image(filename=str(paths4[0])))

# %% [markdown]
# ## Figure 6: cumulative tokens against decoding step

# %%
fig6 = report.load_experiment(RESULTS, "figure6")
curves = figures.cumulative_tokens(fig6) if len(fig6) else pd.DataFrame()
if len(curves):
    display(curves.groupby(["dataset", "preset"])["step"].max().rename("steps to finish (mean curve)"))
paths6 = figures.figure6(fig6, OUT)
display(Image(filename=str(paths6[0])))
