"""A DFlash step as one graph (specbench/drafting/dflash_graph.py), rehearsed on this CPU.

The graphed step must give the eager network's logits on every step of a text (new context rows of every
count, padded), hand out nothing a replay overwrites, take its buffers again for a later request, and hand the
context to the eager network when the buffers are full, the drafts staying the eager drafter's.
"""

from __future__ import annotations

import gc

import pytest
import torch

from methods.dflash import DFlash, DFlashConfig
from specbench.core.decode import generate
from specbench.core.draft import DecodeState, Drafter, DrafterContext, VerifyResult
from specbench.core.forward import Target
from specbench.drafting.dflash_graph import DFlashGraphs
from specbench.drafting.eagle_drafter import random_head
from tests.core.test_engine import PROMPT, VOCAB, build


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    model = build(layers=4)
    head = str(random_head("dflash", model.config, tmp_path_factory.mktemp("dflash") / "head"))
    return model, head


def drafter(setup, graphs: bool, block: int = 5) -> DFlash:
    model, head = setup
    context = DrafterContext(target_model=model, target_name="tiny", graphs=graphs)
    return DFlash(DFlashConfig(head=head, block=block), vocab_size=VOCAB, context=context)


def drafts(d: DFlash, model, steps: int, keep_graphs_poisoned: bool = False) -> list[list[int]]:
    """Each step's chain for a text the steps extend by 1-4 tokens (what the target 'accepted'),
    the target's tapped states handed over as a decode loop hands them."""
    target = Target(model)
    cache = target.new_cache(1, limit=400)
    d.start(PROMPT)
    target.prefill(PROMPT, cache, features=d.feature_layers)
    d.prefilled(target.features)
    tokens, out = [*PROMPT, 7], []  # the root last
    with torch.inference_mode():
        for step in range(steps):
            draft = d.propose(DecodeState(tokens=list(tokens), prompt_len=len(PROMPT), max_new_tokens=1000))
            if keep_graphs_poisoned and d.graphs is not None:
                for graph in d.graphs.graphs.values():
                    graph.poison()
            out.append(draft.tokens)
            new = [(step * 5 + i) % (VOCAB - 1) + 1 for i in range(1 + step % 4)]  # accepted guesses, the bonus
            target.prefill([tokens[-1], *new[:-1]], cache, features=d.feature_layers)  # the verified positions
            d.update(VerifyResult(accepted_nodes=[], tokens=new, draft=draft, features=target.features))
            tokens += new
    return out


def test_the_graphed_step_drafts_what_the_eager_one_drafts_and_keeps_nothing_a_replay_overwrites(setup):
    model, _ = setup
    eager, graphed = drafter(setup, False), drafter(setup, True)
    assert graphed.graphs is not None and eager.graphs is None
    want = drafts(eager, model, 10)
    got = drafts(graphed, model, 10, keep_graphs_poisoned=True)
    assert got == want
    assert graphed.graphs.graphs and graphed.static is not None and graphed.static.length == eager.context.length


def test_a_full_buffer_hands_the_context_to_the_eager_network(setup):
    model, _ = setup
    eager, graphed = drafter(setup, False), drafter(setup, True)
    small = DFlashGraphs(graphed.net, graphed.embed, graphed.lm_head, capacity=40)
    graphed.graphs, graphed.static = small, small.new_context()
    want, got = drafts(eager, model, 12), drafts(graphed, model, 12)
    assert got == want
    assert graphed.static is None and graphed.context.length == eager.context.length  # eager since it filled


def test_a_later_request_takes_the_buffers_again(setup):
    d = drafter(setup, True)
    twin = d.spawn()
    theirs = twin.static.keys[0].data_ptr()
    assert theirs != d.static.keys[0].data_ptr()
    del twin
    gc.collect()
    assert d.spawn().static.keys[0].data_ptr() == theirs


def test_greedy_output_under_graphs_is_autoregressive(setup):
    model, _ = setup
    target = Target(model)
    ar = generate(target, Drafter(vocab_size=0), PROMPT, max_new_tokens=30).output_ids
    d = drafter(setup, True)
    assert generate(target, d, PROMPT, max_new_tokens=30).output_ids == ar and d.graphs.graphs


def test_a_sampled_block_under_graphs_keeps_its_q_when_the_graph_is_replayed(setup):
    """Sampling: the same seed draws the same guesses from the graphed step as from the eager one, and the ``q``
    the draft carries is its own (a later replay, here a poisoning, leaves it unchanged)."""
    from specbench.core.acceptance import SamplingParams

    model, head = setup
    made = []
    for graphs in (False, True):
        context = DrafterContext(target_model=model, target_name="tiny", graphs=graphs,
                                 sampling=SamplingParams(temperature=1.0))
        made.append(DFlash(DFlashConfig(head=head, block=5), vocab_size=VOCAB, seed=3, context=context))
    target = Target(model)
    out = []
    with torch.inference_mode():
        for d in made:
            cache = target.new_cache(1, limit=100)
            d.start(PROMPT)
            target.prefill(PROMPT, cache, features=d.feature_layers)
            d.prefilled(target.features)
            draft = d.propose(DecodeState(tokens=[*PROMPT, 7], prompt_len=len(PROMPT), max_new_tokens=50))
            kept = draft.draft_probs.clone()
            for graph in (d.graphs.graphs.values() if d.graphs else []):
                graph.poison()
            assert torch.equal(draft.draft_probs, kept)
            out.append(draft)
    assert out[0].tokens == out[1].tokens
    torch.testing.assert_close(out[1].draft_probs, out[0].draft_probs, atol=1e-5, rtol=1e-4)
