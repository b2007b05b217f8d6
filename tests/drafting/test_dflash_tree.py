"""DFlash's block as a best-first tree (:mod:`specbench.drafting.dflash_tree`), checked by hand on made-up
log-probabilities, and ``method=dflash``'s drafts: the tree's shape and caps, the chain's argmaxes, the sampled
chain's ``q`` (a ``q`` that lies is caught by the shared sampling check). The lossless checks of both settings
run in tests/methods/test_contract.py."""

from __future__ import annotations

import pytest
import torch

from methods.registry import build_method_config, get_method
from specbench.core.acceptance import SamplingParams
from specbench.core.decode import generate
from specbench.core.draft import SOURCE_BLOCK, DecodeState, Draft, DrafterContext
from specbench.drafting.dflash_tree import best_first, grow
from specbench.drafting.eagle_drafter import random_head
from tests.lossless import SMALL_VOCAB, BigramModel, BigramTarget, assert_sampling_preserves_distribution

LOW = -9.0  # the other tokens' log-probability


def made_up(*rows: dict[int, float]) -> torch.Tensor:
    """Each position's log-probabilities: the tokens named, every other one of 6 at LOW (exact in float32)."""
    out = torch.full((len(rows), 6), LOW)
    for k, row in enumerate(rows):
        for tok, value in row.items():
            out[k, tok] = value
    return out


def test_nodes_are_added_best_first_parents_first():
    # position 1: a -0.5, b -1.25; position 2: c -0.5, d -1 (tokens 0..3 are a, b, c, d)
    logprobs = made_up({0: -0.5, 1: -1.25}, {2: -0.5, 3: -1.0})
    tree = best_first(logprobs, nodes=6, top_k=2)
    # a -0.5, a-c -1, b -1.25, a-d -1.5, b-c -1.75, b-d -2.25
    assert tree.tokens == [0, 2, 1, 3, 2, 3]
    assert tree.parents == [-1, 0, -1, 0, 2, 2]
    assert tree.depths == [1, 2, 1, 2, 2, 2]
    assert tree.scores == [-0.5, -1.0, -1.25, -1.5, -1.75, -2.25]
    assert tree.needs == [1, 1, 2, 2, 2, 2]  # the largest rank on the path
    Draft(tokens=tree.tokens, parents=tree.parents).validate()  # parents before children, as the core needs
    assert Draft(tokens=tree.tokens, parents=tree.parents).children()[0] == [0, 2]  # siblings best first
    assert best_first(logprobs, nodes=4, top_k=2).tokens == [0, 2, 1, 3]  # the budget: the first four
    three = best_first(logprobs, nodes=100, top_k=3)  # a third token per position: LOW, last
    assert len(three.tokens) == 3 + 9 and three.scores[:6] == tree.scores and three.needs[-1] == 3


def test_ties_go_to_the_node_made_first():
    # b (-2, made as the root was expanded) and a-c (-1 + -1, made when a was added) tie: b first
    tree = best_first(made_up({0: -1.0, 1: -2.0}, {2: -1.0, 3: -3.0}), nodes=3, top_k=2)
    assert tree.tokens == [0, 1, 2] and tree.parents == [-1, -1, 0]
    tree = grow([[-0.5, -0.5]], [[7, 3]], nodes=2)  # equal siblings: in rank order (the first made first)
    assert tree.tokens == [7, 3]


def test_the_node_budget_and_the_depth_stop_the_growth():
    logprobs = made_up({0: -0.1, 1: -2.0}, {0: -0.1, 1: -2.0}, {0: -0.1, 1: -2.0})
    assert best_first(logprobs, nodes=2, top_k=2).tokens == [0, 0]  # the budget: the two best
    assert best_first(logprobs, nodes=0, top_k=2).tokens == []
    full = best_first(logprobs, nodes=100, top_k=2)
    assert len(full.tokens) == 2 + 4 + 8 and max(full.depths) == 3  # every path reached the last position
    assert best_first(logprobs[:1], nodes=100, top_k=2).depths == [1, 1]  # a depth cap: fewer positions
    assert best_first(logprobs[:0], nodes=5, top_k=2).tokens == []


def test_top_k_1_is_the_argmax_chain():
    g = torch.Generator().manual_seed(0)
    logprobs = torch.randn(7, 50, generator=g).log_softmax(-1)
    tree = best_first(logprobs, nodes=7, top_k=1)
    assert tree.tokens == logprobs.argmax(-1).tolist() and tree.parents == list(range(-1, 6))
    assert best_first(logprobs, nodes=3, top_k=1).tokens == logprobs.argmax(-1).tolist()[:3]
    assert best_first(logprobs, nodes=100, top_k=1).tokens == tree.tokens  # the depth stops it


# ---------------------------------------------------------------- method=dflash


