"""Where things are: the config folder, the cache, files shipped inside installed packages, settings.

A base module: it imports nothing from the project but :mod:`specbench.errors`.
"""

from __future__ import annotations

import fcntl
import importlib.metadata as md
import os
import shutil
import uuid
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def conf_choices(group: str) -> list[str]:
    """The presets of a config group (``conf/<group>/*.yaml``), sorted."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def cache_root() -> Path:
    """``$SPECBENCH_CACHE`` (default ``~/.cache/specbench``): converted weights, cost curves, stores, heads."""
    return Path(os.environ.get("SPECBENCH_CACHE") or Path.home() / ".cache" / "specbench")


def compiled_packages() -> Path:
    """Where ``forward=compiled`` keeps what it compiles ahead of time (a CPU's one-token steps)."""
    return cache_root() / "compiled"


def private_tmp(path: Path) -> Path:
    """A temporary name beside ``path`` that no other process uses: write there, then ``replace`` onto
    ``path`` (two jobs filling one cache entry at once must not share, and lose, one temporary file)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def write_json(path: Path, data) -> None:
    """``data`` as indented JSON at ``path``, whole or not at all: written to a :func:`private_tmp` name, then
    replaced onto ``path`` (its folder made)."""
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = private_tmp(path)
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


@contextmanager
def exclusive(path: Path, on_wait=None):
    """An exclusive lock on ``.<name>.lock`` beside ``path`` (flock: jobs on one machine, or on nodes of a
    shared filesystem that supports it): what many jobs need is made by one while the others wait.
    ``on_wait()`` is called once when another holder makes this one wait."""
    lock = path.with_name(f".{path.name}.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def atomic_publish(tmp: Path, final: Path) -> None:
    """Rename a finished temporary file/dir into place; if another process won the race, keep theirs."""
    tmp.chmod(0o755 if tmp.is_dir() else 0o644)  # mkdtemp/mkstemp create private entries
    try:
        os.rename(tmp, final)
    except OSError:
        if not final.exists():
            raise
        shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()


def package_file(dist_name: str, name: str, *, prefix: bool = False) -> Path | None:
    """A file shipped inside an installed distribution, found through its metadata (never imported), or None
    when the distribution or the file is absent. ``name`` is the file's path in the distribution, or with
    ``prefix=True`` the start of its file name (code files excluded)."""
    try:
        dist = md.distribution(dist_name)
    except md.PackageNotFoundError:
        return None
    for entry in dist.files or []:
        if prefix:
            hit = entry.name.startswith(name) and not entry.name.endswith((".py", ".pyc"))
        else:
            hit = str(entry).replace("\\", "/") == name
        if hit:
            path = Path(dist.locate_file(entry))
            if path.is_file():
                return path
    if prefix:
        return None
    path = Path(dist.locate_file(name))
    return path if path.is_file() else None


def package_installed(dist_name: str) -> bool:
    try:
        md.distribution(dist_name)
    except md.PackageNotFoundError:
        return False
    return True


def setting(cfg: Any, key: str, default: Any = None) -> Any:
    """``cfg[key]`` for a mapping (dict, DictConfig) or attribute object; ``default`` if absent or null."""
    if cfg is None:
        return default
    if isinstance(cfg, Mapping):
        value = cfg.get(key, None)
    else:
        value = getattr(cfg, key, None)
    return default if value is None else value
