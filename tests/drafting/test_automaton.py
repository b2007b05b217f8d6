"""The suffix automaton (specbench/drafting/automaton.py) against brute-force longest matches on random token streams."""

from __future__ import annotations

import random

import pytest

from specbench.drafting.automaton import SEPARATOR, SuffixAutomaton


def brute_dynamic(tokens: list[int], n: int) -> tuple[int, list[int]]:
    """Longest suffix of ``tokens`` that also ends earlier, and what followed its first occurrence."""
    size = len(tokens)
    for m in range(size - 1, 0, -1):
        tail = tokens[size - m :]
        for end in range(m - 1, size - 1):  # occurrences ending before the last token
            if tokens[end - m + 1 : end + 1] == tail:
                return m, tokens[end + 1 : end + 1 + n]
    return 0, []


def brute_static(docs: list[list[int]], context: list[int], n: int) -> tuple[int, list[int]]:
    """Longest suffix of ``context`` inside one document, and what followed its first occurrence."""
    text: list[int] = []
    for i, d in enumerate(docs):
        text += ([SEPARATOR] if i else []) + d
    for m in range(len(context), 0, -1):
        tail = context[len(context) - m :]
        for end in range(m - 1, len(text)):
            if text[end - m + 1 : end + 1] == tail:
                cont = text[end + 1 : end + 1 + n]
                return m, cont[: cont.index(SEPARATOR)] if SEPARATOR in cont else cont
    return 0, []


def test_hand_worked_dynamic_match():
    sam = SuffixAutomaton()
    sam.extend([1, 2, 3, 1, 2])  # [1, 2] ended first at index 1; 3, 1, 2 followed
    assert sam.match_len == 2 and sam.continuation(5) == [3, 1, 2]
    sam.extend([4])  # [1, 2, 4] and [2, 4], [4] never occurred before
    assert sam.match_len == 0 and sam.continuation(5) == []
    sam.extend([1, 2, 3])
    assert sam.match_len == 3 and sam.continuation(2) == [1, 2]


@pytest.mark.parametrize("alphabet", [2, 3, 5, 40])
def test_dynamic_match_agrees_with_brute_force(alphabet):
    rng = random.Random(alphabet)
    for _ in range(60):
        sam = SuffixAutomaton()
        tokens: list[int] = []
        for _ in range(rng.randrange(1, 80)):
            chunk = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 4))]
            sam.extend(chunk)
            tokens += chunk
            m, cont = brute_dynamic(tokens, 6)
            assert (sam.match_len, sam.continuation(6)) == (m, cont), tokens
        assert sam.n_states <= max(2 * len(tokens) - 1, 1) + 1  # a suffix automaton has < 2n states


@pytest.mark.parametrize("alphabet", [2, 4, 30])
def test_static_match_agrees_with_brute_force(alphabet):
    rng = random.Random(100 + alphabet)
    for _ in range(40):
        docs = [[rng.randrange(alphabet) for _ in range(rng.randrange(0, 30))] for _ in range(rng.randrange(1, 4))]
        sam = SuffixAutomaton().build(docs)
        context: list[int] = []
        for _ in range(rng.randrange(1, 50)):
            tok = rng.randrange(alphabet + 1)  # sometimes a token no document has
            sam.advance(tok)
            context.append(tok)
            m, cont = brute_static(docs, context, 5)
            assert sam.match_len == m, (docs, context)
            assert sam.continuation(5) == cont, (docs, context)
        sam.reset_match()
        assert sam.match_len == 0 and sam.continuation(3) == []


def test_matches_never_cross_documents():
    sam = SuffixAutomaton().build([[1, 2], [3, 4]])
    for tok in [2, 3]:
        sam.advance(tok)
    assert sam.match_len == 1 and sam.continuation(4) == [4]  # "2 3" spans the separator: only "3" matches
    sam.reset_match()
    sam.advance(2)
    assert sam.continuation(4) == []  # document end
