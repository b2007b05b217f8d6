"""How a figure is printed with its spread (``1.54× ±0.03 [1.38, 1.71]``), and the stores rows read; the tables
themselves are :mod:`specbench.results.summary`'s."""

from __future__ import annotations

import math

import pandas as pd

from specbench.results.metrics import with_preset


def _fmt(value, spec: str, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:{spec}}{suffix}"


def format_interval(value: float, lo: float = math.nan, hi: float = math.nan, std: float = math.nan,
                    spec: str = ".2f", suffix: str = "") -> str:
    """``1.54× ±0.03 [1.38, 1.71]``: the value, its spread over repeats (when there are several) and its
    interval (when there is one)."""
    text = _fmt(value, spec, suffix)
    if text == "—":
        return text
    if not _missing(std):
        text += f" ±{std:{spec}}"
    if not _missing(lo) and not _missing(hi):
        text += f" [{lo:{spec}}, {hi:{spec}}]"
    return text


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


STORE_COLUMNS = ["datastore", "datastore_tokens", "datastore_kind", "datastore_fingerprint"]


def stores_read(rows: pd.DataFrame) -> list[tuple[str, str, str, str]]:
    """``(method, preset, fingerprint, description)`` of each datastore the rows read, as the rows record it:
    name, size, refined or not, fingerprint, and how ``datastore: auto`` chose it (a fallback says so)."""
    if rows.empty or "datastore_fingerprint" not in rows.columns:
        return []
    rows = with_preset(rows.dropna(subset=["datastore_fingerprint"]))
    cols = ["method", "preset", *STORE_COLUMNS] + (["datastore_choice"] if "datastore_choice" in rows.columns else [])
    out = []
    for s in rows[cols].drop_duplicates().itertuples():
        choice = getattr(s, "datastore_choice", None)
        choice = f"; {choice}" if isinstance(choice, str) and choice else ""
        out.append((s.method, s.preset, s.datastore_fingerprint, f"{s.datastore} ({int(s.datastore_tokens):,} tokens, "
                    f"{s.datastore_kind}, fingerprint {s.datastore_fingerprint}{choice})"))
    return out
