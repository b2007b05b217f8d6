"""What one verification forward costs on this machine: t(q, context[, batch]), the curve the planner prices with.

:class:`CostModel` interpolates the seconds measured for block sizes ``qs`` after context lengths ``contexts``
linearly in q, context and batch size, extending the last slopes. :mod:`specbench.machine.costs` measures and
caches it; runs store the curve they used.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import asdict, dataclass, field
from typing import Any

STAGGERED = "staggered"  # how a batch's curve is timed: its rows' lengths spread from the longest down to half


@dataclass
class CostModel:
    """Seconds per forward, ``seconds[i][j]`` for ``contexts[i]`` and ``qs[j]``."""

    qs: list[int]
    contexts: list[int]
    seconds: list[list[float]]
    device_name: str = ""
    key: str = ""
    batches: dict[int, CostModel] = field(default_factory=dict)  # batch size (> 1): its curve, q per row
    rows: str = ""  # a batch's curve: "staggered" (rows of lengths spread below the longest, keyed by it)
    checked: float = 0.0  # a plain step timed when a run began over the curve's (0: not checked; machine.costs)
    forward: str = "eager"  # the forward mode timed; "compiled" runs blocks padded to a power of two, priced so

    def __post_init__(self) -> None:
        if not self.qs or not self.contexts or len(self.seconds) != len(self.contexts):
            raise ValueError("cost model: need one row of seconds per context length")
        if any(len(row) != len(self.qs) for row in self.seconds):
            raise ValueError("cost model: need one time per block size in every row")
        if list(self.qs) != sorted(set(self.qs)) or list(self.contexts) != sorted(set(self.contexts)):
            raise ValueError("cost model: block sizes and context lengths must increase")

    def _row(self, i: int, q: float) -> float:
        qs, row = self.qs, self.seconds[i]
        if len(qs) == 1:
            return row[0]
        j = min(max(bisect.bisect_right(qs, q) - 1, 0), len(qs) - 2)  # the segment (extended at both ends)
        slope = (row[j + 1] - row[j]) / (qs[j + 1] - qs[j])
        return max(row[j] + slope * (q - qs[j]), 1e-9)

    def __call__(self, q: float, context: float = 0, batch: int = 1) -> float:
        """Estimated seconds of a forward of ``q`` tokens after ``context`` tokens; with ``batch`` rows, of
        a block of ``q`` tokens in each row, the longest row after ``context`` (interpolated linearly between
        the batch sizes measured, beyond the largest along the last two)."""
        if self.forward == "compiled":  # the width that will run: the next power of two
            q = 1 << max(0, math.ceil(q) - 1).bit_length()
        if batch > 1:
            return self._batched(q, context, batch)
        cs = self.contexts
        if len(cs) == 1 or context <= cs[0]:
            return self._row(0, q)
        i = min(bisect.bisect_right(cs, context) - 1, len(cs) - 2)  # past the last context: its slope goes on
        w = (context - cs[i]) / (cs[i + 1] - cs[i])
        return max((1 - w) * self._row(i, q) + w * self._row(i + 1, q), 1e-9)

    def _batched(self, q: float, context: float, batch: int) -> float:
        if batch in self.batches:
            return self.batches[batch](q, context)
        sizes = sorted(self.batches)
        if not sizes:
            raise ValueError(f"cost model: no curve measured at batch size {batch} (measure_batch)")
        points = [1, *sizes]
        i = min(max(bisect.bisect_right(points, batch) - 1, 0), len(points) - 2)
        lo, hi = points[i], points[i + 1]
        t_lo, t_hi = self(q, context, lo), self(q, context, hi)
        return max(t_lo + (t_hi - t_lo) * (batch - lo) / (hi - lo), 1e-9)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["batches"] = {str(b): m.to_dict() for b, m in sorted(self.batches.items())}
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CostModel:
        batches = {int(b): cls.from_dict(m) for b, m in (d.get("batches") or {}).items()}
        batches = {b: m for b, m in batches.items() if m.rows == STAGGERED}  # equal rows: an older timing, re-timed
        return cls(**{k: d[k] for k in ("qs", "contexts", "seconds", "device_name", "key", "rows", "checked", "forward")
                      if k in d},
                   batches=batches)

    @classmethod
    def flat(cls, seconds: float = 0.02, max_q: int = 128) -> CostModel:
        """A GPU-like curve: every block up to ``max_q`` costs one step."""
        return cls(qs=[1, max_q], contexts=[0], seconds=[[seconds, seconds]], device_name="flat")

    def table(self) -> str:
        head = "context " + " ".join(f"{'q=' + str(q):>8}" for q in self.qs)
        lines = [head]
        for c, row in zip(self.contexts, self.seconds, strict=True):
            lines.append(f"{c:7d} " + " ".join(f"{1000 * s:6.1f}ms" for s in row))
            lines.append("  ×t(1) " + " ".join(f"{s / row[0]:7.2f}×" for s in row))
        for b, m in sorted(self.batches.items()):  # then each batch size's, q tokens in every row
            lines += ["", f"batch size {b} (q per row)", m.table()]
        return "\n".join(lines)
