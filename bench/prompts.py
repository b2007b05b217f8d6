"""The benchmark scripts' prompts and presets: a dataset's first samples, built as a run builds turn 1, and a preset as
the scripts name it (``<preset>:<budget>,key=value``)."""

from __future__ import annotations

from pathlib import Path

import yaml
from omegaconf import OmegaConf

from methods.registry import build_method_config, get_method
from specbench.data import get_dataset, select
from specbench.errors import DatasetUnavailableError
from specbench.paths import CONF_DIR
from specbench.run.config import load_preset
from specbench.stores.naming import RANDOM_SUFFIX


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


def preset(name: str, run_cfg=None, store: str | None = None):
    """A preset's method, config and budget; ``<preset>:norefine`` reads the unrefined store,
    ``<preset>:random`` the refined store's matched-size random control, ``<preset>:auto`` /
    ``<preset>:fixed`` set the budget (default: the preset's). Retrieval presets get ``store`` and are
    checked against ``run_cfg`` as a run checks them (preflight). ``,key=value`` after it sets a field
    (``eagle3-cpu:auto,head=<dir>``: another head)."""
    name, *fields = name.split(",")
    base, _, variant = name.partition(":")
    method, cfg, preset_budget = load_preset(base)
    for field in fields:
        key, eq, value = field.partition("=")
        if not eq:
            raise SystemExit(f"{name}: fields are given as ,key=value")
        cfg[key] = yaml.safe_load(value)
    if variant not in ("", "norefine", "random", "auto", "static", "fixed"):
        raise SystemExit(f"{name}: the variants are <preset>:norefine, :random, :auto, :static and :fixed")
    budget = variant if variant in ("auto", "static", "fixed") else preset_budget or "fixed"
    if cfg.get("datastore") and store:  # presets without a store (sam_decoding) keep none
        cfg["datastore"] = store
    if variant in ("norefine", "random"):
        cfg["refine"] = False
    if variant == "random":
        cfg["datastore"] = cfg["datastore"] + RANDOM_SUFFIX
    config = build_method_config(method, cfg, budget)
    if run_cfg is not None:
        get_method(method).preflight(config, run_cfg)
    return method, config, budget


def one_preset(description: str, method: str, extra=()):
    """What a script that decodes one preset against autoregressive decoding reads and loads: its arguments
    (``--model --dtype --method --dataset --data --prompts --max-new-tokens``, and ``extra``: (flag, type,
    default) triples), the model, the prompts, the preset's drafter and method name, and plain decoding's."""
    import argparse

    from specbench.core.acceptance import SamplingParams
    from specbench.core.draft import DrafterContext
    from specbench.models import load_model

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--method", default=method, help="a preset from conf/method/ (<preset>:auto, ,key=value)")
    ap.add_argument("--dataset", default="mtbench")
    ap.add_argument("--data", help="a local copy of the dataset")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    for flag, kind, default in extra:
        ap.add_argument(flag, type=kind, default=default)
    args = ap.parse_args()
    model_cfg = OmegaConf.load(CONF_DIR / "model" / f"{args.model}.yaml")
    hardware_cfg = OmegaConf.load(CONF_DIR / "hardware" / "cpu.yaml")
    loaded = load_model(OmegaConf.merge(model_cfg, {"dtype": args.dtype}), hardware_cfg)
    found = dataset_prompts(args.dataset, loaded.tokenizer, model_cfg, limit=args.prompts, path=args.data)
    if found is None:
        raise SystemExit(f"{args.dataset}: not available here: pass --data <path>")
    name, cfg, _ = preset(args.method)
    context = DrafterContext(sampling=SamplingParams(), device=loaded.device, target_model=loaded.model,
                             target_name=loaded.name)
    drafter = get_method(name)(cfg, vocab_size=loaded.vocab_size, seed=0, tokenizer=loaded.tokenizer,
                               context=context)
    plain = get_method("autoregressive")(None, vocab_size=loaded.vocab_size)
    return args, hardware_cfg, loaded, found[1], name, drafter, plain
