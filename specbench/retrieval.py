"""Retrieval guesses from a datastore, shared by every retrieval method (REST, SPECTRA-RETRIEVAL, SPECTRA).

One lookup takes the continuations of the longest context suffix found in the
store (:meth:`specbench.datastore.Datastore.search`), inserts them into a
:class:`specbench.trie.WeightedTrie` (a node's weight = how many of them share
that prefix), and reads either a tree of the top-weighted nodes
(:func:`retrieval_tree`, REST) or the best root-to-leaf sequences
(:func:`retrieval_guesses`, for methods with a budget of guess sequences).
"""

from __future__ import annotations

from collections.abc import Sequence

from specbench.datastore import Datastore
from specbench.trie import WeightedTrie


def retrieval_trie(store: Datastore, context: Sequence[int], *, max_suffix: int = 16, min_suffix: int = 2,
                   max_occurrences: int, max_continuation: int = 10) -> WeightedTrie:
    trie = WeightedTrie()
    for cont in store.search(context, max_suffix=max_suffix, min_suffix=min_suffix,
                             max_occurrences=max_occurrences, max_continuation=max_continuation):
        trie.insert(cont)
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
