"""Config checks that run before any long work: group names, values, method settings."""

from __future__ import annotations

import functools
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from methods.registry import build_method_config
from specbench.errors import ConfigError, UnknownNameError, suggest
from specbench.paths import CONF_DIR, conf_choices

# Every config group (conf/<group>/); variant, ablation and placement are added with +group=<name>.
GROUPS = ("model", "method", "dataset", "hardware", "experiment", "variant", "ablation", "placement")
# Settings that choose where or how much to run, not what a result means: left out of the config hash,
# so that a re-run with a larger limit resumes the same results file.
# `repeats` too: each repeat is its own rows (column `repeat`), so repeats=3 extends a run made with repeats=1.
BOOKKEEPING = ("results_dir", "limit", "offset", "warmup", "progress", "hydra", "paper_dir", "spec_bench_dir",
               "repeats", "build_budget")




def check_overrides(overrides: list[str]) -> list[str]:
    """Check the command line before Hydra composes it; return it, adjusted.

    ``group=unknown`` gets a "did you mean" hint. ``method.<field>=value`` is
    checked against the fields of the method(s) the command selects: an unknown
    field gets a hint, a known one that the preset's YAML does not list is
    passed on as ``++method.<field>=value`` (Hydra would refuse it otherwise). A job bound for a GPU that
    names no method gains ``method=spectra_core`` (:func:`device_defaults`).
    """
    overrides = list(overrides) + device_defaults(overrides)
    out = []
    for item in overrides:
        if item.startswith("-") or "=" not in item:
            out.append(item)
            continue
        key, value = item.split("=", 1)
        bare = key.lstrip("+~")
        if key == bare:
            _check_setting(bare)
        if bare in GROUPS and value and "," not in value and value != "null":
            choices = conf_choices(bare)
            if value not in choices:
                raise ConfigError(suggest(bare, value, choices, f"Pick one with {bare}=<name>."))
        if key.startswith("method.") and "." not in key[len("method.") :]:
            field = key[len("method.") :]
            if field not in PRESET_KEYS and not _check_method_field(field, overrides):
                item = f"++{item}"
        out.append(item)
    return out


# The default method on a GPU: conf/config.yaml's default (a -cpu preset) with the paper's budget.
GPU_DEFAULT_METHOD = "spectra_core"


def device_defaults(overrides: list[str], cuda: bool | None = None) -> list[str]:
    """What the command line gains from the device: ``method=spectra_core`` (the paper's budget) when the job
    will run on a GPU (``hardware=auto``, the default, with CUDA seen, or a CUDA preset) and neither the command
    line nor its experiment names a method."""
    if _override_values(overrides, "method") or _experiment_sets(overrides, "method"):
        return []
    hardware = _override_values(overrides, "hardware")
    if len(hardware) > 1 or _experiment_sets(overrides, "hardware"):
        return []
    choice = hardware[0] if hardware else "auto"
    if choice == "auto":
        if cuda is None:
            import torch

            cuda = torch.cuda.is_available()
        on_gpu = cuda
    else:
        path = CONF_DIR / "hardware" / f"{choice}.yaml"
        on_gpu = path.exists() and OmegaConf.load(path).get("device") == "cuda"
    return [f"method={GPU_DEFAULT_METHOD}"] if on_gpu else []


def _experiment_choices(overrides: list[str], group: str) -> list[str]:
    """The choices of ``group`` that an experiment on the command line makes (its defaults, its sweep)."""
    chosen = []
    for exp in _override_values(overrides, "experiment"):
        path = CONF_DIR / "experiment" / f"{exp}.yaml"
        if not path.exists():
            continue
        conf = OmegaConf.to_container(OmegaConf.load(path))
        for entry in conf.get("defaults", []) or []:
            if isinstance(entry, dict) and f"override /{group}" in entry:
                chosen.append(str(entry[f"override /{group}"]))
        swept = ((conf.get("hydra") or {}).get("sweeper") or {}).get("params") or {}
        if group in swept:
            chosen += [x.strip() for x in str(swept[group]).split(",")]
    return chosen


def _experiment_sets(overrides: list[str], group: str) -> bool:
    return bool(_experiment_choices(overrides, group))


