"""Sampling acceptance keeps the target distribution (statistical tests, no model).

The "target" is a bigram table over a small vocabulary: the logits after a
node depend only on that node's token, so a draft tree's logits are rows of
the table. Generation runs step after step with drafts that are mostly wrong,
until three tokens exist; the distribution of those three tokens is compared
with the exact product p(a)·p(b|a)·p(c|b) by a chi-square test. Seeds are
fixed, so each test is deterministic; the threshold (p-value > 1e-3) is the
stated significance level. A negative control shows the test has power: a
mis-stated draft distribution is detected.
"""

from collections import Counter
from itertools import product

import numpy as np
import pytest
import torch

from specbench.core.acceptance import SamplingParams, accept, target_probs
from specbench.core.draft import Draft
from tests.lossless import chi_square_pvalue

V = 5
LENGTH = 3
TRIALS = 4000
ALPHA = 1e-3


def bigram_table(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(V, V, generator=g) * 1.5


def exact_distribution(table: torch.Tensor, params: SamplingParams, root: int = 0) -> dict:
    p = target_probs(table, params)
    dist = {}
    for seq in product(range(V), repeat=LENGTH):
        prob, prev = 1.0, root
        for tok in seq:
            prob *= float(p[prev, tok])
            prev = tok
        dist[seq] = prob
    return dist


def simulate(table, params, make_draft, seed: int, trials: int = TRIALS) -> Counter:
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    counts: Counter = Counter()
    for _ in range(trials):
        seq = [0]
        while len(seq) - 1 < LENGTH:
            draft = make_draft(rng, gen)
            logits = table[[seq[-1]] + draft.tokens]
            _, tokens = accept(draft, logits, params, gen)
            seq += tokens
        counts[tuple(seq[1 : 1 + LENGTH])] += 1
    return counts


def p_value(counts: Counter, exact: dict, trials: int = TRIALS) -> float:
    """The shared chi-square check: cells expected below 5 are pooled."""
    return chi_square_pvalue(counts, exact, trials)


def deterministic_tree(rng, gen) -> Draft:
    """Two random branches (often wrong), sometimes sharing a first token, sometimes empty."""
    if rng.random() < 0.15:
        return Draft()
    seqs = [list(rng.integers(0, V, size=rng.integers(1, 4))) for _ in range(2)]
    return Draft.from_sequences(seqs, ["a", "b"])


Q = torch.tensor([0.4, 0.3, 0.1, 0.1, 0.1])


def draft_model_chain(rng, gen) -> Draft:
    """A chain of tokens sampled from q (a 'draft model' that ignores context)."""
    k = int(rng.integers(1, 4))
    tokens = torch.multinomial(Q, k, replacement=True, generator=gen).tolist()
    return Draft.chain(tokens, "draft_model", draft_probs=Q.expand(k, V).clone())


def draft_model_siblings(rng, gen) -> Draft:
    """Two i.i.d. samples from q as sibling guesses (multi-draft rejection)."""
    tokens = torch.multinomial(Q, 2, replacement=True, generator=gen).tolist()
    return Draft(tokens=tokens, parents=[-1, -1], sources=["m", "m"], draft_probs=Q.expand(2, V).clone())


PARAMS = {
    "t1": SamplingParams(temperature=1.0),
    "t07_top_p": SamplingParams(temperature=0.7, top_p=0.9),
    "top_k": SamplingParams(temperature=1.0, top_k=3),
}


@pytest.mark.parametrize("params_name", list(PARAMS))
@pytest.mark.parametrize("make_draft", [deterministic_tree, draft_model_chain, draft_model_siblings])
def test_sampling_preserves_target_distribution(params_name, make_draft):
    params = PARAMS[params_name]
    table = bigram_table(1)
    counts = simulate(table, params, make_draft, seed=7)
    assert p_value(counts, exact_distribution(table, params)) > ALPHA


def test_negative_control_misstated_draft_distribution_is_detected():
    """Claiming q is uniform while sampling from Q biases the output; the test must see it."""
    table = bigram_table(1)
    params = PARAMS["t1"]

    def lying_chain(rng, gen):
        k = int(rng.integers(1, 4))
        tokens = torch.multinomial(Q, k, replacement=True, generator=gen).tolist()
        return Draft.chain(tokens, "draft_model", draft_probs=torch.full((k, V), 1.0 / V))

    counts = simulate(table, params, lying_chain, seed=7)
    assert p_value(counts, exact_distribution(table, params)) < ALPHA


def test_small_cells_are_pooled():
    """A cell expected 0.5 times that turns up 4 times would alone dominate an unpooled chi-square."""
    exact = {"a": 0.5, "b": 0.4995, "rare": 0.0005}
    counts = Counter({"a": 500, "b": 496, "rare": 4})
    assert p_value(counts, exact, 1000) > ALPHA  # pooled: 'rare' joins the smallest bin
    from scipy.stats import chisquare

    unpooled = chisquare([500, 496, 4], [500, 499.5, 0.5]).pvalue
    assert unpooled < ALPHA
