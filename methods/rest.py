"""REST: retrieval-based speculative decoding (He et al. 2024).

Each step searches a token datastore (:mod:`specbench.datastore`) for the
longest suffix of the context, 16 tokens down to 2; reads what followed up to
``max_occurrences`` of its occurrences (10 tokens each); inserts those
continuations into a trie whose node weight counts how often each prefix
occurs; and verifies the ``max_nodes`` heaviest nodes (64 in the paper) as one
tree in one forward (shared prefixes computed once). No suffix found → an
empty draft: the step is a plain autoregressive step.

Reading choices:

* **Which occurrences.** When the suffix occurs more than ``max_occurrences``
  times, an even stride over its suffix-table range (a stratified sample of the
  continuations), so the trie weights keep the true proportions.
* **Ties.** Nodes of equal weight: the shallower first, then the first
  retrieved; siblings are listed heaviest first (sampling tries them in that
  order).
* **Depth cap.** Continuations are cut at ``remaining - 1`` tokens (the target
  adds its own token after the accepted ones).
* **Store.** ``datastore`` names a store built for the model
  (``make datastore``); a store of model outputs refuses a run on its own
  prompts unless ``allow_overlap=true``. Lookup seconds are recorded per step
  apart from drafting (``Draft.lookup_s``), every guess with source
  ``retrieval``.
"""

from __future__ import annotations

from dataclasses import dataclass

from methods.registry import register_method
from specbench.core.draft import SOURCE_RETRIEVAL, Draft
from specbench.drafting.retrieval import RetrievalConfig, StoreDrafter
from specbench.drafting.trie import WeightedTrie


@dataclass
class RESTConfig(RetrievalConfig):
    max_nodes: int = 64  # trie nodes verified per step

    def validate(self) -> None:
        super().validate()
        if self.max_nodes < 1:
            raise ValueError(f"rest: max_nodes must be >= 1, got {self.max_nodes}")


@register_method
class REST(StoreDrafter):
    name = "rest"
    Config = RESTConfig

    def draft(self, trie: WeightedTrie) -> Draft:
        tokens, parents = trie.select(self.config.max_nodes)
        return Draft(tokens=tokens, parents=parents, sources=[SOURCE_RETRIEVAL] * len(tokens))
