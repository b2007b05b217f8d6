"""A second language model for drafting: a separate small model, or the target with layers skipped.

:class:`DraftLM` runs a causal LM's own parts (embedding, rotary embedding,
a chosen list of decoder layers, final norm, LM head) with a KV cache of its
own. With every layer it is the model itself; with some layers left out it is
a *self-draft*: the target's first ``k`` layers, or the target without a set
of skipped layers (layer-skipping self-speculation keeps early and late
layers). The weights are the target's, shared, never copied or patched; the
skipped layers' cache slots simply stay empty.

A draft whose vocabulary is shorter than the target's (same tokenizer, a
smaller embedding) gets ``q`` padded with zeros up to the target's vocabulary,
and reads a committed token it has no embedding for as token 0 (such tokens
are unused or special ids; only the draft's guesses can suffer). A longer one
has its logits cut to the target's vocabulary before ``q`` is formed.

The draft's cache follows the committed tokens: before each proposal it is
cropped to the longest prefix it shares with them (rejected drafted tokens go)
and the tokens committed since are fed in one forward.

:class:`ModelDrafter` is the drafter both draft-model methods share (``sps``
with a fixed length, ``specdec_pp`` with a learned stopping rule). It
proposes one *chain* per step: tokens drawn from ``q``, the draft's
distribution shaped by the run's temperature / top-k / top-p exactly as the
target's ``p`` is, with ``q`` sent along as ``draft_probs`` so verification
accepts with ``min(1, p/q)``. Chains, not trees: siblings drawn i.i.d. from
``q`` would need the multi-draft rule and must never be merged as one guess.
Greedy drafting takes the draft's argmax and sends no ``q`` (the one-hot case).

Under ``budget=auto`` the chain is cut where it stops paying: each drafted
token costs a draft forward, measured in the drafter's own seconds, and the
planner's depth cap (``DecodeState.max_depth``) bounds the chain before it is
drafted (nothing at all when drafting does not pay); the verified chain may be
trimmed further to the prefix whose expected tokens pay for the target's
wider forward (``draft_probs`` rows follow the kept tokens).
"""

from __future__ import annotations

import copy
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import DynamicCache

from specbench.core.acceptance import SamplingParams, sample, target_probs
from specbench.core.draft import SOURCE_MODEL, DecodeState, Draft, Drafter, DrafterContext
from specbench.core.forward import Target, cache_kwarg, upload
from specbench.errors import ConfigError
from specbench.models import model_config_check, model_preset

SELF = "self"


@dataclass
class DraftModelSettings:
    """Which draft: ``draft_model`` names a model preset (``conf/model/``) or ``self``.

    For ``self``, ``self_first_layers`` keeps the target's first k layers; when
    it is null, ``self_skip_layers`` lists the layers to leave out. The default
    skips SmolLM2's layers 12-15 (of 30), the best of the choices measured
    (README, "Draft-model methods").
    """

    draft_model: str = SELF
    self_first_layers: int | None = None
    self_skip_layers: list[int] | None = field(default_factory=lambda: [12, 13, 14, 15])

    def validate(self) -> None:
        if self.draft_model == SELF:
            if self.self_first_layers is None and self.self_skip_layers is None:
                raise ValueError("self-draft: set self_first_layers or self_skip_layers")
            if self.self_first_layers is not None and self.self_first_layers < 1:
                raise ValueError(f"self-draft: self_first_layers must be >= 1, got {self.self_first_layers}")
            if self.self_skip_layers is not None and any(i < 0 for i in self.self_skip_layers):
                raise ValueError(f"self-draft: self_skip_layers must be layer indices >= 0, got {self.self_skip_layers}")

    def identity(self) -> str:
        """A file-name-safe name of the draft (trained heads are kept per target × draft)."""
        if self.draft_model != SELF:
            return self.draft_model
        if self.self_first_layers is not None:
            return f"self-first{self.self_first_layers}"
        return "self-skip" + "-".join(str(i) for i in sorted(set(self.self_skip_layers)))

    def preflight(self) -> None:
        """An unknown or malformed draft model preset fails here, before any model loads."""
        if self.draft_model != SELF:
            model_config_check(model_preset(self.draft_model))

    def kept_layers(self, n_layers: int) -> list[int]:
        if self.self_first_layers is not None:
            if self.self_first_layers > n_layers:
                raise ConfigError(
                    f"self-draft keeps {self.self_first_layers} layers but the target has {n_layers}: "
                    f"set method.self_first_layers to at most {n_layers}"
                )
            return list(range(self.self_first_layers))
        bad = [i for i in self.self_skip_layers if i >= n_layers]
        if bad:
            raise ConfigError(f"self-draft: skipped layers {bad} do not exist (the target has {n_layers} layers)")
        kept = [i for i in range(n_layers) if i not in set(self.self_skip_layers)]
        if not kept:
            raise ConfigError("self-draft: self_skip_layers skips every layer: keep at least one")
        return kept


