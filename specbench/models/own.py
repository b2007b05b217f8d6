"""One's own checkpoint as a model: ``model=hf model.hub_id=<owner/name>`` or ``model=hf model.path=<folder>``
(``conf/model/hf.yaml``, docs/own-model.md).

A model config's ``auto`` fields are read from the checkpoint's small files before anything loads: ``name``
from the hub id or the folder, ``dtype`` from ``config.json`` (on a GPU; a CPU runs float32), ``params_b`` from
the weight files' size (the memory check before loading), ``chat`` from the tokenizer's chat template. A hub
model is read from the Hugging Face cache (or, where the hub is reachable, its two small files downloaded);
a folder must hold ``config.json``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from specbench.errors import ModelLoadError

AUTO = "auto"
AUTO_KEYS = ("name", "dtype", "params_b", "chat")
STORED = {"float32": 4, "float16": 2, "bfloat16": 2}  # a checkpoint's dtype: bytes a parameter


def wants_resolving(cfg: dict) -> bool:
    return any(cfg.get(k) == AUTO for k in AUTO_KEYS)


def derived_name(cfg: dict) -> str:
    """The hub id's or the folder's last part, lower-cased, as a preset name (``Qwen/Qwen2.5-0.5B`` -> qwen2.5-0.5b)."""
    source = str(cfg.get("path") or cfg.get("hub_id") or "").rstrip("/")
    name = re.sub(r"[^a-z0-9._-]+", "-", Path(source).name.lower()).strip("-")
    if not name:
        raise ModelLoadError("model=hf needs the checkpoint: model.hub_id=<owner/name> (the Hugging Face hub or its "
                             "cache) or model.path=<folder with config.json>")
    return name


def checkpoint_folder(cfg: dict) -> Path:
    """The folder holding the checkpoint's ``config.json``: ``path``, or the hub model's cached snapshot."""
    if cfg.get("path"):
        folder = Path(str(cfg["path"])).expanduser()
        if not (folder / "config.json").is_file():
            raise ModelLoadError(f"model.path {folder} has no config.json: point it at a folder saved with "
                                 "save_pretrained (or downloaded with 'hf download <id> --local-dir <folder>')")
        return folder
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    from specbench import hub
    from specbench.models.weights import _resolve_hub

    hub_id, revision = str(cfg["hub_id"]), cfg.get("revision")
    cached = try_to_load_from_cache(hub_id, "config.json", cache_dir=hub.model_cache_dir(), revision=revision)
    if not isinstance(cached, str):
        _resolve_hub(cfg)  # not cached and the hub unreachable: its one line
        cached = hf_hub_download(hub_id, "config.json", cache_dir=hub.model_cache_dir(), revision=revision)
        for extra in ("tokenizer_config.json", "model.safetensors.index.json"):
            try:
                hf_hub_download(hub_id, extra, cache_dir=hub.model_cache_dir(), revision=revision)
            except Exception:  # noqa: BLE001 - optional files: a checkpoint may have neither
                pass
    return Path(cached).parent


def _stored_dtype(config: dict) -> str | None:
    for c in (config, config.get("text_config") or {}):
        dtype = c.get("dtype") or c.get("torch_dtype")
        if dtype in STORED:
            return dtype
    return None


def _params_b(folder: Path, stored: str | None) -> float | None:
    """Billions of parameters from the weight files' bytes (the shard index's total, or the files' sizes)."""
    per = STORED.get(stored or "", 2)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        total = (json.loads(index.read_text()).get("metadata") or {}).get("total_size")
        if total:
            return round(total / per / 1e9, 6)
    files = list(folder.glob("*.safetensors")) or list(folder.glob("pytorch_model*.bin"))
    return round(sum(f.stat().st_size for f in files) / per / 1e9, 6) if files else None


def _has_chat_template(folder: Path) -> bool:
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    tok = folder / "tokenizer_config.json"
    return tok.is_file() and bool(json.loads(tok.read_text()).get("chat_template"))


def resolve_model(cfg: dict, device: str = "cpu") -> dict:
    """``cfg`` with its ``auto`` fields read from the checkpoint (``device``: where it will run); unchanged when
    none is ``auto``."""
    if not wants_resolving(cfg):
        return cfg
    cfg = dict(cfg)
    if not (cfg.get("hub_id") or cfg.get("path")):
        derived_name(cfg)  # raises the line naming what to set
    if cfg.get("name") == AUTO:
        cfg["name"] = derived_name(cfg)
    folder = checkpoint_folder(cfg)
    config = json.loads((folder / "config.json").read_text())
    stored = _stored_dtype(config)
    if cfg.get("dtype") == AUTO:
        cfg["dtype"] = stored if device == "cuda" and stored else "float32"
    if cfg.get("params_b") == AUTO:
        cfg["params_b"] = _params_b(folder, stored)
    if cfg.get("chat") == AUTO:
        cfg["chat"] = _has_chat_template(folder) or bool(cfg.get("chat_template"))
    return cfg
