"""What gpu-check runs its checks on: random-weight models built from configs (no weights, no internet), prompts
with repeats in them, a retrieval store over them, and a fresh drafter per method with whatever it needs here
(a self-draft, random heads in their published formats).

Two shapes stand for the paper's models: Llama-2-7B (multi-head attention, 32k vocabulary) and Llama-3-8B
(grouped-query attention, 128k vocabulary); :data:`TINY` has the same two kinds of attention at CPU size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from methods.registry import build_method_config, get_method, method_names
from specbench.budget.costs import CostModel
from specbench.core.acceptance import SamplingParams
from specbench.core.attention import fold_gqa
from specbench.core.draft import Drafter, DrafterContext
from specbench.core.forward import Target
from specbench.core.reference import References
from specbench.drafting.draft_model import ModelDrafter

SHAPES = {
    "llama2-7b": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_attention_heads=32,
                      num_key_value_heads=32, max_position_embeddings=4096, rms_norm_eps=1e-5),
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                      num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5),
}
TINY = {  # the same two kinds of attention, small enough for a CPU
    "llama2-7b": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                      num_key_value_heads=4, max_position_embeddings=4096),
    "llama3-8b": dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=8192, rope_theta=500000.0),
}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
SHARPEN = 4.0  # the output layer scaled up: random models then make greedy choices far from ties
TARGET_NAME = "gpu-check"
REFERENCE_TOKENS = 256  # the oracle's reference outputs: longer than any generation of the checks

Row = tuple[str, str, str, bool, str]


def build(shape: dict, layers: int, dtype: torch.dtype, device: str | torch.device, seed: int = 0) -> torch.nn.Module:
    """A random-weight Llama of ``shape`` with ``layers`` layers, initialised on ``device`` directly."""
    config = LlamaConfig(num_hidden_layers=layers, **shape)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(SHARPEN)
    fold_gqa(model)  # as load_model does (hardware.gqa=fold)
    return model.eval()


def prompts(vocab: int, n: int = 2, length: int = 48, seed: int = 1) -> list[list[int]]:
    """Prompts with repeats in them (a phrase twice), so that copying drafters find something."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        phrase = torch.randint(3, vocab, (length // 3,), generator=gen).tolist()
        filler = torch.randint(3, vocab, (length - 2 * len(phrase),), generator=gen).tolist()
        out.append(phrase + filler + phrase)
    return out


