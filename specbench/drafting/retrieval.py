"""Retrieval guesses from a datastore, shared by every retrieval method (REST, SPECTRA-RETRIEVAL, SPECTRA).

One lookup takes the continuations of the longest context suffix found in the
store (:meth:`specbench.stores.datastore.Datastore.search`), inserts them into a
:class:`specbench.trie.WeightedTrie` (a node's weight = how many of them share
that prefix), and reads either a tree of the top-weighted nodes
(:func:`retrieval_tree`, REST) or the best root-to-leaf sequences
(:func:`retrieval_guesses`, for methods with a budget of guess sequences).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any, ClassVar

from specbench.core.draft import DecodeState, Draft, Drafter
from specbench.drafting.trie import WeightedTrie
from specbench.stores.datastore import Datastore
from specbench.stores.naming import open_store, prepare_store


def retrieval_trie(store: Datastore, context: Sequence[int], *, max_suffix: int = 16, min_suffix: int = 2,
                   max_occurrences: int, max_continuation: int = 10) -> WeightedTrie:
    """The trie of what follows the longest matched suffix (identical continuations inserted once, with
    their count as weight: the same weights, fewer inserts)."""
    trie = WeightedTrie()
    counts = Counter(store.search(context, max_suffix=max_suffix, min_suffix=min_suffix,
                                  max_occurrences=max_occurrences, max_continuation=max_continuation))
    for cont, count in counts.items():  # first-seen order (suffix-table order)
        trie.insert(cont, count)
    return trie


def retrieval_guesses(store: Datastore, context: Sequence[int], *, max_guesses: int, max_suffix: int = 16,
                      min_suffix: int = 2, max_occurrences: int, max_continuation: int = 10) -> list[list[int]]:
    """Up to ``max_guesses`` guess sequences, best first (trie path weight); ``[]`` when nothing matches."""
    trie = retrieval_trie(store, context, max_suffix=max_suffix, min_suffix=min_suffix,
                          max_occurrences=max_occurrences, max_continuation=max_continuation)
    return trie.sequences(max_guesses)


def retrieval_tree(store: Datastore, context: Sequence[int], *, max_nodes: int, max_suffix: int = 16,
                   min_suffix: int = 2, max_occurrences: int, max_continuation: int = 10) -> tuple[list[int], list[int]]:
    """REST's draft: the ``max_nodes`` heaviest trie nodes as ``(tokens, parents)``, parents first."""
    trie = retrieval_trie(store, context, max_suffix=max_suffix, min_suffix=min_suffix,
                          max_occurrences=max_occurrences, max_continuation=max_continuation)
    return trie.select(max_nodes)


# ----------------------------------------------------------------------------- the drafters' shared part


@dataclass
class RetrievalConfig:
    """Settings every retrieval drafter shares (REST's defaults)."""

    datastore: str = "auto"  # the paper's corpus for the model (stdlib offline), a store name (per model), or a path
    max_suffix: int = 16  # longest context suffix searched (tried first)
    min_suffix: int = 2  # shortest suffix searched
    max_occurrences: int = 500  # occurrences of the matched suffix read (an even stride when there are more)
    max_continuation: int = 10  # tokens read after each occurrence
    allow_overlap: bool = False  # run even if the store was generated from this run's prompts

    def validate(self) -> None:
        name = type(self).__name__
        if not str(self.datastore):
            raise ValueError(f"{name}: datastore must name a store or a path")
        if self.min_suffix < 1 or self.max_suffix < self.min_suffix:
            raise ValueError(f"{name}: need 1 <= min_suffix <= max_suffix, got {self.min_suffix}, {self.max_suffix}")
        if self.max_occurrences < 1 or self.max_continuation < 1:
            raise ValueError(f"{name}: max_occurrences and max_continuation must be >= 1")


class StoreDrafter(Drafter):
    """A drafter that reads a datastore: checks it before the model loads, opens it for the
    tokenizer, and times each lookup (``Draft.lookup_s``). Subclasses implement :meth:`draft`."""

    refined: ClassVar[bool] = False  # read the perplexity-refined store built from ``datastore``

    @classmethod
    def uses_refined(cls, config: Any) -> bool:
        return bool(getattr(config, "refine", cls.refined))

    @classmethod
    def preflight(cls, config: Any, run_cfg: Any) -> None:
        prepare_store(cls.name, config, run_cfg, refined=cls.uses_refined(config))

    def __init__(self, config: Any = None, **kwargs) -> None:
        super().__init__(config, **kwargs)
        self.store = open_store(self.name, self.config, self.tokenizer, refined=self.uses_refined(self.config))

    def provenance(self) -> dict[str, Any]:
        choice = getattr(self.config, "_store_choice", None)
        return {**self.store.provenance(), **({"datastore_choice": choice} if choice else {})}

    def propose(self, state: DecodeState) -> Draft | None:
        depth = min(self.config.max_continuation, state.max_depth)
        if depth < 1:
            return None
        t0 = perf_counter()
        trie = retrieval_trie(self.store, state.tokens, max_suffix=self.config.max_suffix,
                              min_suffix=self.config.min_suffix, max_occurrences=self.config.max_occurrences,
                              max_continuation=depth)
        lookup = perf_counter() - t0
        draft = self.draft(trie) if len(trie) else Draft()  # no match: an empty draft (a plain step)
        draft.lookup_s = lookup
        return draft

    def draft(self, trie: WeightedTrie) -> Draft:
        """The step's draft from the lookup's trie: every subclass says how (rest: its top-weighted nodes
        as one tree; spectra_retrieval: its best sequences). Abstract hook, not a gap."""
        raise NotImplementedError
