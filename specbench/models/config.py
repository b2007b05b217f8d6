"""Model and hardware settings, checked before anything is loaded: fields, dtype, quantization, device,
attention implementation, and whether the weights fit the memory there is."""

from __future__ import annotations

import difflib
import importlib.util
import os

import torch
from omegaconf import DictConfig, OmegaConf

from specbench.core.engine import FORWARD_MODES
from specbench.errors import ModelLoadError, UnknownNameError, suggest
from specbench.models.cuda_setup import no_cuda_reason, warn_if_gpu_unused
from specbench.models.own import resolve_model
from specbench.paths import CONF_DIR, conf_choices

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MODEL_KEYS = ("name", "hub_id", "path", "gguf", "tiny", "dtype", "revision", "chat", "chat_template", "params_b",
              "quantization", "domain", "heads")
HEAD_KINDS = ("eagle", "eagle3", "medusa")  # published draft heads a preset may name (methods eagle, eagle3, medusa)
DOMAINS = ("chat", "code")  # which corpus ``datastore: auto`` reads (specbench.stores.naming.DOMAIN_CORPORA)
QUANTIZATIONS = ("int8",)  # bitsandbytes LLM.int8 weights (paper Table 6: Llama-2-70B on one GPU)
DEVICES = ("cpu", "cuda", "auto")
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2")
GQA_MODES = ("fold", "repeat")  # grouped-query tree steps under sdpa (specbench.core.attention)
LINEAR_MODES = ("auto", "packed", "plain")  # CPU linear layers (specbench.models.packed)


def _plain(cfg) -> dict:
    return OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg or {})


