"""A missing store built by the run that needs it, when that is quick enough.

``python run.py method=spectra`` reads the perplexity-refined copy of the store ``datastore: auto`` picks
(:func:`specbench.stores.naming.choose_store`: UltraChat for a chat model, The Stack's Python for a code
model, the standard library offline). When it (or the store it is refined from) is missing, the run
estimates the build before any work, from what it knows without a model: the corpus's size (the standard
library's files; a hub corpus's ~100k records at its typical record size, and their download), the
tokenizer's speed, and the model's scoring rate (its parameter count against this device's measured
matrix-multiply rate in the model's dtype). Within ``build_budget`` seconds (default 600) the run prints the
estimate and builds both after the model loads, with progress bars, resumable (scores are kept as they are
made); past it the run stops before any work with one line: the estimate and the command that builds the
store.

A refinement built here scores a sample of the pieces (:data:`SAMPLE` per device: ~4 minutes of scoring
for the embedded model on a 2-core CPU; the paper's ~100k sequences on a GPU); ``make datastore-refine``
builds the full one under the same name. Rows record which store they read (name, fingerprint, size).
Jobs that need the same store take a lock (:func:`store_lock`, which ``make datastore`` takes too): one
builds, the others wait and read it.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specbench.errors import ConfigError
from specbench.paths import exclusive
from specbench.stores.datastore import META

BUILDABLE = ("stdlib", "ultrachat", "the-stack-python")  # sources a run builds itself (hub ones: when reachable)
SAMPLE = {"cpu": 400, "cuda": 100_000}  # pieces a refinement built on demand scores
PIECE = 256  # tokens a scored piece holds at most (refine's max_len)
BYTES_PER_TOKEN = 3.5  # of Python source, for the estimate (SmolLM2: 3.46 on the standard library)
TOKENIZE_BYTES_S = 2.5e6  # tokenizing and indexing a corpus, for the estimate (2.8 MB/s measured on 2 cores)
SCORING_OVERHEAD = 1.5  # a scoring forward's cost over 2 × parameters FLOPs per token at the GEMM rate
DOWNLOAD_BYTES_S = 20e6  # streaming a hub corpus, for the estimate (an assumption: no hub here to measure)


@dataclass
class StoreBuild:
    """What a run builds before decoding: the store ``spec`` names (when missing), then its refined copy."""

    method: str
    spec: str
    model: str
    parent: Path
    refined: Path | None
    build_parent: bool
    sample: int
    seconds: dict[str, float]
    command: str
    limit: int | None = None  # records streamed from a hub corpus

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())

    def describe(self) -> str:
        parts = []
        if self.build_parent:
            what = f"{self.limit:,} records of " if self.limit else ""
            took = self.seconds["build"] + self.seconds.get("download", 0)
            parts.append(f"the {self.spec} store ({what}~{_duration(took)})")
        if self.refined is not None:
            parts.append(f"its perplexity-refined copy ({self.sample:,} pieces scored, ~{_duration(self.seconds['score'])})")
        return " and ".join(parts)

    def run(self, loaded: Any, *, progress: bool = True) -> None:
        """Build what is still missing (another job may have built it meanwhile), under the store's lock."""
        from specbench.stores.corpus import _ByteCounter, open_corpus, tokenized
        from specbench.stores.datastore import tokenizer_identity, write_store
        from specbench.stores.refine import refine_store

        start = time.perf_counter()
        waited: list[bool] = []
        with store_lock(self.parent, on_wait=lambda: (waited.append(True), self._say(
                f"another job is building {self.refined or self.parent}; waiting for it"))):
            if (self.refined or self.parent).joinpath(META).exists():
                if waited:
                    self._say(f"read the store another job built ({_duration(time.perf_counter() - start)} waited)")
                return
            self._say(f"building {self.describe()} for {self.model}; next time it is read from "
                      f"{self.refined or self.parent}")
            if not (self.parent / META).exists():
                corp = open_corpus(self.spec, limit=self.limit)
                texts = _ByteCounter(corp.texts)
                write_store(self.parent, tokenized(texts, loaded.tokenizer),
                            tokenizer=tokenizer_identity(loaded.tokenizer, loaded.name), source=corp.source,
                            n_bytes=lambda: texts.n_bytes, total=corp.total, progress=progress)
            if self.refined is not None and not (self.refined / META).exists():
                refine_store(self.parent, self.refined, loaded.model, loaded.tokenizer, keep=0.5,
                             sample=self.sample, max_len=PIECE, model_name=self.model, progress=progress)
        self._say(f"store ready in {_duration(time.perf_counter() - start)} (estimated ~{_duration(self.total_seconds)})")

    def _say(self, line: str) -> None:
        print(f"{self.method}: {line}", file=sys.stderr)


