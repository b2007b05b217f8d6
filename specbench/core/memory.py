"""How long what a drafter learns is kept: a method's ``memory`` setting.

One generation (``turn``), every turn of a sample (``sample``), or the whole run (``run``). At batch size > 1
a drafter is spawned for each request decoded beside another; under ``memory: run`` the spawned drafters
share what the run keeps (the objects :attr:`ScopedMemory.RUN_STATE` names), so the run has one memory that
every request reads and teaches, as at batch size 1, while what belongs to one generation (a window, a
match, the step's root) stays each request's own.
"""

from __future__ import annotations

from typing import Any, ClassVar

MEMORY_SCOPES = ("turn", "sample", "run")


def check_memory(method: str, memory: str) -> None:
    if memory not in MEMORY_SCOPES:
        raise ValueError(f"{method}: memory must be one of {', '.join(MEMORY_SCOPES)}, got '{memory}'")


def share(source: Any, twin: Any, paths: tuple[str, ...]) -> None:
    """Point ``twin``'s attributes at ``paths`` (dotted: ``engine.dicts``) to the objects ``source`` holds."""
    for path in paths:
        *inner, last = path.split(".")
        a, b = source, twin
        for name in inner:
            a, b = getattr(a, name), getattr(b, name)
        setattr(b, last, getattr(a, last))


class ScopedMemory:
    """Mixin for drafters whose learned state can outlive a generation. It is kept for
    ``self.config.memory`` (:data:`MEMORY_SCOPES`); the drafter defines :meth:`forget` (clearing what it
    learned in place, so that drafters sharing it stay shared), and :meth:`Drafter.new_turn` calls
    :meth:`begin_turn` before each generation."""

    # What ``memory: run`` keeps, as attribute paths: shared by the drafters spawned for concurrent requests.
    RUN_STATE: ClassVar[tuple[str, ...]] = ()

    def forget(self) -> None:  # abstract hook: each drafter clears its own learned state
        raise NotImplementedError

    def reset(self) -> None:
        self.forget()

    def begin_sample(self) -> None:
        if self.config.memory != "run":
            self.forget()

    def begin_turn(self) -> None:
        if self.config.memory == "turn":
            self.forget()

    def spawn(self):
        """Another request's drafter (:meth:`Drafter.spawn`); under ``memory: run`` it shares this one's
        :attr:`RUN_STATE`."""
        twin = super().spawn()  # type: ignore[misc]
        if self.config.memory == "run":
            share(self, twin, self.RUN_STATE)
        return twin
