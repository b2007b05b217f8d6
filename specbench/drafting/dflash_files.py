"""DFlash drafters on disk, in the layouts their authors and vLLM's ``speculators`` publish.

- **z-lab's** (``architectures: ["DFlashDraftModel"]``): the draft layers' Qwen3 config at the top level,
  ``block_size``, and ``dflash_config`` with ``mask_token_id`` and ``target_layer_ids``.
- **speculators'** (``speculators_model_type: "dflash"``): ``transformer_layer_config`` (the draft layers'
  Qwen3 config), ``block_size``, ``aux_hidden_state_layer_ids``, ``mask_token_id``, ``draft_vocab_size``.

Both keep the weights in ``model.safetensors`` under the same names (``fc``, ``hidden_norm``, ``layers.N.…``,
``norm``), without the target's embedding and LM head. Ours are written in speculators' layout. What this
harness does not run (sliding-window draft layers, a draft vocabulary of its own, the Domino projector,
drafting from the anchor, a mask id outside the target's vocabulary, a target layer the target lacks) is
refused in one line, never ignored.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specbench.drafting.dflash import DFlashNet, DFlashShape
from specbench.errors import ConfigError

WEIGHTS = "model.safetensors"
CONFIG = "config.json"


class DFlashFileError(ConfigError):
    """A DFlash checkpoint this harness cannot run as its authors meant: the message names why."""


def _layers_config(s: DFlashShape, vocab: int) -> dict:
    return {"model_type": "qwen3", "hidden_size": s.hidden, "num_attention_heads": s.heads,
            "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim, "intermediate_size": s.intermediate,
            "num_hidden_layers": s.layers, "rms_norm_eps": s.eps, "rope_theta": s.rope_theta, "vocab_size": vocab,
            "hidden_act": "silu", "attention_bias": False}


def save_dflash(net: DFlashNet, folder: str | Path, vocab: int, verifier: str = "") -> Path:
    """``net`` in speculators' layout at ``folder`` (``vocab``: the target's vocabulary; ``verifier``: its name)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    s = net.s
    config = {"speculators_model_type": "dflash", "architectures": ["DFlashSpeculator"],
              "transformer_layer_config": _layers_config(s, vocab), "draft_vocab_size": vocab, "block_size": s.block,
              "aux_hidden_state_layer_ids": list(s.taps), "mask_token_id": s.mask_token,
              "projector_type": "dflash", "sample_from_anchor": False,
              "speculators_config": {"algorithm": "dflash", "verifier": {"name_or_path": verifier}}}
    (folder / CONFIG).write_text(json.dumps(config, indent=2))
    save_file({k: v.detach().contiguous() for k, v in net.state_dict().items()}, str(folder / WEIGHTS))
    return folder


