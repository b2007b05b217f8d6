"""``load_model(model_cfg, hardware_cfg)``: the one way a model is loaded, and ``load_tokenizer``."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
import transformers

from specbench.core.attention import fold_gqa
from specbench.errors import ModelLoadError
from specbench.models.config import DTYPES, _hardware, _memory_check, _plain, model_config_check
from specbench.models.own import resolve_model
from specbench.models.packed import pack_linears, wants_packed
from specbench.models.placement import check_placed, draft_hardware, placement_kwargs
from specbench.models.shards import share_layer_inputs
from specbench.models.tiny import _build_tiny, build_tiny_tokenizer
from specbench.models.weights import _weights_source

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: transformers.PreTrainedTokenizerBase
    name: str
    dtype: str
    device: torch.device
    context_length: int
    eos_token_ids: list[int]
    vocab_size: int
    source: str = ""  # where the weights came from: "tiny", "path", "converted", "gguf", "hub"
    quantization: str = ""  # "int8", or "" for weights in ``dtype``
    device_map: str = ""  # "auto" when sharded by accelerate, "" when the model sits on one device
    linear: str = "plain"  # "packed": linear layers prepacked for oneDNN (specbench.models.packed)
    forward: str = "eager"  # the forward mode its target runs in (specbench.core.engine.make_target)


def _placement(cfg: dict, hw: dict) -> dict:
    """from_pretrained keywords that place the weights (:mod:`specbench.models.placement`), int8 included."""
    visible = torch.cuda.device_count() if hw["device"] == "cuda" else 0
    placement = placement_kwargs(hw, cfg.get("quantization"), visible, lambda i: torch.cuda.mem_get_info(i)[0])
    if cfg.get("quantization") == "int8":
        placement["quantization_config"] = transformers.BitsAndBytesConfig(load_in_8bit=True)
    return placement


def load_tokenizer(model_cfg) -> transformers.PreTrainedTokenizerBase:
    """The model's tokenizer alone (for building datastores): no weights are loaded, except that a GGUF
    file is converted once (as :func:`load_model` would) when no converted copy exists yet."""
    model_config_check(model_cfg)
    cfg = resolve_model(_plain(model_cfg))
    if cfg.get("tiny"):
        return build_tiny_tokenizer(int(cfg["tiny"].get("vocab_size", 128)))
    src, kw, _ = _weights_source(cfg)
    tokenizer = transformers.AutoTokenizer.from_pretrained(src, **kw)
    if cfg.get("chat_template"):
        tokenizer.chat_template = cfg["chat_template"]
    return tokenizer


def allocated_cpus() -> int | None:
    """The CPUs a scheduler gave this job (``SLURM_CPUS_PER_TASK``), for torch's threads: its default is
    every core of the node, which jobs sharing a node then fight over. None outside SLURM."""
    value = os.environ.get("SLURM_CPUS_PER_TASK", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def load_model(model_cfg, hardware_cfg=None) -> LoadedModel:
    """Load a model and its tokenizer as ``model_cfg`` describes: eval mode, on the configured device.

    ``LoadedModel.source`` says where the weights came from: tiny, path, hub, gguf (converted
    just now) or converted (read from the cache of an earlier conversion).
    """
    hw = _hardware(hardware_cfg)
    cfg = resolve_model(_plain(model_cfg), hw["device"])  # model=hf: its auto fields read from the checkpoint
    model_config_check(cfg)
    name, dtype_name, attn = cfg["name"], cfg.get("dtype", "float32"), hw["attn_implementation"]
    threads = hw["num_threads"] or allocated_cpus()
    if threads:
        torch.set_num_threads(int(threads))
    _memory_check(cfg, hw)

    if cfg.get("tiny"):
        model, tokenizer = _build_tiny(cfg["tiny"], DTYPES[dtype_name], attn)
        source, placement = "tiny", {}  # from_config takes no device_map
    else:
        src, kw, source = _weights_source(cfg)
        tokenizer = transformers.AutoTokenizer.from_pretrained(src, **kw)
    if cfg.get("chat_template"):
        tokenizer.chat_template = cfg["chat_template"]
    if cfg.get("chat", True) and not tokenizer.chat_template:
        raise ModelLoadError(f"model '{name}' has no chat template in its tokenizer: set model.chat=false or model.chat_template")
    if source != "tiny":
        placement = _placement(cfg, hw)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            src, dtype=DTYPES[dtype_name], attn_implementation=attn, **placement, **kw)
    if not placement:
        model.to(hw["device"])
    model.eval()
    check_placed(model, name, hw)
    share_layer_inputs(model)  # a sharded model: the mask, cos/sin and positions copied once per device
    if hw["gqa"] == "fold" and attn == "sdpa":
        fold_gqa(model)  # a no-op without grouped-query attention
    linear = "plain"
    if not cfg.get("quantization") and wants_packed(hw["linear"], hw["device"], DTYPES[dtype_name]):
        pack_linears(model)
        linear = "packed"

    eos = model.generation_config.eos_token_id if model.generation_config is not None else None
    eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    limit = getattr(model.config, "max_position_embeddings", None)
    if not limit:
        limit = tokenizer.model_max_length if tokenizer.model_max_length < 1e7 else 2048
    log.info("loaded %s (%s, %s%s) from %s", name, dtype_name, attn, ", packed linears" * (linear == "packed"), source)
    return LoadedModel(
        model=model, tokenizer=tokenizer, name=name, dtype=dtype_name,
        device=model.get_input_embeddings().weight.device, context_length=int(limit),
        eos_token_ids=sorted(eos), vocab_size=model.get_output_embeddings().weight.shape[0], source=source,
        quantization=str(cfg.get("quantization") or ""),
        device_map="auto" if len({str(v) for v in (getattr(model, "hf_device_map", None) or {}).values()}) > 1 else "",
        linear=linear, forward=hw["forward"])


def load_draft(name: str, dtype: str, hardware_cfg=None) -> LoadedModel:
    """A draft model preset (``conf/model/<name>.yaml``) in the target's dtype, on one device of the target's
    hardware (:func:`specbench.models.placement.draft_hardware`)."""
    from omegaconf import OmegaConf

    from specbench.models.config import model_preset

    return load_model(OmegaConf.merge(model_preset(name), {"dtype": dtype}), draft_hardware(_plain(hardware_cfg)))
