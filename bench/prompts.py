"""The benchmark scripts' prompts: a dataset's first samples, built as a run builds turn 1."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from specbench.data import get_dataset, select
from specbench.errors import DatasetUnavailableError
from specbench.paths import CONF_DIR


def dataset_prompts(name: str, tokenizer, model_cfg, *, limit: int, offset: int = 0, path: str | None = None):
    """``(dataset config, prompt token ids)`` of ``limit`` samples from ``offset``; None (with the reason
    printed) when the dataset is not reachable offline. ``path``: a local copy. ``NAME:cat1+cat2`` keeps
    those categories, ``limit`` questions spread evenly over them (``spec_bench:translation+qa+rag``)."""
    name, _, cats = name.partition(":")
    ds_cfg = OmegaConf.load(CONF_DIR / "dataset" / f"{name}.yaml")
    if path:
        ds_cfg.path = str(Path(path).expanduser())
    if cats:
        ds_cfg.categories = cats.split("+")
        ds_cfg.per_category = -(-limit // len(ds_cfg.categories))
    ddef = get_dataset(name)
    try:
        ddef.check_available(ds_cfg)
    except DatasetUnavailableError as err:
        print(f"(skipping {name}: {err})")
        return None
    samples = select(ddef.load(ds_cfg), limit=limit, offset=offset, shuffle=False, seed=0)
    chat = bool(model_cfg.get("chat", True))
    return ds_cfg, [ddef.build_prompt(tokenizer, s, 0, [], ds_cfg, chat) for s in samples]
