"""The shared acceptance rule (specbench/core/acceptance.py ``accept``) on hand-made p and q, and statistical
tests shown to have power.

Hand-made cases choose p and q so that each decision is certain (p(x) >= q(x):
accepted for every draw; p(x) = 0: rejected for every draw) or so that the
residual norm(max(p - q, 0)) is a single token; the random ones are checked by
frequency over many seeds.

Power: the chi-square test of tests/core/test_sampling_stats.py is run against
three deliberately broken rules, kept in this file only: accepting every
guess, forgetting to zero and renormalise p after a rejected deterministic
guess (with a drafter that favours some tokens), and resampling from p - q
without the clamp at 0 (negative weights shifted up instead of cut). Each must
be detected (p-value below the significance level) with the same drafters
and seeds for which the real rule passes.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch

from specbench.core.acceptance import SamplingParams, accept, sample, target_probs
from specbench.core.draft import Draft
from tests.core.test_sampling_stats import ALPHA, LENGTH, TRIALS, V, bigram_table, exact_distribution, p_value

T1 = SamplingParams(temperature=1.0)
GREEDY = SamplingParams()


def logits_of(*rows: list[float]) -> torch.Tensor:
    """Logits whose softmax at T = 1 is each row (zeros become -inf)."""
    return torch.tensor(rows, dtype=torch.float32).log()


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- hand-made p and q


def test_accept_when_p_covers_q():
    # p(x) = 0.5 >= q(x) = 0.4: accepted whatever the draw; then the bonus token from the next row.
    draft = Draft.chain([1], "m", torch.tensor([[0.3, 0.4, 0.3, 0.0]]))
    logits = logits_of([0.2, 0.5, 0.3, 0.0], [0.0, 0.0, 0.0, 1.0])
    for seed in range(50):
        assert accept(draft, logits, T1, gen(seed)) == ([0], [1, 3])


def test_reject_when_p_is_zero_and_resample_from_the_residual():
    # p(2) = 0: always rejected; residual max(p - q, 0) = [0, 0.3, 0, 0] → token 1.
    draft = Draft.chain([2, 3], "m", torch.tensor([[0.5, 0.2, 0.3, 0.0], [0.25] * 4]))
    logits = logits_of([0.5, 0.5, 0.0, 0.0], [0.25] * 4, [0.25] * 4)
    for seed in range(50):
        assert accept(draft, logits, T1, gen(seed)) == ([], [1])


def test_accept_with_probability_p_over_q_and_residual_otherwise():
    # p(0) / q(0) = 0.2: accepted 20% of the time; the residual [0, 0.5, 0, 0] is token 1.
    draft = Draft.chain([0], "m", torch.tensor([[0.5, 0.1, 0.4, 0.0]]))
    logits = logits_of([0.1, 0.6, 0.3, 0.0], [0.0, 0.0, 1.0, 0.0])
    outcomes = [tuple(accept(draft, logits, T1, gen(seed))[1]) for seed in range(4000)]
    assert set(outcomes) == {(0, 2), (1,)}
    share = outcomes.count((0, 2)) / len(outcomes)
    assert abs(share - 0.2) < 4 * math.sqrt(0.2 * 0.8 / len(outcomes))


def test_chain_that_ends_early():
    # First guess certain (p >= q), second certainly rejected (p = 0), residual a single token.
    q = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.25] * 4])
    draft = Draft.chain([1, 2, 3], "m", q)
    logits = logits_of([0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0], [0.25] * 4, [0.25] * 4)
    assert accept(draft, logits, T1, gen()) == ([0], [1, 3])


def test_chain_that_ends_late_takes_the_bonus_token():
    q = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    draft = Draft.chain([1, 2, 3], "m", q)
    logits = logits_of([0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0])
    assert accept(draft, logits, T1, gen()) == ([0, 1, 2], [1, 2, 3, 0])


def test_deterministic_guess_is_the_one_hot_case():
    # No q: accepted with probability p(x); on rejection p(x) is zeroed, so x never comes back.
    draft = Draft.chain([0], "ngram")
    logits = logits_of([0.3, 0.7, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0])
    outcomes = [tuple(accept(draft, logits, T1, gen(seed))[1]) for seed in range(4000)]
    assert set(outcomes) == {(0, 2), (1,)}
    assert abs(outcomes.count((0, 2)) / 4000 - 0.3) < 4 * math.sqrt(0.3 * 0.7 / 4000)


def test_greedy_is_the_one_hot_case_of_the_same_rule():
    q = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.9, 0.1, 0.0, 0.0]])
    draft = Draft.chain([1, 0], "m", q)
    logits = logits_of([0.1, 0.6, 0.3, 0.0], [0.2, 0.5, 0.3, 0.0], [0.7, 0.1, 0.1, 0.1])
    assert accept(draft, logits, GREEDY, gen()) == ([0], [1, 1])  # second guess 0 is not the argmax 1


def test_sample_never_draws_a_zero_weight_token():
    w = torch.tensor([0.0, 2.0, 0.0, 0.0, 1.0, 0.0])
    draws = [sample(w, gen(s)) for s in range(3000)]
    assert set(draws) == {1, 4}
    assert abs(draws.count(1) / 3000 - 2 / 3) < 0.04


def test_top_p_keeps_the_smallest_head_reaching_the_mass_and_its_ties():
    probs = torch.tensor([0.4, 0.3, 0.1, 0.1, 0.05, 0.05])
    kept = target_probs(probs.log(), SamplingParams(temperature=1.0, top_p=0.75)) > 0
    assert kept.tolist() == [True, True, True, True, False, False]  # 0.8 reached at the tied 0.1s
    kept = target_probs(probs.log(), SamplingParams(temperature=1.0, top_p=0.7)) > 0
    assert kept.tolist() == [True, True, False, False, False, False]
    # The CPU's growing top-k agrees with a full sort on a large vocabulary.
    big = torch.randn(3, 5000, generator=gen(3)) * 4
    full = torch.sort(big.softmax(-1), descending=True, dim=-1).values
    got = target_probs(big, SamplingParams(temperature=1.0, top_p=0.9))
    for row, sorted_row in zip(got, full, strict=True):
        k = int((sorted_row.cumsum(0) < 0.9).sum()) + 1
        assert int((row > 0).sum()) == k


# ---------------------------------------------------------------- power of the statistical test


def accept_always(draft, logits, params, generator):
    """Broken: every guess along the first chain is accepted, then the bonus token."""
    kids, path, node = draft.children(), [], -1
    while kids[node + 1]:
        node = kids[node + 1][0]
        path.append(node)
    bonus = sample(target_probs(logits[node + 1], params), generator)
    return path, [draft.tokens[i] for i in path] + [bonus]


def no_zeroing(draft, logits, params, generator):
    """Broken: a rejected deterministic guess stays in p (p not zeroed, not renormalised)."""
    kids, path, node = draft.children(), [], -1
    while True:
        p = target_probs(logits[node + 1], params)
        nxt = next((c for c in kids[node + 1] if float(torch.rand((), generator=generator)) < float(p[draft.tokens[c]])), None)
        if nxt is None:
            return path, [draft.tokens[i] for i in path] + [sample(p, generator)]
        path.append(nxt)
        node = nxt


def unclamped_residual(draft, logits, params, generator):
    """Broken: after a rejection, sample from p - q shifted up to be non-negative instead of clamped at 0."""
    path, node = [], -1
    q_all = draft.draft_probs
    while node + 1 < len(draft.tokens):
        c = node + 1
        p, q, x = target_probs(logits[c], params), q_all[c], draft.tokens[c]
        if float(torch.rand((), generator=generator)) * float(q[x]) >= float(p[x]):
            residual = p - q
            return path, [draft.tokens[i] for i in path] + [sample(residual - residual.min(), generator)]
        path.append(c)
        node = c
    return path, [draft.tokens[i] for i in path] + [sample(target_probs(logits[node + 1], params), generator)]


def simulate(rule, table, params, make_draft, seed: int) -> Counter:
    generator = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    counts: Counter = Counter()
    for _ in range(TRIALS):
        seq = [0]
        while len(seq) - 1 < LENGTH:
            draft = make_draft(rng, generator)
            _, tokens = rule(draft, table[[seq[-1]] + draft.tokens], params, generator)
            seq += tokens
        counts[tuple(seq[1 : 1 + LENGTH])] += 1
    return counts


FAVOURED = np.array([0.6, 0.25, 0.1, 0.05, 0.0])
Q = torch.tensor([0.45, 0.3, 0.15, 0.05, 0.05])


def favouring_guesses(rng, generator) -> Draft:
    """Deterministic (no q) two-sibling guesses that favour token 0: a non-uniform drafter."""
    seqs = [[int(t)] for t in rng.choice(V, size=2, p=FAVOURED)]
    return Draft.from_sequences(seqs, ["a", "b"])


def model_chain(rng, generator) -> Draft:
    k = int(rng.integers(1, 4))
    tokens = torch.multinomial(Q, k, replacement=True, generator=generator).tolist()
    return Draft.chain(tokens, "draft_model", draft_probs=Q.expand(k, V).clone())


@pytest.mark.parametrize(
    "broken,make_draft",
    [(accept_always, model_chain), (no_zeroing, favouring_guesses), (unclamped_residual, model_chain)],
    ids=["accept_always", "no_zeroing", "unclamped_residual"],
)
def test_broken_rule_is_detected_while_the_real_rule_passes(broken, make_draft):
    table = bigram_table(1)
    exact = exact_distribution(table, T1)
    assert p_value(simulate(accept, table, T1, make_draft, seed=11), exact) > ALPHA
    bad = simulate(broken, table, T1, make_draft, seed=11)
    support_violation = any(exact[s] == 0 for s in bad)
    assert support_violation or p_value(bad, exact) < ALPHA
