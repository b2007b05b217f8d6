"""Lookahead + REST: Table 2's naive combination of the two methods, one tree, one forward.

The SPECTRA paper reports this row (1.08× GSM8K, 1.27× MT-Bench on
Llama-2-7B-chat) and names it, giving no detail of how the two were combined.
Here, the plainest union of the two drafts:

* Lookahead's part is unchanged (:class:`specbench.drafting.lookahead_window.LookaheadEngine`):
  the Jacobi window as auxiliary nodes, its harvested n-grams in the pool, the
  pool's n-grams keyed by the root as guesses (at most ``guesses`` = G of them,
  oldest first, source ``pool``);
* REST's part is unchanged (:func:`specbench.drafting.retrieval.retrieval_tree`): the
  ``max_nodes`` heaviest nodes of the trie of the store's continuations of the
  longest context suffix, cut to ``max_continuation`` tokens and to what the
  generation may still take, read back as root-to-leaf sequences (source
  ``retrieval``);
* the pool's sequences first, then REST's, merged into one tree by
  :meth:`Draft.from_sequences` (a shared prefix is verified once and credits
  both sources). Neither budget yields to the other: a step verifies up to
  G·(N−1) + ``max_nodes`` guess tokens plus the window.

Lookahead's pool and REST's store are otherwise independent: the window never
sees retrieval guesses and the store learns nothing from the window.
"""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter

from methods.registry import register_method
from specbench.core.draft import (
    SOURCE_POOL,
    SOURCE_RETRIEVAL,
    DecodeState,
    Draft,
    ScopedMemory,
    VerifyResult,
    check_memory,
)
from specbench.drafting.lookahead_window import LookaheadEngine
from specbench.drafting.retrieval import RetrievalConfig, StoreDrafter, retrieval_tree


@dataclass
class LookaheadRestConfig(RetrievalConfig):
    window: int = 15  # W: Lookahead's Jacobi window columns
    ngram: int = 5  # N: Lookahead's n-gram size
    guesses: int = 15  # G: Lookahead's pool guesses per step
    pool_from_prompt: bool = False
    max_nodes: int = 64  # REST's tree: the top-weighted trie nodes
    memory: str = "turn"  # how long Lookahead's n-gram pool lives: turn | sample | run

    def validate(self) -> None:
        super().validate()
        if self.window < 1 or self.ngram < 3 or self.guesses < 1 or self.max_nodes < 1:
            raise ValueError(
                "lookahead_rest: need window >= 1, ngram >= 3, guesses >= 1, max_nodes >= 1, got "
                f"{self.window}, {self.ngram}, {self.guesses}, {self.max_nodes}"
            )
        check_memory("lookahead_rest", self.memory)


def leaf_paths(tokens: list[int], parents: list[int]) -> list[list[int]]:
    """A tree (parents before children) as its root-to-leaf sequences, in node order of the leaves."""
    has_child = set(parents)
    paths = []
    for i in range(len(tokens)):
        if i in has_child:
            continue
        path, j = [], i
        while j >= 0:
            path.append(tokens[j])
            j = parents[j]
        paths.append(path[::-1])
    return paths


@register_method
class LookaheadRest(ScopedMemory, StoreDrafter):
    name = "lookahead_rest"
    HOST_READS = 1  # the auxiliary nodes' logits, read once
    Config = LookaheadRestConfig
    AUX_FEEDS = (SOURCE_POOL,)
    RUN_STATE = ("engine.pool",)

    def __init__(self, config: LookaheadRestConfig | None = None, **kwargs) -> None:
        super().__init__(config, **kwargs)
        c = self.config
        eos = getattr(self.tokenizer, "eos_token_id", None)
        self.engine = LookaheadEngine(c.window, c.ngram, c.guesses, c.pool_from_prompt, self.seed, eos)

    def forget(self) -> None:
        self.engine.forget()

    def start(self, prompt_ids: list[int]) -> None:
        self.engine.start(prompt_ids, keep=True)

    def propose(self, state: DecodeState) -> Draft:
        c = self.config
        seqs = self.engine.pool_guesses(state.tokens, state.max_depth)
        sources = [SOURCE_POOL] * len(seqs)
        depth = min(c.max_continuation, state.max_depth)
        lookup = 0.0
        if depth >= 1:
            t0 = perf_counter()
            tokens, parents = retrieval_tree(
                self.store,
                state.tokens,
                max_nodes=c.max_nodes,
                max_suffix=c.max_suffix,
                min_suffix=c.min_suffix,
                max_occurrences=c.max_occurrences,
                max_continuation=depth,
            )
            lookup = perf_counter() - t0
            found = leaf_paths(tokens, parents)
            seqs += found
            sources += [SOURCE_RETRIEVAL] * len(found)
        draft = Draft.from_sequences(seqs, sources)
        draft.lookup_s = lookup
        return self.engine.attach_window(draft)

    def update(self, result: VerifyResult) -> None:
        self.engine.update(result.aux_logits)
