"""Host syncs a decode step may cost, per method, and how they are counted on a CUDA GPU.

A sync is a point where the host waits for the device: a read of a GPU value (``item()``, ``tolist()``,
``.cpu()``, a boolean mask, ``nonzero``) or a blocking copy from host memory. torch's sync debug mode
(``torch.cuda.set_sync_debug_mode("warn")``) warns at each one; :func:`step_syncs` counts those warnings
between one proposal and the next, so each decode step's count includes its verification, its acceptance and
the drafter's own reads. The timing's explicit ``torch.cuda.synchronize`` does not warn and is not counted.

:func:`ceilings` is what each step of a method needs: one read of the step's verified tokens, what its drafter
reads (:meth:`~specbench.core.draft.Drafter.host_reads`: an auxiliary window's logits once, an EAGLE tree once
per level, a draft model once per drafted token); a sampled step's acceptance is decided on the device and read
once, as a greedy step's argmaxes are.
These are the counts measured on simulated GPUs, where each is reached. :func:`judge` checks every step
against its ceiling and against the floor of one read a step: a counter that counted nothing fails.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch

SYNC_MESSAGE = "synchroniz"  # torch's warning: "called a synchronizing CUDA operation"
FLOOR = 1  # every decode step reads what the target verified


def ceilings(cls: Any, config: Any, record: Any) -> list[int]:
    """The most syncs each decode step of ``record`` may cost for drafter class ``cls`` (its ``config``): the
    verification's one read (greedy: the argmaxes; sampled: the whole walk, decided on the device) and what the
    drafter reads for the guesses it drafted (:meth:`specbench.core.draft.Drafter.host_reads`)."""
    return [1 + cls.host_reads(config, drafted) for drafted in record.step_drafted[1:]]


def batch_ceiling(cls: Any, config: Any, drafted: list[int]) -> int:
    """The most syncs one step of a batch may cost, its rows having drafted ``drafted`` guesses: one read of
    every row's verified tokens (greedy: every argmax at once; sampling: every row's walk at once), and the
    drafting's: one row's reads for the longest draft when ``cls`` drafts the batch at once
    (``propose_rows``; ``drafts_batch_at_once(config)`` where that depends on the settings), else every row's own."""
    together = getattr(cls, "drafts_batch_at_once", None)  # a class whose batch path may read per row says so
    if (together(config) if together else getattr(cls, "propose_rows", None) is not None):
        return 1 + cls.host_reads(config, max(drafted))
    return 1 + sum(cls.host_reads(config, d) for d in drafted)


@contextlib.contextmanager
def sync_warnings() -> Iterator[list]:
    """torch's sync debug mode set to warn for the block; yields the live list of warnings caught (every kind:
    :func:`count` picks the syncs). Off CUDA the list stays empty."""
    if not torch.cuda.is_available():
        yield []
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            yield seen
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def count(caught: list) -> int:
    return sum(SYNC_MESSAGE in str(w.message) for w in caught)


@contextlib.contextmanager
def step_syncs(drafter: Any) -> Iterator[list[int]]:
    """Each decode step's syncs (from one of ``drafter``'s proposals to the next, the last to the block's end),
    appended to the yielded list when the block ends."""
    counts: list[int] = []
    marks: list[int] = []
    propose = drafter.propose
    with sync_warnings() as caught:

        def marked(state):
            marks.append(len(caught))
            return propose(state)

        drafter.propose = marked
        try:
            yield counts
        finally:
            drafter.propose = propose
            ends = [*marks[1:], len(caught)]
            counts.extend(count(caught[a:b]) for a, b in zip(marks, ends, strict=True))


def judge(counts: list[int], limits: list[int]) -> tuple[bool, str]:
    """Every step within [:data:`FLOOR`, its ceiling]; the detail gives what was seen, and the steps over or
    under."""
    if not counts or len(counts) != len(limits):
        return False, f"{len(counts)} steps counted for {len(limits)} decode steps"
    over = [(c, lim) for c, lim in zip(counts, limits, strict=True) if c > lim]
    under = sum(c < FLOOR for c in counts)
    ok = not over and not under
    detail = f"{min(counts)}–{max(counts)} a step (ceilings {min(limits)}–{max(limits)})"
    if over:
        detail += f", {len(over)} steps over (e.g. {over[0][0]} > {over[0][1]})"
    if under:
        detail += f", {under} steps under {FLOOR}"
    return ok, detail
