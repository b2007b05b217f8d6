"""A draft model's forward as graphs (specbench/drafting/draft_graph.py), rehearsed on this CPU.

The graphed draft must feed what the eager one feeds (logits and hidden states, a self-draft's kept layers and
a whole model, short blocks, a block past a graph's widest, every position, after a crop), keep nothing a
replay overwrites, take its cache buffer again for a later draft, and draft the chains the eager draft drafts,
so greedy output stays autoregressive decoding's.
"""

from __future__ import annotations

import gc

import pytest
import torch

from methods.sps import SpeculativeSampling, SpSConfig
from specbench.core.decode import generate
from specbench.core.draft import DecodeState, Drafter, DrafterContext
from specbench.core.engine import PIECE
from specbench.core.forward import Target
from specbench.drafting.draft_lm import DraftLM
from tests.core.test_engine import PROMPT, VOCAB, build

LONG = [i % (VOCAB - 1) + 1 for i in range(PIECE + 11)]  # past a graph's widest block: fed in pieces


@pytest.fixture(scope="module")
def model():
    return build(layers=3)


@pytest.mark.parametrize("layers", [None, [0, 2]], ids=["whole", "self-draft"])
def test_a_graphed_draft_feeds_what_the_eager_one_feeds(model, layers):
    eager, graphed = DraftLM(model, layers), DraftLM(model, layers, graphs=True)
    assert graphed.graphed is not None and eager.graphed is None
    with torch.inference_mode():
        for block, every in ((PROMPT, False), ([5], False), ([7, 8, 9], False), (LONG, False), ([4, 5, 6], True),
                             ("crop", False), ([3], False)):
            if block == "crop":  # rejected guesses dropped: both continue from a shorter prefix
                block = graphed.crop_to(graphed.tokens[:10] + [1, 2])
                assert eager.crop_to(eager.tokens[:10] + [1, 2]) == block
            want, got = eager.forward(block, every), graphed.forward(block, every)
            for a, b in zip(want, got, strict=True):
                torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
    assert graphed.graphed.engine._graphs, "no block ran as a graph"
    assert graphed.rows.cache.lengths == eager.rows.cache.lengths and graphed.tokens == eager.tokens


def test_what_a_graphed_draft_hands_out_survives_the_next_replay(model):
    lm = DraftLM(model, [0, 1], graphs=True)
    with torch.inference_mode():
        lm.forward(PROMPT)
        logits, hidden = lm.forward([5, 6])
        kept = logits.clone(), hidden.clone()
        for graph in lm.graphed.engine._graphs.values():
            graph.poison()
    assert torch.equal(logits, kept[0]) and torch.equal(hidden, kept[1])


def test_a_later_twin_takes_the_buffer_of_one_that_has_gone(model):
    lm = DraftLM(model, [0, 1], graphs=True)
    store = lambda d: d.rows.cache.stores[d.graphed.engine.device].data_ptr()  # noqa: E731
    twin = lm.twin()
    mine, theirs = store(lm), store(twin)
    assert twin.rows is not lm.rows and theirs != mine  # under graphs a twin's cache is its own
    del twin
    gc.collect()
    lm.reset()  # a new request: the same buffer, emptied
    assert store(lm.twin()) == theirs and store(lm) == mine and lm.rows.cache.lengths == [0]


@pytest.mark.parametrize("layers", [None, [1]], ids=["whole", "self-draft"])
def test_greedy_chains_under_graphs_are_the_eager_chains_and_output_stays_autoregressive(model, layers):
    def drafter(graphs: bool) -> SpeculativeSampling:
        context = DrafterContext(target_model=model, target_name="tiny", graphs=graphs)
        skip = [i for i in range(3) if i not in layers] if layers else None
        return SpeculativeSampling(SpSConfig(self_skip_layers=skip, self_first_layers=None if skip else 3, k=4),
                                   vocab_size=VOCAB, context=context)

    eager, graphed = drafter(False), drafter(True)
    assert graphed.lm.graphed is not None
    tokens = list(PROMPT)
    for d in (eager, graphed):
        d.start(PROMPT)
    for step in range(6):  # the same committed tokens each step: the same chain
        state = DecodeState(tokens=list(tokens), prompt_len=len(PROMPT), max_new_tokens=100)
        a, b = eager.propose(state), graphed.propose(state)
        assert a.tokens == b.tokens and len(b.tokens) == 4, step
        tokens += a.tokens[: step % 3] + [(step * 7) % (VOCAB - 1) + 1]  # some accepted, then a correction
    target = Target(model)
    ar = generate(target, Drafter(vocab_size=0), PROMPT, max_new_tokens=30).output_ids
    assert generate(target, drafter(True), PROMPT, max_new_tokens=30).output_ids == ar


def test_a_sampled_chain_under_graphs_is_the_eager_chain_and_keeps_its_q(model):
    """Sampling: the same seed draws the same chain through graphed feeds as through eager ones, and the ``q``
    rows the draft carries survive the graphs' next replay (here a poisoning)."""
    from specbench.core.acceptance import SamplingParams

    drafts = []
    for graphs in (False, True):
        context = DrafterContext(target_model=model, target_name="tiny", graphs=graphs,
                                 sampling=SamplingParams(temperature=1.0))
        d = SpeculativeSampling(SpSConfig(self_skip_layers=[1], k=4), vocab_size=VOCAB, seed=5, context=context)
        d.start(PROMPT)
        with torch.inference_mode():
            draft = d.propose(DecodeState(tokens=[*PROMPT, 7], prompt_len=len(PROMPT), max_new_tokens=50))
            kept = draft.draft_probs.clone()
            if graphs:
                for graph in d.lm.graphed.engine._graphs.values():
                    graph.poison()
        assert torch.equal(draft.draft_probs, kept)
        drafts.append(draft)
    assert drafts[0].tokens == drafts[1].tokens and len(drafts[1].tokens) == 4
    torch.testing.assert_close(drafts[1].draft_probs, drafts[0].draft_probs, atol=1e-5, rtol=1e-4)
