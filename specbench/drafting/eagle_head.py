"""EAGLE's draft heads: one decoder layer over the target's features, in the published formats.

* **EAGLE-1/2** (``kind: eagle``): ``fc`` fuses ``[embedding of token t+1, feature at t]`` (2H → H, a bias
  unless the config says ``"bias": false``) into one Llama decoder layer whose input norm is left out;
  its output, the raw residual stream, is the predicted feature at t+1, and the target's own LM head
  reads it directly. The feature is the target's last hidden state after its final norm
  (``output_hidden_states`` index -1).
* **EAGLE-3** (``kind: eagle3``): the target's states at the inputs of layers 2, L/2 and L-3 (hidden-state
  indices ``[2, L // 2, L - 3]``, or those its config names in ``eagle_aux_hidden_state_layer_ids``) are
  concatenated and fused by ``fc`` (3 × ``target_hidden_size`` → H, no bias); the layer
  (``midlayer``) normalises the embedding and the feature apart (``input_layernorm``, ``hidden_norm``),
  attends over their concatenation (2H → H), adds the feature back (the normed one with
  ``norm_before_residual``); ``norm`` and its own ``lm_head`` give
  logits over a reduced draft vocabulary, mapped to the target's by ``d2t`` (target id = draft id +
  ``d2t[draft id]``). Deeper draft steps feed the layer's own output back (no ``fc``). Current speculators
  heads add options, read as vLLM reads them: ``norm_before_fc`` (an RMSNorm, ``input_norm``, over the
  concatenated states before ``fc``), ``norm_output`` (deeper steps read the normed output, the state the LM
  head reads), a ``sliding_window`` over the draft layer's keys, and a token embedding of the head's own.

Refused, each in one line: a draft vocabulary smaller than the target's without ``d2t``; a head whose layer
is not as wide as the target's states (``hidden_size`` ≠ ``target_hidden_size``: it would embed tokens with a
table of its own); layer ids the target has no layer input for; another model's head.

Positions are rotated as the config says: plain RoPE at ``rope_theta``, or a ``rope_scaling`` (``rope_parameters``)
of any type transformers knows (``linear`` and ``dynamic`` as EAGLE's reference applies them, ``llama3``, ``yarn``…).

Both read ``config.json`` (a one-layer ``LlamaConfig``) and ``pytorch_model.bin`` or ``model.safetensors``
with the reference's key names (``fc.weight``, ``layers.0.self_attn.q_proj.weight``, ``midlayer.…``,
``d2t``); :func:`save_head` writes the same, so a head trained here and one from the hub load alike. The
embedding is the target's unless the head carries its own (``own_embedding``; a speculators head's
``embed_tokens``); an EAGLE-layout checkpoint's copy of the target's is ignored.

The head keeps a KV cache of its own (:class:`HeadCache`) over the committed positions; a draft tree's
entries are appended after them and cropped away once the step is verified.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from specbench.core.attention import grouped_sdpa
from specbench.drafting.head_parts import HeadCache, RMSNorm, Rotary, reference_scaling, scaling_of
from specbench.errors import ConfigError

KINDS = ("eagle", "eagle3")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def eagle3_layers(n_layers: int) -> tuple[int, int, int]:
    """The target's hidden-state indices EAGLE-3 fuses: the inputs of layers 2, L/2 and L-3."""
    return (2, n_layers // 2, n_layers - 3)


@dataclass
class HeadConfig:
    kind: str
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    bias: bool = True  # fc's bias (EAGLE-1/2)
    vocab_size: int = 0  # the target's
    draft_vocab_size: int = 0  # EAGLE-3's reduced vocabulary (0: the target's)
    target_layers: int = 0  # the target's decoder layers (EAGLE-3's feature indices depend on it)
    head_dim: int = 0
    rope_scaling: dict | None = None  # transformers' rope_scaling ({"rope_type" or "type": …, "factor": …})
    max_position_embeddings: int = 2048  # what ``dynamic`` scaling measures positions against
    aux_layers: tuple[int, ...] = ()  # EAGLE-3's hidden-state indices when its config names them (else 2, L/2, L-3)
    target_hidden_size: int = 0  # the width of the target's states ``fc`` reads (0: hidden_size)
    norm_before_residual: bool = False  # EAGLE-3: the residual is the normed feature (speculators' option)
    norm_before_fc: bool = False  # EAGLE-3: an RMSNorm over the concatenated target states before fc
    norm_output: bool = False  # EAGLE-3: deeper draft steps read the normed output (else the raw one)
    sliding_window: int = 0  # the draft layer attends to the last this many positions (0: all)
    own_embedding: bool = False  # EAGLE-3: the head embeds tokens with a table of its own (else the target's)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"eagle head: kind must be one of {', '.join(KINDS)}, got '{self.kind}'")
        self.head_dim = self.head_dim or self.hidden_size // self.num_attention_heads
        self.aux_layers = tuple(int(i) for i in self.aux_layers or ())
        self.target_hidden_size = self.target_hidden_size or self.hidden_size
        self.rope_scaling = scaling_of(self.rope_scaling)
        if self.rope_scaling is not None:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            kind = self.rope_scaling["rope_type"]
            if kind not in ROPE_INIT_FUNCTIONS:
                raise ConfigError(f"eagle head: rope scaling '{kind}' is not one transformers knows "
                                  f"({', '.join(ROPE_INIT_FUNCTIONS)})")

    @classmethod
    def for_target(cls, kind: str, target_config, draft_vocab_size: int = 0) -> HeadConfig:
        """A fresh head shaped like one layer of the target."""
        c = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
        rope = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
        return cls(kind=kind, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                   num_attention_heads=c.num_attention_heads,
                   num_key_value_heads=getattr(c, "num_key_value_heads", None) or c.num_attention_heads,
                   rms_norm_eps=getattr(c, "rms_norm_eps", 1e-6),
                   rope_theta=float(rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))),
                   bias=True, vocab_size=c.vocab_size,
                   draft_vocab_size=draft_vocab_size if kind == "eagle3" else 0,
                   target_layers=c.num_hidden_layers, head_dim=getattr(c, "head_dim", 0) or 0,
                   rope_scaling=dict(rope), max_position_embeddings=getattr(c, "max_position_embeddings", 2048))

    def feature_layers(self) -> tuple[int, ...]:
        if self.kind != "eagle3":
            return (-1,)
        return self.aux_layers or eagle3_layers(self.target_layers)

    def to_json(self) -> dict:
        """``config.json`` as the reference writes it (a one-layer Llama config) plus what it leaves implicit."""
        out = {"architectures": ["LlamaForCausalLMEagle3" if self.kind == "eagle3" else "LlamaForCausalLM"],
               "model_type": "llama", "hidden_act": "silu", "num_hidden_layers": 1,
               "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
               "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
               "head_dim": self.head_dim, "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
               "vocab_size": self.vocab_size, "bias": self.bias, "target_num_hidden_layers": self.target_layers,
               "max_position_embeddings": self.max_position_embeddings}
        if self.rope_scaling is not None:
            out["rope_scaling"] = reference_scaling(self.rope_scaling)
        if self.kind == "eagle3":
            out["draft_vocab_size"] = self.draft_vocab_size or self.vocab_size
            out["target_hidden_size"] = self.target_hidden_size
            if self.aux_layers:
                out["eagle_aux_hidden_state_layer_ids"] = list(self.aux_layers)
            for key in ("norm_before_residual", "norm_before_fc", "norm_output", "own_embedding"):
                if getattr(self, key):
                    out[key] = True
        if self.sliding_window:
            out["sliding_window"] = self.sliding_window
        return out

    @classmethod
    def from_json(cls, data: dict, target_layers: int) -> HeadConfig:
        kind = "eagle3" if "draft_vocab_size" in data or any("Eagle3" in a for a in data.get("architectures", [])) \
            else "eagle"
        heads = data["num_attention_heads"]
        rope = data.get("rope_scaling") or data.get("rope_parameters") or {}
        theta = data.get("rope_theta") or rope.get("rope_theta") or 10000.0
        return cls(kind=kind, hidden_size=data["hidden_size"], intermediate_size=data["intermediate_size"],
                   num_attention_heads=heads, num_key_value_heads=data.get("num_key_value_heads") or heads,
                   rms_norm_eps=data.get("rms_norm_eps", 1e-6), rope_theta=float(theta), rope_scaling=rope,
                   max_position_embeddings=data.get("max_position_embeddings") or 2048,
                   bias=data.get("bias", True), vocab_size=data.get("vocab_size", 0),
                   draft_vocab_size=data.get("draft_vocab_size", 0) if kind == "eagle3" else 0,
                   target_layers=data.get("target_num_hidden_layers", target_layers),
                   head_dim=data.get("head_dim") or 0, aux_layers=aux_layers_of(data) if kind == "eagle3" else (),
                   target_hidden_size=data.get("target_hidden_size") or 0,
                   norm_before_residual=bool(data.get("norm_before_residual", False)),
                   norm_before_fc=bool(data.get("norm_before_fc", False)), norm_output=bool(data.get("norm_output")),
                   sliding_window=int(data.get("sliding_window") or 0), own_embedding=bool(data.get("own_embedding")))