@pytest.fixture(scope="module")
def bigram_head(tmp_path_factory):
    model = BigramModel()
    return model, str(random_head("dflash", model.config, tmp_path_factory.mktemp("dflash") / "head"))


def drafter(model, head, sampling=None, seed=0, **settings):
    config = build_method_config("dflash", {"head": head, **settings})
    return get_method("dflash")(config, vocab_size=SMALL_VOCAB, seed=seed,
                                context=DrafterContext(sampling=sampling, target_model=model))


def drafts_of(d, prompt, sampling=None, width_cap=None, depth_cap=None, n=6):
    """The drafts ``d`` proposes while generating ``n`` tokens on the bigram target (caps set as budget=auto's)."""
    seen = []
    propose = d.propose

    def capped(state):
        state.width_cap, state.depth_cap = width_cap, depth_cap
        draft = propose(state)
        seen.append(draft)
        return draft

    d.propose = capped
    generate(BigramTarget(), d, prompt, max_new_tokens=n, sampling=sampling or SamplingParams(),
             generator=torch.Generator().manual_seed(0))
    return [x for x in seen if x is not None]


def test_best_first_drafts_a_tree_within_its_caps(bigram_head):
    model, head = bigram_head
    block = drafter(model, head).block
    trees = drafts_of(drafter(model, head, tree="best_first", top_k=3, nodes=10), [1, 2, 3, 1], n=40)
    assert trees and all(len(t) == 10 and t.tree_width == 3 and not t.is_chain() for t in trees[:-3])
    assert all(max(t.depths()) <= block - 1 and max(t.needs) <= 3 for t in trees)
    capped = drafts_of(drafter(model, head, tree="best_first", top_k=3, nodes=10), [1, 2, 3, 1], width_cap=2,
                       depth_cap=2, n=40)
    assert capped and all(t.tree_width == 2 and max(t.depths()) <= 2 and max(t.needs) <= 2 for t in capped)
    chains = drafts_of(drafter(model, head), [1, 2, 3, 1], n=40)  # nodes 0: as many as the chain; top_k 1: it
    ones = drafts_of(drafter(model, head, tree="best_first", top_k=1), [1, 2, 3, 1], n=40)
    assert [c.tokens for c in chains] == [t.tokens for t in ones] and all(c.is_chain() for c in chains)
    assert all(c.draft_probs is None for c in chains)  # greedy: argmaxes, no q
    # every guess is DFlash's own source, so the site colours and labels it as DFlash's, apart from EAGLE's heads
    assert {s for d in trees + chains for s in d.sources} == {SOURCE_BLOCK}


def test_the_sampled_chain_sends_the_q_it_drew_from(bigram_head):
    model, head = bigram_head
    t1 = SamplingParams(temperature=1.0)
    drafts = drafts_of(drafter(model, head, t1), [1, 2, 3, 1], sampling=t1, n=40)
    assert drafts and all(d.is_chain() and d.draft_probs is not None for d in drafts)
    for d in drafts:
        assert d.draft_probs.shape == (len(d), SMALL_VOCAB)
        assert torch.allclose(d.draft_probs.sum(-1), torch.ones(len(d)))
        assert all(float(d.draft_probs[i, t]) > 0 for i, t in enumerate(d.tokens))
    again = drafts_of(drafter(model, head, t1), [1, 2, 3, 1], sampling=t1, n=40)
    assert [d.tokens for d in again] == [d.tokens for d in drafts]  # seeded: the same draws again
    other = drafts_of(drafter(model, head, t1, seed=1), [1, 2, 3, 1], sampling=t1, n=40)
    assert [d.tokens for d in other] != [d.tokens for d in drafts]
    tree = drafts_of(drafter(model, head, t1, tree="best_first"), [1, 2, 3, 1], sampling=t1, n=40)
    assert tree and all(d.draft_probs is None for d in tree)  # the tree's guesses: deterministic, no q


def test_a_q_that_lies_fails_the_sampling_check(bigram_head):
    """The argmaxes sent with the q of the sampled chain (as if they were drawn from it): the shared check sees
    the target's distribution broken, where the contract's run of the real chain keeps it."""
    model, head = bigram_head
    t1, seeds = SamplingParams(temperature=1.0), iter(range(10_000))
    loaded = drafter(model, head, t1)

    def lying():
        d = loaded.spawn()  # the head loaded once, each trial a twin with a seed of its own
        d.seed = next(seeds)
        propose = d.propose

        def lie(state: DecodeState):
            draft = propose(state)
            if draft is not None:
                draft.tokens = draft.draft_probs.argmax(-1).tolist()
            return draft

        d.propose = lie
        return d

    with pytest.raises(AssertionError, match="differs from the target"):
        assert_sampling_preserves_distribution(lying, t1, trials=800, extra=2)