@functools.cache
def top_level_settings() -> list[str]:
    """The settings a command line may set without ``+``: conf/config.yaml's keys, those experiments add,
    and the config groups (read once a process: plain YAML, no interpolation is resolved)."""
    keys = set(GROUPS) | {"hydra"}
    for path in [CONF_DIR / "config.yaml", *sorted((CONF_DIR / "experiment").glob("*.yaml"))]:
        conf = yaml.safe_load(path.read_text()) or {}
        keys |= {str(k) for k in conf if k != "defaults"}
    return sorted(keys)


def _check_setting(key: str) -> None:
    """A misspelt setting gets "did you mean", not Hydra's advice to append it with ``+`` (which would run
    with the setting silently ignored)."""
    head = key.split(".", 1)[0].split("/", 1)[0]  # hydra/launcher=slurm: a group of Hydra's own
    known = top_level_settings()
    if head not in known:
        raise UnknownNameError(suggest("setting", head, [k for k in known if k != "hydra"],
                                       "Settings are listed in conf/config.yaml (python run.py --cfg job)."))


def _override_values(overrides: list[str], key: str) -> list[str]:
    values = []
    for item in overrides:
        k, _, v = item.partition("=")
        if k.lstrip("+") == key and v:
            values += [x.strip() for x in v.split(",") if x.strip()]
    return values


def _chosen_method_presets(overrides: list[str]) -> list[str]:
    """The method presets a command line selects: its own ``method=``, its experiment's, or the default."""
    presets = _override_values(overrides, "method") or _experiment_choices(overrides, "method")
    if presets:
        return presets
    for entry in OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml"))["defaults"]:
        if isinstance(entry, dict) and "method" in entry:
            return [str(entry["method"])]
    return []


def _check_method_field(field: str, overrides: list[str]) -> bool:
    """Is ``field`` listed in every selected preset's YAML? Raise when a selected method lacks it."""
    import dataclasses

    from methods.registry import get_method

    listed = True
    for preset in _chosen_method_presets(overrides):
        path = CONF_DIR / "method" / f"{preset}.yaml"
        if not path.exists():
            continue  # an unknown preset is reported as such
        conf = method_preset(preset)
        config_cls = get_method(str(conf.get("name", preset))).Config
        fields = [f.name for f in dataclasses.fields(config_cls)] if dataclasses.is_dataclass(config_cls) else []
        if field not in fields:
            raise UnknownNameError(
                suggest(f"setting of method {conf.get('name', preset)}", field, fields or ["(none)"])
            )
        listed = listed and field in conf
    return listed


def _number(cfg: DictConfig, key: str, kind: type, *, minimum=None, nullable=False, what=""):
    """``cfg[key]`` as an int or float, or a one-line ConfigError naming what it should be."""
    value = cfg.get(key)
    if value is None and nullable:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and kind is int:
        ok = float(value).is_integer()
    if ok and minimum is not None:
        ok = value >= minimum
    if not ok:
        raise ConfigError(f"{key} must be {what}, got {value!r}")
    return kind(value)


