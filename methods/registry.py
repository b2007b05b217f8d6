"""The method registry: name → drafter class, with "did you mean" errors.

Importing the package :mod:`methods` imports every method module, each of which registers itself
with :func:`register_method`; :func:`get_method` and :func:`method_names` answer from the table.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from specbench.errors import UnknownNameError, suggest

_METHODS: dict[str, type] = {}


def register_method(cls: type) -> type:
    """Class decorator: register a :class:`specbench.core.draft.Drafter` under ``cls.name``."""
    name = cls.name
    if name in _METHODS and _METHODS[name] is not cls:
        raise ValueError(f"method '{name}' is registered twice")
    _METHODS[name] = cls
    return cls


def method_names() -> list[str]:
    return sorted(_METHODS)


def get_method(name: str) -> type:
    if name not in _METHODS:
        raise UnknownNameError(suggest("method", name, list(_METHODS), "Pick one with method=<name>."))
    return _METHODS[name]


def build_method_config(name: str, params: dict[str, Any], budget: str = "fixed") -> Any:
    """Fill a method's hyperparameter dataclass, rejecting unknown keys with a hint; a config with an
    ``under_budget(budget)`` method resolves its budget-dependent settings there."""
    import dataclasses

    cls = get_method(name)
    fields = (
        {f.name for f in dataclasses.fields(cls.Config)} if dataclasses.is_dataclass(cls.Config) else set()
    )
    for key in params:
        if key not in fields:
            raise UnknownNameError(suggest(f"setting of method {name}", key, sorted(fields) or ["(none)"]))
    if fields:
        hints = typing.get_type_hints(cls.Config)
        params = {k: _typed(k, hints.get(k), v) for k, v in params.items()}
    cfg = cls.Config(**params)
    resolve = getattr(cfg, "under_budget", None)
    if callable(resolve):
        resolve(budget)
    check = getattr(cfg, "validate", None)
    if callable(check):
        check()
    return cfg


_KIND = {int: "a whole number", float: "a number", bool: "true or false", str: "a string"}


def _typed(field: str, hint: Any, value: Any) -> Any:
    """``value`` as the dataclass field's type (int, float, bool, str, optionally ``| None``), or ValueError."""
    options = [hint]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = list(typing.get_args(hint))
    if value is None:
        if type(None) in options or hint is None:
            return None
        raise ValueError(f"{field} may not be null")
    simple = [t for t in options if t in _KIND]
    if len(simple) != len([t for t in options if t is not type(None)]):
        return value  # a type this check does not know (list, Literal, ...): the dataclass decides
    for t in simple:
        if t is bool and isinstance(value, bool):
            return value
        if t is int and isinstance(value, (int, float)) and not isinstance(value, bool):
            if float(value).is_integer():
                return int(value)
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if t is str and isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    want = " or ".join(_KIND[t] for t in simple) + (" (or null)" if type(None) in options else "")
    raise ValueError(f"{field} must be {want}, got {value!r}")
