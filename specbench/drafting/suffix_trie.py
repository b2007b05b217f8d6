"""A counted suffix trie of bounded depth and SuffixDecoding's scored speculation (Oliaro et al. 2025).

:class:`SuffixTrie` holds every substring of at most ``max_depth`` tokens of
the sequences added to it, each node counting the positions where its
substring occurs. Sequences grow online: each new token extends the (at most
``max_depth``) suffixes still open, so adding a token costs O(max_depth) and
adds at most that many nodes (memory grows with the text; the method's
``memory`` setting bounds how much text a trie holds).

:meth:`SuffixTrie.speculate` follows SuffixDecoding: for every match length m
(1, 2, ... while the context's last m tokens are in the trie) it grows a draft
below the match node, each candidate token scored by its empirical
probability, the product of ``count(child) / count(parent)`` along the way;
it adds the most probable candidate first (a tree, or only the most frequent
child for a chain), stops below ``min_token_prob`` or at
``min(max_tokens, max_spec_factor * m + max_spec_offset)`` tokens, and keeps
the draft whose summed probability is highest (a longer match wins ties).
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class Speculation:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # -1 = the root (the last context token)
    probs: list[float] = field(default_factory=list)
    score: float = 0.0  # sum of probs: the expected number of accepted tokens, by the counts
    match_len: int = 0


class SuffixTrie:
    """Substrings (up to ``max_depth`` tokens) of several growing sequences, with occurrence counts.

    Nodes live in flat arrays (most nodes sit on chains of substrings seen once, with one child each):
    a node's first child is kept in ``first_tok``/``first_kid``; only nodes with two or more children
    get a dict (``more``). Measured: ~21 nodes and ~0.7 KB per token of natural-like text at depth 24.
    """

    def __init__(self, max_depth: int = 24) -> None:
        if max_depth < 1:
            raise ValueError(f"suffix trie: max_depth must be >= 1, got {max_depth}")
        self.max_depth = max_depth
        self.count = array("q", [0])
        self.token = array("i", [-1])
        self.depth = array("i", [0])
        self.first_tok = array("i", [-1])  # the first child's token (-1: no child)
        self.first_kid = array("i", [-1])
        self.more: dict[int, dict[int, int]] = {}  # node -> {token: child} once it has two children
        self.open: list[list[int]] = []  # per sequence: nodes of its suffixes still shorter than max_depth

    def clear(self) -> None:
        """Forget every sequence (in place: drafters may share the trie)."""
        self.__init__(self.max_depth)

    @property
    def n_nodes(self) -> int:
        return len(self.count)

    def new_sequence(self) -> int:
        self.open.append([])
        return len(self.open) - 1

    def child(self, node: int, tok: int) -> int:
        """The child of ``node`` by ``tok`` (-1 when there is none)."""
        if self.first_tok[node] == tok:
            return self.first_kid[node]
        kids = self.more.get(node)
        return kids.get(tok, -1) if kids else -1

    def children(self, node: int) -> list[int]:
        kids = self.more.get(node)
        if kids:
            return list(kids.values())
        return [self.first_kid[node]] if self.first_tok[node] >= 0 else []

    def _child(self, node: int, tok: int) -> int:
        found = self.child(node, tok)
        if found >= 0:
            return found
        new = len(self.count)
        self.count.append(0)
        self.token.append(tok)
        self.depth.append(self.depth[node] + 1)
        self.first_tok.append(-1)
        self.first_kid.append(-1)
        if self.first_tok[node] < 0:
            self.first_tok[node], self.first_kid[node] = tok, new
        else:
            kids = self.more.get(node)
            if kids is None:
                kids = self.more[node] = {self.first_tok[node]: self.first_kid[node]}
            kids[tok] = new
        return new

    def extend(self, seq: int, tokens: Sequence[int]) -> None:
        """Append ``tokens`` to sequence ``seq``: every open suffix, and a new one, grows by each token."""
        count, depth, cap = self.count, self.depth, self.max_depth
        active = self.open[seq]
        for tok in tokens:
            tok = int(tok)
            grown = []
            for node in [*active, 0]:
                child = self._child(node, tok)
                count[child] += 1
                if depth[child] < cap:
                    grown.append(child)
            count[0] += 1
            active = grown
        self.open[seq] = active

    def find(self, context: Sequence[int]) -> int:
        """The node of ``context`` (-1 when it never occurred)."""
        node = 0
        for tok in context:
            node = self.child(node, int(tok))
            if node < 0:
                return -1
        return node

    def _ranked(self, node: int) -> list[int]:
        return sorted(self.children(node), key=self.count.__getitem__, reverse=True)

    def _grow(self, node: int, budget: int, min_prob: float, tree: bool) -> Speculation:
        spec = Speculation()
        if budget < 1:
            return spec
        count = self.count
        heap: list[tuple[float, int, int, int]] = []  # (-prob, tie, node, parent index in the draft)
        tie = 0
        for child in self._ranked(node):
            prob = count[child] / count[node]
            if prob < min_prob:
                break
            heap.append((-prob, tie, child, -1))
            tie += 1
            if not tree:
                break
        heapq.heapify(heap)
        while heap and len(spec.tokens) < budget:
            neg, _, nd, parent = heapq.heappop(heap)
            spec.tokens.append(self.token[nd])
            spec.parents.append(parent)
            spec.probs.append(-neg)
            spec.score += -neg
            me = len(spec.tokens) - 1
            for child in self._ranked(nd):
                prob = -neg * count[child] / count[nd]
                if prob < min_prob:
                    break
                heapq.heappush(heap, (-prob, tie, child, me))
                tie += 1
                if not tree:
                    break
        return spec

    def speculate(
        self,
        context: Sequence[int],
        *,
        max_tokens: int,
        max_spec_factor: float = 1.0,
        max_spec_offset: float = 0.0,
        min_token_prob: float = 0.1,
        tree: bool = True,
    ) -> Speculation:
        """The best-scoring draft over every match length of ``context``'s suffix (see the module doc)."""
        best = Speculation()
        context = list(context)[-self.max_depth :]
        for m in range(1, len(context) + 1):
            node = self.find(context[len(context) - m :])
            if node < 0:
                break
            budget = max(0, min(max_tokens, int(m * max_spec_factor + max_spec_offset + 1e-6)))
            spec = self._grow(node, budget, min_token_prob, tree)
            if spec.score >= best.score:
                spec.match_len = m
                best = spec
        return best
