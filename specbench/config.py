"""Config checks that run before any long work: group names, values, method settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from specbench.registry import UnknownNameError, build_method_config, suggest

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
GROUPS = ("model", "method", "dataset", "hardware", "experiment")
# Settings that choose where or how much to run, not what a result means: left out of the config hash,
# so that a re-run with a larger limit resumes the same results file.
BOOKKEEPING = ("results_dir", "limit", "offset", "warmup", "progress", "hydra")


class ConfigError(ValueError):
    """A bad setting; the message is one line and names the fix."""


def group_choices(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def check_overrides(overrides: list[str]) -> None:
    """Reject ``group=unknown`` on the command line with a "did you mean" hint."""
    for item in overrides:
        if item.startswith("-") or "=" not in item:
            continue
        key, value = item.split("=", 1)
        key = key.lstrip("+~")
        if key in GROUPS and value and "," not in value and value != "null":
            choices = group_choices(key)
            if value not in choices:
                raise ConfigError(suggest(key, value, choices, f"Pick one with {key}=<name>."))


def model_preset(name: str) -> DictConfig:
    """``conf/model/<name>.yaml`` (a draft model is named like a target), or a "did you mean" error."""
    choices = group_choices("model")
    if name not in choices:
        raise UnknownNameError(suggest("model", name, choices, "Name a preset from conf/model/."))
    return OmegaConf.load(CONF_DIR / "model" / f"{name}.yaml")


def method_params(cfg: DictConfig) -> dict[str, Any]:
    params = OmegaConf.to_container(cfg.method, resolve=True)
    params.pop("name", None)
    return params


def validate(cfg: DictConfig) -> dict[str, Any]:
    """Check every setting that can be checked without loading a model; return the method config."""
    from specbench.data import get_dataset
    from specbench.models import model_config_check
    from specbench.sampling import SamplingParams

    try:
        SamplingParams(temperature=cfg.temperature, top_k=cfg.top_k or 0, top_p=cfg.top_p)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if cfg.max_new_tokens is not None and int(cfg.max_new_tokens) < 1:
        raise ConfigError(f"max_new_tokens must be a positive number of tokens, got {cfg.max_new_tokens}")
    if cfg.limit is not None and int(cfg.limit) < 1:
        raise ConfigError(f"limit must be a positive number of samples (or null for all), got {cfg.limit}")
    if int(cfg.offset) < 0:
        raise ConfigError(f"offset must be >= 0, got {cfg.offset}")
    try:
        method_cfg = build_method_config(cfg.method.name, method_params(cfg))
    except UnknownNameError:
        raise
    except (TypeError, ValueError) as err:
        raise ConfigError(f"method {cfg.method.name}: {err}") from None
    get_dataset(cfg.dataset.name)
    model_config_check(cfg.model, cfg.hardware)
    return {"method": method_cfg}
