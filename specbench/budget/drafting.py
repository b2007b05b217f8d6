"""What a drafter's own work costs a step: seconds against the depth and top-k it drafts, and a stopped step's.

A step's drafting (an EAGLE head's levels, a draft model's chain, a lookup) is modelled as a + b·d + c·d·w + e·p
seconds for depth d, top-k w (w = 0 for a drafter without one) and p tokens committed by plain steps since the
drafter last drafted (an EAGLE head catches up on them first; 0 while it drafts every step, so a drafter that
never pauses fits e = 0: a minimum-norm fit leaves a column of zeros out), a least-squares fit through the steps
measured, each weighing as much as the last :data:`WINDOW` together (so the fit follows a machine's drift);
a step that drafts nothing costs ``stopped`` (the drafter's update and the loop's bookkeeping), priced in the
plain option. Under ``budget=auto`` the fit starts from the warm-up's measurement and goes on learning from the
run; under ``budget=static`` it is a table stored once per machine and preset
(:func:`specbench.machine.costs.table_path`) and never changes, so two runs make the same decisions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

WINDOW = 32  # a measured step weighs 1/32 of the fit once 32 are in: drift is followed within ~32 steps


class DraftingCost:
    """Drafting seconds for (depth, top-k); ``frozen``: a stored table that measurements do not change."""

    def __init__(self, frozen: bool = False) -> None:
        self.frozen = frozen
        self.points = 0  # drafting steps in the fit
        self.deepest = self.widest = 0  # the deepest depth and widest top-k measured
        self.stopped = 0.0  # seconds of a step that drafted nothing (running mean)
        self._stops = 0
        self._xx, self._xy = np.zeros((4, 4)), np.zeros(4)  # weighted means of x xᵀ and x·s, x = (1, d, d·w, p)
        self.coef = (0.0, 0.0, 0.0, 0.0)  # plain floats: the first numpy call after a forward takes ~50 µs on a
        # CPU (caches cold), plain arithmetic ~10

    def __call__(self, depth: int, width: int | None = None, behind: int = 0) -> float:
        if depth <= 0:
            return self.stopped
        a, b, c, e = self.coef
        return max(a + b * depth + c * depth * (width or 0) + e * behind, 0.0)

    def observe(self, depth: int, width: int | None, seconds: float, behind: int = 0) -> None:
        """A step drafted to ``depth`` at top-k ``width`` (0 or None: none) in ``seconds`` (depth 0: stopped), with
        ``behind`` tokens committed by plain steps since the drafter last drafted."""
        if self.frozen:
            return
        if depth <= 0:
            self._stops += 1
            self.stopped += max(1 / WINDOW, 1 / self._stops) * (seconds - self.stopped)
            return
        self.points += 1
        self.deepest, self.widest = max(self.deepest, depth), max(self.widest, width or 0)
        x = np.array([1.0, depth, depth * (width or 0), behind])
        v = max(1 / WINDOW, 1 / self.points)
        self._xx += v * (np.outer(x, x) - self._xx)
        self._xy += v * (x * seconds - self._xy)
        # minimum-norm least squares: while only one depth was drafted, its seconds spread over a and b
        self.coef = tuple(float(x) for x in np.linalg.lstsq(self._xx, self._xy, rcond=1e-9)[0])

    def copy(self, frozen: bool | None = None) -> DraftingCost:
        out = DraftingCost.from_dict(self.to_dict())
        out.frozen = self.frozen if frozen is None else frozen
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"coef": list(self.coef), "stopped": self.stopped, "points": self.points, "stops": self._stops,
                "deepest": self.deepest, "widest": self.widest, "xx": self._xx.tolist(), "xy": self._xy.tolist()}

    @classmethod
    def from_dict(cls, d: dict[str, Any], frozen: bool = False) -> DraftingCost:
        out = cls(frozen)
        n = len(out.coef)  # tables stored before p was a column have three: p's is zero
        out.coef, out.stopped = tuple(map(float, [*d["coef"], 0.0][:n])), float(d["stopped"])
        out.points, out._stops = int(d.get("points", 0)), int(d.get("stops", 0))
        out.deepest, out.widest = int(d.get("deepest", 0)), int(d.get("widest", 0))
        xx, xy = np.array(d.get("xx", np.zeros((n, n)))), np.array(d.get("xy", np.zeros(n)))
        out._xx[:len(xx), :len(xx)], out._xy[:len(xy)] = xx, xy
        return out

