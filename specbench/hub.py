"""The Hugging Face hub: is it reachable, and where is its local cache. One answer for models and data.

A base module: it imports nothing from the project.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlparse

_TRUE = {"1", "ON", "YES", "TRUE"}
_PROBES: dict[str, bool] = {}


def offline_forced() -> bool:
    """True when the environment puts the hub offline (read at call time, unlike the libraries)."""
    return any(
        os.environ.get(var, "").strip().upper() in _TRUE
        for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def reachable(timeout: float = 3.0) -> bool:
    """Whether the hub endpoint accepts a TCP connection (probed once per process), unless forced offline."""
    if offline_forced():
        return False
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    if endpoint not in _PROBES:
        url = urlparse(endpoint)
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            socket.create_connection((url.hostname, port), timeout=timeout).close()
            _PROBES[endpoint] = True
        except OSError:
            _PROBES[endpoint] = False
    return _PROBES[endpoint]


def model_cache_dir() -> str:
    """The hub's cache of model files: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache",
                                                     "huggingface")
    return os.path.join(home, "hub")