def aux_layers_of(data: dict) -> tuple[int, ...]:
    """The hidden-state indices (``output_hidden_states``' numbering: index i is layer i's input) an EAGLE-3
    config names, in ascending order as vLLM and EAGLE concatenate them whatever order the config lists. A top-level ``eagle_aux_hidden_state_layer_ids`` is read as vLLM reads it (those indices);
    one inside ``eagle_config`` (SpecForge's, for SGLang) as SGLang reads it: layer outputs (index + 1) when
    its first id is 1, else indices."""
    if data.get("eagle_aux_hidden_state_layer_ids"):
        return tuple(sorted(int(i) for i in data["eagle_aux_hidden_state_layer_ids"]))
    ids = sorted(int(i) for i in (data.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or [])
    return tuple(i + 1 for i in ids) if ids and ids[0] == 1 else tuple(ids)


class Attention(nn.Module):
    def __init__(self, c: HeadConfig, in_size: int) -> None:
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(in_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(in_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(in_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)
        self.rotary = Rotary(c)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: HeadCache | None,
                visible: torch.Tensor | None) -> torch.Tensor:
        """``x`` [n, in]; ``visible`` [n, cached + n] bool (None: causal over a fresh sequence)."""
        return self.o_proj(self.attend(*self.project(x, positions), positions, cache, visible))

    def project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values ([heads, n, head_dim]) of ``x`` [n, in], rotated to ``positions``."""
        c, n = self.c, x.shape[0]
        q = self.q_proj(x).view(n, c.num_attention_heads, c.head_dim).transpose(0, 1)
        k = self.k_proj(x).view(n, c.num_key_value_heads, c.head_dim).transpose(0, 1)
        v = self.v_proj(x).view(n, c.num_key_value_heads, c.head_dim).transpose(0, 1)
        return self.rotary(q, positions), self.rotary(k, positions), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
               cache: HeadCache | None, visible: torch.Tensor | None) -> torch.Tensor:
        """One sequence's attention over its cache ([n, heads × head_dim], before ``o_proj``)."""
        c, n = self.c, q.shape[1]
        window = c.sliding_window
        if cache is not None:
            k, v = cache.append(k, v, positions if window else None)
        if window:  # a key is seen within the last ``window`` positions (Mistral's and transformers' rule)
            keys = cache.positions[: len(cache)] if cache is not None else positions
            near = positions[:, None] - keys[None, :] < window
            visible = near & (keys[None, :] <= positions[:, None] if visible is None else visible)
        return grouped_sdpa(q, k, v, visible).transpose(0, 1).reshape(n, -1)


class MLP(nn.Module):
    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    """EAGLE-1/2's layer 0 (no input norm) or EAGLE-3's midlayer (embedding and feature normed apart)."""

    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        three = c.kind == "eagle3"
        self.norm_before_residual = three and c.norm_before_residual
        self.self_attn = Attention(c, 2 * c.hidden_size if three else c.hidden_size)
        self.mlp = MLP(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        if three:
            self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
            self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, hidden: torch.Tensor, embeds: torch.Tensor | None, positions, cache, visible,
                rows: list[tuple[int, HeadCache | None, torch.Tensor | None]] | None = None) -> torch.Tensor:
        """One sequence's rows, or with ``rows`` (each sequence's row count, cache and visibility, in order)
        several sequences' rows at once: every projection over all of them, attention per sequence."""
        residual, x = hidden, hidden
        if embeds is not None:
            normed = self.hidden_norm(hidden)
            residual = normed if self.norm_before_residual else hidden
            x = torch.cat([self.input_layernorm(embeds), normed], -1)
        if rows is None:
            attended = self.self_attn(x, positions, cache, visible)
        else:
            q, k, v = self.self_attn.project(x, positions)
            parts, at = [], 0
            for n, own_cache, own_visible in rows:
                parts.append(self.self_attn.attend(q[:, at : at + n], k[:, at : at + n], v[:, at : at + n],
                                                   positions[at : at + n], own_cache, own_visible))
                at += n
            attended = self.self_attn.o_proj(torch.cat(parts))
        hidden = residual + attended
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class EagleHead(nn.Module):
    """An EAGLE-1/2 or EAGLE-3 head. :meth:`forward` maps (features, next tokens' embeddings) to predicted
    features; :meth:`logits` reads them (over the target's vocabulary, EAGLE-3's mapped from its own)."""

    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.c = c
        h = c.hidden_size
        if c.kind == "eagle":
            self.fc = nn.Linear(2 * h, h, bias=c.bias)
            self.layers = nn.ModuleList([Layer(c)])
        else:
            width = len(c.feature_layers()) * c.target_hidden_size
            self.input_norm = RMSNorm(width, c.rms_norm_eps) if c.norm_before_fc else None
            self.fc = nn.Linear(width, h, bias=False)
            self.midlayer = Layer(c)
            self.embed_tokens = nn.Embedding(c.vocab_size, h) if c.own_embedding else None
            self.norm = RMSNorm(h, c.rms_norm_eps)
            dv = c.draft_vocab_size or c.vocab_size
            self.lm_head = nn.Linear(h, dv, bias=False)
            self.register_buffer("d2t", torch.zeros(dv, dtype=torch.long))

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.c.feature_layers()

    def fuse(self, features: dict[int, torch.Tensor]) -> torch.Tensor:
        """The head's input feature [n, H] from the target's states ({layer: [n, H]})."""
        if self.c.kind == "eagle":
            return features[-1]
        joined = torch.cat([features[i] for i in self.feature_layers], -1)
        return self.fc(joined if self.input_norm is None else self.input_norm(joined))

    def feed(self, hidden: torch.Tensor) -> torch.Tensor:
        """What a deeper draft step reads of this step's output: the output, or with ``norm_output`` its
        normed state (the one the LM head reads)."""
        return self.norm(hidden) if self.c.kind == "eagle3" and self.c.norm_output else hidden

    def forward(self, feature: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor,
                cache: HeadCache | None = None, visible: torch.Tensor | None = None,
                rows: list[tuple[int, HeadCache | None, torch.Tensor | None]] | None = None) -> torch.Tensor:
        """Predicted features [n, H] from ``feature`` [n, H] (fused, or the head's own output) and the
        embeddings [n, H] of the tokens that follow each; ``rows``: several sequences at once (:class:`Layer`)."""
        if self.c.kind == "eagle":
            return self.layers[0](self.fc(torch.cat([embeds, feature], -1)), None, positions, cache, visible, rows)
        return self.midlayer(feature, embeds, positions, cache, visible, rows)

    def logits(self, hidden: torch.Tensor, target_head: nn.Module) -> torch.Tensor:
        """[n, V_draft] logits: the target's LM head (EAGLE-1/2) or the head's own (EAGLE-3)."""
        if self.c.kind == "eagle":
            return target_head(hidden)
        return self.lm_head(self.norm(hidden))

    def to_target_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Target token ids of draft-vocabulary ids."""
        return ids if self.c.kind == "eagle" else ids + self.d2t[ids]


def save_head(head: EagleHead, directory: Path, extra: dict | None = None) -> Path:
    """``config.json`` and ``model.safetensors`` in the reference's layout (plus ``extra`` in the config)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({**head.c.to_json(), **(extra or {})}, indent=2))
    state = {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}
    save_file(state, str(directory / "model.safetensors"))
    return directory


def read_state(directory: Path) -> dict[str, torch.Tensor]:
    for name in WEIGHT_FILES:
        path = directory / name
        if path.is_file():
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return load_file(str(path))
            return torch.load(path, map_location="cpu", weights_only=True)
    raise ConfigError(f"eagle head: no {' or '.join(WEIGHT_FILES)} in {directory}")


def param_count(head: nn.Module) -> int:
    return sum(p.numel() for p in head.parameters())
