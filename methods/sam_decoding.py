"""SAM-Decoding (Hu et al. 2025): longest suffix matches from suffix automata, Token Recycling below them.

Two suffix automata (``specbench.automaton.SuffixAutomaton``): a *dynamic* one
over the text so far (prompt + output, extended with every committed token)
and, when ``datastore`` names a store, a *static* one built once over the
store's documents. Each keeps the longest suffix of the text that it contains
(for the dynamic one: that also ends earlier) in amortised O(1) per token.
Each step takes the better match (the static one counts ``len_bias`` tokens
less, so the text's own match wins unless the corpus matches clearly longer),
and if it is at least ``len_threshold`` tokens long, proposes the
``num_draft`` tokens that followed the match's first occurrence as a chain.
Otherwise it proposes Token Recycling's tree (``auxiliary: recycling``, the
paper's SAM-Decoding[T]): the shared candidate matrix and template of
``specbench.recycling``, updated from every forward's logits whichever draft
was verified; or EAGLE-2's dynamic tree (``auxiliary: eagle``, SAM-Decoding[E2],
the paper's best), whose head reads every step's features whichever draft was
verified, so its cache stays whole.

Reading choices:

* **Defaults** are the reference implementation's: ``n_predicts = 10`` counts
  the root, so 9 guesses; threshold 4; bias 4; the 80-node template.
* **Corpus.** The static automaton is built in Python when the drafter is
  made, from the store's first ``static_max_tokens`` tokens (about 2 states and
  a few hundred bytes per token); documents never run into each other.
* **Short continuations.** A match whose first occurrence ends near the end
  of the text has fewer than ``num_draft`` tokens after it; we propose what
  there is (the reference may fall back to a shorter match further back).
* **Memory.** The dynamic automaton is per generation by definition; the
  auxiliary matrix follows ``memory`` (the reference keeps it across queries:
  ``run``). The warm-up generations are forgotten in every case.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from methods.registry import register_method
from specbench.core.draft import (
    SOURCE_PROMPT,
    SOURCE_RETRIEVAL,
    DecodeState,
    Draft,
    Drafter,
    ScopedMemory,
    VerifyResult,
    check_memory,
)
from specbench.core.memory import share
from specbench.drafting.automaton import SuffixAutomaton
from specbench.drafting.eagle_drafter import (
    EagleSettings,
    HeadDrafter,
    check_draft_dtype,
    preflight_head,
)
from specbench.drafting.recycling import Recycler, check_tree
from specbench.stores.naming import open_store, prepare_store

AUXILIARIES = ("recycling", "eagle", "none")


@dataclass
class SAMDecodingConfig:
    num_draft: int = 9  # tokens copied after a match (the reference's n_predicts = 10 with the root)
    len_threshold: int = 4  # shortest match whose continuation is proposed; below it, the auxiliary drafter
    len_bias: int = 4  # the static match counts this many tokens less when compared with the dynamic one
    datastore: str | None = None  # a retrieval store (name or path) for the static automaton; null: none
    static_max_tokens: int = 2_000_000  # corpus tokens the static automaton holds (read from the start)
    allow_overlap: bool = False  # run even if the store was generated from this run's prompts
    auxiliary: str = "recycling"  # below the threshold: recycling (Token Recycling's tree) | eagle (EAGLE-2) | none
    head: str = "auto"  # auxiliary eagle's head: auto (published, else trained here) | trained | a dir | a hub repo
    eagle_depth: int = 6  # auxiliary eagle: EAGLE-2's tree (levels, top-k, tokens with the root)
    eagle_top_k: int = 10
    eagle_total_tokens: int = 60
    eagle_draft_dtype: str | None = None  # auxiliary eagle: the head's precision (null: the target's)
    topk: int = 8  # Token Recycling's candidates per token
    tree: str = "paper"  # Token Recycling's template: paper | cpu
    memory: str = "run"  # how long the candidate matrix lives: turn | sample | run

    def validate(self) -> None:
        if self.num_draft < 1 or self.len_threshold < 1 or self.len_bias < 0:
            raise ValueError("sam_decoding: need num_draft >= 1, len_threshold >= 1 and len_bias >= 0")
        if self.static_max_tokens < 1:
            raise ValueError("sam_decoding: static_max_tokens must be >= 1")
        if self.auxiliary not in AUXILIARIES:
            raise ValueError(f"sam_decoding: auxiliary must be one of {', '.join(AUXILIARIES)}, got '{self.auxiliary}'")
        check_tree("sam_decoding", self.tree, self.topk)
        check_memory("sam_decoding", self.memory)
        check_draft_dtype(self.eagle_draft_dtype)


def corpus_automaton(documents, max_tokens: int) -> SuffixAutomaton:
    """The static automaton over the first ``max_tokens`` tokens of ``documents``."""

    def capped():
        left = max_tokens
        for doc in documents:
            if left <= 0:
                return
            doc = [int(t) for t in doc[:left]]
            left -= len(doc)
            yield doc

    return SuffixAutomaton().build(capped())


@register_method
class SAMDecoding(ScopedMemory, Drafter):
    name = "sam_decoding"

    @classmethod
    def host_reads(cls, config: SAMDecodingConfig, drafted: int) -> int:
        # the auxiliary drafter's: EAGLE's tree (grown on the device, read once), or the recycler's read of the logits
        return 1 if config.auxiliary in ("eagle", "recycling") else 0
    Config = SAMDecodingConfig
    RUN_STATE = ("recycler.matrix",)  # memory: run, at batch size > 1: one candidate matrix for every request

    @classmethod
    def preflight(cls, config: SAMDecodingConfig, run_cfg: Any) -> None:
        if config.datastore:
            prepare_store(cls.name, config, run_cfg)
        if config.auxiliary == "eagle":
            preflight_head(config.head, run_cfg, "eagle")

    def __init__(self, config: SAMDecodingConfig | None = None, **kwargs) -> None:
        super().__init__(config, **kwargs)
        self.static: SuffixAutomaton | None = None
        self.store_columns: dict = {}
        if self.config.datastore:
            store = open_store(self.name, self.config, self.tokenizer)
            self.store_columns = store.provenance()
            self.static = corpus_automaton(store.documents(), self.config.static_max_tokens)
        self.recycler = Recycler(self.vocab_size, self.config.topk, self.config.tree)
        self.dynamic = SuffixAutomaton()
        self.eagle: HeadDrafter | None = None
        self.catches_up = self.config.auxiliary == "eagle"  # its head, as EAGLE's
        if self.config.auxiliary == "eagle":
            c = self.config
            settings = EagleSettings(head=c.head, depth=c.eagle_depth, top_k=c.eagle_top_k,
                                     total_tokens=c.eagle_total_tokens, draft_dtype=c.eagle_draft_dtype)
            self.eagle = HeadDrafter(settings, vocab_size=self.vocab_size, tokenizer=self.tokenizer,
                                     context=self.context)
            self.feature_layers = self.eagle.feature_layers

    matrix = property(lambda self: self.recycler.matrix)  # for inspection

    def spawn(self) -> SAMDecoding:
        """Another request's drafter: the static automaton's structure and the EAGLE head shared, its own match,
        dynamic automaton, recycler root (and, under ``memory: run``, the shared candidate matrix)."""
        twin = copy.copy(self)
        twin.static = copy.copy(self.static)  # the built automaton is read only; the match is per request
        twin.recycler = Recycler(self.vocab_size, self.config.topk, self.config.tree)
        twin.dynamic = SuffixAutomaton()
        twin.eagle = self.eagle.spawn() if self.eagle is not None else None
        if self.config.memory == "run":
            share(self, twin, self.RUN_STATE)
        return twin

    def provenance(self) -> dict:
        return {**self.store_columns, **(self.eagle.provenance() if self.eagle is not None else {})}

    def forget(self) -> None:
        self.recycler.clear()

    def start(self, prompt_ids: list[int]) -> None:
        self.dynamic = SuffixAutomaton()
        if self.static is not None:
            self.static.reset_match()
        if self.eagle is not None:
            self.eagle.start(prompt_ids)

    def prefilled(self, features) -> None:
        if self.eagle is not None:
            self.eagle.prefilled(features)

    def _sync(self, tokens: list[int]) -> float:
        """Feed the tokens committed since the last call to both automata; returns the static part's seconds."""
        seen = len(self.dynamic)
        if seen > len(tokens) or (seen and self.dynamic.tokens[seen - 1] != tokens[seen - 1]):
            self.start([])  # not the text we indexed (no start() call): start over
            seen = 0
        new = tokens[seen:]
        self.dynamic.extend(new)
        if self.static is None:
            return 0.0
        t0 = perf_counter()
        for tok in new:
            self.static.advance(tok)
        return perf_counter() - t0

    def propose(self, state: DecodeState) -> Draft | None:
        return self.propose_rows([self], [state])[0]

    @classmethod
    def drafts_batch_at_once(cls, config: SAMDecodingConfig) -> bool:
        return config.auxiliary == "eagle"  # the heads' levels, shared; a recycler reads for each row

    @staticmethod
    def propose_rows(drafters: list[SAMDecoding], states: list[DecodeState]) -> list[Draft | None]:
        """Each row's draft: from its automata when a match is long enough, else from its auxiliary drafter; rows
        that fall back on an EAGLE head (SAM-Decoding[EAGLE2]) draft together, one head forward per tree level
        for all of them (:meth:`HeadDrafter.propose_rows`)."""
        out: list[Draft | None] = []
        heads = []  # (row, its lookup seconds) of the rows its head drafts for
        for i, (d, state) in enumerate(zip(drafters, states, strict=True)):
            draft, lookup, head = d._own(state)
            out.append(draft)
            if head:
                heads.append((i, lookup))
        if heads:
            drafts = HeadDrafter.propose_rows([drafters[i].eagle for i, _ in heads], [states[i] for i, _ in heads])
            for (i, lookup), draft in zip(heads, drafts, strict=True):
                if draft is not None:
                    draft.lookup_s = lookup
                out[i] = draft
        return out

    def _own(self, state: DecodeState) -> tuple[Draft | None, float, bool]:
        """The row's automaton draft (or recycler's), its lookup seconds, and whether its head should draft."""
        lookup = self._sync(state.tokens)
        # every forward's rows teach the recycler, a suffix-automaton step's too: under this step's root
        self.recycler.root = state.tokens[-1]
        depth = state.max_depth
        if depth < 1:
            return None, lookup, False
        cfg = self.config
        sam, source, length = self.dynamic, SOURCE_PROMPT, self.dynamic.match_len
        if self.static is not None and self.static.match_len - cfg.len_bias > length:
            sam, source, length = self.static, SOURCE_RETRIEVAL, self.static.match_len - cfg.len_bias
        if length >= cfg.len_threshold:
            guess = sam.continuation(min(cfg.num_draft, depth))
            if guess:
                draft = Draft.chain(guess, source)
                draft.lookup_s = lookup
                if self.eagle is not None:
                    self.eagle.catch_up(state.tokens)
                return draft, lookup, False
        if cfg.auxiliary == "none":
            return None, lookup, False
        if self.eagle is not None:
            return None, lookup, True
        draft = self.recycler.propose(state.tokens[-1], depth)
        if draft is not None:
            draft.lookup_s = lookup
        return draft, lookup, False

    def update(self, result: VerifyResult) -> None:
        if self.eagle is not None:
            self.eagle.update(result)
        elif self.config.auxiliary != "none":
            self.recycler.update(result)
