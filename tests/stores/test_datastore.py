"""The token datastore: suffix search on hand-made streams, document separators, disk round trip,
vocabularies above 65,535, tokenizer identity."""

import json

import numpy as np
import pytest

from specbench.drafting.retrieval import retrieval_guesses, retrieval_tree
from specbench.errors import ConfigError
from specbench.stores.datastore import Datastore, prompt_hash, tokenizer_identity, write_store

IDENT10 = {"name": "hand", "vocab_size": 10, "vocab_sha256": "x" * 64}
DOCS = [[1, 2, 3, 4], [2, 3, 5], [1, 2, 3, 6, 7]]


@pytest.fixture
def store(tmp_path):
    return write_store(tmp_path / "s", DOCS, tokenizer=IDENT10, source={"kind": "hand"}, n_bytes=123,
                       progress=False)


def test_layout_and_meta(store):
    # 1 2 3 4 S 2 3 5 S 1 2 3 6 7 with S = 10 (one past the vocabulary)
    assert store.tokens.tolist() == [1, 2, 3, 4, 10, 2, 3, 5, 10, 1, 2, 3, 6, 7]
    assert store.dtype == np.dtype("<u2")
    meta = store.meta
    assert (meta["tokens"], meta["documents"], meta["bytes"], meta["separator"]) == (14, 3, 123, 10)
    assert meta["tokenizer"] == IDENT10 and meta["source"] == {"kind": "hand"}
    assert len(meta["fingerprint"]) == 64 and meta["build_seconds"] >= 0
    assert [d.tolist() for d in store.documents()] == DOCS


def test_longest_suffix_first(store):
    # [9 1 2 3] and [1 2 3] ... : 9 never occurs, so the longest suffix found is [1 2 3] (at 0 and 9);
    # continuations in suffix-table order (4 < 6), the first cut at the separator
    assert store.match([9, 1, 2, 3]) == (3, [0, 9])
    assert store.search([9, 1, 2, 3], max_occurrences=10) == [(4,), (6, 7)]
    # [0 2 3] is absent, [2 3] occurs three times
    assert store.search([0, 2, 3], max_occurrences=10) == [(4,), (5,), (6, 7)]
    assert store.search([0, 2, 3], max_occurrences=10, max_continuation=1) == [(4,), (5,), (6,)]
    # a cap takes an even stride over the suffix-table range: indices 0 and 1 of 3
    assert store.search([0, 2, 3], max_occurrences=2) == [(4,), (5,)]
    assert store.search([0, 2, 3], max_occurrences=1) == [(4,)]
    # max_suffix bounds the suffix: [1 2 3] is not tried with max_suffix=2
    assert store.match([1, 2, 3], max_suffix=2) == (2, [1, 5, 10])


def test_min_suffix_and_no_match(store):
    assert store.search([7, 2], max_occurrences=10) == []  # [7 2] never occurs, [2] is below min_suffix
    assert store.search([7, 2], max_occurrences=10, min_suffix=1) == [(3, 4), (3, 5), (3, 6, 7)]
    assert store.search([], max_occurrences=10) == []
    assert store.search([7], max_occurrences=10) == []
    assert store.search([6, 7], max_occurrences=10) == []  # occurs, but at the very end: nothing follows


def test_never_across_documents(store):
    # 4 is followed by a separator then 2: [4 2] must not match
    assert store.match([4, 2]) == (0, [])
    # 5 S 1: [5 1] must not match either
    assert store.search([5, 1], max_occurrences=10) == []
    # a separator id (or any id past the vocabulary) in the context cuts the suffix there
    assert store.match([1, 2, 3, 10, 2, 3]) == (2, [1, 5, 10])
    assert store.match([1, 2, 3, 99, 2, 3]) == (2, [1, 5, 10])


def test_round_trip(store, tmp_path):
    again = Datastore.load(tmp_path / "s")
    assert again.meta == store.meta
    assert again.tokens.tolist() == store.tokens.tolist()
    assert again.search([0, 2, 3], max_occurrences=10) == [(4,), (5,), (6, 7)]
    on_disk = json.loads((tmp_path / "s" / "meta.json").read_text())
    assert on_disk["fingerprint"] == store.meta["fingerprint"]
    # same documents, same fingerprint; other documents, another
    twin = write_store(tmp_path / "t", DOCS, tokenizer=IDENT10, source={}, progress=False)
    other = write_store(tmp_path / "u", DOCS[:2], tokenizer=IDENT10, source={}, progress=False)
    assert twin.meta["fingerprint"] == store.meta["fingerprint"] != other.meta["fingerprint"]
    # rewriting a store replaces it
    write_store(tmp_path / "s", DOCS[:1], tokenizer=IDENT10, source={}, progress=False)
    assert Datastore.load(tmp_path / "s").tokens.tolist() == [1, 2, 3, 4]