def method_settings(name: str, store: Path | None, head_dir: Path, hidden: int, layers: int,
                    model_config: Any = None, temperature: float = 0.0, device: str | torch.device = "cpu"
                    ) -> dict[str, Any]:
    """What a method needs beyond its defaults to run here: the check's store, a self-draft of the
    target's first layers, an acceptance head (random: it only decides where a draft stops), an EAGLE or
    Medusa head (random: verification keeps the target's tokens whatever it proposes). Heads are written to
    ``head_dir`` once per kind, in fp16 (initialised on ``device``), and reused by every later call."""
    from specbench.drafting.acceptance_head import AcceptanceHead, save_head
    from specbench.drafting.eagle_drafter import random_head

    config_cls = get_method(name).Config
    fields = {f.name for f in dataclasses.fields(config_cls)} if dataclasses.is_dataclass(config_cls) else set()
    params: dict[str, Any] = {}
    if "datastore" in fields and store is not None:
        params["datastore"] = str(store)
    if "refine" in fields:
        params["refine"] = False
    if "draft_model" in fields:
        params.update(draft_model="self", self_first_layers=max(1, layers // 4), self_skip_layers=None)
    if "head_path" in fields:
        config = build_method_config(name, params)
        path = head_dir / f"{name}.pt"
        torch.manual_seed(0)
        save_head(path, AcceptanceHead(hidden, 2), {"target": TARGET_NAME, "draft": config.identity(),
                                                     "temperature": temperature})
        params["head_path"] = str(path)
    kind = getattr(get_method(name), "KIND", None)
    if "head" in fields and kind and model_config is not None:
        folder = head_dir / f"{kind}-head"
        if not (folder / "config.json").exists():  # written once, reused (Medusa's for the 8B shape: 3 GB)
            random_head(kind, model_config, folder, dtype=torch.float16, device=device)
        params["head"] = str(folder)
    return params


def build_store(folder: Path, vocab: int, texts: list[list[int]]) -> Path:
    """A small retrieval store over the prompts' tokens and random documents of this vocabulary."""
    from specbench.stores.datastore import write_store

    gen = torch.Generator().manual_seed(2)
    docs = [list(t) for t in texts] + [torch.randint(3, vocab, (64,), generator=gen).tolist() for _ in range(32)]
    ident = {"name": TARGET_NAME, "vocab_size": vocab, "vocab_sha256": "0" * 64}
    return write_store(folder / "store", docs, tokenizer=ident, source={}, progress=False).path


def drafters(target: Target, vocab: int, workdir: Path, texts: list[list[int]], only: tuple[str, ...] | None = None,
             sampling: SamplingParams | None = None, heads: Path | None = None) -> dict[str, Callable[[], Drafter]]:
    """A fresh drafter per call, for every registered method (the baseline included), or those ``only`` names;
    drafting for ``sampling`` (greedy when None); random heads from ``heads`` (written there once; ``workdir``
    when None), loaded once per target and sampling (later drafters are spawns of the first: fresh state, the
    same weights)."""
    workdir.mkdir(parents=True, exist_ok=True)
    store = build_store(workdir, vocab, texts)
    hidden = target.model.config.hidden_size
    layers = target.model.config.num_hidden_layers
    context = DrafterContext(sampling=sampling or SamplingParams(), device=target.device, dtype=target.dtype,
                             target_model=target.model, target_name=TARGET_NAME, forward_cost=CostModel.flat(),
                             graphs=bool(getattr(target, "graphed", False)),
                             reference=References(target, REFERENCE_TOKENS))
    out = {}
    for name in only or method_names():
        settings = method_settings(name, store, heads or workdir, hidden, layers, target.model.config,
                                   temperature=context.sampling.temperature, device=target.head_device)
        config = build_method_config(name, settings)
        cls = get_method(name)
        if getattr(cls, "KIND", None) and "head" in settings or issubclass(cls, ModelDrafter):  # loaded once
            key = (id(target.model), name, context.sampling.temperature, settings.get("head"))
            out[name] = lambda cls=cls, config=config, key=key: _prototype(key, lambda: cls(
                config, vocab_size=vocab, seed=0, context=context)).spawn()
        else:
            out[name] = lambda cls=cls, config=config: cls(config, vocab_size=vocab, seed=0, context=context)
    return out


_PROTOTYPES: dict = {}


def _prototype(key, make: Callable[[], Drafter]) -> Drafter:
    """A head method's or a draft model's first drafter for this target, sampling and head, kept so that later
    ones are its spawns (the same weights, fresh state) instead of loading the head again (Medusa's for the 8B
    shape is 3 GB); under graphs a draft model's spawns replay the graphs the first captured."""
    if key not in _PROTOTYPES:
        _PROTOTYPES[key] = make()
    return _PROTOTYPES[key]


def forget_drafters() -> None:
    """Drop the kept head drafters (their GPU memory with them): at the end of each gpu-check stage."""
    _PROTOTYPES.clear()


@torch.inference_mode()
def margins(target: Target, prompt: list[int], output: list[int]) -> float:
    """The largest teacher-forced argmax margin of ``output``: max over tokens of (best logit − its logit)."""
    ids = torch.tensor([prompt + output], device=target.device)
    logits = target.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    chosen = logits.gather(-1, torch.tensor(output, device=logits.device)[:, None])[:, 0]
    return float((logits.max(-1).values - chosen).max()) if output else 0.0
