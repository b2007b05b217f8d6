"""EAGLE-2's tree grown on the device draws what the host's tree draws: the same tokens, parents and needs, in the
same order, ties included, for batches whose rows differ in top-k and depth."""

from __future__ import annotations

import random

import pytest
import torch

from specbench.drafting.device_tree import ancestors, grow_on_device
from specbench.drafting.dynamic_tree import grow_rows, rerank


def made_up(seed: int, rows: int, vocab: int, coarse: int):
    """Root log-probabilities [rows, V] and a child table [rows, level, parent token, V]: a node's children depend
    on its row, depth and token. ``coarse`` > 0 rounds the logits to 1/coarse, so scores tie often."""
    g = torch.Generator().manual_seed(seed)

    def logprobs(*shape):
        x = torch.randn(*shape, generator=g)
        return torch.log_softmax((x * coarse).round() / coarse if coarse else x, -1)

    return logprobs(rows, vocab), logprobs(rows, 8, vocab, vocab)


def both(seed: int, rows: int, vocab: int, depths: list[int], top_ks: list[int], nodes: int, coarse: int):
    roots, table = made_up(seed, rows, vocab, coarse)

    def on_host(live, levels, trees):
        return [torch.stack([table[r, trees[j].depths[i], trees[j].tokens[i]] for i in level])
                for j, (r, level) in enumerate(zip(live, levels, strict=True))]

    width, calls = max(top_ks), []

    def on_device(level, parent_slots, tokens):
        calls.append((level, tokens.shape))
        return table[torch.arange(rows)[:, None], level + 1, tokens].reshape(rows * width, vocab)

    host = [rerank(tree, nodes) for tree in grow_rows(list(roots), on_host, depths=depths, top_ks=top_ks)]
    device = grow_on_device(roots, on_device, depths=depths, top_ks=top_ks, nodes=nodes)
    assert calls == [(j, (rows, width)) for j in range(max(depths) - 1)]  # fixed shapes, one call a level
    return [(tokens, parents, needs) for tokens, parents, _, needs in host], device


@pytest.mark.parametrize("seed", range(60))
def test_the_device_tree_is_the_host_tree(seed):
    rnd = random.Random(seed)
    rows, vocab = rnd.randint(1, 3), rnd.randint(3, 30)
    top_ks = [rnd.randint(1, min(6, vocab)) for _ in range(rows)]
    depths = [rnd.randint(1, 5) for _ in range(rows)]
    host, device = both(seed, rows, vocab, depths, top_ks, rnd.randint(1, 40), rnd.choice([0, 1, 2]))
    assert device == host


def test_a_tie_goes_to_the_candidate_made_first():
    """Every log-probability equal: the first level keeps topk's order, and the best children are the first made."""
    roots = torch.zeros(1, 4).log_softmax(-1)
    flat = torch.zeros(4).log_softmax(-1)
    drafts = grow_on_device(roots, lambda level, slots, tokens: flat.expand(tokens.numel(), -1), depths=[2],
                            top_ks=[2], nodes=4)
    host = rerank(grow_rows([roots[0]], lambda live, levels, trees: [flat.expand(len(levels[0]), -1)], depths=[2],
                            top_ks=[2])[0], 4)
    assert drafts == [(host[0], host[1], host[3])]
    assert drafts[0][1] == [-1, -1, 0, 0]  # both root children, then the first one's two children


def test_a_node_sees_its_ancestors_and_no_cousin():
    """Level 2 of a top-2 tree: node 0 descends from level 1's node 1, itself from level 0's node 0; node 1 from
    level 1's node 0, from level 0's node 1."""
    level1 = ancestors(torch.zeros(1, 2, 0, dtype=torch.bool), torch.tensor([[0, 1]]), 2)
    assert level1.tolist() == [[[True, False], [False, True]]]
    level2 = ancestors(level1, torch.tensor([[1, 0]]), 2)
    assert level2.int().tolist() == [[[0, 1, 0, 1], [1, 0, 1, 0]]]


def test_graphed_head_buffers_are_taken_again_and_a_tree_past_them_is_left_eager():
    from specbench.drafting.head_graph import TreeGraphs

    trees = TreeGraphs(1, 2, 10, torch.float32, torch.device("cpu"))
    cache = trees.new_cache()
    keys = cache.keys.data_ptr()
    cache.length = 6
    assert trees.fits(cache, 2, 2) and not trees.fits(cache, 2, 3)  # 6 + 3 levels × 2 nodes > 10 entries
    del cache  # an ended request's buffers go back for the next one
    assert trees.new_cache().keys.data_ptr() == keys