def _check_numbers(cfg: DictConfig) -> None:
    _number(cfg, "temperature", float, minimum=0, what="a number >= 0 (0 = greedy)")
    _number(cfg, "top_p", float, what="a number in (0, 1]")
    _number(cfg, "top_k", int, minimum=0, nullable=True, what="a whole number >= 0 (0 = off)")
    _number(cfg, "seed", int, what="a whole number")
    _number(cfg, "max_new_tokens", int, minimum=1, nullable=True, what="a positive number of tokens (or null)")
    if cfg.get("limit") != "auto":
        _number(cfg, "limit", int, minimum=1, nullable=True,
                what="a positive number of samples (null: all; auto: 8 × batch_size, what a batch point needs)")
    _number(cfg, "offset", int, minimum=0, what="a whole number >= 0")
    _number(cfg, "warmup", int, minimum=0, what="a whole number of warm-up generations >= 0")
    _number(cfg, "build_budget", float, minimum=0, nullable=True,
            what="a number of seconds a run may spend building a missing store (0: never)")
    _number(cfg, "repeats", int, minimum=1, nullable=True,
            what="a positive number of measurements of each sample (repeats=3 as Spec-Bench)")
    _number(cfg, "batch_size", int, minimum=1, nullable=True,
            what="a positive number of requests decoded together (1: one at a time, as the papers measure)")
    _number(cfg, "request_rate", float, nullable=True, what="requests per second > 0 (null: all at once)")
    if cfg.get("request_rate") is not None and float(cfg.request_rate) <= 0:
        raise ConfigError(f"request_rate must be requests per second > 0 (null: all at once), got {cfg.request_rate!r}")
    concurrency = _number(cfg, "max_concurrency", int, minimum=1, nullable=True,
                          what="a positive number of requests in flight (null: batch_size)")
    if concurrency is not None and concurrency > batch_size(cfg):
        raise ConfigError(f"max_concurrency={concurrency} is more than batch_size={batch_size(cfg)}: the engine "
                          "decodes at most batch_size requests at once; raise batch_size or lower max_concurrency")
    if "hardware" in cfg and cfg.hardware.get("num_threads") is not None:
        _number(cfg.hardware, "num_threads", int, minimum=1, what="a positive number of threads (or null)")


# Keys of a method preset that are not the method's own settings.
PRESET_KEYS = ("name", "budget")


def method_preset(preset: str) -> dict[str, Any]:
    """``conf/method/<preset>.yaml`` as a plain dict, its ``defaults`` (presets of the same group it
    builds on, e.g. a ``-cpu`` preset on its paper preset) merged in as Hydra merges them."""
    raw = OmegaConf.load(CONF_DIR / "method" / f"{preset}.yaml")
    merged = OmegaConf.create()
    for entry in raw.get("defaults", []) or []:  # the bases first, then the preset's own keys (_self_ last)
        if entry != "_self_":
            merged = OmegaConf.merge(merged, method_preset(str(entry)))
    own = OmegaConf.masked_copy(raw, [k for k in raw.keys() if k != "defaults"])
    return OmegaConf.to_container(OmegaConf.merge(merged, own))


def load_preset(preset: str) -> tuple[str, dict[str, Any], str | None]:
    """``conf/method/<preset>.yaml`` as (method name, its settings, the budget it names or None)."""
    raw = method_preset(preset)
    name, budget = raw.pop("name"), raw.pop("budget", None)
    return name, raw, budget


def method_params(cfg: DictConfig) -> dict[str, Any]:
    params = OmegaConf.to_container(cfg.method, resolve=True)
    for key in PRESET_KEYS:
        params.pop(key, None)
    return params


def drafting_budget(cfg: DictConfig) -> str:
    """The budget a method's settings are resolved under: a planned one (static, or a replay) drafts as auto."""
    budget = effective_budget(cfg)
    return "auto" if budget in ("replay", "static") else budget


def effective_budget(cfg: DictConfig) -> str:
    """``budget`` when set on the command line or in the config, else the method preset's, else fixed."""
    budget = cfg.get("budget")
    if budget is None:
        budget = cfg.method.get("budget") or "fixed"
    return str(budget)


def validate(cfg: DictConfig) -> dict[str, Any]:
    """Check every setting that can be checked without loading a model; return the method config."""
    from specbench.core.acceptance import SamplingParams
    from specbench.data import get_dataset
    from specbench.models import model_config_check

    _check_numbers(cfg)
    try:
        SamplingParams(temperature=cfg.temperature, top_k=cfg.top_k or 0, top_p=cfg.top_p)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    try:
        method_cfg = build_method_config(cfg.method.name, method_params(cfg), drafting_budget(cfg))
    except UnknownNameError:
        raise
    except (TypeError, ValueError) as err:
        raise ConfigError(f"method {cfg.method.name}: {err}") from None
    _check_attention(cfg)
    _check_forward(cfg)
    _check_budget(cfg)
    _check_batch(cfg)
    get_dataset(cfg.dataset.name)
    model_config_check(cfg.model, cfg.hardware)
    return {"method": method_cfg}


