"""SPECTRA-CORE (Le, Do, Nguyen 2025): internal speculation from two n-gram dictionaries.

State (see :mod:`specbench.drafting.ngram_dicts`): a forward dictionary S_fwd (token →
continuations), a backward dictionary S_bwd (tokens → next token) and a
candidate pool of W sequences of N−1 tokens, decoded as auxiliary nodes in the
same forward as the guesses. Each step:

1. Guesses (priority order = sibling order for sampling): first the backward
   guess (up to N tokens, built from S_bwd with the longest context first,
   source ``bwd_dict``), then S_fwd[last token], most recent first (source
   ``fwd_dict``; a continuation equal to the backward guess is skipped); the
   list is cut to ``max_guesses`` (G) and shared prefixes merge into a tree.
   The backward guess goes first because S_bwd "favours quality" and because a
   full S_fwd list (G entries) would otherwise always push it out.
2. The core verifies the guesses; the logits of each pool sequence's last
   token (``aux_logit_rows``: the output layer runs on those W rows only)
   come back in ``aux_logits``.
3. Each pool sequence gets its next token by the coverage rule: r ~ U(0,1)
   from the drafter's own ``random.Random(seed)`` (reseeded at every
   :meth:`start`); on the exploring branch the most probable token not yet
   "present in S_fwd", else the argmax. ``coverage_reading`` says how the
   paper's rule is read (τ = ``coverage_threshold`` in all three):

   * ``epsilon``: explore when r < τ; present = a key of S_fwd (ε-greedy:
     the paper's τ = 0.1 explores 10% of the time);
   * ``literal_key``: explore when r > τ, the paper's stated direction (90%
     of the time); present = a key of S_fwd;
   * ``literal_ngram`` (the presets): explore when r > τ; present = the
     n-gram the token would complete (the pool sequence + the token) is
     already stored under its first token in S_fwd. Only a sequence whose
     argmax completes an n-gram S_fwd already holds takes its next best.

   **Choice.** The paper states r > τ three times, and its τ (tokens per
   step) ≈ 4 on Llama-2-7B says the rule cannot be costing much acceptance.
   ``literal_key`` replaces the argmax by a token that has never started an
   S_fwd entry in 90% of the rows: the pool stops following the model and
   τ drops (bench/README.md). ``literal_ngram`` keeps r > τ and costs nothing
   where the model's top continuation is new; it diversifies exactly where
   the argmax would only re-insert an n-gram already stored, which is the
   reading of "coverage" that is consistent with both. The rule reads S_fwd
   as it was before this step's updates.

   How much each reading costs in τ is measured in docs/measurements/methods.md ("coverage readings").

4. Every completed sequence c_0..c_{N-1} updates both dictionaries (with or
   without sub-n-grams), then every sequence shifts left by one.

Reading choices: the pool starts with tokens drawn uniformly with replacement
from the prompt. The paper feeds the dictionaries from the pool only
(``context_ngrams: false``, the default); ``context_ngrams: true`` also inserts
every window of N tokens of the prompt (at start) and of the committed output
(as it grows), like a pool sequence; ``context_ngrams: auto`` (the paper
presets) does so only under ``budget=auto``, which may leave the pool out. The pool is drawn anew at every
:meth:`start`; the dictionaries are emptied there too (``memory: turn``, the
paper's behaviour) or kept across a sample's turns (``sample``) or the run
(``run``). With ``use_forward_dict: false`` S_fwd is still kept (the
coverage rule reads it) but proposes nothing. Guesses are not cut to the
remaining token budget: the core truncates at ``max_new_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass

from methods.registry import register_method
from specbench.core.draft import (
    SOURCE_BWD,
    SOURCE_FWD,
    DecodeState,
    Draft,
    Drafter,
    ScopedMemory,
    VerifyResult,
)
from specbench.drafting.spectra_engine import CoreSettings, SpectraCoreEngine


@dataclass
class SpectraCoreConfig(CoreSettings):
    """The engine's settings (:class:`specbench.drafting.spectra_engine.CoreSettings`), nothing more."""


@register_method
class SpectraCore(ScopedMemory, Drafter):
    name = "spectra_core"
    HOST_READS = 1  # the auxiliary nodes' logits, read once
    Config = SpectraCoreConfig
    AUX_FEEDS = (SOURCE_FWD, SOURCE_BWD)  # the candidate pool fills both dictionaries
    RUN_STATE = ("engine.dicts", "dicts")  # memory: run, at batch size > 1: one pair for every request

    def __init__(self, config: SpectraCoreConfig | None = None, **kwargs) -> None:
        super().__init__(config, **kwargs)
        self.engine = SpectraCoreEngine(self.config, self.seed)
        self.dicts, self.pool = self.engine.dicts, self.engine.pool

    def forget(self) -> None:
        self.engine.forget()

    def start(self, prompt_ids: list[int]) -> None:
        self.engine.start(prompt_ids, keep=True)

    def guesses(self, tokens: list[int]) -> tuple[list[list[int]], list[str]]:
        """The step's guess sequences and their sources, in priority order, at most G."""
        return self.engine.guesses(tokens)

    def propose(self, state: DecodeState) -> Draft | None:
        if state.max_depth < 1:  # budget=auto: nothing worth drafting (the context is learned when it drafts again)
            return None
        self.engine.learn_context(state.tokens)
        return self.engine.attach_pool(Draft.from_sequences(*self.engine.guesses(state.tokens)).cut(state.max_depth))

    def update(self, result: VerifyResult) -> None:
        self.engine.update(result.aux_logits)
