"""Loading EAGLE and EAGLE-3 heads in the layouts they are published in (:func:`load_head`): EAGLE's own
(what :func:`~specbench.drafting.eagle_head.save_head` writes) and the ``speculators`` layout (what vLLM
reads; many hub heads are published so), each checked against the target.

``config.json`` says ``speculators_model_type`` (``eagle`` or ``eagle3``) and carries the draft layer's Llama
config in ``transformer_layer_config`` (written as a difference from ``LlamaConfig``'s defaults, so those fill
what it leaves out; its ``vocab_size`` is the target's). EAGLE-3 adds ``draft_vocab_size``,
``norm_before_residual``, ``target_hidden_size`` and ``eagle_aux_hidden_state_layer_ids`` (hidden-state
indices as vLLM numbers them: index i is layer i's input); EAGLE-1/2 adds ``fusion_bias`` and ``layernorms``.

The weights (``model.safetensors`` or ``pytorch_model.bin``) are renamed to :class:`EagleHead`'s:

* ``eagle``: ``fusion_fc.*`` → ``fc.*``, ``transformer.*`` → ``layers.0.*``;
* ``eagle3``: ``layers.0.*`` → ``midlayer.*``; ``fc``, ``norm``, ``lm_head``, ``d2t``, ``input_norm``
  (``norm_before_fc``) and ``embed_tokens`` keep their names (an embedding in the weights is the head's own, as
  vLLM reads it); ``t2d`` and the verifier's ``verifier_*`` copies are dropped. The options current
  speculators training writes are read as vLLM reads them: ``norm_before_fc`` (an RMSNorm over the
  concatenated target states before ``fc``), ``norm_output`` (deeper steps read the normed output), the draft
  layer's ``sliding_window`` (where its ``layer_types`` say ``sliding_attention``); absent, ``norm_before_fc``
  and ``norm_output`` are off and ``norm_before_residual`` on, as vLLM's speculators config reads them.

Refused in one line: a head whose ``speculators_config.verifier`` names another hub model than the target's;
another ``speculators_model_type``; a layer that is not Llama's; more than one draft
layer; HASS's extra norms (``layernorms``); EAGLE 3.1's per-state norms before ``fc`` (``fc_norm``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specbench.drafting.eagle_head import EagleHead, HeadConfig, read_state
from specbench.drafting.medusa_head import hub_id
from specbench.errors import ConfigError

READ = ("eagle", "eagle3")
DROPPED = ("t2d", "embed_tokens.", "verifier_", "lm_head.")  # lm_head: an EAGLE-1/2 head's copy of the target's


def layer_config(directory: Path, data: dict):
    """The draft layer's ``LlamaConfig`` (its defaults where the config leaves a field out)."""
    from transformers import LlamaConfig

    layer = dict(data.get("transformer_layer_config") or {})
    if not layer:
        raise ConfigError(f"eagle head in {directory}: its speculators config has no transformer_layer_config: "
                          "use a head saved by the speculators library")
    kind = layer.pop("model_type", "llama")
    if kind != "llama":
        raise ConfigError(f"eagle head in {directory}: its draft layer is '{kind}' (transformer_layer_config), "
                          "only Llama layers are read: use a head with a Llama draft layer")
    for key in ("architectures", "transformers_version", "_name_or_path"):
        layer.pop(key, None)
    c = LlamaConfig(**layer)
    if c.num_hidden_layers != 1:
        raise ConfigError(f"eagle head in {directory}: it has {c.num_hidden_layers} draft layers, only one-layer "
                          "heads are read: use a one-layer head")
    return c


def read_speculators(directory: Path, data: dict, target_layers: int) -> tuple[HeadConfig, dict[str, torch.Tensor]]:
    """The head's config and its weights under :class:`EagleHead`'s names, from a speculators checkpoint."""
    kind = data.get("speculators_model_type")
    if kind not in READ:
        raise ConfigError(f"eagle head in {directory}: speculators_model_type '{kind}' is not read here (only "
                          f"{', '.join(READ)}): use an EAGLE or EAGLE-3 head")
    lc = layer_config(directory, data)
    c = HeadConfig.for_target(kind, lc, draft_vocab_size=int(data.get("draft_vocab_size") or 0))
    c.target_layers = target_layers
    if kind == "eagle":
        if data.get("layernorms"):
            raise ConfigError(f"eagle head in {directory}: it normalises the embedding and the output "
                              "(layernorms: true), which EAGLE-1/2 heads here do not: use a head without them")
        c.bias = bool(data.get("fusion_bias", False))
    else:
        if data.get("fc_norm"):
            raise ConfigError(f"eagle head in {directory}: it normalises each target state apart before fc "
                              "(fc_norm: true, EAGLE 3.1's), which is not read here: use a head without it")
        c.norm_before_residual = bool(data.get("norm_before_residual", True))  # vLLM's default when absent
        c.norm_before_fc, c.norm_output = bool(data.get("norm_before_fc")), bool(data.get("norm_output"))
        c.sliding_window = window_of(data.get("transformer_layer_config") or {})
        c.target_hidden_size = int(data.get("target_hidden_size") or c.hidden_size)
        c.aux_layers = tuple(sorted(int(i) for i in data.get("eagle_aux_hidden_state_layer_ids") or ()))
    state = renamed(kind, read_state(directory))
    c.own_embedding = kind == "eagle3" and "embed_tokens.weight" in state  # vLLM embeds with a head's own table
    return c, state


