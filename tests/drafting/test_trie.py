"""WeightedTrie: prefix counts, REST's top-node selection and the best sequences, worked by hand."""

from specbench.drafting.trie import WeightedTrie


def _trie():
    trie = WeightedTrie()
    for seq in ([1, 2, 3], [1, 2, 4], [1, 5], [6]):
        trie.insert(seq)
    return trie


def test_weights_count_prefixes():
    trie = _trie()
    # nodes in insertion order: 1, 1-2, 1-2-3, 1-2-4, 1-5, 6
    assert len(trie) == 6
    assert [trie.path(n) for n in range(1, 7)] == [[1], [1, 2], [1, 2, 3], [1, 2, 4], [1, 5], [6]]
    assert trie.weight[1:] == [3, 2, 1, 1, 1, 1]
    trie.insert([1, 2], weight=5)
    assert trie.weight[1:3] == [8, 7]


def test_select_keeps_heaviest_nodes_parents_first():
    trie = _trie()
    # weights 3 (1), 2 (1-2), then ties of 1 broken by depth: 6 (depth 1) before 1-5 (depth 2)
    assert trie.select(1) == ([1], [-1])
    assert trie.select(3) == ([1, 2, 6], [-1, 0, -1])
    # depth-first, siblings by weight: 1, 1-2, 1-5, 6
    assert trie.select(4) == ([1, 2, 5, 6], [-1, 0, 0, -1])
    tokens, parents = trie.select(64)
    assert tokens == [1, 2, 3, 4, 5, 6]
    assert parents == [-1, 0, 1, 1, 0, -1]
    assert all(p < i for i, p in enumerate(parents))
    assert trie.select(0) == ([], [])
    assert WeightedTrie().select(5) == ([], [])


def test_select_siblings_by_weight():
    trie = WeightedTrie()
    trie.insert([7, 1])
    trie.insert([8, 1])
    trie.insert([8, 2])
    # nodes: 7 (w1), 7-1 (w1), 8 (w2), 8-1 (w1), 8-2 (w1)
    # 8 (weight 2) is tried before 7 (weight 1), though 7 was inserted first
    assert trie.select(2) == ([8, 7], [-1, -1])
    # among the weight-1 nodes of depth 2, 7-1 was inserted first
    assert trie.select(3) == ([8, 7, 1], [-1, -1, 1])
    assert trie.select(4) == ([8, 1, 7, 1], [-1, 0, -1, 2])


def test_sequences_ranked_by_path_weight():
    trie = _trie()
    # path scores: 1-2-3 = 3+2+1 = 6, 1-2-4 = 6, 1-5 = 4, 6 = 1
    assert trie.sequences(10) == [[1, 2, 3], [1, 2, 4], [1, 5], [6]]
    assert trie.sequences(2) == [[1, 2, 3], [1, 2, 4]]
    assert trie.sequences(0) == []
    trie.insert([6, 9, 9, 9], weight=2)  # 6 now weighs 3, 6-9 2, 6-9-9 2, 6-9-9-9 2: score 9
    assert trie.sequences(1) == [[6, 9, 9, 9]]
