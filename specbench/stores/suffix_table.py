"""A suffix table in numpy, for when tokengrams is not installed (it ships no wheel for Python 3.12 and later).

It reads and writes the files tokengrams does: ``index.bin`` is the corpus's suffix table as little-endian u64
positions, suffixes in token order (a suffix before every longer one it begins), so a store built by either
opens with the other. Building sorts by prefix doubling (O(n log² n) in numpy); a lookup is a binary search
from Python, several times slower than tokengrams' Rust. The datastore uses tokengrams when it can import it
(:func:`specbench.stores.datastore._index_module`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np


def suffix_table(tokens: np.ndarray) -> np.ndarray:
    """The suffix table of ``tokens``: start positions sorted by the suffix that begins there."""
    n = len(tokens)
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    rank = np.asarray(tokens, dtype=np.int64)
    k = 1
    while True:
        second = np.full(n, -1, dtype=np.int64)  # a suffix that ends sorts before any that goes on
        second[: n - k] = rank[k:] if k < n else second[:0]
        order = np.lexsort((second, rank))
        key_first, key_second = rank[order], second[order]
        new = np.empty(n, dtype=np.int64)
        changes = np.ones(n, dtype=bool)
        changes[1:] = (key_first[1:] != key_first[:-1]) | (key_second[1:] != key_second[:-1])
        new[order] = np.cumsum(changes) - 1
        rank = new
        if changes.all() or k >= n:
            return order.astype(np.uint64)
        k *= 2


class MemmapIndex:
    """tokengrams' ``MemmapIndex``, the part the datastore uses: :meth:`build` and :meth:`positions`."""

    def __init__(self, tokens_path: str, index_path: str, vocab: int) -> None:
        self.dtype = np.dtype("<u2") if vocab <= 2**16 else np.dtype("<u4")
        self.tokens = np.memmap(tokens_path, dtype=self.dtype, mode="r") if Path(tokens_path).stat().st_size else \
            np.zeros(0, dtype=self.dtype)
        self.table = np.memmap(index_path, dtype="<u8", mode="r") if Path(index_path).stat().st_size else \
            np.zeros(0, dtype="<u8")

    @staticmethod
    def build(tokens_path: str, index_path: str, vocab: int, verbose: bool = False) -> None:  # noqa: ARG004
        dtype = np.dtype("<u2") if vocab <= 2**16 else np.dtype("<u4")
        suffix_table(np.fromfile(tokens_path, dtype=dtype)).astype("<u8").tofile(index_path)

    def _compare(self, start: int, query: list[int]) -> int:
        """-1, 0 or 1: the suffix at ``start`` cut to the query's length, against the query."""
        piece = self.tokens[start : start + len(query)].tolist()
        if piece == query:
            return 0
        return -1 if piece < query else 1

    def positions(self, query: Sequence[int]) -> list[int]:
        """Where ``query`` occurs, in suffix-table order."""
        query = [int(t) for t in query]
        lo, hi = 0, len(self.table)
        while lo < hi:  # the first suffix not below the query
            mid = (lo + hi) // 2
            if self._compare(int(self.table[mid]), query) < 0:
                lo = mid + 1
            else:
                hi = mid
        first, hi = lo, len(self.table)
        while lo < hi:  # the first suffix above it
            mid = (lo + hi) // 2
            if self._compare(int(self.table[mid]), query) <= 0:
                lo = mid + 1
            else:
                hi = mid
        return [int(p) for p in self.table[first:lo]]
