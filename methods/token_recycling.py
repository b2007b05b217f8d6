"""Token Recycling (Luo et al. 2024, "Turning Trash into Treasure"): the target's own candidates, recycled.

Every forward computes the target's next-token distribution after the root and
after every guess; speculative decoding keeps one token of each and throws the
rest away. Token Recycling keeps the top-k (k = 8) of every such row in a
candidate matrix (``specbench.drafting.recycling.CandidateMatrix``: token -> its latest
candidates, overwritten by each forward) and each step fills a static
breadth-first tree template from it, starting at the root: the root's
candidates, their candidates, and so on, with more children and depth for the
higher ranks. The tree is verified in one forward, whose logits update the
matrix again (all rows: root, accepted and rejected guesses alike).

Reading choices:

* **Template.** ``tree: paper`` is the paper's 80-node, 6-level tree (its
  "2.2.2"); ``tree: cpu`` is a 16-node corner of it for CPUs, where a forward's
  cost grows with its token count.
* **Empty rows.** A token the target has not yet been run on has no
  candidates and its branch is pruned (the paper starts from an all-zero
  matrix, i.e. proposes token 0 there).
* **Duplicates.** A token occurring twice in one forward keeps its last
  occurrence's candidates (the paper's "last" variant; its CUDA scatter leaves
  the merge unspecified).
* **Memory.** ``memory: run`` (the paper's "hot start": each query inherits the
  matrix of the previous one), ``sample`` (forgotten between samples, kept
  across a sample's turns) or ``turn`` (every generation starts empty). The
  warm-up generations are forgotten in every case. The prefill's logits are not
  seen (the core does not hand them to drafters), so the first step's root
  has candidates only if an earlier generation left them.
"""

from __future__ import annotations

from dataclasses import dataclass

from methods.registry import register_method
from specbench.core.draft import DecodeState, Draft, Drafter, ScopedMemory, VerifyResult, check_memory
from specbench.drafting.recycling import Recycler, check_tree


@dataclass
class TokenRecyclingConfig:
    topk: int = 8  # candidates kept per token (k)
    tree: str = "paper"  # static template: paper (80 nodes, 6 levels) | cpu (16 nodes, 5 levels)
    memory: str = "run"  # how long the matrix lives: turn | sample | run (the paper's hot start)

    def validate(self) -> None:
        check_tree("token_recycling", self.tree, self.topk)
        check_memory("token_recycling", self.memory)


@register_method
class TokenRecycling(ScopedMemory, Drafter):
    name = "token_recycling"
    HOST_READS = 1  # the auxiliary nodes' logits, read once
    Config = TokenRecyclingConfig
    RUN_STATE = ("recycler.matrix",)  # memory: run, at batch size > 1: one matrix for every request

    def __init__(self, config: TokenRecyclingConfig | None = None, **kwargs) -> None:
        super().__init__(config, **kwargs)
        self.recycler = Recycler(self.vocab_size, self.config.topk, self.config.tree)

    matrix = property(lambda self: self.recycler.matrix)  # for inspection

    def forget(self) -> None:
        self.recycler.clear()

    def propose(self, state: DecodeState) -> Draft | None:
        return self.recycler.propose(state.tokens[-1], state.max_depth)

    def update(self, result: VerifyResult) -> None:
        self.recycler.update(result)
