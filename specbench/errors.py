"""Every error a user can cause, in one place, and how they end a run: one line naming the fix.

This module sits below every other one and imports nothing from the project.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import sys


class ConfigError(ValueError):
    """A bad setting; the message is one line and names the fix."""


class UnknownNameError(ValueError):
    """An unknown method/model/dataset/preset name; the message suggests the closest ones."""


class DatasetUnavailableError(ValueError):
    """A dataset cannot be read from its configured source; the message is one line naming the fix."""


class ModelLoadError(ValueError):
    """A model cannot be loaded; the message is one line and names the fix."""


USER_ERRORS = (ConfigError, UnknownNameError, DatasetUnavailableError, ModelLoadError)


def user_error_types() -> tuple[type[BaseException], ...]:
    return USER_ERRORS


def suggest(kind: str, name: str, choices: list[str], hint: str = "") -> str:
    """``unknown <kind> '<name>'; did you mean ...? Choices: ...`` with an optional hint."""
    close = difflib.get_close_matches(name, choices, n=3, cutoff=0.5)
    msg = f"unknown {kind} '{name}'"
    if close:
        msg += f"; did you mean {' or '.join(repr(c) for c in close)}?"
    msg += f" Choices: {', '.join(sorted(choices))}."
    if hint:
        msg += f" {hint}"
    return msg


@contextlib.contextmanager
def one_line_errors():
    """Print a user error as ``error: ...`` and exit 2 (set SPECBENCH_DEBUG=1 for the traceback)."""
    try:
        yield
    except USER_ERRORS as err:
        if os.environ.get("SPECBENCH_DEBUG"):
            raise
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