def window_of(layer: dict) -> int:
    """The draft layer's sliding window (0: none): ``sliding_window`` where its ``layer_types`` (if listed) say
    ``sliding_attention`` and ``use_sliding_window`` is not false."""
    kinds = layer.get("layer_types") or ["sliding_attention"]
    if not layer.get("sliding_window") or layer.get("use_sliding_window") is False or kinds[0] != "sliding_attention":
        return 0
    return int(layer["sliding_window"])


def renamed(kind: str, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A speculators state dict under :class:`EagleHead`'s key names (what the head does not read dropped)."""
    moves = (("fusion_fc.", "fc."), ("transformer.", "layers.0.")) if kind == "eagle" else (("layers.0.", "midlayer."),)
    # EAGLE-3's LM head is its own, and so is an embedding it carries (vLLM embeds with it)
    dropped = DROPPED if kind == "eagle" else tuple(d for d in DROPPED if d not in ("lm_head.", "embed_tokens."))
    out = {}
    for key, value in state.items():
        if key.startswith(dropped):
            continue
        for old, new in moves:
            if key.startswith(old):
                key = new + key[len(old):]
                break
        out[key] = value
    return out


def load_head(directory: Path, target_config) -> EagleHead:
    """A head saved by :func:`save_head`, published by EAGLE's authors or in the ``speculators`` layout (vLLM's;
    read here), checked against the target. What it cannot read rightly it
    refuses in one line."""
    directory = Path(directory)
    cfg_path = directory / "config.json"
    if not cfg_path.is_file():
        raise ConfigError(f"eagle head: no config.json in {directory}")
    tc = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
    data = json.loads(cfg_path.read_text())
    if "speculators_model_type" in data:
        c, state = read_speculators(directory, data, tc.num_hidden_layers)
        verifier = str(((data.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path") or "")
        target = str(getattr(target_config, "_name_or_path", ""))
        if hub_id(verifier) and hub_id(target) and verifier.lower() != target.lower():
            raise ConfigError(f"eagle head in {directory} was trained for {verifier} (speculators_config.verifier), "
                              f"not for the target {target}: use the head published for this target")
    else:
        c, state = HeadConfig.from_json(data, tc.num_hidden_layers), read_state(directory)
    if c.target_hidden_size != tc.hidden_size or (c.vocab_size and c.vocab_size != tc.vocab_size):
        raise ConfigError(
            f"eagle head in {directory} is for another model (hidden {c.target_hidden_size}, vocabulary "
            f"{c.vocab_size}; the target has {tc.hidden_size} and {tc.vocab_size}): use the head trained for this target")
    if c.hidden_size != tc.hidden_size:
        raise ConfigError(
            f"eagle head in {directory}: its layer is {c.hidden_size} wide over the target's {tc.hidden_size}-wide "
            f"states (target_hidden_size): heads of another width than the target are not read; use one of the "
            f"target's width")
    c.vocab_size, c.target_layers = tc.vocab_size, tc.num_hidden_layers
    if any(not 0 <= i < tc.num_hidden_layers for i in c.aux_layers):  # L: the final state, before the norm
        raise ConfigError(
            f"eagle head in {directory}: eagle_aux_hidden_state_layer_ids {list(c.aux_layers)} name states the "
            f"target ({tc.num_hidden_layers} layers) has no input of a layer for: use the head trained for this target")
    head = EagleHead(c)
    if not c.own_embedding:
        state = {k: v for k, v in state.items() if not k.startswith("embed_tokens")}
    if c.kind == "eagle3":
        state.pop("t2d", None)
        if "d2t" not in state:
            if head.lm_head.out_features != c.vocab_size:
                raise ConfigError(
                    f"eagle head in {directory}: its draft vocabulary ({head.lm_head.out_features} of the target's "
                    f"{c.vocab_size}) comes without d2t in its weights: add the draft-to-target map (d2t) it was "
                    f"trained with")
            state["d2t"] = torch.zeros(head.lm_head.out_features, dtype=torch.long)  # draft ids are target ids
    missing, unexpected = head.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ConfigError(f"eagle head in {directory}: weights do not match its config.json "
                          f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")
    return head
