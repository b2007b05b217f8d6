"""SPECTRA-CORE (Le, Do, Nguyen 2025): internal speculation from two n-gram dictionaries.

State (see :mod:`specbench.ngram_dicts`): a forward dictionary S_fwd (token →
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
   :meth:`start`); when ``r < coverage_threshold`` (τ) the most probable token
   that is not yet a key of S_fwd (over the whole vocabulary; the argmax if
   every token is a key), else the argmax. **Reading**: τ is the probability
   of the coverage branch (ε-greedy exploration), so the paper's τ = 0.1
   explores 10% of the time. The paper's garbled text, taken literally
   ("r > τ"), explores 90% of the time: that is ``coverage_threshold: 0.9``
   here. On SmolLM2 (bf16, 2 MT-Bench prompts, 200 tokens) the literal
   reading cut τ (tokens per step) from 2.19 to 1.18 at the paper budget and
   from 1.82 to 1.15 at W=5, N=4, G=5; ``coverage: false`` (plain argmax) gave
   2.33 and 1.92. The rule reads the keys S_fwd had before this step's updates.
4. Every completed sequence c_0..c_{N-1} updates both dictionaries (with or
   without sub-n-grams), then every sequence shifts left by one.

Reading choices: the pool starts with tokens drawn uniformly with replacement
from the prompt. The paper feeds the dictionaries from the pool only
(``context_ngrams: false``, the default); ``context_ngrams: true`` also inserts
every window of N tokens of the prompt (at start) and of the committed output
(as it grows), like a pool sequence. Dictionaries and pool are reset at every
:meth:`start` (each sample and turn), so a generation does not depend on the
ones before it. With ``use_forward_dict: false`` S_fwd is still kept (the
coverage rule reads its keys) but proposes nothing. Guesses are not cut to the
remaining token budget: the core truncates at ``max_new_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass

from specbench.draft import DecodeState, Draft, Drafter, VerifyResult
from specbench.registry import register_method
from specbench.spectra_engine import CoreSettings, SpectraCoreEngine


@dataclass
class SpectraCoreConfig(CoreSettings):
    """The engine's settings (:class:`specbench.spectra_engine.CoreSettings`), nothing more."""


@register_method
class SpectraCore(Drafter):
    name = "spectra_core"
    Config = SpectraCoreConfig

    def __init__(self, config=None, *, vocab_size: int, seed: int = 0, tokenizer=None) -> None:
        config = config or SpectraCoreConfig()
        config.validate()
        super().__init__(config, vocab_size=vocab_size, seed=seed, tokenizer=tokenizer)
        self.engine = SpectraCoreEngine(config, seed)
        self.dicts, self.pool = self.engine.dicts, self.engine.pool

    def start(self, prompt_ids: list[int]) -> None:
        self.engine.start(prompt_ids)

    def guesses(self, tokens: list[int]) -> tuple[list[list[int]], list[str]]:
        """The step's guess sequences and their sources, in priority order, at most G."""
        return self.engine.guesses(tokens)

    def propose(self, state: DecodeState) -> Draft:
        self.engine.learn_context(state.tokens)
        return self.engine.attach_pool(Draft.from_sequences(*self.engine.guesses(state.tokens)))

    def update(self, result: VerifyResult) -> None:
        self.engine.update(result.aux_logits)
