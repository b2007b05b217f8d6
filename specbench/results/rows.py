"""Result rows and their parquet files: one row (one file) per sample × turn × method × repeat.

A run (one config: model, method, dataset, settings) is the folder ``results/<experiment>/<run_name>/``, one small
parquet file per row, each written under a temporary name and renamed into place. So a job killed at any moment
loses at most the generation in flight, a re-run resumes, and any number of jobs (shards of one run, a requeued
job) write the same run at once without losing or overwriting a row (see :class:`ResultWriter`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbench.core.record import GenerationRecord
from specbench.errors import ConfigError

if TYPE_CHECKING:  # pandas and pyarrow load when rows are read or written, not when a job's config is checked
    import pandas as pd
    import pyarrow as pa

# Run-level fields the runner must put in ``context``.
REQUIRED_CONTEXT = ("run_id", "experiment", "config_hash", "provenance", "model", "method", "dataset", "dtype",
                    "temperature", "top_p", "top_k", "seed", "max_new_tokens")
# Rows that agree on these are one measurement: reading keeps one of them.
DEDUP_KEYS = ("experiment", "config_hash", "sample_id", "turn", "method", "repeat")
PROVENANCE_FIELDS = (
    "git_commit", "specbench_version", "python_version", "torch_version", "transformers_version",
    "device_name", "gpu_count", "device_map", "quantization", "cuda_version", "driver_version", "linear",
    "slurm_job_id", "slurm_node", "slurm_restarts",
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
    repeat: int = 0,
) -> dict[str, Any]:
    """One result row: run-level ``context`` + this generation's counts and timings.

    ``context`` holds :data:`REQUIRED_CONTEXT` (``provenance`` is the dict of
    :func:`specbench.provenance.environment_info`), and optionally
    ``method_params`` (dict or JSON), ``dataset_version``, ``device`` (the
    hardware label), ``preset`` (the method's config preset, default the method)
    and ``attn_implementation``. ``extra`` columns (ROUGE scores, ...) are merged in; they
    may not overwrite a schema column.
    """
    from specbench.results import metrics

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
        "forward": str(context.get("forward") or "eager"),
        "method_params": _json(context.get("method_params")),
        "dataset": str(context["dataset"]),
        "dataset_version": str(context.get("dataset_version", "")),
        "sample_id": str(sample_id),
        "turn": int(turn),
        "repeat": int(repeat),
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
        "mac_tp": metrics.mac_tp(step_tokens[1:], step_times[1:]),
        "mic_tp": metrics.mic_tp(step_tokens[1:], step_times[1:]),
        "step_tokens": step_tokens,
        "step_times": step_times,
        "step_drafted": [int(n) for n in record.step_drafted],
        "accepted_per_step": [int(n) for n in record.accepted_per_step],
        "step_depth": [int(n) for n in record.step_depth],
        "drafted_by_source": _counter_json(record.drafted_by_source),
        "accepted_by_source": _counter_json(record.accepted_by_source),
        "accepted_by_position": _counter_json(record.accepted_by_position),
        "token_sources": [str(s) for s in record.token_sources],
        "draft_overhead_s": float(sum(record.step_draft_s)),
        "lookup_s": float(sum(record.step_lookup_s)),
        "step_lookup_s": [float(t) for t in record.step_lookup_s],
        "output_ids": ids,
        "output_sha1": output_sha1(ids),
        "output_text": output_text,
        "finish_reason": record.finish_reason,
        "batch_size": int(context.get("batch_size") or 1),
        "slot": int(record.slot),
        "started_s": float(record.started_s),
        "finished_s": float(record.finished_s),
        "arrival_s": float(record.arrival_s),
        "step_ends_s": [float(t) for t in record.step_ends],
        # a served run's load (None: requests decoded one at a time, each on its own clock)
        "request_rate": float(context["request_rate"]) if context.get("request_rate") is not None else None,
        "max_concurrency": int(context.get("max_concurrency") or context.get("batch_size") or 1),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="microseconds"),
    }
    for k, v in (extra or {}).items():
        if k in row:
            raise ValueError(f"make_row: extra column {k!r} clashes with the schema")
        row[k] = v
    return row


def _slug(value: Any, keep: str = "") -> str:
    return re.sub(rf"[^A-Za-z0-9._{re.escape(keep)}-]+", "-", str(value)).strip("-.") or "x"


def run_name(model: str, preset: str, dataset: str, temperature: float, seed: int, config_hash: str) -> str:
    """Filesystem-safe job name, e.g. ``smollm2-135m__spectra_core-cpu:auto__mtbench__t0__s0__1a2b3c4d5e6f``
    (the preset as the tables name it: a budget's ``:`` kept)."""
    parts = [
        _slug(model.rstrip("/").split("/")[-1]),
        _slug(preset, keep=":"),
        *(_slug(p) for p in (dataset, f"t{float(temperature):g}", f"s{int(seed)}", config_hash)),
    ]
    return "__".join(parts)


def run_dir_path(results_dir: str | os.PathLike, experiment: str, run_name: str) -> Path:
    """``<results_dir>/<experiment>/<run_name>/``: the folder of one run's row files."""
    return Path(results_dir) / _slug(experiment) / run_name


def run_file_path(results_dir: str | os.PathLike, experiment: str, run_name: str) -> Path:
    """``<results_dir>/<experiment>/<run_name>.parquet``: a run's single file as earlier versions wrote it
    (still read, never written)."""
    return Path(results_dir) / _slug(experiment) / f"{run_name}.parquet"


def key_hash(sample_id: str, turn: int, method: str, repeat: int = 0) -> str:
    """Short stable hash of a row key (sample_id, turn, method, repeat), used in row file names
    (repeat 0 hashes as rows written before repeats existed, so those runs resume)."""
    key = [str(sample_id), int(turn), str(method)] + ([int(repeat)] if repeat else [])
    return hashlib.sha1(json.dumps(key).encode()).hexdigest()[:16]


Key = tuple[str, int, str, int]


def row_key(row: dict[str, Any]) -> Key:
    """(sample_id, turn, method, repeat); rows written before repeats existed are repeat 0."""
    repeat = row.get("repeat")
    repeat = 0 if repeat is None or (isinstance(repeat, float) and repeat != repeat) else int(repeat)
    return (str(row["sample_id"]), int(row["turn"]), str(row["method"]), repeat)


def _key(key: tuple) -> Key:
    """A key given as (sample_id, turn, method) is repeat 0."""
    return (str(key[0]), int(key[1]), str(key[2]), int(key[3]) if len(key) > 3 else 0)


def _to_table(rows: list[dict[str, Any]]) -> pa.Table:
    import pyarrow as pa

    columns: dict[str, None] = {}
    for r in rows:
        columns.update(dict.fromkeys(r))
    return pa.table({c: [r.get(c) for r in rows] for c in columns})


def _reason(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:160]


def _earlier(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Of two rows for one key, the one to keep: the earlier ``finished_at``, then the smaller file name."""
    return (str(a.get("finished_at", "")), a.get("_file", "")) < (str(b.get("finished_at", "")), b.get("_file", ""))


class ResultWriter:
    """The rows of one run: a folder of small parquet files, one per generation.

    Several jobs may write the same run at once (shards by offset/limit, a requeued SLURM job, a sweep and a
    manual re-run, on one machine or on a shared filesystem). Each writer puts every row in a file of its own,
    ``<method>__<key hash>__<writer id>.parquet``, written to a hidden temporary name and renamed into place, so
    no writer ever touches another's files and no lock is needed. Before a generation the runner asks
    :meth:`recorded`, which also looks for rows other jobs wrote since, and skips what is there; after it,
    :meth:`add` keeps a row another job wrote meanwhile. Two jobs that write the same generation at the same
    moment both keep their row; :func:`load_results` and this class keep exactly one (the earlier
    ``finished_at``). Appending costs one small file, whatever the size of the run.

    ``legacy_file`` is a single-file run as earlier versions wrote it: read, never written.
    An unreadable file of the run stops the writer with a one-line error (never overwritten).
    """

    def __init__(self, run_dir: str | os.PathLike, legacy_file: str | os.PathLike | None = None) -> None:
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.writer_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{secrets.token_hex(4)}"
        self._rows: dict[Key, dict[str, Any]] = {}
        self._seen: set[str] = set()
        self.found_from_others = 0  # rows other jobs recorded after this writer started
        files = sorted(self.dir.glob("*.parquet"))
        self.legacy_files = [Path(legacy_file)] if legacy_file is not None and Path(legacy_file).exists() else []
        files = self.legacy_files + files
        for f in files:
            self._load(f, strict=True)

    def _load(self, path: Path, strict: bool) -> None:
        name = str(path)
        if name in self._seen:
            return
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as err:  # a truncated or corrupt file (killed copy, full disk)
            if strict:
                raise ConfigError(
                    f"results file {path} is unreadable ({_reason(err)}): move it aside "
                    f"(mv '{path}' '{path}.bad') and re-run; nothing was written"
                ) from None
            return  # another job's file caught mid-rename is never visible: this one is damaged; skip it
        self._seen.add(name)
        for row in rows:
            row["_file"] = path.name
            key = row_key(row)
            if key not in self._rows or _earlier(row, self._rows[key]):
                self._rows[key] = row

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The run's rows, one per key, without bookkeeping fields."""
        return [{k: v for k, v in r.items() if k != "_file"} for r in self._rows.values()]

    def __len__(self) -> int:
        return len(self._rows)

    def done_keys(self) -> set[Key]:
        """(sample_id, turn, method, repeat) of every row recorded when this writer last looked."""
        return set(self._rows)

    def recorded(self, key: tuple) -> dict[str, Any] | None:
        """The row recorded for ``key`` (sample_id, turn, method[, repeat]: 0 if left out), looking for
        files other jobs wrote since this writer started."""
        key = _key(key)
        if key not in self._rows:
            for f in sorted(self.dir.glob(f"*__{key_hash(*key)}__*.parquet")):
                self._load(f, strict=False)
            if key in self._rows:
                self.found_from_others += 1
        return self._rows.get(key)

    def append(self, row: dict[str, Any]) -> None:
        """Write one row to a file of its own; a key already recorded (here or by another job) is refused."""
        if self.add(row) is not None:
            raise ValueError(f"ResultWriter: {row_key(row)} is already recorded in {self.dir}")

    def add(self, row: dict[str, Any]) -> dict[str, Any] | None:
        """The row recorded for ``row``'s key (this job's or a concurrent job's, found with one look), else
        None once ``row`` is written: a row another job writes meanwhile is never an error (two rows of one key
        on disk read as the earlier)."""
        import pyarrow.parquet as pq

        key = row_key(row)
        earlier = self.recorded(key)
        if earlier is not None:
            return earlier
        path = self.dir / f"{_slug(key[2])}__{key_hash(*key)}__{self.writer_id}.parquet"
        tmp = self.dir / f".{path.name}.tmp"
        with open(tmp, "wb") as f:
            pq.write_table(_to_table([row]), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(self.dir)
        self._seen.add(str(path))
        self._rows[key] = {**row, "_file": path.name}
        return None


def _fsync_dir(path: Path) -> None:
    """Make a rename durable (best effort: some filesystems refuse to open a directory)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def result_files(source: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    """Parquet files of a file, a directory (searched recursively) or a list of either."""
    sources = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    files: list[Path] = []
    for s in map(Path, sources):
        files += sorted(s.rglob("*.parquet")) if s.is_dir() else [s]
    return files


def load_results(
    source: str | os.PathLike | Iterable[str | os.PathLike], *, quiet: bool = False
) -> pd.DataFrame:
    """Every row of a file, a directory (searched recursively) or a list of either, one per run and key.

    Rows that concurrent jobs both recorded for one (experiment, config_hash,
    sample_id, turn, method) are kept once: the earlier ``finished_at``. An
    unreadable file is reported in one line on stderr (unless ``quiet``) and
    the rest are read; their paths are in ``df.attrs["unreadable"]``.
    """

    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    def read(f: Path) -> pa.Table | Exception:
        try:
            return pq.read_table(f)
        except Exception as err:  # reported below, in file order
            return err

    files = result_files(source)
    with ThreadPoolExecutor(max_workers=8) as pool:  # file reads wait on the filesystem (NFS, Lustre)
        read_back = list(pool.map(read, files))
    tables, unreadable = [], []
    for f, table in zip(files, read_back, strict=True):
        if isinstance(table, Exception):
            unreadable.append(str(f))
            if not quiet:
                print(
                    f"warning: skipped unreadable results file {f} ({_reason(table)}); move it aside",
                    file=sys.stderr,
                )
        elif table.num_rows:
            tables.append(table.append_column("_file", pa.array([f.name] * table.num_rows, pa.string())))
    # one conversion for the whole set (a pandas frame per file costs more than reading the file)
    df = pa.concat_tables(tables, promote_options="permissive").to_pandas() if tables else pd.DataFrame()
    if not df.empty:
        if "sample_id" in df.columns:  # rows written before repeats existed are repeat 0
            df["repeat"] = df["repeat"].fillna(0).astype(int) if "repeat" in df.columns else 0
        keys = [k for k in DEDUP_KEYS if k in df.columns]
        if {"sample_id", "turn", "method"} <= set(keys):
            order = ["finished_at", "_file"] if "finished_at" in df.columns else ["_file"]
            df = (
                df.sort_values(order, kind="stable", na_position="last")
                .drop_duplicates(keys, keep="first")
                .sort_index()
                .reset_index(drop=True)
            )
        df = df.drop(columns="_file")
    df.attrs["unreadable"] = unreadable
    return df