def _shape(layers: dict, block: int, taps: list[int], mask: int | None, where: str) -> DFlashShape:
    if mask is None:
        raise DFlashFileError(f"{where}: the checkpoint names no mask_token_id (the block's placeholder token)")
    kinds = set(layers.get("layer_types") or ["full_attention"])
    if kinds != {"full_attention"}:
        raise DFlashFileError(f"{where}: draft layers of kinds {sorted(kinds)} (sliding windows) are not supported")
    hidden, heads = int(layers["hidden_size"]), int(layers["num_attention_heads"])
    rope = layers.get("rope_parameters") or layers.get("rope_scaling") or {}
    if rope.get("rope_type", "default") != "default":
        raise DFlashFileError(f"{where}: rotary scaling {rope.get('rope_type')!r} is not supported")
    theta = float(rope.get("rope_theta", layers.get("rope_theta", 1_000_000.0)))
    return DFlashShape(hidden=hidden, heads=heads, kv_heads=int(layers.get("num_key_value_heads", heads)),
                       head_dim=int(layers.get("head_dim") or hidden // heads),
                       intermediate=int(layers["intermediate_size"]), layers=int(layers["num_hidden_layers"]),
                       taps=tuple(int(t) for t in taps), block=int(block), mask_token=int(mask),
                       eps=float(layers.get("rms_norm_eps", 1e-6)), rope_theta=theta)


def read_shape(folder: str | Path) -> tuple[DFlashShape, int | None]:
    """The drafter's shape from its ``config.json`` in either layout, and the vocabulary it drafts in (None:
    the target's, z-lab's layout)."""
    folder = Path(folder)
    where = str(folder)
    if not (folder / CONFIG).is_file():
        raise DFlashFileError(f"{where}: no {CONFIG}: not a DFlash checkpoint")
    c = json.loads((folder / CONFIG).read_text())
    if c.get("speculators_model_type") == "dflash":
        if c.get("projector_type", "dflash") != "dflash":
            raise DFlashFileError(f"{where}: projector_type {c['projector_type']!r} is not supported (only dflash)")
        if c.get("sample_from_anchor"):
            raise DFlashFileError(f"{where}: sample_from_anchor (drafting the anchor's token too) is not supported")
        layers = c.get("transformer_layer_config") or {}
        shape = _shape(layers, c.get("block_size", 8), c.get("aux_hidden_state_layer_ids") or [],
                       c.get("mask_token_id"), where)
        return shape, c.get("draft_vocab_size")
    if "DFlashDraftModel" in (c.get("architectures") or []):
        extra = c.get("dflash_config") or {}
        taps = extra.get("target_layer_ids", c.get("target_layer_ids"))
        if not taps:
            raise DFlashFileError(f"{where}: dflash_config.target_layer_ids is missing")
        return _shape(c, c.get("block_size", 16), taps, extra.get("mask_token_id", c.get("mask_token_id")), where), None
    raise DFlashFileError(f"{where}: {CONFIG} is neither z-lab's (DFlashDraftModel) nor speculators' (dflash) layout")


def load_dflash(folder: str | Path, vocab: int, target_layers: int, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu") -> DFlashNet:
    """The drafter at ``folder`` for a target of ``vocab`` tokens and ``target_layers`` layers."""
    shape, draft_vocab = read_shape(folder)
    where = str(folder)
    if draft_vocab is not None and int(draft_vocab) != vocab:
        raise DFlashFileError(f"{where}: drafts in a vocabulary of {draft_vocab} tokens, the target has {vocab} "
                              "(a draft vocabulary of its own is not supported)")
    if not 0 <= shape.mask_token < vocab:
        raise DFlashFileError(f"{where}: mask_token_id {shape.mask_token} is outside the target's vocabulary "
                              f"of {vocab} tokens")
    if any(not 0 <= t < target_layers for t in shape.taps):
        raise DFlashFileError(f"{where}: reads target layers {list(shape.taps)}, the target has {target_layers}")
    net = DFlashNet(shape)
    weights = load_file(str(Path(folder) / WEIGHTS))
    weights = {k: v for k, v in weights.items() if not k.startswith(("verifier_", "embed_tokens", "lm_head"))}
    missing, unexpected = net.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise DFlashFileError(f"{where}: weights do not match the config (missing {missing[:3]}, unexpected "
                              f"{unexpected[:3]})")
    return net.to(device=device, dtype=dtype).eval()


def shape_for(target_config, layers: int = 1, block: int = 8) -> DFlashShape:
    """A drafter for a target: its widths and rotary base, ``layers`` draft layers reading the target layers
    DFlash taps by default, blocks of ``block`` tokens, the vocabulary's last id as the mask (recorded in the
    drafter's config: a model without a mask token of its own)."""
    from specbench.drafting.dflash import tapped_layers

    if layers < 1 or block < 2:
        raise DFlashFileError(f"dflash: need at least 1 draft layer and blocks of at least 2, got {layers} and {block}")
    c = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
    heads = c.num_attention_heads
    theta = (getattr(c, "rope_parameters", None) or {}).get("rope_theta") or getattr(c, "rope_theta", None) or 1e4
    return DFlashShape(hidden=c.hidden_size, heads=heads, kv_heads=getattr(c, "num_key_value_heads", heads),
                       head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads,
                       intermediate=c.intermediate_size, layers=layers,
                       taps=tuple(tapped_layers(c.num_hidden_layers, layers)), block=block,
                       mask_token=c.vocab_size - 1, eps=float(getattr(c, "rms_norm_eps", 1e-6)),
                       rope_theta=float(theta))


def random_dflash(target_config, folder: str | Path, layers: int = 1, block: int = 8, seed: int = 0,
                  dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> Path:
    """An untrained drafter for a target (:func:`shape_for`), saved in speculators' layout: what checks of
    losslessness use (what verification keeps does not depend on the drafter)."""
    c = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
    torch.manual_seed(seed)
    with torch.device(device):
        net = DFlashNet(shape_for(c, layers, block)).to(dtype)
    return save_dflash(net, folder, c.vocab_size)
