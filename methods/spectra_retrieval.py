"""SPECTRA-RETRIEVAL (Le, Do, Nguyen 2025) as a stand-alone method: Table 2's "RETRIEVAL module" rows.

The same lookup as REST (longest context suffix in a token datastore, the
continuations of its occurrences in a prefix-weighted trie), over a store
refined by perplexity: :mod:`specbench.stores.refine` scores every corpus sequence
under the target model, keeps the lowest-perplexity ones and indexes those
(``make datastore-refine``). ``refine: false`` reads the unrefined store
instead, so the rows with and without refinement are one setting apart.

SPECTRA verifies a budget of G guess *sequences* (its internal guesses first,
retrieval guesses filling the rest); alone, this module proposes the
``max_guesses`` best root-to-leaf sequences of the trie (by the sum of their
prefix weights), merged into one tree (shared prefixes verified once), every
guess with source ``retrieval``. No suffix found → an empty draft.
"""

from __future__ import annotations

from dataclasses import dataclass

from methods.registry import register_method
from specbench.core.draft import SOURCE_RETRIEVAL, Draft
from specbench.drafting.retrieval import RetrievalConfig, StoreDrafter
from specbench.drafting.trie import WeightedTrie


@dataclass
class SpectraRetrievalConfig(RetrievalConfig):
    max_guesses: int = 15  # G: guess sequences per step
    refine: bool = True  # read the perplexity-refined store built from `datastore` (false: the store itself)

    def validate(self) -> None:
        super().validate()
        if self.max_guesses < 1:
            raise ValueError(f"spectra_retrieval: max_guesses must be >= 1, got {self.max_guesses}")


@register_method
class SpectraRetrieval(StoreDrafter):
    name = "spectra_retrieval"
    Config = SpectraRetrievalConfig

    def draft(self, trie: WeightedTrie) -> Draft:
        seqs = trie.sequences(self.config.max_guesses)
        return Draft.from_sequences(seqs, [SOURCE_RETRIEVAL] * len(seqs))
