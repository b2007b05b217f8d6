"""A trie of candidate continuations weighted by how often each prefix occurs (REST's draft selection).

Every candidate continuation retrieved for one step is inserted; a node's
weight is the number of inserted continuations (or the sum of their weights)
that pass through it, i.e. how often that prefix of a continuation occurs among
the retrieved occurrences. A child's weight never exceeds its parent's, so the
top-weighted nodes always form a subtree that contains the root's children it
needs: :meth:`WeightedTrie.select` keeps those nodes as one tree of guesses
(REST verifies at most 64 of them in one forward). Methods that take guess
*sequences* instead (SPECTRA's budget of G guesses) read :meth:`sequences`.

Ties are broken by insertion order (the first inserted wins), so a selection
is deterministic for a given retrieval.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


class WeightedTrie:
    """Prefix counts of token sequences; pure Python, no model."""

    def __init__(self) -> None:
        # node 0 is the root (no token); children[node] maps token -> child node id
        self.token: list[int] = [-1]
        self.parent: list[int] = [-1]
        self.weight: list[int] = [0]
        self.depth: list[int] = [0]
        self.children: list[dict[int, int]] = [{}]

    def __len__(self) -> int:
        """Number of nodes, the root excluded."""
        return len(self.token) - 1

    def insert(self, seq: Sequence[int], weight: int = 1) -> None:
        """Add ``weight`` to every prefix of ``seq`` (creating the nodes it lacks)."""
        node = 0
        self.weight[0] += weight
        for tok in seq:
            tok = int(tok)
            child = self.children[node].get(tok)
            if child is None:
                child = len(self.token)
                self.children[node][tok] = child
                self.token.append(tok)
                self.parent.append(node)
                self.weight.append(0)
                self.depth.append(self.depth[node] + 1)
                self.children.append({})
            self.weight[child] += weight
            node = child

    def _ordered_children(self, node: int, keep: set[int] | None = None) -> list[int]:
        kids = [c for c in self.children[node].values() if keep is None or c in keep]
        return sorted(kids, key=lambda c: (-self.weight[c], c))

    def select(self, max_nodes: int) -> tuple[list[int], list[int]]:
        """The ``max_nodes`` heaviest nodes as one tree: ``(tokens, parents)``.

        ``parents[i]`` indexes the returned lists (``-1`` = the root). Nodes are
        chosen by weight (ties: shallower first, then insertion order), which
        keeps every chosen node's parent; they are listed depth-first with
        siblings by weight, so parents come before children and the most
        frequent sibling is tried first.
        """
        if max_nodes <= 0 or len(self) == 0:
            return [], []
        weight, depth = self.weight, self.depth
        keep = set(heapq.nsmallest(max_nodes, range(1, len(self.token)), key=lambda n: (-weight[n], depth[n], n)))
        tokens: list[int] = []
        parents: list[int] = []
        stack = [(c, -1) for c in reversed(self._ordered_children(0, keep))]
        while stack:
            node, out_parent = stack.pop()
            index = len(tokens)
            tokens.append(self.token[node])
            parents.append(out_parent)
            stack.extend((c, index) for c in reversed(self._ordered_children(node, keep)))
        return tokens, parents

    def path(self, node: int) -> list[int]:
        """Tokens from the root down to ``node``."""
        out: list[int] = []
        while node > 0:
            out.append(self.token[node])
            node = self.parent[node]
        return out[::-1]

    def path_score(self, node: int) -> int:
        """Sum of the weights along the path to ``node``: proportional to the expected number of tokens
        a guess ending at ``node`` gets accepted, if each prefix is as likely as its share of occurrences."""
        total = 0
        while node > 0:
            total += self.weight[node]
            node = self.parent[node]
        return total

    def sequences(self, k: int) -> list[list[int]]:
        """The ``k`` best root-to-leaf sequences, best first (by :meth:`path_score`; ties: insertion order).

        Only leaves are candidates: an inner node's path is a prefix of a longer
        path whose score is at least as high.
        """
        if k <= 0:
            return []
        leaves = [n for n in range(1, len(self.token)) if not self.children[n]]
        leaves.sort(key=lambda n: (-self.path_score(n), n))
        return [self.path(n) for n in leaves[:k]]
