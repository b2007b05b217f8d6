"""Token Recycling's pure parts (Luo et al. 2024): the candidate matrix and its static tree templates.

* :class:`CandidateMatrix` keeps, for every token ``x``, the top-k tokens of
  the target's most recent logits row that followed ``x`` (its *candidates*).
  Every verification forward updates the rows of the root and of every guess,
  accepted or not: the target computed those rows anyway, and discarding them
  is the waste the method recycles. A token repeated in one forward keeps the
  candidates of its last occurrence (the paper's best-MAT variant; its CUDA
  scatter leaves the merge unspecified). A token never seen has no row
  (the paper fills rows with token 0 instead; a missing row simply prunes the
  branch, which a 0 would have wasted).
* :class:`TreeTemplate` is a static, breadth-first, unbalanced tree of ranks:
  node ``(0, 1)`` is the second candidate of the first candidate of the root.
  :meth:`TreeTemplate.fill` reads the matrix along the template, level by
  level, and returns the draft's tokens and parents.

Memory: the matrix is dense ``int32 [vocab, k]``: with k = 8 that is 1.0 MB for
a 32k vocabulary, 4.2 MB for 128k and 8.4 MB for 262k (the paper's "< 2 MB" is
32k × 8 int64). Dense stays small, so no sparse structure is needed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from specbench.core.draft import SOURCE_RECYCLE, Draft, VerifyResult

# The paper's template (its "2.2.2" tree: 80 nodes, 6 levels, 8/21/25/15/8/3 nodes per level),
# written level by level as rank paths.
PAPER_TREE: tuple[tuple[int, ...], ...] = (
    *[(i,) for i in range(8)],
    *[(0, i) for i in range(8)], (1, 0), (1, 1), (1, 2), (1, 3), (2, 0), (2, 1), (2, 2), (3, 0), (3, 1),
    (4, 0), (5, 0), (6, 0), (7, 0),
    *[(0, 0, i) for i in range(8)], (0, 1, 0), (0, 1, 1), (0, 1, 2), (0, 2, 0), (0, 2, 1), (0, 3, 0),
    (0, 4, 0), (0, 5, 0), (0, 6, 0), (0, 7, 0), (1, 0, 0), (1, 0, 1), (1, 1, 0), (2, 0, 0), (3, 0, 0),
    (4, 0, 0), (5, 0, 0),
    *[(0, 0, 0, i) for i in range(5)], (0, 0, 1, 0), (0, 0, 1, 1), (0, 0, 2, 0), (0, 0, 3, 0), (0, 0, 4, 0),
    (0, 1, 0, 0), (0, 2, 0, 0), (1, 0, 0, 0), (2, 0, 0, 0), (3, 0, 0, 0),
    (0, 0, 0, 0, 0), (0, 0, 0, 0, 1), (0, 0, 0, 0, 2), (0, 0, 0, 1, 0), (0, 0, 0, 2, 0), (0, 0, 1, 0, 0),
    (0, 1, 0, 0, 0), (1, 0, 0, 0, 0),
    (0, 0, 0, 0, 0, 0), (0, 0, 0, 0, 0, 1), (0, 0, 0, 1, 0, 0),
)

# A CPU budget (16 nodes, 5 levels): the paper tree's most probable corner, same unbalanced shape
# (earlier ranks get more children and go deeper).
CPU_TREE: tuple[tuple[int, ...], ...] = (
    (0,), (1,), (2,), (3,),
    (0, 0), (0, 1), (1, 0), (2, 0),
    (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0),
    (0, 0, 0, 0), (0, 0, 1, 0), (1, 0, 0, 0),
    (0, 0, 0, 0, 0),
)

TREES = {"paper": PAPER_TREE, "cpu": CPU_TREE}


class TreeTemplate:
    """A static tree of candidate ranks, breadth-first (every node after its parent)."""

    def __init__(self, paths: Sequence[Sequence[int]]) -> None:
        index: dict[tuple[int, ...], int] = {}
        self.parent: list[int] = []
        self.rank: list[int] = []
        self.depth: list[int] = []
        for path in paths:
            path = tuple(int(r) for r in path)
            if not path or path in index or min(path) < 0:
                raise ValueError(f"tree template: bad or repeated path {path}")
            if len(path) > 1 and path[:-1] not in index:
                raise ValueError(f"tree template: {path} comes before its parent {path[:-1]}")
            if self.depth and len(path) < self.depth[-1]:
                raise ValueError(f"tree template: {path} breaks breadth-first order")
            index[path] = len(self.parent)
            self.parent.append(index[path[:-1]] if len(path) > 1 else -1)
            self.rank.append(path[-1])
            self.depth.append(len(path))
        self.paths = list(index)

    def __len__(self) -> int:
        return len(self.parent)

    @property
    def max_rank(self) -> int:
        return max(self.rank) + 1 if self.rank else 0

    def fill(self, matrix: CandidateMatrix, root: int, max_depth: int) -> tuple[list[int], list[int]]:
        """Draft tokens and parents (indices into the draft, -1 = root) read from ``matrix``.

        A node whose parent has no candidates (never seen, or pruned) is dropped with its subtree,
        and so is every node deeper than ``max_depth``.
        """
        rows = matrix.rows
        have = matrix.filled
        node_tok = [-1] * len(self.parent)
        out = [-1] * len(self.parent)
        tokens: list[int] = []
        parents: list[int] = []
        for i, (par, rank, depth) in enumerate(zip(self.parent, self.rank, self.depth, strict=True)):
            if depth > max_depth:
                break  # breadth-first: every later node is at least as deep
            ptok = root if par < 0 else node_tok[par]
            if ptok < 0 or ptok >= len(have) or not have[ptok]:
                continue
            tok = int(rows[ptok, rank]) if rank < rows.shape[1] else -1
            if tok < 0:
                continue
            node_tok[i] = tok
            out[i] = len(tokens)
            tokens.append(tok)
            parents.append(-1 if par < 0 else out[par])
        return tokens, parents


class CandidateMatrix:
    """token -> the top-k tokens of the latest target logits row that followed it (dense int32)."""

    def __init__(self, vocab_size: int, k: int = 8) -> None:
        if k < 1:
            raise ValueError(f"candidate matrix: k must be >= 1, got {k}")
        self.k = k
        self.rows = np.zeros((max(vocab_size, 1), k), dtype=np.int32)
        self.filled = np.zeros(max(vocab_size, 1), dtype=bool)

    @property
    def nbytes(self) -> int:
        return self.rows.nbytes + self.filled.nbytes

    def clear(self) -> None:
        self.filled[:] = False

    def _grow(self, size: int) -> None:
        if size > len(self.filled):  # a model whose logits are wider than the declared vocabulary
            self.rows = np.concatenate([self.rows, np.zeros((size - len(self.rows), self.k), np.int32)])
            self.filled = np.concatenate([self.filled, np.zeros(size - len(self.filled), bool)])

    def set_rows(self, tokens: Sequence[int], candidates: np.ndarray) -> None:
        """Row ``tokens[i]`` := ``candidates[i]``; a repeated token keeps its last row."""
        last = {int(t): i for i, t in enumerate(tokens)}  # last occurrence wins
        if not last:
            return
        keys = np.fromiter(last.keys(), dtype=np.int64, count=len(last))
        self._grow(int(keys.max()) + 1)
        self.rows[keys] = candidates[np.fromiter(last.values(), dtype=np.int64, count=len(last))]
        self.filled[keys] = True

    def update(self, tokens: Sequence[int], logits: torch.Tensor) -> None:
        """Rows of ``tokens`` from the target's logits after each of them (``logits[i]`` follows ``tokens[i]``)."""
        k = min(self.k, logits.shape[-1])
        top = torch.topk(logits, k, dim=-1, sorted=True).indices.to(torch.int32).cpu().numpy()
        if k < self.k:
            top = np.pad(top, ((0, 0), (0, self.k - k)), constant_values=-1)  # fewer tokens than k
        self._grow(logits.shape[-1])
        self.set_rows(tokens, top)

    def candidates(self, token: int) -> list[int]:
        """The row of ``token`` (empty when never seen)."""
        if token >= len(self.filled) or not self.filled[token]:
            return []
        return [t for t in self.rows[token].tolist() if t >= 0]


