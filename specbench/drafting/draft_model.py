"""A second language model for drafting: a separate small model, or the target with layers skipped.

The draft itself, :class:`~specbench.drafting.draft_lm.DraftLM`, keeps its KV entries in a slot of a cache it
shares with the other requests' drafts, so a batch drafts in lockstep (:meth:`ModelDrafter.propose_rows`: one
draft forward and one read per drafted position for every row).

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

from specbench.core.acceptance import SamplingParams, sample_rows
from specbench.core.draft import SOURCE_MODEL, DecodeState, Draft, Drafter, DrafterContext
from specbench.core.forward import upload
from specbench.drafting.draft_lm import DraftLM
from specbench.errors import ConfigError
from specbench.models import model_config_check, model_preset

SELF = "self"


@dataclass
class DraftModelSettings:
    """Which draft: ``draft_model`` names a model preset (``conf/model/``) or ``self``.

    For ``self``, ``self_first_layers`` keeps the target's first k layers; when
    it is null, ``self_skip_layers`` lists the layers to leave out. The default
    skips SmolLM2's layers 12-15 (of 30), the best of the choices measured
    (docs/methods.md, "Draft-model methods").
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


def same_tokenizer(a: Any, b: Any) -> bool:
    return a is b or (a is not None and b is not None and a.get_vocab() == b.get_vocab())


def build_draft_lm(settings: DraftModelSettings, context: DrafterContext, tokenizer: Any, vocab_size: int) -> DraftLM:
    """The draft the settings name: the target with layers skipped, or a model preset loaded beside it."""
    if settings.draft_model == SELF:
        if context.target_model is None:
            raise ConfigError("self-draft needs the target model in the drafter context (DrafterContext.target_model)")
        n_layers = len(context.target_model.base_model.layers)
        return DraftLM(context.target_model, settings.kept_layers(n_layers), vocab_size, graphs=context.graphs)
    if context.load_model is None:
        raise ConfigError(f"draft model '{settings.draft_model}' needs a model loader in the drafter context")
    loaded = context.load_model(settings.draft_model)
    if not same_tokenizer(loaded.tokenizer, tokenizer):
        raise ConfigError(
            f"draft model '{settings.draft_model}' does not share the target's tokenizer "
            f"({len(loaded.tokenizer.get_vocab())} vs {len(tokenizer.get_vocab()) if tokenizer else '?'} entries): "
            "pick a draft of the target's family (same tokenizer), or method.draft_model=self"
        )
    return DraftLM(loaded.model, None, vocab_size, graphs=context.graphs)


@dataclass
class DraftChain:
    tokens: list[int] = field(default_factory=list)
    q_rows: list[torch.Tensor] = field(default_factory=list)


class ModelDrafter(Drafter):
    """Propose a chain drawn from a draft model; subclasses decide its length (:meth:`keep_drafting`)."""

    catches_up = True  # the draft model reads every token committed while it did not draft

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
        twin.lm = self.lm.twin()
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
        """After a drafted token was fed (``hidden`` is its last hidden state): draft another? (A rule that
        stops early sets :attr:`needs_last_hidden`: without it, a greedy chain under graphs is drafted whole.)"""
        return True

    needs_last_hidden = False  # feed the chain's last token too (a stopping rule reads its hidden state)

    def keep_drafting_rows(self, drafters: list[ModelDrafter], hidden: torch.Tensor) -> list[bool]:
        """:meth:`keep_drafting` of several drafters, ``hidden`` their rows (a stopping rule may read them at once)."""
        return [d.keep_drafting(h) for d, h in zip(drafters, hidden, strict=True)]

    def propose(self, state: DecodeState) -> Draft | None:
        return self.propose_rows([self], [state])[0]

    @staticmethod
    def propose_rows(drafters: list[ModelDrafter], states: list[DecodeState]) -> list[Draft | None]:
        """The chains of several requests (a batch) drafting with one draft model, drafted in lockstep: the
        tokens committed since each last drafted in one forward, then one draft forward and one read per drafted
        position for every row still drafting. A row drafts what it would alone (its own sampling stream)."""
        out: list[Draft | None] = [None] * len(drafters)
        rows = [(i, d, min(d.max_length(), s.max_depth)) for i, (d, s) in enumerate(zip(drafters, states,
                                                                                     strict=True))]
        rows = [row for row in rows if row[2] >= 1]
        if not rows:
            return out
        first = rows[0][1]
        logits, _ = DraftLM.catch_up_rows([d.lm for _, d, _ in rows], [states[i].tokens for i, _, _ in rows])
        if len(rows) == 1 and first.lm.graphed is not None and first.params.greedy and not first.needs_last_hidden:
            (i, d, length), = rows  # under graphs, alone and greedy: the chain drafted on the device, read once
            tokens = d.lm.graphed.chain(d.lm.rows.cache, logits, length, d.lm.vocab_size)
            d.lm.tokens.extend(tokens[:-1])  # the last one chosen, not fed
            out[i] = Draft.chain(tokens, SOURCE_MODEL)
            return out
        chains = [DraftChain() for _ in rows]
        for _, d, _ in rows:
            d.begin_chain()
        live = list(range(len(rows)))  # rows still drafting; ``logits`` holds theirs, in this order
        greedy, params = first.params.greedy, first.params
        while live:
            if greedy:
                tokens = logits[:, : first.lm.vocab_size].argmax(-1).tolist()
            else:
                q = first.lm.q(logits, params)
                tokens = sample_rows(q, [rows[j][1].generator for j in live])  # each row's own stream
                for k, j in enumerate(live):
                    chains[j].q_rows.append(q[k])
            for j, token in zip(live, tokens, strict=True):
                chains[j].tokens.append(token)
            fed = [j for j in live if len(chains[j].tokens) < rows[j][2] or first.needs_last_hidden]
            if not fed:
                break
            at = {j: k for k, j in enumerate(live)}
            logits, hidden = DraftLM.feed([rows[j][1].lm for j in fed], [[tokens[at[j]]] for j in fed])
            more = [k for k, j in enumerate(fed) if len(chains[j].tokens) < rows[j][2]]
            if len(more) < len(fed):
                index = upload(more, logits.device, torch.int64)
                logits, hidden = logits.index_select(0, index), hidden.index_select(0, index)
            go = first.keep_drafting_rows([rows[fed[k]][1] for k in more], hidden) if more else []
            keep = [k for k, ok in enumerate(go) if ok]
            live = [fed[more[k]] for k in keep]
            if len(keep) < len(more):
                logits = logits.index_select(0, upload(keep, logits.device, torch.int64))
        for (i, _, _), chain in zip(rows, chains, strict=True):
            probs = None if greedy else torch.stack(chain.q_rows)
            out[i] = Draft.chain(chain.tokens, SOURCE_MODEL, draft_probs=probs)
        return out
