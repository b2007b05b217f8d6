"""Decoding methods: one small drafter module each, registered by name.

Importing this package imports every method module (each registers itself in :mod:`methods.registry`);
a method imports nothing from another method.
"""

import importlib
import pkgutil

from methods.registry import build_method_config, get_method, method_names, register_method

for _mod in pkgutil.iter_modules(__path__):
    if not _mod.name.startswith("_") and _mod.name != "registry":
        importlib.import_module(f"{__name__}.{_mod.name}")

__all__ = ["build_method_config", "get_method", "method_names", "register_method"]
