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
was verified.

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

from dataclasses import dataclass
from time import perf_counter
from typing import Any

from specbench.automaton import SuffixAutomaton
from specbench.config import ConfigError
from specbench.draft import (
    SOURCE_PROMPT,
    SOURCE_RECYCLE,
    SOURCE_RETRIEVAL,
    DecodeState,
    Draft,
    Drafter,
    ScopedMemory,
    VerifyResult,
    check_memory,
)
from specbench.recycling import TREES, CandidateMatrix, TreeTemplate
from specbench.registry import register_method

AUXILIARIES = ("recycling", "none")


@dataclass
class SAMDecodingConfig:
    num_draft: int = 9  # tokens copied after a match (the reference's n_predicts = 10 with the root)
    len_threshold: int = 4  # shortest match whose continuation is proposed; below it, the auxiliary drafter
    len_bias: int = 4  # the static match counts this many tokens less when compared with the dynamic one
    datastore: str | None = None  # a retrieval store (name or path) for the static automaton; null: none
    static_max_tokens: int = 2_000_000  # corpus tokens the static automaton holds (read from the start)
    allow_overlap: bool = False  # run even if the store was generated from this run's prompts
    auxiliary: str = "recycling"  # below the threshold: recycling (Token Recycling's tree) | none
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
        if self.tree not in TREES:
            raise ValueError(f"sam_decoding: tree must be one of {', '.join(TREES)}, got '{self.tree}'")
        check_memory("sam_decoding", self.memory)
        if TreeTemplate(TREES[self.tree]).max_rank > self.topk:
            raise ValueError(f"sam_decoding: tree '{self.tree}' needs topk >= 8")


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
    Config = SAMDecodingConfig

    @classmethod
    def preflight(cls, config: SAMDecodingConfig, run_cfg: Any) -> None:
        if config.datastore:
            from specbench.datastore import build_command, check_store

            path = check_store(config.datastore, run_cfg.model, run_cfg, allow_overlap=bool(config.allow_overlap))
            config._store_path = str(path)  # where the drafter finds it (results record the setting)
            config._store_hint = build_command(config.datastore, run_cfg.model)

    def __init__(self, config: SAMDecodingConfig | None = None, *, vocab_size: int, seed: int = 0, tokenizer=None):
        config = config or SAMDecodingConfig()
        config.validate()
        super().__init__(config, vocab_size=vocab_size, seed=seed, tokenizer=tokenizer)
        self.static: SuffixAutomaton | None = None
        if config.datastore:
            self.static = corpus_automaton(self._open_store(config, tokenizer).documents(), config.static_max_tokens)
        self.template = TreeTemplate(TREES[config.tree])
        self.matrix = CandidateMatrix(vocab_size, config.topk)
        self.dynamic = SuffixAutomaton()
        self.root = -1

    @staticmethod
    def _open_store(config: SAMDecodingConfig, tokenizer: Any):
        from specbench.datastore import Datastore, is_path_spec, resolve_store

        path = getattr(config, "_store_path", None)
        if path is None:
            if not is_path_spec(str(config.datastore)):
                raise ConfigError(f"sam_decoding: datastore '{config.datastore}' is a name; the runner resolves "
                                  "it for the model (or pass a path)")
            path = resolve_store(config.datastore, None)
        return Datastore.load(path, tokenizer, hint=getattr(config, "_store_hint", None))

    def forget(self) -> None:
        self.matrix.clear()

    def start(self, prompt_ids: list[int]) -> None:
        self.begin_turn()
        self.dynamic = SuffixAutomaton()
        if self.static is not None:
            self.static.reset_match()

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
        lookup = self._sync(state.tokens)
        self.root = state.tokens[-1]
        depth = state.max_depth
        if depth < 1:
            return None
        cfg = self.config
        sam, source, length = self.dynamic, SOURCE_PROMPT, self.dynamic.match_len
        if self.static is not None and self.static.match_len - cfg.len_bias > length:
            sam, source, length = self.static, SOURCE_RETRIEVAL, self.static.match_len - cfg.len_bias
        if length >= cfg.len_threshold:
            guess = sam.continuation(min(cfg.num_draft, depth))
            if guess:
                draft = Draft.chain(guess, source)
                draft.lookup_s = lookup
                return draft
        if cfg.auxiliary == "none":
            return None
        tokens, parents = self.template.fill(self.matrix, self.root, depth)
        if not tokens:
            return None
        draft = Draft(tokens=tokens, parents=parents, sources=[SOURCE_RECYCLE] * len(tokens))
        draft.lookup_s = lookup
        return draft

    def update(self, result: VerifyResult) -> None:
        if self.config.auxiliary != "none":
            self.matrix.update([self.root, *result.draft.tokens], result.logits)
