"""Lookahead decoding's pure parts: the Jacobi window's layout and schedule, and the n-gram pool.

No model and no cache, so that ``lookahead`` and ``lookahead_rest`` share them
and they are tested with hand-worked answers.

Window layout (the official implementation's; offsets from the root, root = 0).
The window has C columns and up to N - 1 levels (W = window, N = ngram):

* level 0 holds C - 1 tokens, ``a[0][k]`` at offset ``k + 1``. With the root it
  is the first level: column ``i``'s *key* is the root (i = 0) or ``a[0][i - 1]``;
* level l >= 1 holds C tokens, ``a[l][i]`` at offset ``i + l``;
* besides the prefix and the root (always visible), ``a[0][k]`` sees
  ``a[0][:k]`` (causal first level) and ``a[l][i]`` sees ``a[0][:i]`` (the first
  level up to its key) and ``a[1:l][i]`` (its column in earlier levels). So every
  window token sees a chain at consecutive offsets 1 .. its own, and column i is
  the chain ``key_i, a[1][i], ..., a[N-2][i]``;
* guesses see only the prefix, the root and their ancestors; the window never
  sees a guess (the core's rule for auxiliary nodes).

Window schedule (``advance_window``). A method's ``start`` draws level 0 (W + N - 3 tokens,
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
least recently harvested.
"""

from __future__ import annotations

import random
from functools import lru_cache

import numpy as np


@lru_cache(maxsize=64)
def window_layout(columns: int, levels: int) -> tuple[np.ndarray, tuple[int, ...]]:
    """Visibility (bool [m, m], self included, read-only) and offsets of a window in aux order.

    Aux order: level 0 (``columns - 1`` tokens), then levels 1 .. ``levels - 1``
    (``columns`` tokens each), column by column.
    """
    first = columns - 1
    m = first + (levels - 1) * columns
    vis = np.zeros((m, m), dtype=bool)
    offsets = list(range(1, first + 1))
    vis[:first, :first] = np.tril(np.ones((first, first), dtype=bool))
    for lv in range(1, levels):
        for i in range(columns):
            row = first + (lv - 1) * columns + i
            vis[row, :i] = True  # the first level up to this column's key
            vis[row, [first + (k - 1) * columns + i for k in range(1, lv + 1)]] = True  # its column, itself
            offsets.append(i + lv)
    vis.flags.writeable = False
    return vis, tuple(offsets)


def harvest(levels: list[list[int]], root: int, new: list[int]) -> list[tuple[int, tuple[int, ...]]]:
    """The steady window's n-grams: (key, the N - 1 tokens after it) for each column."""
    keys = [root] + levels[0]
    return [(keys[i], tuple(lv[i] for lv in levels[1:]) + (new[i],)) for i in range(len(new))]


def advance_window(levels: list[list[int]], new: list[int], ngram: int) -> list[list[int]]:
    """The window one position further, given the top level's Jacobi update ``new``."""
    if len(levels) < ngram - 1:  # fill: stack the new level, drop every level's first column
        return [lv[1:] for lv in levels] + [new[len(new) - len(levels[0]) :]]
    return [levels[1][1:]] + levels[2:] + [list(new)]


class NgramPool:
    """key -> at most ``cap`` token tuples, least recently harvested first."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.table: dict[int, dict[tuple[int, ...], None]] = {}

    def add(self, key: int, seq: tuple[int, ...]) -> None:
        entries = self.table.setdefault(key, {})
        if seq in entries:  # harvested again: moves to the newest end
            del entries[seq]
        elif len(entries) >= self.cap:  # evict the least recently harvested
            del entries[next(iter(entries))]
        entries[seq] = None

    def get(self, key: int) -> list[tuple[int, ...]]:
        return list(self.table.get(key, ()))

    def clear(self) -> None:
        self.table.clear()

    def __len__(self) -> int:
        return sum(len(v) for v in self.table.values())


class LookaheadEngine:
    """One generation's Jacobi window and n-gram pool, as ``lookahead`` and ``lookahead_rest`` run them.

    ``pool_from_prompt`` (the reference's ``POOL_FROM_PROMPT``) also pools every
    n-gram of the prompt and of the committed output, in text order. EOS in a
    new window level is replaced by a prompt token (as in the reference).
    """

    def __init__(
        self, window: int, ngram: int, guesses: int, pool_from_prompt: bool, seed: int, eos: int | None
    ) -> None:
        self.window, self.ngram, self.guesses = window, ngram, guesses
        self.pool_from_prompt, self.seed, self.eos = pool_from_prompt, seed, eos
        self.prompt: list[int] = []
        self.levels: list[list[int]] = []
        self.pool = NgramPool(guesses)
        self.rng = random.Random(seed)
        self.root = -1
        self.indexed = 0  # tokens whose n-grams (ending there) are in the pool (pool_from_prompt)

    def forget(self) -> None:
        """Empty the n-gram pool (what the engine learns), in place: engines may share it (``memory: run``)."""
        self.pool.clear()

    def start(self, prompt_ids: list[int], keep: bool = False) -> None:
        """A new generation: level 0 drawn from the prompt (seeded), an empty pool unless ``keep``."""
        self.rng = random.Random(self.seed)
        self.prompt = list(prompt_ids)
        self.levels = [[self.rng.choice(self.prompt) for _ in range(self.window + self.ngram - 3)]]
        if not keep:
            self.forget()
        self.indexed = 0
        self.index_text(self.prompt)

    def index_text(self, tokens: list[int]) -> None:
        n = self.ngram
        if self.pool_from_prompt:
            for end in range(max(self.indexed + 1, n), len(tokens) + 1):
                self.pool.add(tokens[end - n], tuple(tokens[end - n + 1 : end]))
        self.indexed = len(tokens)

    def pool_guesses(self, tokens: list[int], max_depth: int) -> list[list[int]]:
        """The pool's n-grams keyed by the root (``tokens[-1]``), oldest first, cut to ``max_depth``."""
        self.index_text(tokens)
        self.root = tokens[-1]
        depth = min(self.ngram - 1, max_depth)
        return [list(s[:depth]) for s in self.pool.get(self.root)] if depth > 0 else []

    def attach_window(self, draft):
        """Send the window as ``draft``'s auxiliary nodes; only the top level's logits come back."""
        draft.aux_visible, offsets = window_layout(len(self.levels[0]) + 1, len(self.levels))
        draft.aux_positions = list(offsets)
        draft.aux_tokens = [t for lv in self.levels for t in lv]
        top = len(self.levels[-1])
        draft.aux_logit_rows = list(range(len(draft.aux_tokens) - top, len(draft.aux_tokens)))
        return draft

    def update(self, top_logits) -> None:
        """One Jacobi iteration from the top level's logits: harvest (steady window), then advance.
        No logits (the step went without the window, see specbench.budget): the window waits."""
        if top_logits is None:
            return
        new = top_logits.argmax(-1).tolist()
        if len(self.levels) == self.ngram - 1:
            for key, seq in harvest(self.levels, self.root, new):
                self.pool.add(key, seq)
        if self.eos is not None:  # keep EOS out of the window (the pool keeps what was harvested)
            new = [self.rng.choice(self.prompt) if t == self.eos else t for t in new]
        self.levels = advance_window(self.levels, new, self.ngram)
