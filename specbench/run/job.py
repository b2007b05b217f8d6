"""The job a config describes, checked once: :func:`plan` reads the config, the runner reads the :class:`Job`.

Everything that can fail without a model fails here, in this order: settings and
method fields, whether the weights can be read, the method's own preflight (stores, heads, draft models named),
the budget, the dataset's reachability, the sample selection. What comes out is
a frozen description: the runner never goes back to the config, so every
decision about what a run means is made in this one place.

The model, hardware and dataset nodes stay config mappings: they are open
groups whose keys the model loader and the dataset definition read.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from methods.registry import get_method
from specbench import data as datasets_
from specbench.core.acceptance import SamplingParams
from specbench.errors import ConfigError, suggest
from specbench.models import check_weights, resolve_hardware
from specbench.models.own import resolve_model
from specbench.paths import CONF_DIR, conf_choices
from specbench.provenance import config_hash
from specbench.results.rows import run_dir_path, run_file_path, run_name
from specbench.run.config import (
    BOOKKEEPING,
    REQUESTS_PER_SLOT,
    batch_size,
    effective_budget,
    sample_limit,
    validate,
)
from specbench.stores.naming import resolve_auto_store


@dataclass(frozen=True)
class Job:
    """One model × method × dataset × hardware measurement, checked."""

    method: str  # the registered method's name
    preset: str  # the label rows carry (``lookahead-cpu``, ``spectra_core-cpu:auto``)
    method_config: Any  # the method's filled, validated settings
    budget: str  # "auto" / "static" (a planner decides each draft), "replay" (a recorded run's decisions), "fixed"
    baseline: bool  # also measure autoregressive decoding on the same prompts
    dataset: datasets_.DatasetDef
    dataset_cfg: DictConfig
    samples: tuple[datasets_.Sample, ...]
    model_cfg: DictConfig
    hardware: DictConfig
    chat: bool  # prompts through the model's chat template
    sampling: SamplingParams
    max_new_tokens: int
    seed: int
    repeats: int
    warmup: int  # unrecorded warm-up generations per method
    batch_size: int  # requests decoded together (specbench.run.batched)
    progress: bool
    experiment: str
    config_hash: str
    results_dir: str
    replay: str | None = None  # budget=replay: the recorded run's results folder
    engines: tuple[str, ...] = ()  # peer engines' rows (llama.cpp:ar first), each sample decoded by them too
    engine_draft: str | None = None  # llama.cpp:draft-simple's draft model preset
    request_rate: float | None = None  # served runs: requests per second (Poisson arrivals; None: all at once)
    max_concurrency: int | None = None  # served runs: the most requests in flight (None: batch_size)

    @property
    def served(self) -> bool:
        """Whether each method's requests are decoded as a served run (specbench.run.batched): a batch, or
        requests arriving at a rate; else one at a time, alternating with the baseline sample by sample."""
        return self.batch_size > 1 or self.request_rate is not None

    @property
    def rows(self) -> list[str]:
        """Every row name a sample is measured with: the methods, then the peer engines'."""
        return self.methods + list(self.engines)

    @property
    def methods(self) -> list[str]:
        """What each sample is measured with: the method, then its baseline."""
        from specbench.results.metrics import BASELINE  # pandas loads once a job runs, not for its checks

        return [self.method] + ([BASELINE] if self.baseline and self.method != BASELINE else [])

    @property
    def auto(self) -> bool:
        """Whether a planner decides the drafts (budget=auto or static)."""
        return self.budget in ("auto", "static")

    @property
    def name(self) -> str:
        """The run's folder name: model, preset (as the tables and the progress bar name it), dataset, sampling,
        seed and config hash."""
        return run_name(self.model_cfg.name, self.preset, self.dataset.name, self.sampling.temperature,
                        self.seed, self.config_hash)

    @property
    def legacy_name(self) -> str:
        """The folder name of runs recorded before folders were named by preset (by method)."""
        return run_name(self.model_cfg.name, self.method, self.dataset.name, self.sampling.temperature,
                        self.seed, self.config_hash)

    @property
    def folder(self) -> Path:
        """Where this job's rows live (one file per writer inside); an earlier version's folder of this very job
        (named by method) is resumed where it is."""
        new = run_dir_path(self.results_dir, self.experiment, self.name)
        old = run_dir_path(self.results_dir, self.experiment, self.legacy_name)
        return old if old != new and old.is_dir() and not new.exists() else new

    @property
    def legacy_file(self) -> Path:
        """The single results file of runs written before the per-writer folders."""
        return run_file_path(self.results_dir, self.experiment, self.legacy_name)

    def preset_of(self, method: str) -> str:
        """The label a method's rows are filed under (the baseline's carries the forward mode too, so that
        no table puts eager and compiled decoding in one row)."""
        return self.preset if method == self.method else method + mode_tag(self.hardware.get("forward", "eager"))

    def config_of(self, method: str) -> Any:
        """The settings a drafter is built with (None: its defaults, for the baseline)."""
        return self.method_config if method == self.method else None

    def context(self) -> dict[str, Any]:
        """The columns every row of this job shares, as far as the config decides them."""
        return {
            "experiment": self.experiment,
            "config_hash": self.config_hash,
            "dataset": self.dataset.name,
            "dataset_version": self.dataset.version,
            "temperature": self.sampling.temperature,
            "top_p": self.sampling.top_p,
            "top_k": self.sampling.top_k,
            "seed": self.seed,
            "max_new_tokens": self.max_new_tokens,
            "device": self.hardware.label,
            "attn_implementation": self.hardware.get("attn_implementation", ""),
            "forward": self.hardware.get("forward", "eager"),
            **({"request_rate": self.request_rate or float("inf"), "max_concurrency": self.max_concurrency or self.batch_size}
               if self.served else {}),
        }


