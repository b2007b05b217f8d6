"""Benchmark datasets: ``dataset=<name>`` for the SPECTRA paper's seven sets, Spec-Bench and smoke prompts.

Typical use by the runner::

    ddef = get_dataset(cfg.dataset.name)
    check_available(cfg.dataset)                 # before the model loads: fails fast, one line
    samples = select(ddef.load(cfg.dataset), limit=cfg.limit, offset=cfg.offset,
                     shuffle=cfg.dataset.shuffle, seed=cfg.seed)
    for sample in samples:
        answers = []
        for turn in range(len(sample.turns)):
            try:
                ids = ddef.build_prompt(tokenizer, sample, turn, answers, cfg.dataset, chat=is_chat_model)
            except SampleSkipped:                # over max_input_tokens with overlong=skip
                break
            text = ...generate...
            answers.append(text)
            scores = ddef.score(sample, text, turn, cfg.dataset)   # {} / rouge1.. / accuracy / pass

Every result row carries ``ddef.name`` and ``ddef.version``; ``mean_scores``
aggregates the per-row scores for a run summary. See :mod:`specbench.data.base`
for sources and prompt rendering, and each family module for its prompt format.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from typing import Any

from specbench.errors import DatasetUnavailableError, UnknownNameError, suggest
from specbench.paths import setting

from .base import DatasetDef, Sample, SampleSkipped
from .chat import CodeEdits, MTBench, Prompts, SpecBench
from .coding import MBPP, ClassEval, HumanEval
from .gsm8k import GSM8K
from .quality import mean_scores, rouge
from .summarize import CNNDailyMail, XSum

__all__ = [
    "DatasetDef",
    "DatasetUnavailableError",
    "Sample",
    "SampleSkipped",
    "check_available",
    "dataset_names",
    "get_dataset",
    "mean_scores",
    "register_dataset",
    "rouge",
    "select",
]

_DATASETS: dict[str, DatasetDef] = {}


def register_dataset(definition: DatasetDef | type[DatasetDef]) -> DatasetDef:
    """Register a definition (an instance, or a class to instantiate) under its ``name``."""
    instance = definition() if isinstance(definition, type) else definition
    if not instance.name:
        raise ValueError("a dataset definition needs a name")
    if instance.name in _DATASETS and type(_DATASETS[instance.name]) is not type(instance):
        raise ValueError(f"dataset '{instance.name}' is registered twice")
    _DATASETS[instance.name] = instance
    return instance


for _cls in (MTBench, GSM8K, HumanEval, MBPP, ClassEval, CNNDailyMail, XSum, SpecBench, Prompts, CodeEdits):
    register_dataset(_cls)


def dataset_names() -> list[str]:
    return sorted(_DATASETS)


def get_dataset(name: str) -> DatasetDef:
    if name not in _DATASETS:
        raise UnknownNameError(
            suggest("dataset", str(name), list(_DATASETS), "Pick one with dataset=<name>.")
        )
    return _DATASETS[name]


def select(
    samples: Iterable[Sample],
    *,
    limit: int | None = None,
    offset: int = 0,
    shuffle: bool = False,
    seed: int = 0,
) -> list[Sample]:
    """Samples ``offset .. offset+limit`` of the list, after a shuffle seeded with ``seed`` when asked.

    The shuffle permutes the whole list first, so a sample's rank does not
    depend on ``limit`` and a larger limit extends a smaller one.
    """
    items = list(samples)
    if offset < 0 or (limit is not None and limit < 0):
        raise ValueError(f"limit and offset must be >= 0 (limit={limit}, offset={offset})")
    if shuffle:
        random.Random(seed).shuffle(items)
    items = items[offset:]
    return items if limit is None else items[:limit]


def check_available(cfg: Any) -> None:
    """Raise :class:`DatasetUnavailableError` (one line naming the fix) unless the dataset can be loaded.

    Cheap: a file check, a package lookup, or a cache lookup plus one TCP probe of
    the hub. Accepts the ``dataset`` node or the whole run config.
    """
    node = setting(cfg, "dataset")
    dcfg = node if isinstance(node, Mapping) else cfg
    name = setting(dcfg, "name")
    if not name:
        raise ValueError("the dataset config has no name")
    get_dataset(str(name)).check_available(dcfg)
