"""A batch's sampling acceptance decided for all rows on the device decides what each row decides alone."""

from __future__ import annotations

import random

import pytest
import torch

from specbench.core.acceptance import (
    SamplingParams,
    _draw,
    _draw_rows,
    accept,
    accept_rows,
    sample,
    sample_rows,
)
from specbench.core.draft import Draft

V = 40


def random_tree(rng: random.Random, logits: torch.Tensor | None = None) -> Draft:
    """Guesses drawn mostly from the target's likely tokens (so that walks go deep), sometimes repeated."""
    n = rng.choice([0, 1, 3, 6, 10])
    tokens, parents = [], []
    for i in range(n):
        tokens.append(rng.randrange(6) if rng.random() < 0.8 else rng.randrange(V))
        parents.append(rng.randrange(-1, i))
    return Draft(tokens=tokens, parents=parents, sources=["x"] * n)


def random_chain(rng: random.Random) -> Draft:
    n = rng.choice([0, 1, 2, 5])
    q = torch.softmax(peaked_logits(rng, n), -1) if n else None
    tokens = [int(torch.multinomial(q[i], 1)) for i in range(n)] if n else []
    return Draft.chain(tokens, "m", draft_probs=q)


def peaked_logits(rng: random.Random, rows: int) -> torch.Tensor:
    logits = torch.randn(rows, V)
    logits[:, :6] += 3.0  # the tokens guesses are drawn from: acceptances happen, several levels deep
    return logits


PARAMS = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=8),
          SamplingParams(temperature=1.3, top_p=0.8)]


@pytest.mark.parametrize("params", PARAMS, ids=["T1", "topk", "topp"])
@pytest.mark.parametrize("kind", ["trees", "chains_with_q", "mixed"])
def test_each_row_decides_as_it_decides_alone(params, kind):
    rng = random.Random(7)
    torch.manual_seed(7)
    depths_seen, accepted_seen = set(), 0
    for trial in range(60):
        batch = rng.choice([2, 3, 5])
        makers = {"trees": [random_tree], "chains_with_q": [random_chain],
                  "mixed": [random_tree, random_chain]}[kind]
        drafts = [rng.choice(makers)(rng) for _ in range(batch)]
        logits = [peaked_logits(rng, 1 + len(d.tokens) + 2) for d in drafts]  # two aux rows, never read
        alone_gens = [torch.Generator().manual_seed(100 * trial + r) for r in range(batch)]
        batch_gens = [torch.Generator().manual_seed(100 * trial + r) for r in range(batch)]
        alone = [accept(d, x[: 1 + len(d.tokens)], params, g) for d, x, g in zip(drafts, logits, alone_gens, strict=True)]
        together = accept_rows(drafts, [x[: 1 + len(d.tokens)] for d, x in zip(drafts, logits, strict=True)], params,
                               batch_gens)
        assert together == alone
        for a, b in zip(alone_gens, batch_gens, strict=True):  # the streams are left where the walks alone leave them
            assert torch.equal(a.get_state(), b.get_state())
        for path, _ in alone:
            depths_seen.add(len(path))
            accepted_seen += len(path)
    assert accepted_seen > 20 and len(depths_seen) >= 3  # the walks went somewhere: the comparison can fail


def test_a_broken_batched_walk_would_differ():
    """The comparison above catches a walk that reads the wrong uniform (one shifted by a node)."""
    rng = random.Random(3)
    params = SamplingParams(temperature=1.0)
    differ = 0
    for trial in range(40):
        drafts = [random_tree(rng) for _ in range(3)]
        logits = [peaked_logits(rng, 1 + len(d.tokens)) for d in drafts]
        alone = [accept(d, x, params, torch.Generator().manual_seed(trial)) for d, x in zip(drafts, logits, strict=True)]
        shifted = []
        for d, x in zip(drafts, logits, strict=True):
            g = torch.Generator().manual_seed(trial)
            torch.rand(1, dtype=torch.float64, generator=g)  # one uniform skipped
            shifted.append(accept(d, x, params, g))
        differ += shifted != alone
    assert differ > 10


def test_greedy_single_rows_and_multi_draft_q_go_one_by_one():
    rng = random.Random(1)
    q = torch.softmax(torch.randn(2, V), -1)
    siblings = Draft(tokens=[1, 2], parents=[-1, -1], sources=["m", "m"], draft_probs=q)  # multi-draft rule
    drafts = [siblings, random_tree(rng)]
    logits = [peaked_logits(rng, 1 + len(d.tokens)) for d in drafts]
    params = SamplingParams(temperature=1.0)
    alone = [accept(d, x, params, torch.Generator().manual_seed(5)) for d, x in zip(drafts, logits, strict=True)]
    assert accept_rows(drafts, logits, params, [torch.Generator().manual_seed(5) for _ in drafts]) == alone
    greedy = SamplingParams()
    assert accept_rows(drafts, logits, greedy, [None, None]) == [accept(d, x, greedy) for d, x in
                                                                  zip(drafts, logits, strict=True)]


def test_rows_drawn_together_take_each_uniform_at_full_precision():
    """A uniform just past a boundary of the cumulative weights draws the token past it, alone and in a batch (a
    uniform carried in float32 would round onto the boundary and draw the token before it)."""
    weights = torch.tensor([[0.5, 0.5], [0.25, 0.75]])
    us = [0.5 + 1e-9, 0.25 + 1e-9]
    assert _draw_rows(weights, us) == [int(_draw(w, u)) for w, u in zip(weights, us, strict=True)] == [1, 1]
    logits = torch.randn(3, V)
    gens = [torch.Generator().manual_seed(s) for s in range(3)]
    alone = [sample(w, torch.Generator().manual_seed(s)) for s, w in enumerate(logits.softmax(-1))]
    assert sample_rows(logits.softmax(-1), gens) == alone
