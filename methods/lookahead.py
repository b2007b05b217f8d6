"""Lookahead decoding (Fu et al. 2024): a Jacobi window and an n-gram pool in one forward.

Each step verifies the pool's n-grams for the root and, in the same forward,
runs one Jacobi iteration of a 2-D window held as auxiliary nodes. The window
and pool live in :mod:`specbench.lookahead_window` (shared with ``lookahead_rest``).

Window layout (the official implementation's; offsets from the root, root = 0).
The window has C columns and up to N - 1 levels (W = window, N = ngram):

* level 0 holds C - 1 tokens, ``a[0][k]`` at offset ``k + 1``. With the root it
  is the first level: column ``i``'s *key* is the root (i = 0) or ``a[0][i - 1]``;
* level l >= 1 holds C tokens, ``a[l][i]`` at offset ``i + l``;
* besides the prefix and the root (always visible), ``a[0][k]`` sees
  ``a[0][:k]`` (causal first level) and ``a[l][i]`` sees ``a[0][:i]`` (the first
  level up to its key) and ``a[1:l][i]`` (its column in earlier levels). So every
  window token sees a chain at consecutive offsets 1 .. its own, and column i is
  the chain key_i, a[1][i], ..., a[N-2][i];
* guesses see only the prefix, the root and their ancestors; the window never
  sees a guess (the core's rule for auxiliary nodes).

Window schedule (``advance_window``). ``start`` draws level 0 (W + N - 3 tokens,
so C = W + N - 2) from the prompt with ``random.Random(seed)``. The argmax of the
top level's logits is the Jacobi update: it predicts one offset further, i.e.
the next level. For the first N - 2 steps (fill) that level is stacked on top and
every level drops its first column; no n-grams are harvested (the pool is empty,
so there are no guesses either). Then (steady: N - 1 levels, W columns) column i
yields the n-gram ``(key_i, a[1][i], ..., a[N-2][i], new[i])`` and the levels
move down: ``a[0] = a[1][1:]``, ``a[l] = a[l + 1]``, top = new. Either way the
window advances by exactly one position per step, whatever the number of
accepted tokens (the reference's default ``ALWAYS_FWD_ONE``): after k > 1
accepted tokens its offsets lag by k - 1 positions. Columns stay chains the
model produced, conditioned on a slightly older context, and the following
iterations re-align; nothing else is done about it. As in the reference, an EOS
in the new level is replaced by a prompt token (when the tokenizer names one).

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

from specbench.draft import SOURCE_POOL, DecodeState, Draft, Drafter, VerifyResult
from specbench.lookahead_window import LookaheadEngine
from specbench.registry import register_method


@dataclass
class LookaheadConfig:
    window: int = 15  # W: columns of the Jacobi window
    ngram: int = 5  # N: n-gram size; the window keeps N - 1 levels, guesses have N - 1 tokens
    guesses: int = 15  # G: n-grams kept per key in the pool = guesses verified per step
    pool_from_prompt: bool = False  # also pool the n-grams of the prompt and of the output

    def validate(self) -> None:
        if self.window < 1:
            raise ValueError(f"lookahead.window must be >= 1, got {self.window}")
        if self.ngram < 3:
            raise ValueError(f"lookahead.ngram must be >= 3 (the reference needs 2 levels), got {self.ngram}")
        if self.guesses < 1:
            raise ValueError(f"lookahead.guesses must be >= 1, got {self.guesses}")


@register_method
class Lookahead(Drafter):
    name = "lookahead"
    Config = LookaheadConfig

    def __init__(
        self, config: LookaheadConfig | None = None, *, vocab_size: int, seed: int = 0, tokenizer=None
    ):
        config = config or LookaheadConfig()
        config.validate()
        super().__init__(config, vocab_size=vocab_size, seed=seed, tokenizer=tokenizer)
        c = config
        eos = getattr(tokenizer, "eos_token_id", None)
        self.engine = LookaheadEngine(c.window, c.ngram, c.guesses, c.pool_from_prompt, seed, eos)

    # The window and the pool, for inspection (tests set the pool directly).
    levels = property(lambda self: self.engine.levels)
    pool = property(lambda self: self.engine.pool, lambda self, p: setattr(self.engine, "pool", p))

    def start(self, prompt_ids: list[int]) -> None:
        self.engine.start(prompt_ids)

    def propose(self, state: DecodeState) -> Draft:
        seqs = self.engine.pool_guesses(state.tokens, state.max_depth)
        return self.engine.attach_window(Draft.from_sequences(seqs, [SOURCE_POOL] * len(seqs)))

    def update(self, result: VerifyResult) -> None:
        self.engine.update(result.aux_logits)  # rows = the top level (draft.aux_logit_rows)
