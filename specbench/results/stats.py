"""The spread of a measured ratio: a seeded paired bootstrap interval over prompts, its verdict against
1.00, and the standard deviation over repeats."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

BOOTSTRAP_RESAMPLES = 2000
INTERVAL = 0.95
NO_CHANGE = "no measurable change"


def speedup_ratio(m_tokens, m_seconds, b_tokens, b_seconds):
    """(method tokens / method seconds) ÷ (baseline tokens / baseline seconds); works on arrays."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return (np.asarray(m_tokens, dtype=float) / np.asarray(m_seconds, dtype=float)) / (
            np.asarray(b_tokens, dtype=float) / np.asarray(b_seconds, dtype=float)
        )


def bootstrap_interval(
    parts: dict[str, Sequence[float]],
    stat: Callable[..., np.ndarray],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    level: float = INTERVAL,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``stat`` over units (prompts) drawn with replacement.

    ``parts`` maps a name to one total per unit (all of one length); ``stat`` takes
    the same names, each an array of resampled sums, and returns one value per
    resample. Units stay whole, so paired quantities (a method's and its
    baseline's times on one prompt) are resampled together. NaN with fewer than
    two units. Seeded: the same rows give the same interval.
    """
    arrays = {k: np.asarray(v, dtype=float) for k, v in parts.items()}
    n = len(next(iter(arrays.values()))) if arrays else 0
    if n < 2:
        return math.nan, math.nan
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    values = np.asarray(stat(**{k: v[idx].sum(axis=1) for k, v in arrays.items()}), dtype=float)
    values = values[np.isfinite(values)]
    if not len(values):
        return math.nan, math.nan
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(values, [tail, 100 - tail])
    return float(lo), float(hi)


def share_interval(mine: dict[str, Sequence[float]], best: dict[str, Sequence[float]]) -> tuple[float, float]:
    """The paired bootstrap interval over prompts of one speedup ÷ another (a method's ÷ the oracle's): each
    maps :func:`speedup_ratio`'s four arguments to per-prompt totals, over the same prompts in the same order."""
    parts = {**{f"a_{k}": v for k, v in mine.items()}, **{f"b_{k}": v for k, v in best.items()}}

    def share(**p):
        return speedup_ratio(**{k[2:]: v for k, v in p.items() if k[0] == "a"}) / speedup_ratio(
            **{k[2:]: v for k, v in p.items() if k[0] == "b"})

    return bootstrap_interval(parts, share)


def verdict(lo: float, hi: float) -> str:
    """How a speedup interval reads: faster, slower, or no measurable change (it contains 1.00)."""
    if math.isnan(lo) or math.isnan(hi):
        return ""
    return "faster" if lo > 1 else "slower" if hi < 1 else NO_CHANGE


def std(values: list[float]) -> float:
    return float(np.std(values, ddof=1)) if len(values) > 1 else math.nan
