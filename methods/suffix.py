"""SuffixDecoding (Oliaro et al. 2025): frequency-scored speculation trees from suffix trees.

Two counted suffix tries (``specbench.suffix_tree.SuffixTrie``, depth
``max_depth``): a *local* one over the current prompt and output, and a
*global* one over the outputs of earlier generations (and the current output
as it grows). Each step matches the last tokens against both, grows from each
the speculation tree of highest expected acceptance (candidates scored by
their empirical probability ``count(child) / count(parent)`` along the path,
at most ``min(max_spec_tokens, max_spec_factor × match_len + max_spec_offset)``
nodes, none below ``min_token_prob``) and verifies the better-scoring one
(the local one on ties). A match of m tokens thus buys about m guesses: the
longer the pattern, the more aggressive the speculation.

Reading choices:

* **Index.** Our own bounded-depth suffix trie (pure Python, O(max_depth) per
  token), not Snowflake's ``arctic-inference`` C++ tree: its only release is
  source, and its build requires ``torch>=2.10`` in an isolated build
  environment (another multi-GB torch) and compiles CUDA operators next to the
  suffix tree. Same scoring and selection rules as its ``speculate``.
* **Defaults** are vLLM's for ``method: suffix`` (tree depth 24, factor 1.0,
  min probability 0.1, up to 24 tokens), with tree speculation as in the paper
  (vLLM verifies chains only: ``tree: false``).
* **Memory.** ``memory: run`` (the paper's global tree spans every earlier
  request of the deployment), ``sample`` (forgotten between samples, kept
  across a sample's turns), ``turn`` (only the current output). The warm-up
  generations are forgotten in every case.
"""

from __future__ import annotations

from dataclasses import dataclass

from methods.registry import register_method
from specbench.core.draft import (
    SOURCE_HISTORY,
    SOURCE_PROMPT,
    DecodeState,
    Draft,
    Drafter,
    ScopedMemory,
    check_memory,
)
from specbench.drafting.suffix_trie import SuffixTrie


@dataclass
class SuffixConfig:
    max_depth: int = 24  # longest substring the tries hold (bounds the match and the draft's depth)
    max_spec_tokens: int = 24  # nodes per draft
    max_spec_factor: float = 1.0  # nodes <= factor × match length + offset
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1  # no node whose empirical probability is lower
    tree: bool = True  # a speculation tree (the paper) or the most frequent chain (vLLM)
    memory: str = "run"  # what the global tree holds: turn | sample | run

    def validate(self) -> None:
        if self.max_depth < 1 or self.max_spec_tokens < 1:
            raise ValueError("suffix: max_depth and max_spec_tokens must be >= 1")
        if self.max_spec_factor < 0 or not 0 <= self.min_token_prob <= 1:
            raise ValueError("suffix: need max_spec_factor >= 0 and 0 <= min_token_prob <= 1")
        check_memory("suffix", self.memory)


@register_method
class SuffixDecoding(ScopedMemory, Drafter):
    name = "suffix"
    Config = SuffixConfig
    RUN_STATE = ("global_trie",)  # memory: run, at batch size > 1: one global tree for every request

    def __init__(self, config: SuffixConfig | None = None, **kwargs) -> None:
        super().__init__(config, **kwargs)
        self.global_trie = SuffixTrie(self.config.max_depth)
        self.local = SuffixTrie(self.config.max_depth)
        self.local_seq = self.local.new_sequence()
        self.global_seq = self.global_trie.new_sequence()
        self.seen = 0  # tokens of the current generation already in the tries
        self.prompt_len = 0

    def forget(self) -> None:
        self.global_trie.clear()

    def start(self, prompt_ids: list[int]) -> None:
        self.local = SuffixTrie(self.config.max_depth)
        self.local_seq = self.local.new_sequence()
        self.local.extend(self.local_seq, prompt_ids)
        self.global_seq = self.global_trie.new_sequence()  # this generation's output goes in as it grows
        self.seen = self.prompt_len = len(prompt_ids)

    def _sync(self, state: DecodeState) -> None:
        if self.seen > len(state.tokens) or self.prompt_len != state.prompt_len:
            self.start(state.tokens[: state.prompt_len])  # not the generation we indexed (no start() call)
        new = state.tokens[self.seen :]
        if new:
            self.local.extend(self.local_seq, new)
            self.global_trie.extend(self.global_seq, new)
            self.seen = len(state.tokens)

    def propose(self, state: DecodeState) -> Draft | None:
        self._sync(state)
        if state.max_depth < 1:
            return None
        cfg = self.config
        context = state.tokens[-cfg.max_depth :]
        kwargs = dict(max_tokens=cfg.max_spec_tokens, max_spec_factor=cfg.max_spec_factor,
                      max_spec_offset=cfg.max_spec_offset, min_token_prob=cfg.min_token_prob, tree=cfg.tree)
        local = self.local.speculate(context, **kwargs)
        hist = self.global_trie.speculate(context, **kwargs)
        spec, source = (local, SOURCE_PROMPT) if local.score >= hist.score else (hist, SOURCE_HISTORY)
        draft = Draft(tokens=spec.tokens, parents=spec.parents, sources=[source] * len(spec.tokens))
        draft = draft.cut(state.max_depth)
        return draft if len(draft) else None