def check_tree(method: str, tree: str, topk: int) -> None:
    """A template that exists, and enough candidates per token for the deepest rank it reads."""
    if topk < 1:
        raise ValueError(f"{method}: topk must be >= 1, got {topk}")
    if tree not in TREES:
        raise ValueError(f"{method}: tree must be one of {', '.join(TREES)}, got '{tree}'")
    need = TreeTemplate(TREES[tree]).max_rank
    if need > topk:
        raise ValueError(f"{method}: tree '{tree}' reads rank {need - 1}; topk must be >= {need}")


class Recycler:
    """Token Recycling's drafting, for any method that composes it: the candidate matrix, filled from every
    verification forward, and the tree template grown from it at the root."""

    def __init__(self, vocab_size: int, topk: int, tree: str) -> None:
        self.template = TreeTemplate(TREES[tree])
        self.matrix = CandidateMatrix(vocab_size, topk)
        self.root = -1

    def clear(self) -> None:
        self.matrix.clear()

    def propose(self, root: int, max_depth: int) -> Draft | None:
        """The template filled from ``root`` (no deeper than ``max_depth``), or None when nothing is known."""
        self.root = root
        if max_depth < 1:
            return None
        tokens, parents = self.template.fill(self.matrix, root, max_depth)
        if not tokens:
            return None
        return Draft(tokens=tokens, parents=parents, sources=[SOURCE_RECYCLE] * len(tokens))

    def update(self, result: VerifyResult) -> None:
        """Every row of the forward (root, accepted and rejected guesses) refreshes its token's candidates."""
        self.matrix.update([self.root, *result.draft.tokens], result.logits)
