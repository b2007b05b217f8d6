"""The plans a ``budget=auto`` run recorded in its rows (``step_plans``), read back for ``budget=replay``
(:class:`specbench.budget.replay.Replay` re-applies them)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from specbench.errors import ConfigError
from specbench.results.rows import load_results


def load_plans(rows: Any, method: str) -> dict[tuple, list[dict[str, Any]]]:
    """The recorded plans of ``method``'s rows, by (sample_id, turn, repeat)."""
    if rows.empty or "step_plans" not in rows.columns:
        return {}
    mine = rows[(rows["method"] == method) & rows["step_plans"].notna() & (rows["step_plans"] != "")]
    return {(str(r.sample_id), int(r.turn), int(r.repeat)): json.loads(r.step_plans) for r in mine.itertuples()}


def recorded_plans(folder: str | Path, method: str, keys: Iterable[tuple] = ()) -> dict[tuple, list[dict]]:
    """The plans ``budget=replay`` re-applies: ``method``'s rows under ``folder`` (a run's folder or any folder
    above it), checked to cover ``keys`` (sample_id, turn, repeat); a one-line error naming what is missing."""
    path = Path(folder).expanduser()
    if not path.exists():
        raise ConfigError(f"replay={folder}: no such folder: point it at the results of a budget=auto run")
    plans = load_plans(load_results(path, quiet=True), method)
    if not plans:
        raise ConfigError(f"replay={folder}: no {method} rows with recorded plans there: record them with "
                          f"budget=auto first (rows of earlier versions carry none)")
    missing = [k for k in keys if k not in plans]
    if missing:
        sample, turn, repeat = missing[0]
        raise ConfigError(f"replay={folder}: {len(missing)} generations were not recorded there (e.g. sample "
                          f"{sample}, turn {turn}, repeat {repeat}): replay the recorded run's limit, offset and "
                          "repeats")
    return plans
