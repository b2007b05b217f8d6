"""The skeleton of docs/adding-a-method.md, taken from the page as it stands and loaded as a module of
``methods/``, passes the contract tests (greedy equal to autoregressive, the sampling distribution kept) and
drafts; its YAML fills its config."""

import importlib.util
import re
import sys
from pathlib import Path

import yaml

from methods import registry
from specbench.core.acceptance import SamplingParams
from tests.lossless import (
    BigramTarget,
    assert_greedy_lossless,
    assert_sampling_preserves_distribution,
    counting_proposals,
)
from tests.methods.test_contract import GREEDY_PROMPTS, _maker, store, target  # noqa: F401 - fixtures

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "adding-a-method.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", PAGE.read_text(), re.S)


def test_the_pages_skeleton_passes_the_contract(tmp_path, store, target):  # noqa: F811 - the contract's fixtures
    (code,), (conf,) = blocks("python"), blocks("yaml")
    assert len(code.strip().splitlines()) <= 40
    path = tmp_path / "echo.py"
    path.write_text(code)
    spec = importlib.util.spec_from_file_location("methods.echo", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["methods.echo"] = module
    try:
        spec.loader.exec_module(module)
        settings = yaml.safe_load(conf)
        assert settings.pop("name") == "echo"
        config = registry.build_method_config("echo", settings)
        assert config == module.EchoConfig(**settings)
        proposed: list[int] = []
        make = counting_proposals(_maker("echo", store, target, tmp_path, SamplingParams()), proposed)
        assert_greedy_lossless(target, make, GREEDY_PROMPTS, 24)
        assert sum(proposed) > 0
        params = SamplingParams(temperature=1.0)
        make = counting_proposals(_maker("echo", store, target, tmp_path, params), proposed)
        assert_sampling_preserves_distribution(make, params, target=BigramTarget(), trials=1500, extra=2)
    finally:
        registry._METHODS.pop("echo", None)
        sys.modules.pop("methods.echo", None)
