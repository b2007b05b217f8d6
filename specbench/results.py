"""Result rows and their parquet files: one row per sample × turn, one file per job.

A job's file is ``results/<experiment>/<run_name>.parquet``. :class:`ResultWriter`
rewrites it atomically after every row, so a run killed at any moment leaves a
complete file and loses at most the sample in flight; reopening it resumes
(see :meth:`ResultWriter.done_keys`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from specbench import metrics
from specbench.record import GenerationRecord

# Run-level fields the runner must put in ``context``.
REQUIRED_CONTEXT = (
    "run_id",
    "experiment",
    "config_hash",
    "provenance",
    "model",
    "method",
    "dataset",
    "dtype",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "max_new_tokens",
)
PROVENANCE_FIELDS = (
    "git_commit",
    "specbench_version",
    "python_version",
    "torch_version",
    "transformers_version",
    "device_name",
)


def _json(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(dict(value) if value is not None else {}, sort_keys=True, default=str)


def _counter_json(counter: Any) -> str:
    """A Counter as JSON with string keys (positions become "1", "2", ...)."""
    return json.dumps({str(k): int(v) for k, v in dict(counter).items()}, sort_keys=True)


def output_sha1(ids: Iterable[int]) -> str:
    """sha1 of the token ids written as comma-separated decimals."""
    return hashlib.sha1(",".join(str(int(i)) for i in ids).encode("ascii")).hexdigest()


def make_row(
    record: GenerationRecord,
    *,
    context: dict[str, Any],
    sample_id: str,
    turn: int,
    output_text: str,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One result row: run-level ``context`` + this generation's counts and timings.

    ``context`` holds :data:`REQUIRED_CONTEXT` (``provenance`` is the dict of
    :func:`specbench.provenance.environment_info`), and optionally
    ``method_params`` (dict or JSON), ``dataset_version``, ``device`` (the
    hardware label), ``preset`` (the method's config preset, default the method)
    and ``attn_implementation``. ``extra`` columns (ROUGE scores, ...) are merged in; they
    may not overwrite a schema column.
    """
    missing = [k for k in REQUIRED_CONTEXT if k not in context]
    if missing:
        raise KeyError(f"make_row: context lacks {missing}")
    prov = context["provenance"]
    step_tokens = [int(n) for n in record.step_tokens]
    step_times = [float(t) for t in record.step_times]
    ids = [int(i) for i in record.output_ids]
    row: dict[str, Any] = {
        "run_id": str(context["run_id"]),
        "experiment": str(context["experiment"]),
        "config_hash": str(context["config_hash"]),
        **{k: str(prov.get(k, "unknown")) for k in PROVENANCE_FIELDS},
        "device": str(context.get("device", "")),
        "dtype": str(context["dtype"]),
        "model": str(context["model"]),
        "method": str(context["method"]),
        "preset": str(context.get("preset") or context["method"]),
        "attn_implementation": str(context.get("attn_implementation", "")),
        "method_params": _json(context.get("method_params")),
        "dataset": str(context["dataset"]),
        "dataset_version": str(context.get("dataset_version", "")),
        "sample_id": str(sample_id),
        "turn": int(turn),
        "temperature": float(context["temperature"]),
        "top_p": float(context["top_p"]),
        "top_k": int(context["top_k"] or 0),
        "seed": int(context["seed"]),
        "max_new_tokens": int(context["max_new_tokens"]),
        "prompt_tokens": int(record.prompt_len),
        "new_tokens": record.new_tokens,
        "steps": record.steps,
        "tau": metrics.tau(record.new_tokens, record.steps),
        "prefill_s": float(record.prefill_s),
        "decode_s": float(record.decode_s),
        "wall_s": float(record.wall_s),
        "mac_tp": metrics.mac_tp(step_tokens, step_times),
        "mic_tp": metrics.mic_tp(step_tokens, step_times),
        "step_tokens": step_tokens,
        "step_times": step_times,
        "step_drafted": [int(n) for n in record.step_drafted],
        "accepted_per_step": [int(n) for n in record.accepted_per_step],
        "drafted_by_source": _counter_json(record.drafted_by_source),
        "accepted_by_source": _counter_json(record.accepted_by_source),
        "accepted_by_position": _counter_json(record.accepted_by_position),
        "draft_overhead_s": float(sum(record.step_draft_s)),
        "output_ids": ids,
        "output_sha1": output_sha1(ids),
        "output_text": output_text,
        "finish_reason": record.finish_reason,
    }
    for k, v in (extra or {}).items():
        if k in row:
            raise ValueError(f"make_row: extra column {k!r} clashes with the schema")
        row[k] = v
    return row


def _slug(value: Any) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", str(value)).strip("-.") or "x"


def run_name(model: str, method: str, dataset: str, temperature: float, seed: int, config_hash: str) -> str:
    """Filesystem-safe job name, e.g. ``SmolLM2-135M__spectra__mtbench__t0__s0__1a2b3c4d5e6f``."""
    parts = [
        model.rstrip("/").split("/")[-1],
        method,
        dataset,
        f"t{float(temperature):g}",
        f"s{int(seed)}",
        config_hash,
    ]
    return "__".join(_slug(p) for p in parts)


def run_file_path(results_dir: str | os.PathLike, experiment: str, run_name: str) -> Path:
    """``<results_dir>/<experiment>/<run_name>.parquet``."""
    return Path(results_dir) / _slug(experiment) / f"{run_name}.parquet"


def _to_table(rows: list[dict[str, Any]]) -> pa.Table:
    columns: dict[str, None] = {}
    for r in rows:
        columns.update(dict.fromkeys(r))
    return pa.table({c: [r.get(c) for r in rows] for c in columns})


class ResultWriter:
    """Append-only parquet file of one job, rewritten atomically on each append."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.tmp_path = self.path.with_name(self.path.name + ".tmp")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.tmp_path.exists():  # a write interrupted before os.replace: never complete
            self.tmp_path.unlink()
        self.rows: list[dict[str, Any]] = pq.read_table(self.path).to_pylist() if self.path.exists() else []

    def __len__(self) -> int:
        return len(self.rows)

    def done_keys(self) -> set[tuple[str, int, str]]:
        """(sample_id, turn, method) of every row already written."""
        return {(r["sample_id"], int(r["turn"]), r["method"]) for r in self.rows}

    def append(self, row: dict[str, Any]) -> None:
        """Add a row and rewrite the file; a row whose key is already written is refused."""
        key = (row["sample_id"], int(row["turn"]), row["method"])
        if key in self.done_keys():
            raise ValueError(f"ResultWriter: {key} is already in {self.path}")
        self.rows.append(row)
        try:
            self._write()
        except BaseException:
            self.rows.pop()
            raise

    def _write(self) -> None:
        table = _to_table(self.rows)
        with open(self.tmp_path, "wb") as f:
            pq.write_table(table, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(self.tmp_path, self.path)
        try:  # make the rename itself durable
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(dir_fd)
        except OSError:
            pass
        finally:
            os.close(dir_fd)


def load_results(source: str | os.PathLike | Iterable[str | os.PathLike]) -> pd.DataFrame:
    """Concatenate result files: a file, a directory (searched recursively), or a list of either."""
    sources = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    files: list[Path] = []
    for s in map(Path, sources):
        files += sorted(s.rglob("*.parquet")) if s.is_dir() else [s]
    frames = [pq.read_table(f).to_pandas() for f in files]
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
