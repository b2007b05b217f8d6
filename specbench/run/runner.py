"""One job: a model × method × dataset × hardware config → parquet rows and a summary table.

Order of work, so that bad input fails before anything slow:
validate settings → check the dataset is reachable → load the model → build
and check every first-turn prompt → warm up (not recorded) → for each repeat
and sample, run the method and the autoregressive baseline, the one first on
even samples and the other on odd ones (neither always runs on a warmer
machine), appending a row per sample × turn × repeat as soon as it exists (a
re-run skips what is recorded). Each repeat replicates the run: drafters and
the ``budget=auto`` statistics start empty, sampling draws afresh.
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys
import time
import uuid
import zlib
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from methods.registry import get_method
from specbench import data as datasets_
from specbench.core.acceptance import SamplingParams
from specbench.core.decode import generate
from specbench.core.draft import DrafterContext
from specbench.core.forward import Target
from specbench.errors import ConfigError
from specbench.models import load_model, model_preset
from specbench.provenance import config_hash, environment_info
from specbench.results.metrics import BASELINE, summarize
from specbench.results.rows import ResultWriter, load_results, make_row, run_dir_path, run_file_path, run_name
from specbench.results.table import format_table
from specbench.run.config import BOOKKEEPING, effective_budget, validate


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _generator(seed: int, sample_id: str, turn: int, repeat: int = 0) -> torch.Generator:
    """A sampling RNG per generation, the same for the method and its baseline; each repeat draws anew."""
    key = f"{sample_id}/{turn}" + (f"/{repeat}" if repeat else "")
    return torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(key.encode()))


def _hash_config(cfg: DictConfig) -> str:
    plain = OmegaConf.to_container(cfg, resolve=True)
    for key in BOOKKEEPING:
        plain.pop(key, None)
    return config_hash(plain)


def run(cfg: DictConfig) -> Any:
    """Run one job; return the summary DataFrame of everything in its results file.

    ``summary.attrs`` says where the file is (``results``) and how many
    generations this call added (``new_generations``; 0 when all were recorded).
    """
    checked = validate(cfg)
    get_method(cfg.method.name).preflight(checked["method"], cfg)
    ddef = datasets_.get_dataset(cfg.dataset.name)
    datasets_.check_available(cfg.dataset)
    sampling = SamplingParams(temperature=cfg.temperature, top_k=cfg.top_k or 0, top_p=cfg.top_p)
    max_new = int(cfg.max_new_tokens or cfg.dataset.get("max_new_tokens") or ddef.default_max_new_tokens)
    samples = datasets_.select(
        ddef.load(cfg.dataset),
        limit=cfg.limit,
        offset=cfg.offset,
        shuffle=bool(cfg.dataset.shuffle),
        seed=cfg.seed,
    )
    if not samples:
        raise ConfigError(
            f"dataset {ddef.name}: no samples selected (offset={cfg.offset}, limit={cfg.limit})"
        )

    method = cfg.method.name
    methods = [method] + ([BASELINE] if cfg.baseline and method != BASELINE else [])
    chash = _hash_config(cfg)
    name = run_name(cfg.model.name, method, ddef.name, cfg.temperature, cfg.seed, chash)
    folder = run_dir_path(cfg.results_dir, cfg.experiment_name, name)
    # Opened before the model loads: an unreadable results file stops the job before any long work.
    writer = ResultWriter(folder, legacy_file=run_file_path(cfg.results_dir, cfg.experiment_name, name))

    _seed_everything(cfg.seed)
    loaded = load_model(cfg.model, cfg.hardware)
    target = Target(loaded.model)
    tok = loaded.tokenizer
    chat = bool(cfg.model.get("chat", True))

    first_prompts = {}
    for sample in samples:
        try:
            ids = ddef.build_prompt(tok, sample, 0, [], cfg.dataset, chat)
        except datasets_.SampleSkipped:
            continue
        _check_length(ids, loaded.context_length, sample.sample_id)
        first_prompts[sample.sample_id] = ids
    if not first_prompts:
        raise ConfigError(
            f"dataset {ddef.name}: every selected sample was skipped (see dataset.max_input_tokens)"
        )

    drafter_context = DrafterContext(
        sampling=sampling,
        device=target.device,
        dtype=target.dtype,
        load_model=lambda name: load_model(
            OmegaConf.merge(model_preset(name), {"dtype": loaded.dtype}), cfg.hardware
        ),
        target_model=loaded.model,
        target_name=loaded.name,
        hardware=cfg.hardware,
    )
    drafters = {
        name: get_method(name)(
            checked["method"] if name == method else None,
            vocab_size=loaded.vocab_size,
            seed=cfg.seed,
            tokenizer=tok,
            context=drafter_context,
        )
        for name in methods
    }
    seen = environment_info(loaded.device)
    _warn_device_mismatch(cfg.hardware, seen["device_name"])
    auto = effective_budget(cfg) == "auto"
    cost = None
    if auto:
        from specbench.budget.costs import load_or_measure

        cost = load_or_measure(loaded, loaded.name, loaded.dtype, str(cfg.hardware.get("attn_implementation", "")),
                               progress=bool(cfg.get("progress", True)))

    def new_budgets() -> dict[str, Any]:
        """budget=auto: one trimmer for the method (the baseline drafts nothing), fresh statistics."""
        from specbench.budget.planner import AutoBudget

        return {method: AutoBudget(cost, aux_feeds=get_method(method).AUX_FEEDS)} if auto else {}

    budgets = new_budgets()
    curve = json.dumps(cost.to_dict()) if cost is not None else ""
    budget_columns = {n: {"budget": "auto" if auto and n == method else "fixed",
                          "cost_curve": curve if n == method else ""} for n in methods}
    done = writer.done_keys()

    context = {
        "run_id": uuid.uuid4().hex[:12],
        "experiment": cfg.experiment_name,
        "config_hash": chash,
        "provenance": seen,
        "model": loaded.name,
        "dataset": ddef.name,
        "dataset_version": ddef.version,
        "dtype": loaded.dtype,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "top_k": cfg.top_k or 0,
        "seed": cfg.seed,
        "max_new_tokens": max_new,
        "device": cfg.hardware.label,
        "attn_implementation": cfg.hardware.get("attn_implementation", ""),
    }
    # budget=auto rows are their own preset: two budgets of one method never merge in a table
    presets = {name: preset_name(cfg) + (":auto" if auto else "") if name == method else name for name in methods}
    params_json = {
        name: dataclasses.asdict(d.config) if dataclasses.is_dataclass(d.config) else {}
        for name, d in drafters.items()
    }

    repeats = int(cfg.get("repeats") or 1)
    selected = [s for s in samples if s.sample_id in first_prompts]
    n_gen = repeats * len(methods) * sum(len(s.turns) for s in selected)
    n_done = sum(
        (s.sample_id, t, m, r) in done
        for r in range(repeats)
        for s in selected
        for m in methods
        for t in range(len(s.turns))
    )
    if n_done:
        print(f"resuming {folder}: {n_done} of {n_gen} generations already recorded", file=sys.stderr)
    if n_done < n_gen and cfg.warmup:
        warm = next(iter(first_prompts.values()))
        for name in methods:
            for _ in range(int(cfg.warmup)):
                generate(
                    target,
                    drafters[name],
                    warm,
                    max_new_tokens=min(16, max_new),
                    sampling=sampling,
                    eos_token_ids=loaded.eos_token_ids,
                    generator=_generator(cfg.seed, "warmup", 0),
                    planner=budgets.get(name),
                )

    bar = tqdm(
        total=n_gen,
        initial=n_done,
        desc=f"{method} on {ddef.name}" + (f" ×{repeats}" if repeats > 1 else ""),
        unit="gen",
        disable=not cfg.get("progress", True),
        file=sys.stderr,
    )
    for repeat in range(repeats):
        for d in drafters.values():  # warm-up generations and earlier repeats teach a drafter nothing recorded
            d.reset()
        budgets = new_budgets()  # nor the budget's acceptance statistics
        for i, sample in enumerate(selected):
            order = methods if (i + repeat) % 2 == 0 else methods[::-1]
            for name in order:
                drafters[name].begin_sample()
                answers: list[str] = []
                for turn in range(len(sample.turns)):
                    key = (sample.sample_id, turn, name, repeat)
                    recorded = writer.recorded(key)  # also sees rows that concurrent jobs of this run wrote
                    if recorded is not None:
                        answers.append(recorded["output_text"])
                        if key not in done:
                            bar.update(1)
                        continue
                    try:
                        ids = (
                            first_prompts[sample.sample_id]
                            if turn == 0
                            else ddef.build_prompt(tok, sample, turn, answers, cfg.dataset, chat)
                        )
                    except datasets_.SampleSkipped:
                        break
                    _check_length(ids, loaded.context_length, sample.sample_id)
                    budget = min(max_new, loaded.context_length - len(ids))
                    t0 = time.perf_counter()
                    rec = generate(
                        target,
                        drafters[name],
                        ids,
                        max_new_tokens=budget,
                        sampling=sampling,
                        eos_token_ids=loaded.eos_token_ids,
                        generator=_generator(cfg.seed, sample.sample_id, turn, repeat),
                        planner=budgets.get(name),
                    )
                    text = tok.decode(rec.output_ids, skip_special_tokens=True)
                    scores = ddef.score(sample, text, turn, cfg.dataset)
                    category = sample.meta.get("category")
                    row = make_row(
                        rec,
                        context={**context, "method": name, "preset": presets[name],
                                 "method_params": params_json[name]},
                        sample_id=sample.sample_id,
                        turn=turn,
                        repeat=repeat,
                        output_text=text,
                        extra={**scores, **budget_columns[name], **({"category": category} if category else {})},
                    )
                    earlier = writer.recorded(key)  # a concurrent job of this run may have finished it meanwhile
                    if earlier is None:
                        writer.append(row)
                    else:  # keep the earlier row (reading would keep it anyway) and go on from its text
                        text = earlier["output_text"]
                    answers.append(text)
                    bar.set_postfix(method=name, tok_s=f"{rec.new_tokens / max(time.perf_counter() - t0, 1e-9):.1f}")
                    bar.update(1)
    bar.close()
    if writer.found_from_others:
        print(
            f"{writer.found_from_others} generations were recorded by another job of this run and skipped",
            file=sys.stderr,
        )

    summary = summarize(load_results([folder, *writer.legacy_files]), baseline_method=BASELINE)
    print(format_table(summary))
    print(f"results: {folder}")
    summary.attrs.update(results=str(folder), new_generations=n_gen - n_done, generations=n_gen)
    return summary


def preset_name(cfg: DictConfig) -> str:
    """The method preset a job runs (``lookahead-cpu``): Hydra's choice of the method group.

    Two presets of one method (two budgets) must never merge in a table, so rows
    carry this beside the method name. Outside Hydra (a composed config) it is
    the method name.
    """
    try:
        from hydra.core.hydra_config import HydraConfig

        choice = HydraConfig.get().runtime.choices.get("method")
    except (ImportError, ValueError):
        choice = None
    return str(choice or cfg.method.name)


def _warn_device_mismatch(hardware: DictConfig, device_name: str) -> None:
    """Warn when the device seen does not match the hardware label's ``expect_device``."""
    expect = hardware.get("expect_device")

    def norm(text: str) -> str:
        return "".join(ch for ch in str(text).lower() if ch.isalnum())

    if expect and norm(expect) not in norm(device_name):
        print(
            f"warning: hardware label '{hardware.label}' expects a {expect} but the device seen is "
            f"'{device_name}'; rows are filed under the label and record the device seen (device_name)",
            file=sys.stderr,
        )


def _check_length(ids: list[int], context_length: int, sample_id: str) -> None:
    if len(ids) >= context_length:
        raise ConfigError(
            f"sample {sample_id}: the prompt has {len(ids)} tokens but the model's context is {context_length}: "
            "use a model with a longer context, or set dataset.max_input_tokens to skip or truncate long inputs"
        )