def _check_forward(cfg: DictConfig) -> None:
    """``forward``: a known mode; ``compiled`` only for model families it reproduces, where the preset says
    which (a random model's ``tiny.model_type``; a checkpoint's family is read when it loads, before timing)."""
    from specbench.core.engine import FAMILIES, FORWARD_MODES, ONE_DEVICE

    mode = cfg.get("forward") or "eager"
    if mode not in FORWARD_MODES:
        raise UnknownNameError(suggest("forward mode", str(mode), list(FORWARD_MODES)))
    if mode == "compiled" and (cfg.hardware.get("device_map") or (cfg.hardware.get("num_gpus") or 1) > 1):
        raise ConfigError(ONE_DEVICE)
    kind = (cfg.model.get("tiny") or {}).get("model_type") if mode == "compiled" else None
    if kind and kind not in FAMILIES:
        raise ConfigError(f"forward=compiled runs Llama-shaped decoders ({', '.join(FAMILIES)}); model "
                          f"{cfg.model.name} is {kind}: use forward=eager")


def _check_budget(cfg: DictConfig) -> None:
    from methods.registry import get_method
    from specbench.budget.planner import BUDGETS

    budget = effective_budget(cfg)
    if budget not in BUDGETS:
        raise ConfigError(f"budget must be one of {', '.join(BUDGETS)}, got {budget!r}")
    if budget in ("auto", "static", "replay") and not get_method(cfg.method.name).budget_auto:
        raise ConfigError(
            f"budget={budget} trims the drafts of tree methods; {cfg.method.name} sets its own draft length: "
            "use budget=fixed"
        )
    if budget == "replay":
        if not cfg.get("replay"):
            raise ConfigError("budget=replay re-applies a recorded budget=auto run's decisions: name its results "
                              "folder with replay=<folder>")
        if batch_size(cfg) > 1:
            raise ConfigError("budget=replay replays generations decoded one at a time: use batch_size=1")
        from pathlib import Path

        if not Path(str(cfg.replay)).expanduser().exists():
            raise ConfigError(f"replay={cfg.replay}: no such folder: point it at the results of a budget=auto run")
    elif cfg.get("replay"):
        raise ConfigError(f"replay={cfg.replay} is read by budget=replay only (the budget here is {budget})")


def batch_size(cfg: DictConfig) -> int:
    return int(cfg.get("batch_size") or 1)


# limit=auto: samples per batch size, so that a batch point is mostly full batches, not its drain tail
REQUESTS_PER_SLOT = 8


def sample_limit(cfg: DictConfig) -> int | None:
    """``limit`` as a number of samples (``auto``: :data:`REQUESTS_PER_SLOT` × batch_size)."""
    return REQUESTS_PER_SLOT * batch_size(cfg) if cfg.get("limit") == "auto" else cfg.get("limit")


def _check_batch(cfg: DictConfig) -> None:
    """Refuse settings a batch cannot run before any work: a method that cannot batch, flash attention."""
    from methods.registry import get_method, method_names

    size = batch_size(cfg)
    if size == 1:
        return
    cls = get_method(cfg.method.name)
    if not cls.batchable:
        can = ", ".join(n for n in method_names() if get_method(n).batchable)
        raise ConfigError(f"method {cfg.method.name} cannot decode a batch yet: use batch_size=1, or one of {can}")
    if cfg.hardware.get("attn_implementation") == "flash_attention_2":
        raise ConfigError("a batch's rows sit at their own lengths, which needs a 4-D attention mask that "
                          "flash_attention_2 cannot take: use hardware.attn_implementation=sdpa with batch_size > 1")


def _check_attention(cfg: DictConfig) -> None:
    """Refuse a tree-drafting method under flash_attention_2 (it cannot take a custom 4-D mask)."""
    from methods.registry import get_method, method_names

    if cfg.hardware.get("attn_implementation") != "flash_attention_2":
        return
    if get_method(cfg.method.name).tree_drafts:
        chains = ", ".join(n for n in method_names() if not get_method(n).tree_drafts)
        raise ConfigError(
            f"method {cfg.method.name} drafts trees, which need a custom 4-D attention mask that "
            f"flash_attention_2 cannot express: use hardware.attn_implementation=sdpa (or eager), "
            f"or a chain method ({chains})"
        )
