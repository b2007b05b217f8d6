"""The static shapes of ``forward=compiled``: the widths a step's block is padded to, the pieces a prompt is
prefilled in, and the runs of layers one compiled call takes. Pure functions of counts, testable without a model.
"""

from __future__ import annotations

import functools

WIDTHS = (1, 2, 4, 8, 16, 32, 64, 128)  # the block widths compiled (more rows: the next power of two)
PIECE = WIDTHS[-1]  # prompts are prefilled in pieces of at most this many tokens
EACH = 16  # on a CPU a prefill piece costs what this many more rows do (SmolLM2 fp32: about 30 ms + 1.9 ms a row)
GROUP = 6  # at most this many layers run in one compiled call (fewer calls; a longer first compilation)


def width(q: int) -> int:
    """The padded width that ``q`` tokens run at: the next power of two up to :data:`PIECE`, past it the next
    multiple of :data:`PIECE` (a paper-sized block, compiled on its first use)."""
    return 1 << max(0, q - 1).bit_length() if q <= PIECE else -(-q // PIECE) * PIECE


@functools.cache
def pieces(n: int, each: int) -> tuple[int, ...]:
    """The pieces a prompt of ``n`` tokens is prefilled in: :data:`PIECE` tokens while more are left, then those
    of the least rows run, a piece counting as ``each`` rows more (on a tie: fewer pieces, the widest first)."""
    if n > PIECE:
        return (PIECE, *pieces(n - PIECE, each))
    ways = [(n,), *((k, *pieces(n - k, each)) for k in WIDTHS if k < n)]
    return min(ways, key=lambda way: (sum(each + width(k) for k in way), len(way), -way[0]))


def groups(layers: int, most: int = GROUP) -> list[range]:
    """The layers cut into runs of nearly equal length, at most ``most`` each (so at most two lengths, and two
    compiled graphs a shape)."""
    count = -(-layers // most)
    cuts = [layers * i // count for i in range(count + 1)]
    return [range(a, b) for a, b in zip(cuts, cuts[1:], strict=False)]
