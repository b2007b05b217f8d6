"""SPECTRA (Le, Do, Nguyen 2025): SPECTRA-CORE's guesses first, retrieval guesses filling the budget G.

One step, one forward:

1. SPECTRA-CORE's guesses (:class:`specbench.drafting.spectra_engine.SpectraCoreEngine`:
   the backward-dictionary guess, then S_fwd[last token]; sources ``bwd_dict``
   and ``fwd_dict``), at most G;
2. the rest of the budget, G minus what CORE proposed, filled with the best
   retrieval guesses (:func:`specbench.drafting.retrieval.retrieval_guesses`: the
   continuations of the longest context suffix found in the datastore, ranked
   by a prefix-weighted trie; source ``retrieval``), each cut to
   ``max_continuation`` tokens and to what the generation may still take.
   The paper puts internal guesses first because they had the higher
   acceptance rate. A retrieval guess equal to, or sharing a prefix with, a
   CORE guess is kept: the merged node credits both sources;
3. all guesses merged into one tree (:meth:`Draft.from_sequences`, priority =
   list order), CORE's candidate pool sent as auxiliary nodes in the same
   forward; the pool's logits update the dictionaries as in ``spectra_core``.

The retrieval part reads the perplexity-refined store built from
``datastore`` by default (``refine: true``, as the paper does), or the store
itself (``refine: false``). The store is checked before the model loads (one
line naming the build command when it is missing). Seconds spent in the store
go to ``Draft.lookup_s``, apart from drafting.

CORE's settings and their ablations (``+ablation=no_fwd|no_bwd|no_sub|no_coverage``)
are SPECTRA-CORE's (``coverage_reading`` included); the retrieval settings are
SPECTRA-RETRIEVAL's.
"""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter

from methods.registry import register_method
from specbench.core.draft import (
    SOURCE_BWD,
    SOURCE_FWD,
    SOURCE_RETRIEVAL,
    DecodeState,
    Draft,
    ScopedMemory,
    VerifyResult,
)
from specbench.drafting.retrieval import RetrievalConfig, StoreDrafter, retrieval_guesses
from specbench.drafting.spectra_engine import CoreSettings, SpectraCoreEngine


@dataclass
class SpectraConfig(CoreSettings, RetrievalConfig):
    _method = "spectra"

    refine: bool = True  # retrieval over the perplexity-refined store built from `datastore`

    def validate(self) -> None:
        CoreSettings.validate(self)
        RetrievalConfig.validate(self)


@register_method
class Spectra(ScopedMemory, StoreDrafter):
    name = "spectra"
    HOST_READS = 1  # the auxiliary nodes' logits, read once
    Config = SpectraConfig
    AUX_FEEDS = (SOURCE_FWD, SOURCE_BWD)
    RUN_STATE = ("engine.dicts",)

    def __init__(self, config: SpectraConfig | None = None, **kwargs) -> None:
        super().__init__(config, **kwargs)
        self.engine = SpectraCoreEngine(self.config, self.seed)

    def forget(self) -> None:
        self.engine.forget()

    def start(self, prompt_ids: list[int]) -> None:
        self.engine.start(prompt_ids, keep=True)

    def guesses(self, state: DecodeState) -> tuple[list[list[int]], list[str], float]:
        """CORE's guesses, then retrieval guesses up to G; with the seconds spent in the store."""
        c = self.config
        seqs, sources = self.engine.guesses(state.tokens)
        room, depth = c.max_guesses - len(seqs), min(c.max_continuation, state.max_depth)
        if room < 1 or depth < 1:
            return seqs, sources, 0.0
        t0 = perf_counter()
        found = retrieval_guesses(
            self.store,
            state.tokens,
            max_guesses=room,
            max_suffix=c.max_suffix,
            min_suffix=c.min_suffix,
            max_occurrences=c.max_occurrences,
            max_continuation=depth,
        )
        lookup = perf_counter() - t0
        return seqs + found, sources + [SOURCE_RETRIEVAL] * len(found), lookup

    def propose(self, state: DecodeState) -> Draft | None:
        if state.max_depth < 1:  # budget=auto: nothing worth drafting (the context is learned when it drafts again)
            return None
        self.engine.learn_context(state.tokens)
        seqs, sources, lookup = self.guesses(state)
        draft = Draft.from_sequences(seqs, sources).cut(state.max_depth)
        draft.lookup_s = lookup
        return self.engine.attach_pool(draft)

    def update(self, result: VerifyResult) -> None:
        self.engine.update(result.aux_logits)