def test_missing_store_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"no datastore at .*make datastore MODEL=m SOURCE=x") as err:
        Datastore.load(tmp_path / "nothing", hint="make datastore MODEL=m SOURCE=x")
    assert "\n" not in str(err.value)


def test_vocabulary_above_65535(tmp_path):
    ident = {"name": "big", "vocab_size": 262_144, "vocab_sha256": "y" * 64}
    docs = [[70_000, 200_000, 5, 262_143], [1, 70_000, 200_000, 131_072], [65_536, 65_535]]
    s = write_store(tmp_path / "big", docs, tokenizer=ident, source={}, progress=False)
    assert s.dtype == np.dtype("<u4") and s.separator == 262_144
    assert [d.tolist() for d in Datastore.load(tmp_path / "big").documents()] == docs
    # 70000 200000 would be 4464 3392 after a wrap to 16 bits: check nothing wrapped
    assert s.search([9, 70_000, 200_000], max_occurrences=10) == [(5, 262_143), (131_072,)]
    assert s.search([4464, 3392], max_occurrences=10) == []
    assert s.search([65_536, 65_535], max_occurrences=10) == []  # at the end: nothing follows
    assert s.search([262_143, 65_536], max_occurrences=10) == []  # across documents
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        write_store(tmp_path / "bad", [[262_144]], tokenizer=ident, source={}, progress=False)


def test_tokenizer_identity_and_mismatch(tmp_path):
    from specbench.models import build_tiny_tokenizer

    a, b = build_tiny_tokenizer(128), build_tiny_tokenizer(130)
    ia, ib = tokenizer_identity(a, "tiny-a"), tokenizer_identity(b, "tiny-b")
    assert ia["vocab_size"] == 128 and ib["vocab_size"] == 130
    assert ia == tokenizer_identity(build_tiny_tokenizer(128), "tiny-a")
    assert ia["vocab_sha256"] != ib["vocab_sha256"]
    write_store(tmp_path / "s", [a.encode("hello world")], tokenizer=ia, source={}, progress=False)
    assert Datastore.load(tmp_path / "s", a).meta["tokenizer"]["name"] == "tiny-a"
    with pytest.raises(ConfigError, match=r"built for tokenizer tiny-a \(vocab 128\), not for .* \(vocab 130\)") as err:
        Datastore.load(tmp_path / "s", b, hint="make datastore MODEL=tiny-b SOURCE=stdlib")
    assert "\n" not in str(err.value) and "make datastore MODEL=tiny-b" in str(err.value)


def test_retrieval_guesses_and_tree(tmp_path):
    # after [1 2]: 3 4 (x3), 3 5 (x1), 9 (x1)
    docs = [[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9]]
    s = write_store(tmp_path / "g", docs, tokenizer=IDENT10, source={}, progress=False)
    # trie: 3 (4), 3-4 (3), 3-5 (1), 9 (1); path scores 3-4: 7, 3-5: 5, 9: 1
    assert retrieval_guesses(s, [0, 1, 2], max_guesses=5, max_occurrences=10) == [[3, 4], [3, 5], [9]]
    assert retrieval_guesses(s, [0, 1, 2], max_guesses=1, max_occurrences=10) == [[3, 4]]
    assert retrieval_tree(s, [0, 1, 2], max_nodes=2, max_occurrences=10) == ([3, 4], [-1, 0])
    assert retrieval_tree(s, [0, 1, 2], max_nodes=64, max_occurrences=10) == ([3, 4, 5, 9], [-1, 0, 0, -1])
    assert retrieval_guesses(s, [7, 7], max_guesses=5, max_occurrences=10) == []


def test_prompt_hash_ignores_surrounding_space():
    assert prompt_hash(" What is 2+2?\n") == prompt_hash("What is 2+2?") != prompt_hash("What is 2+3?")


def test_resolve_and_check_store(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    from specbench.stores.naming import check_store, resolve_store

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    model = OmegaConf.create({"name": "tiny-llama"})
    assert resolve_store("stdlib", model) == tmp_path / "cache" / "datastores" / "tiny-llama" / "stdlib"
    assert resolve_store("stdlib", model, refined=True).name == "stdlib-refined"
    assert resolve_store(str(tmp_path / "mine"), model) == tmp_path / "mine"
    with pytest.raises(ConfigError, match=r"no datastore at .*`make datastore MODEL=tiny-llama SOURCE=stdlib`$"):
        check_store("stdlib", model)
    with pytest.raises(ConfigError, match=r"`make datastore-refine MODEL=tiny-llama STORE=stdlib`$"):
        check_store("stdlib", model, refined=True)
    with pytest.raises(ConfigError, match=r"specbench datastore build --model tiny-llama .*--out"):
        check_store(str(tmp_path / "mine"), model)
    write_store(resolve_store("stdlib", model), DOCS, tokenizer=IDENT10, source={}, progress=False)
    assert check_store("stdlib", model) == resolve_store("stdlib", model)