def plan(cfg: DictConfig) -> Job:
    """Check ``cfg`` (the composed run config) and describe the job; raise one line naming the fix.

    ``hardware: auto`` is resolved first (to the GPU when torch sees one), so that the job, its rows and
    its hash name the device it runs on; so is a retrieval method's ``datastore: auto`` (the paper's corpus
    for the model, or the standard library offline, said in the run's first lines).
    """
    cfg = cfg.copy()
    with open_dict(cfg):
        cfg.hardware = resolve_hardware(cfg.hardware)
        cfg.model = resolve_model(OmegaConf.to_container(cfg.model, resolve=True), str(cfg.hardware.device))
        cfg.hardware.forward = str(cfg.get("forward") or "eager")  # the loader and the rows read it there
        store_choice = resolve_auto_store(cfg)  # datastore: auto -> the store read (hashed as such)
    checked = validate(cfg)
    check_weights(OmegaConf.to_container(cfg.model, resolve=True))  # before a method plans work for the model
    method = str(cfg.method.name)
    if store_choice:
        checked["method"]._store_choice = store_choice  # rows say how the store was chosen
        if "fallback" in store_choice:
            print(f"{method}: datastore {store_choice} (set method.datastore= to choose)", file=sys.stderr)
    get_method(method).preflight(checked["method"], cfg)
    ddef = datasets_.get_dataset(cfg.dataset.name)
    datasets_.check_available(cfg.dataset)
    samples = datasets_.select(
        ddef.load(cfg.dataset), limit=sample_limit(cfg), offset=cfg.offset, shuffle=bool(cfg.dataset.shuffle),
        seed=cfg.seed)
    if not samples:
        raise ConfigError(f"dataset {ddef.name}: no samples selected (offset={cfg.offset}, limit={cfg.limit})")
    if batch_size(cfg) > len(samples):
        raise ConfigError(f"batch_size={batch_size(cfg)} is more than the {len(samples)} samples selected: raise "
                          f"limit (limit=null: all) or lower batch_size")
    if batch_size(cfg) > 1 and len(samples) < REQUESTS_PER_SLOT * batch_size(cfg):
        print(f"note: {len(samples)} samples at batch_size={batch_size(cfg)}: fewer than {REQUESTS_PER_SLOT} per slot, "
              "so the batch's drain tail weighs on its figures (limit=auto takes "
              f"{REQUESTS_PER_SLOT * batch_size(cfg)})", file=sys.stderr)
    budget = effective_budget(cfg)
    _warn_device_fit(cfg)
    return Job(
        method=method,
        preset=preset_name(cfg) + mode_tag(cfg.hardware.forward)
        + (f":{budget}" if budget in ("auto", "static", "replay") else ""),
        method_config=checked["method"],
        budget=budget,
        baseline=bool(cfg.baseline),
        dataset=ddef,
        dataset_cfg=cfg.dataset,
        samples=tuple(samples),
        model_cfg=cfg.model,
        hardware=cfg.hardware,
        chat=bool(cfg.model.get("chat", True)),
        sampling=SamplingParams(temperature=cfg.temperature, top_k=cfg.top_k or 0, top_p=cfg.top_p),
        max_new_tokens=int(cfg.max_new_tokens or cfg.dataset.get("max_new_tokens") or ddef.default_max_new_tokens),
        seed=int(cfg.seed),
        repeats=int(cfg.get("repeats") or 1),
        warmup=int(cfg.warmup or 0),
        batch_size=batch_size(cfg),
        progress=bool(cfg.get("progress", True)),
        experiment=str(cfg.experiment_name),
        config_hash=hash_config(cfg),
        results_dir=str(cfg.results_dir),
        replay=str(cfg.replay) if cfg.get("replay") else None,
        engines=engine_rows(cfg),
        engine_draft=str(cfg.engine_draft) if cfg.get("engine_draft") else None,
        request_rate=float(cfg.request_rate) if cfg.get("request_rate") is not None else None,
        max_concurrency=int(cfg.max_concurrency) if cfg.get("max_concurrency") is not None else None,
    )


