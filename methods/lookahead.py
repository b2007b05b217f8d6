"""Lookahead decoding (Fu et al. 2024): a Jacobi window and an n-gram pool in one forward.

Each step verifies the pool's n-grams for the root and, in the same forward,
runs one Jacobi iteration of a 2-D window held as auxiliary nodes. The window
and pool live in :mod:`specbench.drafting.lookahead_window` (shared with ``lookahead_rest``).

Window layout (the official implementation's) and schedule: see
:mod:`specbench.drafting.lookahead_window`. The window advances by one position per
step whatever the number of accepted tokens (the reference's ``ALWAYS_FWD_ONE``);
an EOS in the new level is replaced by a prompt token, as in the reference.

Pool (``NgramPool``): key token -> at most G sequences of N - 1 tokens, LRU: an
n-gram harvested again moves to the newest end, a new one beyond G evicts the
least recently harvested. The root's entries are verified oldest first (the
reference's order) as a trie (shared prefixes merge), cut to the tokens the
generation may still take. Pool and window are per generation (``start`` resets
both), as in the reference. ``pool_from_prompt`` (the reference's
``POOL_FROM_PROMPT``, off by default there and here) also puts every n-gram of
the prompt and of the committed output into the pool, in text order.
"""

from __future__ import annotations

from dataclasses import dataclass

from methods.registry import register_method
from specbench.core.draft import (
    SOURCE_POOL,
    DecodeState,
    Draft,
    Drafter,
    ScopedMemory,
    VerifyResult,
    check_memory,
)
from specbench.drafting.lookahead_window import LookaheadEngine


@dataclass
class LookaheadConfig:
    window: int = 15  # W: columns of the Jacobi window
    ngram: int = 5  # N: n-gram size; the window keeps N - 1 levels, guesses have N - 1 tokens
    guesses: int = 15  # G: n-grams kept per key in the pool = guesses verified per step
    pool_from_prompt: bool = False  # also pool the n-grams of the prompt and of the output
    memory: str = "turn"  # how long the n-gram pool lives: turn (the paper) | sample | run

    def validate(self) -> None:
        if self.window < 1:
            raise ValueError(f"lookahead.window must be >= 1, got {self.window}")
        if self.ngram < 3:
            raise ValueError(f"lookahead.ngram must be >= 3 (the reference needs 2 levels), got {self.ngram}")
        if self.guesses < 1:
            raise ValueError(f"lookahead.guesses must be >= 1, got {self.guesses}")
        check_memory("lookahead", self.memory)


@register_method
class Lookahead(ScopedMemory, Drafter):
    name = "lookahead"
    HOST_READS = 1  # the auxiliary nodes' logits, read once
    Config = LookaheadConfig
    AUX_FEEDS = (SOURCE_POOL,)  # the Jacobi window harvests the pool's n-grams
    RUN_STATE = ("engine.pool",)  # memory: run, at batch size > 1: one n-gram pool for every request

    def __init__(self, config: LookaheadConfig | None = None, **kwargs) -> None:
        super().__init__(config, **kwargs)
        c = self.config
        eos = getattr(self.tokenizer, "eos_token_id", None)
        self.engine = LookaheadEngine(c.window, c.ngram, c.guesses, c.pool_from_prompt, self.seed, eos)

    # The window and the pool, for inspection (tests set the pool directly).
    levels = property(lambda self: self.engine.levels)
    pool = property(lambda self: self.engine.pool, lambda self, p: setattr(self.engine, "pool", p))

    def forget(self) -> None:
        self.engine.forget()

    def start(self, prompt_ids: list[int]) -> None:
        self.engine.start(prompt_ids, keep=True)

    def propose(self, state: DecodeState) -> Draft:
        seqs = self.engine.pool_guesses(state.tokens, state.max_depth)
        return self.engine.attach_window(Draft.from_sequences(seqs, [SOURCE_POOL] * len(seqs)))

    def update(self, result: VerifyResult) -> None:
        self.engine.update(result.aux_logits)  # rows = the top level (draft.aux_logit_rows)