class DraftLM:
    """A causal LM run part by part over ``layers`` with its own KV cache (batch size 1)."""

    def __init__(self, model: torch.nn.Module, layers: list[int] | None = None, vocab_size: int | None = None):
        self.model = model
        self.base = model.base_model
        self.head = model.get_output_embeddings()
        n_layers = len(self.base.layers)
        self.layers = list(range(n_layers)) if layers is None else list(layers)
        self.shape = Target(model)  # for its masks (sliding windows included) and device
        self.hidden_device = self.base.norm.weight.device  # where the last hidden states come out (a sharded
        # model's last GPU): heads that read them go there
        config = self.shape.model.config
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.softcap = getattr(config, "final_logit_softcapping", None)
        self.draft_vocab = self.head.weight.shape[0]
        self.embed_size = self.base.embed_tokens.weight.shape[0]
        self.vocab_size = vocab_size or self.draft_vocab  # the target's: q is padded (or cut) to it
        self.cache = DynamicCache()
        self.tokens: list[int] = []  # the tokens whose keys and values the cache holds

    def reset(self) -> None:
        self.cache = DynamicCache()
        self.tokens = []

    def forward(self, ids: list[int], every_position: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed ``ids`` after the cached tokens; return the logits and last hidden state of the last
        one (``[vocab]``, ``[hidden]``), or of every one (``[q, vocab]``, ``[q, hidden]``)."""
        past, q = len(self.tokens), len(ids)
        device = self.shape.device
        ids_t = upload([ids], device)
        if max(ids) >= self.embed_size:  # a target token the draft has no embedding for: read as token 0
            ids_t = ids_t.masked_fill(ids_t >= self.embed_size, 0)
        hidden = self.base.embed_tokens(ids_t)
        positions = torch.arange(past, past + q, device=device)[None]
        mask = None
        if q > 1 or self.shape.has_sliding:
            mask = self.shape._mask(np.tril(np.ones((q, q), dtype=bool)), np.arange(q), past)
        types = self.shape.layer_types
        if types:
            rope = {t: self.base.rotary_emb(hidden, positions, t) for t in set(types)}
        else:
            rope = self.base.rotary_emb(hidden, positions)
        for i in self.layers:
            kind = types[i] if types else None
            out = self.base.layers[i](
                hidden,
                attention_mask=mask[kind] if isinstance(mask, dict) else mask,
                position_embeddings=rope[kind] if types else rope,
                position_ids=positions,
                **{cache_kwarg(self.base.layers[i]): self.cache},
                use_cache=True,
            )
            hidden = out[0] if isinstance(out, tuple) else out
        hidden = self.base.norm(hidden[0] if every_position else hidden[0, -1])
        logits = self.head(hidden).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        self.tokens.extend(ids)
        return logits, hidden

    def catch_up(self, committed: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Keep the cache's longest common prefix with ``committed``, feed the rest (at least its last token)."""
        n = min(len(self.tokens), len(committed) - 1)
        same = next((i for i in range(n) if self.tokens[i] != committed[i]), n)
        if same < len(self.tokens):
            self.cache.crop(same - len(self.tokens))
            del self.tokens[same:]
        return self.forward(committed[same:])

    def q(self, logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
        """The draft distribution over the target's vocabulary (zeros past a shorter draft vocabulary)."""
        logits = logits[: self.vocab_size]
        probs = target_probs(logits, params)
        return F.pad(probs, (0, self.vocab_size - probs.shape[-1])) if probs.shape[-1] < self.vocab_size else probs


def same_tokenizer(a: Any, b: Any) -> bool:
    return a is b or (a is not None and b is not None and a.get_vocab() == b.get_vocab())


def build_draft_lm(settings: DraftModelSettings, context: DrafterContext, tokenizer: Any, vocab_size: int) -> DraftLM:
    """The draft the settings name: the target with layers skipped, or a model preset loaded beside it."""
    if settings.draft_model == SELF:
        if context.target_model is None:
            raise ConfigError("self-draft needs the target model in the drafter context (DrafterContext.target_model)")
        n_layers = len(context.target_model.base_model.layers)
        return DraftLM(context.target_model, settings.kept_layers(n_layers), vocab_size)
    if context.load_model is None:
        raise ConfigError(f"draft model '{settings.draft_model}' needs a model loader in the drafter context")
    loaded = context.load_model(settings.draft_model)
    if not same_tokenizer(loaded.tokenizer, tokenizer):
        raise ConfigError(
            f"draft model '{settings.draft_model}' does not share the target's tokenizer "
            f"({len(loaded.tokenizer.get_vocab())} vs {len(tokenizer.get_vocab()) if tokenizer else '?'} entries): "
            "pick a draft of the target's family (same tokenizer), or method.draft_model=self"
        )
    return DraftLM(loaded.model, None, vocab_size)


@dataclass
class DraftChain:
    tokens: list[int] = field(default_factory=list)
    q_rows: list[torch.Tensor] = field(default_factory=list)


class ModelDrafter(Drafter):
    """Propose a chain drawn from a draft model; subclasses decide its length (:meth:`keep_drafting`)."""

    @classmethod
    def host_reads(cls, config: Any, drafted: int) -> int:
        return drafted  # each drafted token read as it is chosen

    @classmethod
    def extra_params(cls, config: Any, shape: Any) -> int:
        """A draft model's weights beside the target (a batch's memory check; a self-draft shares the target's)."""
        if config.draft_model == SELF:
            return 0
        return int(float(model_preset(config.draft_model).get("params_b") or 0) * 1e9)

    def __init__(self, config: Any = None, **kwargs) -> None:
        super().__init__(config, **kwargs)
        self.lm = build_draft_lm(self.config, self.context, self.tokenizer, self.vocab_size)
        self.params = self.context.sampling or SamplingParams()
        self.generator = torch.Generator()

    def spawn(self) -> ModelDrafter:
        """Another request's drafter: the same draft model (shared weights), its own cache and sampling stream."""
        twin = copy.copy(self)
        twin.lm = copy.copy(self.lm)
        twin.lm.reset()
        twin.generator = torch.Generator()
        return twin

    def start(self, prompt_ids: list[int]) -> None:
        self.lm.reset()
        self.generator.manual_seed(self.seed * 1_000_003 + zlib.crc32(np.asarray(prompt_ids, np.int64).tobytes()))
        self.begin_chain()

    def max_length(self) -> int:
        """How many tokens a chain may draft: every subclass says (sps: a fixed K; specdec_pp: its hard cap,
        the acceptance head stopping earlier). Abstract hook, not a gap."""
        raise NotImplementedError

    def begin_chain(self) -> None:
        """A new chain starts (per-chain state of the stopping rule)."""

    def keep_drafting(self, hidden: torch.Tensor) -> bool:
        """After a drafted token was fed (``hidden`` is its last hidden state): draft another?"""
        return True

    needs_last_hidden = False  # feed the chain's last token too (a stopping rule reads its hidden state)

    def propose(self, state: DecodeState) -> Draft | None:
        depth = min(self.max_length(), state.max_depth)
        if depth < 1:
            return None
        logits, _ = self.lm.catch_up(state.tokens)
        self.begin_chain()
        chain = DraftChain()
        greedy = self.params.greedy
        while True:
            if greedy:
                token = int(logits[: self.lm.vocab_size].argmax())
            else:
                q = self.lm.q(logits, self.params)
                token = sample(q, self.generator)
                chain.q_rows.append(q)
            chain.tokens.append(token)
            last = len(chain.tokens) == depth
            if last and not self.needs_last_hidden:
                break
            logits, hidden = self.lm.forward([token])
            if last or not self.keep_drafting(hidden):
                break
        probs = None if greedy else torch.stack(chain.q_rows)
        return Draft.chain(chain.tokens, SOURCE_MODEL, draft_probs=probs)
