"""The paper's figures 3, 4 and 6 (PNG and PDF) from our results."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from specbench.core.draft import SOURCE_LABELS
from specbench.errors import ConfigError
from specbench.results.metrics import BASELINE, acceptance_by_source, with_preset
from specbench.tables.render import our_summary

# ----------------------------------------------------------------------------- figures


def _plt():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("figures need matplotlib: pip install -e '.[report]'") from None
    return plt


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
    ax.set_xticks(range(len(sources)), [f"{SOURCE_LABELS.get(src, src)}\n({src})" for src in sources])
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
