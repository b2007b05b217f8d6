"""The numpy suffix table (used where tokengrams has no wheel) writes tokengrams' own index and finds the same
positions, so a store built by either opens with the other."""

import numpy as np
import pytest

from specbench.stores import datastore, suffix_table
from specbench.stores.datastore import Datastore, write_store


def corpora():
    gen = np.random.default_rng(0)
    yield np.array([3, 1, 2, 3, 1, 2, 5, 0, 3, 1], dtype="<u2"), 6
    yield gen.integers(0, 4, 300).astype("<u2"), 5  # many repeats: long equal prefixes
    yield gen.integers(0, 70_000, 200).astype("<u4"), 70_001  # a vocabulary past u16


def test_the_table_sorts_suffixes_shorter_first():
    tokens = np.array([2, 1, 2, 1], dtype="<u2")
    table = suffix_table.suffix_table(tokens).tolist()
    assert [tokens[p:].tolist() for p in table] == sorted(tokens[p:].tolist() for p in range(4))
    assert table == [3, 1, 2, 0]  # [1] before [1, 2, 1]


@pytest.mark.parametrize("case", range(3))
def test_it_writes_tokengrams_index_and_finds_its_positions(case, tmp_path):
    tokengrams = pytest.importorskip("tokengrams")  # the reference (installed below Python 3.12)
    tokens, vocab = list(corpora())[case]
    tokens.tofile(tmp_path / "t.bin")
    tokengrams.MemmapIndex.build(str(tmp_path / "t.bin"), str(tmp_path / "ref.bin"), vocab=vocab, verbose=False)
    suffix_table.MemmapIndex.build(str(tmp_path / "t.bin"), str(tmp_path / "ours.bin"), vocab=vocab)
    assert (tmp_path / "ours.bin").read_bytes() == (tmp_path / "ref.bin").read_bytes()
    ref = tokengrams.MemmapIndex(str(tmp_path / "t.bin"), str(tmp_path / "ref.bin"), vocab=vocab)
    ours = suffix_table.MemmapIndex(str(tmp_path / "t.bin"), str(tmp_path / "ours.bin"), vocab=vocab)
    queries = [tokens[i : i + n].tolist() for i in range(0, len(tokens) - 4, 7) for n in (1, 2, 4)]
    queries += [[int(vocab - 1)] * 3, [int(tokens[0]), int(vocab - 1)]]  # absent ones
    for q in queries:
        assert ours.positions(q) == ref.positions(q), q


def test_a_store_is_built_and_searched_without_tokengrams(tmp_path, monkeypatch):
    docs = [[5, 6, 7, 8, 9], [1, 5, 6, 7, 2], [5, 6, 3]]
    ident = {"name": "t", "vocab_size": 16, "vocab_sha256": "0" * 64}
    monkeypatch.setattr(datastore, "_tokengrams", lambda: suffix_table)
    store = Datastore.load(write_store(tmp_path / "s", docs, tokenizer=ident, source={}, progress=False).path)
    assert store.search([0, 5, 6], max_occurrences=8, max_continuation=3) == [(3,), (7, 2), (7, 8, 9)]
    assert store.search([0, 5, 6, 7], max_occurrences=8, max_continuation=2) == [(2,), (8, 9)]
    assert store.search([4, 4], max_occurrences=8) == []