def model_config_check(model_cfg, hardware_cfg=None) -> None:
    """Validate a model config (and optionally a hardware config) without loading anything (``auto`` fields read
    from the checkpoint's small files first: :mod:`specbench.models.own`)."""
    cfg = resolve_model(_plain(model_cfg), str(_plain(hardware_cfg).get("device") or "cpu"))
    name = cfg.get("name")
    if not name:
        raise ModelLoadError("model config has no 'name'")
    for key in cfg:
        if key not in MODEL_KEYS:
            close = difflib.get_close_matches(key, MODEL_KEYS, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ModelLoadError(f"model '{name}': unknown field '{key}'{hint}; allowed: {', '.join(MODEL_KEYS)}")
    if cfg.get("dtype", "float32") not in DTYPES:
        raise ModelLoadError(f"model '{name}': dtype '{cfg.get('dtype')}' is not one of {', '.join(DTYPES)}")
    if not any(cfg.get(k) for k in ("tiny", "path", "gguf", "hub_id")):
        raise ModelLoadError(f"model '{name}': set one of tiny, path, gguf or hub_id")
    gguf = cfg.get("gguf")
    if gguf and not (isinstance(gguf, dict) and gguf.get("package") and gguf.get("file")):
        raise ModelLoadError(f"model '{name}': gguf must be a mapping with 'package' and 'file' (and optional 'parts')")
    tiny = cfg.get("tiny")
    if tiny and not (isinstance(tiny, dict) and tiny.get("model_type")):
        raise ModelLoadError(f"model '{name}': tiny must be a mapping of config kwargs with a 'model_type'")
    params_b = cfg.get("params_b")
    if params_b is not None and (isinstance(params_b, bool) or not isinstance(params_b, (int, float)) or params_b < 0):
        raise ModelLoadError(f"model '{name}': params_b must be a non-negative number of billions, got {params_b!r}")
    if cfg.get("domain") is not None and cfg.get("domain") not in DOMAINS:
        raise ModelLoadError(f"model '{name}': domain must be one of {', '.join(DOMAINS)}, got {cfg.get('domain')!r}")
    heads = cfg.get("heads") or {}
    if not isinstance(heads, dict) or any(k not in HEAD_KINDS or not isinstance(v, str) or v.count("/") != 1
                                          for k, v in heads.items()):
        raise ModelLoadError(f"model '{name}': heads must map {', '.join(HEAD_KINDS)} to hub repositories "
                             f"(owner/name), got {heads!r}")
    if not isinstance(cfg.get("chat", True), bool):
        raise ModelLoadError(f"model '{name}': chat must be true or false, got {cfg.get('chat')!r}")
    hw = _hardware(hardware_cfg) if hardware_cfg is not None else None
    _quantization_check(cfg, hw)


def _quantization_check(cfg: dict, hw: dict | None) -> None:
    """``quantization: int8`` needs a pretrained model, bitsandbytes and a CUDA device."""
    quant, name = cfg.get("quantization"), cfg["name"]
    if quant is None:
        return
    if quant not in QUANTIZATIONS:
        raise ModelLoadError(f"model '{name}': quantization '{quant}' is not one of {', '.join(QUANTIZATIONS)} (or null)")
    if cfg.get("tiny") or cfg.get("gguf"):
        raise ModelLoadError(f"model '{name}': quantization={quant} applies to hub or local checkpoints, not tiny or GGUF models")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ModelLoadError(f"model.quantization={quant} needs the bitsandbytes package: pip install bitsandbytes "
                             "(CUDA only), or set model.quantization=null")
    if hw is not None and hw["device"] != "cuda":
        raise ModelLoadError(f"model.quantization={quant} runs on CUDA only: use a CUDA hardware config or model.quantization=null")


def _hardware(hardware_cfg) -> dict:
    """Normalise a hardware config: resolve the device, check the attention implementation."""
    hw = {"device": "auto", "attn_implementation": "sdpa", "device_map": None, "num_threads": None, "num_gpus": None,
          "gqa": "fold", "linear": "auto", "forward": "eager"}
    hw.update({k: v for k, v in _plain(hardware_cfg).items() if k in hw and v is not None})
    if hw["device"] not in DEVICES:
        raise ModelLoadError(f"hardware.device '{hw['device']}' is not one of {', '.join(DEVICES)}")
    if hw["device"] == "auto":
        hw["device"] = "cuda" if torch.cuda.is_available() else "cpu"
        if hw["device"] == "cpu":
            warn_if_gpu_unused()
    elif hw["device"] == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"hardware.device=cuda but torch sees no CUDA device: {no_cuda_reason()}")
    if hw["num_gpus"] is not None:
        n = hw["num_gpus"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ModelLoadError(f"hardware.num_gpus must be a positive number of GPUs (or null for all), got {n!r}")
        if hw["device"] != "cuda":
            raise ModelLoadError("hardware.num_gpus applies to hardware.device=cuda only")
        if torch.cuda.device_count() < n:
            raise ModelLoadError(f"hardware.num_gpus={n} but torch sees {torch.cuda.device_count()} CUDA devices: "
                                 "request more GPUs (e.g. hydra.launcher.gpus_per_node) or lower hardware.num_gpus")
    if hw["gqa"] not in GQA_MODES:
        raise ModelLoadError(f"hardware.gqa '{hw['gqa']}' is not one of {', '.join(GQA_MODES)}")
    if hw["forward"] not in FORWARD_MODES:
        raise ModelLoadError(f"forward={hw['forward']!r} is not one of {', '.join(FORWARD_MODES)}")
    if hw["linear"] not in LINEAR_MODES:
        raise ModelLoadError(f"hardware.linear '{hw['linear']}' is not one of {', '.join(LINEAR_MODES)}")
    attn = hw["attn_implementation"]
    if attn not in ATTN_IMPLEMENTATIONS:
        raise ModelLoadError(f"hardware.attn_implementation '{attn}' is not one of {', '.join(ATTN_IMPLEMENTATIONS)}")
    if attn == "flash_attention_2" and (hw["device"] != "cuda" or importlib.util.find_spec("flash_attn") is None):
        raise ModelLoadError("flash_attention_2 needs a CUDA device and the flash_attn package (pip install flash-attn); "
                             "otherwise use hardware.attn_implementation=sdpa")
    return hw


def resolve_hardware(hardware_cfg) -> DictConfig:
    """A copy of the hardware config with ``device: auto`` and ``label: auto`` made concrete: CUDA when torch
    sees a GPU, else the CPU (the label follows the device)."""
    hw = OmegaConf.create(_plain(hardware_cfg))
    device = str(hw.get("device") or "auto")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
        hw.device = device
    if str(hw.get("label") or "auto") == "auto":
        hw.label = device
    return hw


def _available_bytes(hw: dict, quantization: str | None = None) -> tuple[int, str]:
    """Memory available for weights: MemAvailable on the CPU; on CUDA, the free memory of the GPUs the
    load may use (:func:`specbench.models.placement.gpus_used`), never the host's."""
    from specbench.models.placement import gpus_used

    if hw["device"] == "cuda":
        gpus = gpus_used(hw, quantization, torch.cuda.device_count())
        where = f"cuda:{gpus[0]}" if len(gpus) == 1 else f"{len(gpus)} GPUs"
        return sum(torch.cuda.mem_get_info(i)[0] for i in gpus), where
    try:
        with open("/proc/meminfo") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
        return kb * 1024, "cpu"
    except (OSError, StopIteration):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "cpu"


def _memory_check(cfg: dict, hw: dict, have: tuple[int, str] | None = None, reserve: float = 0) -> None:
    """Refuse, in one line, a model whose weights (``params_b``), with ``reserve`` bytes beside them (its KV
    cache), exceed the memory available (``have``: bytes and where, else :func:`_available_bytes`)."""
    if not cfg.get("params_b"):
        return
    dtype = cfg.get("dtype", "float32")
    need = cfg["params_b"] * 1e9 * (1 if cfg.get("quantization") == "int8" else DTYPES[dtype].itemsize) + reserve
    have, where = have or _available_bytes(hw, cfg.get("quantization"))
    if need > have:
        kv = f" (with {reserve / 1e9:.1f} GB of KV cache)" if reserve else ""
        raise ModelLoadError(
            f"model '{cfg['name']}' needs ~{need / 1e9:.0f} GB in {dtype}{kv} but {where} has {have / 1e9:.0f} GB available: "
            "use a smaller model, a GPU with more memory, or hardware.device_map=auto across GPUs")


def model_preset(name: str) -> DictConfig:
    """``conf/model/<name>.yaml`` (a draft model is named like a target), or a "did you mean" error."""
    choices = conf_choices("model")
    if name not in choices:
        raise UnknownNameError(suggest("model", name, choices, "Name a preset from conf/model/."))
    return OmegaConf.load(CONF_DIR / "model" / f"{name}.yaml")