def engine_rows(cfg: DictConfig) -> tuple[str, ...]:
    """``engines=[llama.cpp:<spec type>, …]`` checked (greedy, one request at a time, the server built) as the
    rows they add: ``llama.cpp:ar`` first, the engine's own baseline."""
    asked = [str(e) for e in (cfg.get("engines") or [])]
    if not asked:
        return ()
    from specbench.peers import llamacpp

    kinds = ["ar", *[k for k in llamacpp.SPEC_TYPES if k != "none"]]
    for name in asked:
        engine, _, kind = name.partition(":")
        if engine != llamacpp.ENGINE or kind not in kinds:
            raise ConfigError(f"engines: {name!r} is not a peer engine row: use {llamacpp.ENGINE}:<type>, a type "
                              f"of {', '.join(kinds)}")
    if float(cfg.temperature or 0) > 0 or batch_size(cfg) > 1:
        raise ConfigError("engines= runs the peer engines greedily, one request at a time: use temperature=0 and "
                          "batch_size=1")
    if f"{llamacpp.ENGINE}:draft-simple" in asked:
        draft = cfg.get("engine_draft")
        if not draft:
            raise ConfigError("llama.cpp:draft-simple drafts with a smaller model of the same tokenizer: name its "
                              "preset with engine_draft=<model>")
        if str(draft) not in conf_choices("model"):
            raise ConfigError(suggest("engine_draft model", str(draft), conf_choices("model")))
    llamacpp.require_server()
    ar = f"{llamacpp.ENGINE}:ar"
    return (ar, *dict.fromkeys(n for n in asked if n != ar))


def _warn_device_fit(cfg: DictConfig) -> None:
    """One line when a job runs a CPU preset on a GPU, or a model over ~1B parameters on the CPU."""
    preset, device = preset_name(cfg), str(cfg.hardware.device)
    if device == "cuda" and preset.endswith("-cpu"):
        print(f"warning: method={preset} is sized for a CPU; on this GPU the paper's budget is "
              f"method={preset.removesuffix('-cpu')}", file=sys.stderr)
    cpu_twin = CONF_DIR / "method" / f"{preset}-cpu.yaml"
    if device == "cpu" and cpu_twin.is_file() and effective_budget(cfg) not in ("auto", "replay"):
        print(f"note: method={preset} runs the paper's GPU budget (blocks of up to ~120 tokens a forward), which "
              f"a CPU pays for nearly token by token: method={preset}-cpu or budget=auto sizes it for this CPU",
              file=sys.stderr)
    params_b = cfg.model.get("params_b")
    if device == "cpu" and params_b and float(params_b) > 1:
        print(f"warning: model {cfg.model.name} has ~{float(params_b):g}B parameters and will decode on the CPU, "
              "slowly: use a GPU (hardware=cuda) or a smaller model", file=sys.stderr)


# Raised whenever what a run measures changes while its settings do not (budget=auto's rule, the verification
# step, how rows are counted): a re-run then measures afresh instead of resuming rows of the older rule.
# 2: budget=auto's bounded regret.
RESULTS_VERSION = 2


def hash_config(cfg: DictConfig) -> str:
    """The hash that names a run's results: every setting but the bookkeeping ones, and the results version."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    (plain.get("hardware") or {}).pop("forward", None)  # the loader's copy of the top-level setting (hashed there)
    for key in BOOKKEEPING:
        plain.pop(key, None)
    if (plain.get("batch_size") or 1) == 1:  # batch 1 hashes as every run made before batches existed
        plain.pop("batch_size", None)
    if plain.get("forward", "eager") == "eager":  # as every run made before forward modes existed
        plain.pop("forward", None)
    if not plain.get("engines"):  # no peer engine: as every run made before engines existed
        plain.pop("engines", None)
    if not plain.get("engine_draft"):
        plain.pop("engine_draft", None)
    for key in ("request_rate", "max_concurrency"):  # all at once, batch_size in flight: as runs before them
        if plain.get(key) is None:
            plain.pop(key, None)
    if (plain.get("batch_size") or 1) > 1 or "request_rate" in plain:  # 2: the serving clock (harness I/O off it)
        plain["serving_version"] = 2
    return config_hash({**plain, "results_version": RESULTS_VERSION})


def mode_tag(forward: str) -> str:
    """What a preset's label gains in a forward mode other than eager (``pld@compiled``)."""
    return "" if forward in ("eager", None) else f"@{forward}"


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


def in_multirun() -> bool:
    """True inside a job of a Hydra sweep (``run.py -m``)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return HydraConfig.get().mode == RunMode.MULTIRUN
    except (ImportError, ValueError):
        return False