def store_lock(path: Path, on_wait=None):
    """An exclusive lock beside the store: concurrent jobs (and ``make datastore``) build it once."""
    return exclusive(path, on_wait)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def corpus_bytes(spec: str) -> int:
    """The size of a buildable source's text: a stat of its files, or a hub corpus's records at their typical size."""
    from specbench.stores.corpus import HUB_PRESETS, source_files, stdlib_dir

    if spec == "stdlib":
        return sum(p.stat().st_size for p in source_files(stdlib_dir(), "*.py"))
    if spec in HUB_PRESETS:
        return HUB_PRESETS[spec].records * HUB_PRESETS[spec].bytes_per_record
    raise ValueError(f"no on-demand build for source {spec!r}")


def gemm_rate(device: str, dtype: torch.dtype = torch.float32) -> float:
    """FLOP/s of a matrix multiply in ``dtype`` on ``device`` (a tenth of a second's measurement)."""
    a = torch.randn(1024, 1024, device=device, dtype=dtype)
    b = torch.randn(1024, 1024, device=device, dtype=dtype)
    a @ b  # warm-up
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < 0.1 or n < 2:
        a @ b
        n += 1
    if device == "cuda":
        torch.cuda.synchronize()
    return 2 * 1024**3 * n / (time.perf_counter() - start)


def parameters(model_cfg: Any) -> float:
    """The model's parameter count from its settings: ``params_b``, a tiny model's shape, else 1B (a guess
    that errs long)."""
    if model_cfg.get("params_b"):
        return float(model_cfg.get("params_b")) * 1e9
    tiny = model_cfg.get("tiny")
    if tiny:
        h, v = int(tiny.get("hidden_size", 64)), int(tiny.get("vocab_size", 128))
        ff, layers = int(tiny.get("intermediate_size", 4 * h)), int(tiny.get("num_hidden_layers", 2))
        return 2 * v * h + layers * (4 * h * h + 3 * h * ff)
    return 1e9


def scoring_rate(params: float, device: str, dtype: str = "float32") -> float:
    """Estimated tokens/s of perplexity scoring: the device's GEMM rate (the model's dtype on a GPU, fp32 on
    the CPU, which scores in fp32) over the model's FLOPs per token."""
    from specbench.models.config import DTYPES

    rate = gemm_rate(device, DTYPES.get(dtype, torch.float32)) if device == "cuda" else gemm_rate(device)
    return rate / (2 * params * SCORING_OVERHEAD)


def plan_build(method: str, spec: str, model_cfg: Any, parent: Path, refined: Path | None, *, device: str,
               budget_s: float, command: str) -> StoreBuild:
    """What building ``parent`` (when missing) and ``refined`` (when given and missing) takes here; a
    :class:`ConfigError` with the estimate and ``command`` when it is over ``budget_s`` or cannot be built."""
    from specbench.stores.corpus import HUB_PRESETS, hub_problem
    from specbench.stores.datastore import read_meta

    name = str(model_cfg.get("name"))
    have_parent = (parent / META).exists()
    if not have_parent and spec not in BUILDABLE:
        raise ConfigError(f"no datastore at {parent}: build one with `{command}`")
    problem = None if have_parent or spec not in HUB_PRESETS else hub_problem(spec)
    if problem:
        raise ConfigError(f"no datastore at {parent}, and {problem}: build it where the hub is reachable with "
                          f"`{command}`, or choose another store (method.datastore=stdlib)")
    seconds: dict[str, float] = {}
    if have_parent:
        tokens = int(read_meta(parent)["tokens"])
    else:
        size = corpus_bytes(spec)
        tokens = int(size / BYTES_PER_TOKEN)
        if spec in HUB_PRESETS:
            seconds["download"] = size / DOWNLOAD_BYTES_S
        seconds["build"] = size / TOKENIZE_BYTES_S
    sample = 0
    if refined is not None:
        sample = min(max(tokens // PIECE, 1), SAMPLE.get(device, SAMPLE["cuda"]))
        rate = scoring_rate(parameters(model_cfg), device, str(model_cfg.get("dtype") or "float32"))
        seconds["score"] = sample * PIECE / rate
    limit = HUB_PRESETS[spec].records if spec in HUB_PRESETS and not have_parent else None
    plan = StoreBuild(method, spec, name, parent, refined, not have_parent, sample, seconds, command, limit)
    if plan.total_seconds > budget_s:
        raise ConfigError(
            f"{method}: building {plan.describe()} for {name} would take ~{_duration(plan.total_seconds)} here, "
            f"over build_budget={budget_s:.0f} s: build it first with `{command}` (or set build_budget=)")
    return plan
