"""Where a dataset's records come from: a local file (JSONL, JSON or parquet, ``.gz`` allowed) or the
Hugging Face hub through ``datasets``, offline from its cache when the hub cannot be reached."""

from __future__ import annotations

import gzip
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from specbench import hub
from specbench.errors import DatasetUnavailableError


def read_records(path: str | os.PathLike) -> list[dict]:
    """Rows of a JSONL, JSON or parquet file (optionally gzipped JSON/JSONL), as dicts.

    JSON may hold a list of records, a mapping of columns (equal-length lists),
    a mapping id → record, or one of those under ``data`` / ``rows`` / ``examples``.
    A malformed file raises :class:`DatasetUnavailableError` naming the file and line.
    """
    p = Path(path).expanduser()
    name = p.name.lower()
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            return pq.read_table(p).to_pylist()
        except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
            raise DatasetUnavailableError(
                f"{p} is not a readable parquet file ({str(err).splitlines()[0][:120]}): "
                "re-create it or point dataset.path at a good copy"
            ) from None
    opener = gzip.open if name.endswith(".gz") else open
    try:
        with opener(p, "rt", encoding="utf-8") as f:
            text = f.read()
    except (UnicodeDecodeError, OSError, EOFError) as err:
        raise DatasetUnavailableError(f"{p} cannot be read as UTF-8 text ({err}): check the file") from None
    stem = name[:-3] if name.endswith(".gz") else name
    if stem.endswith(".jsonl") or stem.endswith(".ndjson"):
        return _json_lines(text, p)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        first = next((line for line in text.splitlines() if line.strip()), "")
        try:
            json.loads(first)
        except json.JSONDecodeError:  # one JSON document with a syntax error
            raise DatasetUnavailableError(
                f"{p} line {err.lineno} is not valid JSON ({err.msg}): fix the file"
            ) from None
        return _json_lines(text, p)  # JSON Lines under another extension
    return _records_from_json(data, p)


def _json_lines(text: str, p: Path) -> list[dict]:
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise DatasetUnavailableError(
                f"{p} line {number} is not valid JSON ({err.msg}): fix or remove that line"
            ) from None
    return records


def _records_from_json(data: Any, p: Path) -> list[dict]:
    if isinstance(data, list):
        return data
    if isinstance(data, dict):
        for key in ("data", "rows", "examples", "test"):
            if isinstance(data.get(key), list):
                return data[key]
        values = list(data.values())
        if values and all(isinstance(v, list) for v in values) and len({len(v) for v in values}) == 1:
            keys = list(data)
            return [dict(zip(keys, row, strict=True)) for row in zip(*values, strict=True)]
        if values and all(isinstance(v, dict) for v in values):
            return values
    raise DatasetUnavailableError(
        f"{p}: expected a list of records, a mapping of columns or of records: check the file's layout"
    )


def _datasets():
    try:
        import datasets
    except ImportError as e:
        raise DatasetUnavailableError(
            "the Hugging Face `datasets` library is not installed: run: pip install datasets, "
            "or set dataset.path to a local copy"
        ) from e
    return datasets


def hub_cache_root(hub_id: str, cache_dir: str | None = None) -> Path:
    """Where ``datasets`` keeps its prepared copy of ``hub_id`` (``<cache>/<owner>___<name>``)."""
    datasets = _datasets()
    from datasets.naming import camelcase_to_snakecase

    parts = hub_id.split("/")
    parts[-1] = camelcase_to_snakecase(parts[-1])
    root = cache_dir or datasets.config.HF_DATASETS_CACHE
    return Path(root).expanduser() / "___".join(parts)


def hub_cached(hub_id: str, cache_dir: str | None = None, config: str | None = None) -> bool:
    """Whether a prepared copy of ``hub_id`` (of ``config``, if given) is in the datasets cache."""
    root = hub_cache_root(hub_id, cache_dir)
    return any(p.is_dir() for p in root.glob(f"{config or ''}*/*/*"))


@contextmanager
def _offline_mode():
    """Put ``datasets`` and ``huggingface_hub`` offline for one call (their flags are read at import)."""
    datasets = _datasets()
    import huggingface_hub.constants as hub_constants

    saved = (datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE)
    datasets.config.HF_HUB_OFFLINE = hub_constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved


SCRIPT_FALLBACK_REVISION = "refs/convert/parquet"


def hub_load(
    hub_id: str, config: str | None, split: str, revision: str | None, cache_dir: str | None, unavailable: str
) -> list[dict]:
    """Rows of one split through ``datasets.load_dataset``; ``unavailable`` is the error for a missing copy.

    A repository that still holds a loading script (which ``datasets`` >= 4 refuses)
    is retried once on the hub's automatic parquet conversion, ``refs/convert/parquet``.
    """
    datasets = _datasets()
    kwargs: dict[str, Any] = {"split": split, "cache_dir": cache_dir}
    if revision:
        kwargs["revision"] = revision
    if not hub.reachable():
        if not hub_cached(hub_id, cache_dir, config):
            raise DatasetUnavailableError(unavailable)
        try:
            with _offline_mode():
                ds = datasets.load_dataset(hub_id, config, **kwargs)
        except (ConnectionError, FileNotFoundError, ValueError) as e:
            detail = (str(e).splitlines() or [""])[0][:200]
            raise DatasetUnavailableError(f"{unavailable} ({type(e).__name__}: {detail})") from e
        return [dict(r) for r in ds]
    try:
        ds = datasets.load_dataset(hub_id, config, **kwargs)
    except RuntimeError as e:
        if revision or "scripts are no longer supported" not in str(e):
            raise
        kwargs["revision"] = SCRIPT_FALLBACK_REVISION
        ds = datasets.load_dataset(hub_id, config, **kwargs)
    except (ConnectionError, FileNotFoundError) as e:
        detail = (str(e).splitlines() or [""])[0][:200]
        fix = unavailable.split(": ", 1)[-1]  # the "set dataset.path=..., or run: ..." part
        raise DatasetUnavailableError(
            f"loading '{hub_id}' from the hub failed ({type(e).__name__}: {detail}): {fix}"
        ) from e
    return [dict(r) for r in ds]
