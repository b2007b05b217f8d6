"""A batch too large for the device is refused before any weights load, in one line naming one that fits."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import LlamaConfig

import specbench.models.config as model_config
import specbench.models.load as load_module
from specbench.errors import ModelLoadError
from specbench.models.memory import HEADROOM, Shape, check_batch_memory
from specbench.run.runner import run
from tests.run.test_config import make_cfg

VICUNA_13B = LlamaConfig(num_hidden_layers=40, hidden_size=5120, intermediate_size=13824, num_attention_heads=40,
                         vocab_size=32000)


def test_vicuna_13b_at_batch_32_of_2048_tokens_does_not_fit_an_80_gb_gpu():
    """~52 GB of fp16 KV cache (2 × 40 layers × 5120 × 2 bytes = 0.82 MB a token) beside 26 GB of weights."""
    shape = Shape.of(VICUNA_13B)
    per_token = shape.kv_bytes_per_token(2)
    assert per_token == 2 * 40 * 5120 * 2
    assert shape.params() == pytest.approx(13.0e9, rel=0.03)  # the shape's count agrees with the preset's 13B
    with pytest.raises(ModelLoadError) as err:
        check_batch_memory("model 'vicuna-13b'", 26e9, 2048 * per_token, 32, 80e9, "cuda:0")
    fits = int((HEADROOM * 80e9 - 26e9) // (2048 * per_token))
    assert f"use batch_size={fits} or less" in str(err.value) and "\n" not in str(err.value)
    check_batch_memory("model 'vicuna-13b'", 26e9, 2048 * per_token, fits, 80e9, "cuda:0")  # the one named fits
    with pytest.raises(ModelLoadError, match="the weights alone leave no room"):
        check_batch_memory("model 'vicuna-13b'", 75e9, 2048 * per_token, 2, 80e9, "cuda:0")


def test_a_batch_run_too_large_for_the_memory_is_refused_before_loading(tmp_path, monkeypatch):
    loads = []
    monkeypatch.setattr(load_module, "_build_tiny", lambda *a, **k: loads.append(1))
    monkeypatch.setattr(model_config, "_available_bytes", lambda hw, q=None: (1_000_000, "cpu"))
    cfg = make_cfg("experiment=smoke", f"results_dir={tmp_path}", "progress=false", "method=pld", "limit=4",
                   "batch_size=4")
    with pytest.raises(ModelLoadError, match=r"at batch_size=4 needs .* use batch_size=\d or less") as err:
        run(cfg)
    assert not loads and not list(Path(tmp_path).rglob("*.parquet")) and "\n" not in str(err.value)
