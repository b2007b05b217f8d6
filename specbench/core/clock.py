"""The serving clock a batch's records count from.

Seconds since the batch began, as ``perf_counter`` reads them, less two kinds of time that are not the
engine's: the time the harness holds the clock paused (writing a finished request's row while every live row
waits: :func:`specbench.core.decode.decode_batch` pauses it across each yield) and idle gaps skipped when no
request is live and the next one arrives later (requests at a rate: nothing runs meanwhile, so nothing is
measured). Every timestamp of a record (``arrival_s``, ``started_s``, ``step_ends``, ``finished_s``) is on
this clock, so latencies, inter-token gaps and a run's span all leave the harness's own work out.
"""

from __future__ import annotations

from time import perf_counter


class Clock:
    def __init__(self, start: float | None = None) -> None:
        self.origin = perf_counter() if start is None else start
        self.paused_s = self.idle_s = 0.0  # what was left off the clock, for the record
        self._paused_at: float | None = None

    def at(self, t: float) -> float:
        """A ``perf_counter`` reading taken while the clock ran, in this clock's seconds."""
        return t - self.origin

    def now(self) -> float:
        return (perf_counter() if self._paused_at is None else self._paused_at) - self.origin

    def pause(self) -> None:
        if self._paused_at is None:
            self._paused_at = perf_counter()

    def resume(self) -> None:
        if self._paused_at is not None:
            gap = perf_counter() - self._paused_at
            self.origin += gap
            self.paused_s += gap
            self._paused_at = None

    def skip_to(self, t: float) -> None:
        """Nothing runs until ``t`` (this clock's seconds): jump there instead of waiting."""
        gap = t - self.now()
        if gap > 0:
            self.origin -= gap
            self.idle_s += gap
