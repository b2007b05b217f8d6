"""SPECTRA-CORE: pure dictionaries and pool (hand-worked answers), then lossless decoding.

Model tests use fp32 tiny random models (Llama, Gemma 3) and SmolLM2 at a small
CPU budget (W=5, N=4, G=5); the paper budget on SmolLM2 is marked slow.
"""

import dataclasses
import itertools
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from methods.registry import build_method_config, get_method
from methods.spectra_core import SpectraCore, SpectraCoreConfig
from specbench.core.acceptance import SamplingParams
from specbench.core.decode import generate
from specbench.core.draft import SOURCE_BWD, SOURCE_FWD, DecodeState, VerifyResult
from specbench.core.forward import Target
from specbench.drafting.ngram_dicts import CandidatePool, NgramDicts, exploring, pool_layout
from specbench.drafting.spectra_engine import SpectraCoreEngine
from tests.lossless import (
    SMALL_VOCAB,
    assert_greedy_lossless,
    assert_sampling_preserves_distribution,
    autoregressive_output,
    small_vocab_target,
)

CONF = Path(__file__).resolve().parents[2] / "conf" / "method" / "spectra_core.yaml"
SMALL = dict(ngram_size=4, pool_size=5, max_guesses=5)  # the CPU budget


# ----------------------------------------------------------------------------- dictionaries


def test_add_with_sub_ngrams_fills_every_suffix_and_prefix():
    d = NgramDicts(n=5, cap=15, sub_ngrams=True)
    d.add([1, 2, 3, 4, 5])
    assert d.fwd == {1: [(2, 3, 4, 5)], 2: [(3, 4, 5)], 3: [(4, 5)], 4: [(5,)]}
    assert d.bwd == {(1,): 2, (1, 2): 3, (1, 2, 3): 4, (1, 2, 3, 4): 5}


def test_add_without_sub_ngrams_keeps_only_the_whole_ngram():
    d = NgramDicts(n=5, cap=15, sub_ngrams=False)
    d.add([1, 2, 3, 4, 5])
    assert d.fwd == {1: [(2, 3, 4, 5)]}
    assert d.bwd == {(1, 2, 3, 4): 5}


def test_pool_shift_with_sub_ngrams_extends_entries_instead_of_duplicating_them():
    d = NgramDicts(n=4, cap=15, sub_ngrams=True)
    d.add([1, 2, 3, 4])  # fwd[2] = (3, 4), fwd[3] = (4,)
    d.add([2, 3, 4, 5])  # the same sequence one step later: (3, 4) → (3, 4, 5), (4,) → (4, 5)
    assert d.fwd == {1: [(2, 3, 4)], 2: [(3, 4, 5)], 3: [(4, 5)], 4: [(5,)]}
    assert d.bwd[(2, 3, 4)] == 5 and d.bwd[(1, 2, 3)] == 4


def test_forward_list_is_prefix_free_most_recent_first_and_capped():
    d = NgramDicts(n=5, cap=3, sub_ngrams=True)
    d.push_fwd(7, (1, 2))
    d.push_fwd(7, (3,))
    d.push_fwd(7, (1, 2, 9))  # extends (1, 2): replaces it, at the front
    assert d.fwd[7] == [(1, 2, 9), (3,)]
    d.push_fwd(7, (3,))  # already there: moved to the front, not duplicated
    assert d.fwd[7] == [(3,), (1, 2, 9)]
    d.push_fwd(7, (1,))  # a prefix of (1, 2, 9): that entry is refreshed
    assert d.fwd[7] == [(1, 2, 9), (3,)]
    d.push_fwd(7, (4, 4))
    d.push_fwd(7, (5,))  # a fourth entry: the oldest, (3,), drops
    assert d.fwd[7] == [(5,), (4, 4), (1, 2, 9)]


def test_backward_guess_takes_the_longest_context_first():
    d = NgramDicts(n=4, cap=15)
    d.bwd = {(1, 2, 3): 10, (3,): 99, (2, 3, 10): 11, (10,): 50, (11,): 12, (12,): 3}
    # (1,2,3) beats (3,); then (2,3,10) beats (10,); then only (11,) and (12,) match: 11 → 12 → 3.
    assert d.backward_guess([0, 1, 2, 3], length=4) == [10, 11, 12, 3]
    assert d.backward_guess([0, 1, 2, 3], length=2) == [10, 11]
    assert d.backward_guess([5, 3], length=4) == [99]  # (5, 3) unknown → (3,); then (99,) unknown: stop
    assert d.backward_guess([5, 6], length=4) == []


def test_coverage_rule_takes_the_most_probable_unseen_token_when_r_is_below_tau():
    pool = CandidatePool(width=4, n=2)
    pool.seqs = [[1], [1], [1], [1]]
    logits = torch.zeros(4, 10)
    logits[:, 5], logits[:, 6], logits[:, 7] = 3.0, 2.0, 1.0  # ranking 5 > 6 > 7 in every row
    pool.exclude([5])  # 5 is already a key of S_fwd
    done = pool.advance(logits, draws=[0.5, 0.05, 0.1, 0.09], threshold=0.1)
    assert [c[-1] for c in done] == [5, 6, 5, 6]  # r < τ → 6, the best unseen; r >= τ → argmax 5
    pool.exclude([6])
    assert [c[-1] for c in pool.advance(logits, [0.05] * 4, 0.1)] == [7] * 4
    assert [c[-1] for c in pool.advance(logits, [0.5] * 4, 0.9)] == [7] * 4  # the literal reading
    assert [c[-1] for c in pool.advance(logits, None, 0.1)] == [5] * 4  # rule off → argmax
    pool.exclude(list(range(10)))  # every token seen → argmax
    assert [c[-1] for c in pool.advance(logits, [0.05] * 4, 0.1)] == [5] * 4
    pool.reset([3], random.Random(0))  # a new generation forgets
    assert [c[-1] for c in pool.advance(logits, [0.05] * 4, 0.1)] == [5] * 4 and pool.seqs == [[5]] * 4


def test_which_draws_explore_under_each_reading():
    draws = [0.05, 0.5, 0.1, 0.95]
    assert exploring(draws, 0.1, "epsilon") == [0]  # r < τ
    assert exploring(draws, 0.1, "literal_key") == [1, 3] == exploring(draws, 0.1, "literal_ngram")  # r > τ
    assert exploring(None, 0.1, "literal_ngram") == []
    with pytest.raises(ValueError, match="literal_ngram"):
        exploring(draws, 0.1, "literal")


def test_literal_key_reading_explores_when_r_is_above_tau():
    pool = CandidatePool(width=2, n=2)
    pool.seqs = [[1], [1]]
    logits = torch.zeros(2, 10)
    logits[:, 5], logits[:, 6] = 3.0, 2.0
    pool.exclude([5])
    done = pool.advance(logits, [0.5, 0.05], 0.1, "literal_key")
    assert [c[-1] for c in done] == [6, 5]  # r = 0.5 > τ explores; r = 0.05 takes the argmax


def test_completions_are_the_last_tokens_of_stored_ngrams_under_the_first_token():
    d = NgramDicts(n=3, cap=15)
    d.add([1, 2, 5])  # fwd[1] = (2, 5), fwd[2] = (5,)
    d.add([1, 3, 9])  # fwd[1] = (3, 9), (2, 5)
    assert d.completions([1, 2]) == {5} and d.completions([1, 3]) == {9}
    assert d.completions([4, 2]) == set() and d.completions([2, 5]) == set()
    d4 = NgramDicts(n=4, cap=15)
    d4.add([1, 2, 5, 7])  # fwd[1] = (2, 5, 7): stores (1, 2, 5) inside a longer continuation
    assert d4.completions([1, 2]) == {5} and d4.completions([1, 2, 5]) == {7}


def test_literal_ngram_reading_avoids_only_ngrams_already_stored():
    d = NgramDicts(n=3, cap=15)
    d.add([1, 2, 5])
    d.add([1, 3, 9])
    pool = CandidatePool(width=4, n=3)
    pool.seqs = [[1, 2], [1, 3], [4, 2], [1, 2]]
    logits = torch.zeros(4, 12)
    logits[:, 5], logits[:, 6], logits[:, 9] = 3.0, 2.0, 1.0  # rows 0, 2, 3: 5 > 6 > 9
    logits[1, 9] = 4.0  # row 1: 9 > 5 > 6
    pool.exclude([*d.fwd, 5])  # the key readings' exclusions: must not matter here
    done = pool.advance(logits, [0.5, 0.5, 0.5, 0.05], 0.1, "literal_ngram", d.completions)
    # row 0: (1, 2, 5) is stored → next best 6; row 1: (1, 3, 9) is stored → 5;
    # row 2: (4, 2, 5) is not stored → its argmax 5 (excluded only in the key readings); row 3: r < τ → argmax.
    assert [c[-1] for c in done] == [6, 5, 5, 5]
    assert pool.seqs == [[2, 6], [3, 5], [2, 5], [2, 5]]
    with pytest.raises(ValueError, match="completions"):
        pool.advance(logits, [0.5] * 4, 0.1, "literal_ngram")


def test_the_ngram_rule_reads_the_dictionaries_before_the_steps_updates():
    engine = SpectraCoreEngine(SpectraCoreConfig(ngram_size=3, pool_size=2, coverage_threshold=0.0))
    engine.start([1, 2])
    engine.pool.seqs = [[1, 2], [1, 2]]  # twins: both complete (1, 2, argmax) in the same step
    logits = torch.zeros(2, 8)
    logits[:, 5], logits[:, 6] = 3.0, 2.0
    engine.update(logits)  # τ = 0: every r > τ explores, but nothing is stored yet
    assert engine.pool.seqs == [[2, 5], [2, 5]] and engine.dicts.completions([1, 2]) == {5}
    engine.pool.seqs = [[1, 2], [7, 2]]
    engine.update(logits)
    assert engine.pool.seqs == [[2, 6], [2, 5]]  # (1, 2, 5) is known now; (7, 2, 5) is not


@pytest.mark.parametrize("reading", ["epsilon", "literal_key", "literal_ngram"])
def test_every_reading_is_lossless(tiny_llama, reading):
    recs = assert_greedy_lossless(
        Target(tiny_llama.model), lambda: drafter(coverage_reading=reading), REPETITIVE, max_new_tokens=48
    )
    assert all(sum(r.accepted_by_source.values()) > 0 for r in recs)


def test_half_precision_logits_pick_the_same_tokens():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 4
    draws = [0.05, 0.5, 0.05, 0.5, 0.05, 0.5]
    picks = {}
    top = logits.argmax(-1).tolist()
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        pool = CandidatePool(width=6, n=2)
        pool.exclude(top[:3])
        pool.seqs = [[0]] * 6
        picks[dtype] = [pool.advance(logits.to(dtype), draws, 0.1)[i][-1] for i in range(6)] + [
            pool.advance(logits.to(dtype), None, 0.1)[i][-1] for i in range(6)
        ]
        pool.seqs = [[0]] * 6
        stored = lambda seq: set(top[:3])  # noqa: E731 - every row avoids the first three rows' argmaxes
        picks[dtype] += [t[-1] for t in pool.advance(logits.to(dtype), draws, 0.1, "literal_ngram", stored)]
    assert picks[torch.float32] == picks[torch.bfloat16] == picks[torch.float16]
    assert picks[torch.float32][:6] != picks[torch.float32][6:12]  # the exploring rows changed
    assert picks[torch.float32][12:15] != top[:3] and picks[torch.float32][15:] == top[3:]  # r > τ: rows 1, 3, 5


def test_pool_layout_is_level_major_with_causal_chains_invisible_to_each_other():
    positions, visible = pool_layout(2, 3)
    assert positions == [1, 1, 2, 2]  # (lvl0,seq0) (lvl0,seq1) (lvl1,seq0) (lvl1,seq1)
    expected = np.array([[1, 0, 0, 0], [0, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 1]], dtype=bool)
    np.testing.assert_array_equal(visible, expected)
    assert pool_layout(2, 3)[1] is visible  # built once per (W, N)


def test_a_narrower_pool_advances_its_first_sequences_and_the_others_wait():
    pool = CandidatePool(width=3, n=3)
    pool.seqs = [[1, 2], [3, 4], [5, 6]]
    assert pool.columns == [0, 1, 2, 0, 1, 2]  # level-major: each aux node's sequence
    logits = torch.zeros(2, 10)
    logits[0, 7], logits[1, 9] = 5.0, 5.0
    assert pool.advance(logits, draws=None, threshold=0.1) == [(1, 2, 7), (3, 4, 9)]
    assert pool.seqs == [[2, 7], [4, 9], [5, 6]]
    with pytest.raises(ValueError, match="4 rows of logits for 3 sequences"):
        pool.advance(torch.zeros(4, 10), draws=None, threshold=0.1)


def test_pool_advance_predicts_from_the_last_rows_and_shifts_left():
    pool = CandidatePool(width=2, n=3)
    pool.seqs = [[1, 2], [3, 4]]
    assert pool.aux_tokens() == [1, 3, 2, 4]
    logits = torch.zeros(2, 10)
    logits[0, 7], logits[0, 8] = 5.0, 4.0  # sequence 0: argmax 7, runner-up 8
    logits[1, 9], logits[1, 7] = 5.0, 4.0  # sequence 1: argmax 9
    pool.exclude([7])
    done = pool.advance(logits, draws=[0.05, 0.05], threshold=0.1)
    assert done == [(1, 2, 8), (3, 4, 9)]
    assert pool.seqs == [[2, 8], [4, 9]]
    assert pool.advance(logits, draws=None, threshold=0.1) == [(2, 8, 7), (4, 9, 9)]


# ----------------------------------------------------------------------------- drafter without a model


def drafter(vocab=128, seed=0, **kw):
    return SpectraCore(SpectraCoreConfig(**kw), vocab_size=vocab, seed=seed)


def test_guesses_put_the_backward_guess_first_and_stop_at_g():
    d = drafter(ngram_size=3, max_guesses=3)
    d.new_turn([1, 2, 3])
    for i in range(5):
        d.dicts.push_fwd(3, (10 + i, 0))
    d.dicts.bwd[(2, 3)] = 12
    d.dicts.bwd[(3, 12)] = 0  # backward guess (12, 0) equals a forward continuation: listed once
    seqs, sources = d.guesses([1, 2, 3])
    assert seqs == [[12, 0], [14, 0], [13, 0]]
    assert sources == [SOURCE_BWD, SOURCE_FWD, SOURCE_FWD]
    assert drafter(ngram_size=3, max_guesses=3, use_backward_dict=False).guesses([1, 2, 3])[0] == []
    d.engine.settings = dataclasses.replace(d.config, use_backward_dict=False)
    assert d.guesses([1, 2, 3])[0] == [[14, 0], [13, 0], [12, 0]]
    d.engine.settings = dataclasses.replace(d.config, use_backward_dict=True, use_forward_dict=False)
    assert d.guesses([1, 2, 3]) == ([[12, 0]], [SOURCE_BWD])


def test_start_fills_the_pool_from_the_prompt_reproducibly():
    prompt = [4, 8, 15, 16, 23, 42]
    a, b = drafter(seed=3, **SMALL), drafter(seed=3, **SMALL)
    a.new_turn(prompt)
    b.new_turn(prompt)
    assert a.pool.seqs == b.pool.seqs and len(a.pool.seqs) == 5
    assert all(len(s) == 3 and set(s) <= set(prompt) for s in a.pool.seqs)
    c = drafter(seed=4, **SMALL)
    c.new_turn(prompt)
    assert c.pool.seqs != a.pool.seqs
    a.dicts.add([1, 2])
    a.new_turn(prompt)  # a new generation starts from scratch
    assert not a.dicts.fwd and a.pool.seqs == b.pool.seqs


def test_step_sends_the_pool_and_learns_from_its_predictions():
    d = drafter(vocab=16, ngram_size=3, pool_size=2, max_guesses=4, coverage=False)
    d.new_turn([1, 2, 3])
    d.pool.seqs = [[1, 2], [3, 4]]
    draft = d.propose(DecodeState([1, 2, 3], 3, 10, 1))
    assert draft is not None and not draft.tokens and draft.aux_tokens == [1, 3, 2, 4]
    assert draft.aux_positions == [1, 1, 2, 2] and draft.aux_logit_rows == [2, 3]
    logits = torch.zeros(2, 16)  # the core returns the rows of aux_logit_rows only
    logits[0, 5] = logits[1, 6] = 1.0
    d.update(VerifyResult([], [9], draft, aux_logits=logits))
    assert d.dicts.fwd == {1: [(2, 5)], 2: [(5,)], 3: [(4, 6)], 4: [(6,)]}
    assert d.pool.seqs == [[2, 5], [4, 6]]
    assert np.isneginf(d.pool.penalty[[1, 2, 3, 4]]).all() and not np.isneginf(d.pool.penalty[[5, 6]]).any()
    assert d.dicts.bwd == {(1,): 2, (1, 2): 5, (3,): 4, (3, 4): 6}
    nxt = d.propose(DecodeState([1, 2, 3, 9, 2], 3, 10, 2))  # no S_bwd key ends in (9, 2) or (2,)
    assert nxt.tokens == [5] and nxt.sources == [SOURCE_FWD]
    nxt = d.propose(DecodeState([1, 2, 3, 1, 2], 3, 10, 2))  # S_bwd[(1, 2)] = 5, equal to S_fwd[2]
    assert nxt.tokens == [5] and nxt.sources == [SOURCE_BWD]


def test_context_ngrams_learn_the_prompt_and_the_output():
    d = drafter(ngram_size=3, context_ngrams=True, sub_ngrams=False)
    d.new_turn([1, 2, 3, 1])
    assert d.dicts.fwd == {1: [(2, 3)], 2: [(3, 1)]} and d.dicts.bwd == {(1, 2): 3, (2, 3): 1}
    d.propose(DecodeState([1, 2, 3, 1, 2], 4, 10, 1))  # the prefill's token arrives
    assert d.dicts.fwd[3] == [(1, 2)] and d.dicts.bwd[(3, 1)] == 2
    assert drafter(ngram_size=3).dicts.fwd == {}


def test_config_validation_yaml_and_registry():
    for bad in (
        dict(ngram_size=1),
        dict(pool_size=0),
        dict(max_guesses=0),
        dict(coverage_threshold=1.5),
        dict(coverage_reading="literal"),
    ):
        with pytest.raises(ValueError, match="spectra_core"):
            SpectraCoreConfig(**bad).validate()
    yaml = OmegaConf.to_container(OmegaConf.load(CONF))
    assert yaml.pop("name") == "spectra_core" == get_method("spectra_core").name
    fields = {f.name: f.default for f in dataclasses.fields(SpectraCoreConfig)}
    assert yaml == fields
    cfg = build_method_config("spectra_core", {"use_forward_dict": False})
    assert cfg.use_forward_dict is False and cfg.max_guesses == 15


# ----------------------------------------------------------------------------- lossless on tiny models

REPETITIVE = [[5, 6, 7, 8] * 4, [3, 3, 3, 3, 9], [10, 11, 12, 10, 11, 12, 10, 11]]
VARIED = [list(range(20, 50)), [90, 4, 61, 17, 33, 2]]


@pytest.fixture(scope="module", params=["tiny_llama", "tiny_gemma3"])
def tiny(request):
    return Target(request.getfixturevalue(request.param).model)


def test_greedy_lossless_on_tiny_models_and_guesses_get_accepted(tiny):
    recs = assert_greedy_lossless(tiny, lambda: drafter(), REPETITIVE + VARIED, max_new_tokens=64)
    for rec in recs[: len(REPETITIVE)]:
        assert sum(rec.accepted_by_source.values()) > 0 and rec.tau > 1.2
        assert set(rec.drafted_by_source) == {SOURCE_FWD, SOURCE_BWD}
        assert max(rec.step_aux) == 15 * 4


def test_long_generation_is_lossless(tiny):
    (rec,) = assert_greedy_lossless(tiny, lambda: drafter(), [VARIED[1]], max_new_tokens=300)
    assert rec.new_tokens == 300 and rec.steps < 300


@pytest.mark.parametrize(
    "fwd,bwd,sub,cov", list(itertools.product([True, False], repeat=4)), ids=lambda v: "TF"[not v]
)
def test_every_ablation_is_lossless(tiny_llama, fwd, bwd, sub, cov):
    kw = dict(SMALL, use_forward_dict=fwd, use_backward_dict=bwd, sub_ngrams=sub, coverage=cov)
    recs = assert_greedy_lossless(
        Target(tiny_llama.model), lambda: drafter(**kw), REPETITIVE[:2], max_new_tokens=40
    )
    drafted = sum(sum(r.drafted_by_source.values()) for r in recs)
    assert (drafted > 0) == (fwd or bwd)
    for r in recs:
        assert (SOURCE_FWD in r.drafted_by_source) <= fwd and (SOURCE_BWD in r.drafted_by_source) <= bwd


def test_context_ngrams_are_lossless(tiny_llama):
    recs = assert_greedy_lossless(
        Target(tiny_llama.model), lambda: drafter(context_ngrams=True), REPETITIVE, max_new_tokens=48
    )
    assert all(sum(r.accepted_by_source.values()) > 0 for r in recs)


def _run_inside_accepted_run(target, prompt):
    """A record of the full run and an output index strictly inside a step that kept >= 3 tokens."""
    rec = generate(target, drafter(), prompt, max_new_tokens=64)
    start = 0
    for kept in rec.step_tokens:
        if kept >= 3:
            return rec, start + 1
        start += kept
    pytest.fail("no step accepted two guesses")


def test_max_new_tokens_cut_inside_an_accepted_run(tiny_llama):
    target = Target(tiny_llama.model)
    full, cut = _run_inside_accepted_run(target, REPETITIVE[0])
    rec = generate(target, drafter(), REPETITIVE[0], max_new_tokens=cut + 1)
    assert (
        rec.output_ids == full.output_ids[: cut + 1] == autoregressive_output(target, REPETITIVE[0], cut + 1)
    )
    assert rec.finish_reason == "length"
    assert rec.step_tokens[-1] < full.step_tokens[len(rec.step_tokens) - 1]  # the run was cut short


def test_eos_inside_an_accepted_run(tiny_llama):
    target = Target(tiny_llama.model)
    prompt = REPETITIVE[2]
    full, _ = _run_inside_accepted_run(target, prompt)
    out, start, eos = full.output_ids, 0, None
    for kept in full.step_tokens:  # an EOS candidate: first seen in the middle of a long step
        for j in range(start + 1, start + kept - 1):
            if out[j] not in out[:j]:
                eos = (out[j], j)
                break
        if eos:
            break
        start += kept
    assert eos, "no token first occurs inside an accepted run"
    (rec,) = assert_greedy_lossless(target, lambda: drafter(), [prompt], max_new_tokens=64, eos=[eos[0]])
    assert rec.finish_reason == "eos" and rec.new_tokens == eos[1] + 1 and rec.output_ids[-1] == eos[0]


# ----------------------------------------------------------------------------- sampling


class CountingCore(SpectraCore):
    guesses_made = accepted = 0

    def propose(self, state):
        draft = super().propose(state)
        CountingCore.guesses_made += len(draft.tokens) if draft is not None else 0  # None: nothing worth drafting
        return draft

    def update(self, result):
        CountingCore.accepted += result.n_accepted
        super().update(result)


# T=1 with context n-grams, deep: tests/core/test_sampling_deep.py
@pytest.mark.parametrize(
    "params,context",
    [(SamplingParams(temperature=1.0), False), (SamplingParams(temperature=1.0, top_p=0.9), False),
     (SamplingParams(temperature=1.0, top_p=0.9), True)],
    ids=["t1-pool-only", "p09-pool-only", "p09-context"],
)
def test_sampling_keeps_the_target_distribution(params, context):
    seeds = itertools.count()
    cfg = SpectraCoreConfig(ngram_size=3, pool_size=3, max_guesses=3, context_ngrams=context)
    CountingCore.guesses_made = CountingCore.accepted = 0
    assert_sampling_preserves_distribution(  # 3 tokens more than compared: guesses as deep as the drafter's
        lambda: CountingCore(cfg, vocab_size=SMALL_VOCAB, seed=next(seeds)), params, trials=3000, extra=3
    )
    print(f"guesses {CountingCore.guesses_made}, accepted {CountingCore.accepted}")
    assert CountingCore.guesses_made > 1000 and CountingCore.accepted > 300


@pytest.mark.slow
def test_sampling_keeps_the_distribution_of_a_real_transformer():
    seeds = itertools.count()
    cfg = SpectraCoreConfig(ngram_size=3, pool_size=3, max_guesses=3)
    CountingCore.guesses_made = CountingCore.accepted = 0
    assert_sampling_preserves_distribution(
        lambda: CountingCore(cfg, vocab_size=SMALL_VOCAB, seed=next(seeds)),
        SamplingParams(temperature=1.0),
        target=small_vocab_target(),
        trials=1500,
        extra=3,
    )
    assert CountingCore.accepted > 100


# ----------------------------------------------------------------------------- SmolLM2

CODE_EDIT = (
    "Rename the variable `total` to `acc` in this function and reply with the code only.\n\n"
    "```python\ndef total_length(words):\n    total = 0\n    for w in words:\n"
    "        total += len(w)\n    return total\n```"
)
STORY = "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle."
CHAT = "Compose an engaging travel blog post about a recent trip to Hawaii."


def chat_ids(tokenizer, text):
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


@pytest.mark.slow  # a real model over long outputs: tests/methods/test_contract.py covers the method on tiny ones
def test_smollm2_greedy_lossless_at_a_cpu_budget(smollm2):
    target, tok = Target(smollm2.model), smollm2.tokenizer
    eos = [tok.eos_token_id]
    (code,) = assert_greedy_lossless(
        target, lambda: drafter(smollm2.model.config.vocab_size, **SMALL), [chat_ids(tok, CODE_EDIT)], 64, eos
    )
    (story,) = assert_greedy_lossless(
        target, lambda: drafter(smollm2.model.config.vocab_size, **SMALL), [chat_ids(tok, STORY)], 160
    )
    assert story.new_tokens == 160
    assert sum(code.accepted_by_source.values()) + sum(story.accepted_by_source.values()) > 0


@pytest.mark.slow
def test_smollm2_greedy_lossless_at_the_paper_budget(smollm2):
    target, tok = Target(smollm2.model), smollm2.tokenizer
    prompts = [chat_ids(tok, t) for t in (CODE_EDIT, STORY, CHAT)]
    recs = assert_greedy_lossless(
        target, lambda: drafter(smollm2.model.config.vocab_size), prompts, 256, [tok.eos_token_id]
    )
    assert all(r.tau > 1.0 for r in recs)


# ----------------------------------------------------------------------------- memory across generations


@pytest.mark.parametrize("memory,kept_turn,kept_sample", [("run", 1, 1), ("sample", 1, 0), ("turn", 0, 0)])
def test_memory_scopes_of_the_dictionaries(memory, kept_turn, kept_sample):
    d = drafter(memory=memory, coverage_reading="literal_key")
    d.new_turn([1, 2, 3])
    d.engine.dicts.add([4, 5, 6, 7])
    d.engine._sync_keys()
    d.new_turn([8, 9])  # the next turn
    assert (4 in d.dicts.fwd) == kept_turn
    # the key reading still avoids a kept key after the pool is drawn anew
    assert bool(d.pool.penalty.size > 4 and np.isneginf(d.pool.penalty[4])) == kept_turn
    assert bool(d.guesses([8, 4])[0]) == kept_turn
    d.begin_sample()
    assert (4 in d.dicts.fwd) == kept_sample
    d.reset()
    assert not d.dicts.fwd and not d.dicts.bwd


def test_run_memory_is_lossless_and_drafts_from_the_first_step(tiny_llama):
    target = Target(tiny_llama.model)
    shared = drafter(memory="run", **SMALL)
    recs = assert_greedy_lossless(target, lambda: shared, REPETITIVE + REPETITIVE[:1], max_new_tokens=40)
    # The last generation repeats the first prompt: the kept dictionaries already cover its text.
    assert recs[-1].step_tokens[1] > 1 and recs[-1].tau > recs[0].tau


def test_the_gpu_path_of_the_pool_rule_chooses_what_the_cpu_path_does(monkeypatch):
    """Batched in torch (the path for logits on a GPU, run here on CPU tensors) and row by row in numpy give the
    same tokens under every reading; the penalty goes up whole once, then only the newly excluded tokens."""
    from specbench.drafting import ngram_dicts

    gen = torch.Generator().manual_seed(0)
    sent = []
    real_upload = ngram_dicts.upload
    monkeypatch.setattr(ngram_dicts, "upload", lambda v, d, dtype=None: sent.append(len(v)) or real_upload(v, d))
    pool = CandidatePool(width=6, n=3)
    pool.seqs = [[1, 2], [1, 3], [4, 2], [1, 2], [7, 7], [2, 1]]
    avoid = {(1, 2): {5, 9}, (1, 3): {0}, (4, 2): set(), (7, 7): {5}, (2, 1): set(range(40))}
    for step in range(5):
        logits = torch.randn(6, 40, generator=gen)
        logits[:, 5] += 4.0  # a favourite that the rules must step around
        pool.exclude([5, step + 10])
        explore = [0, 2, 3, 4, 5]
        if step == 0:
            assert sent == []  # nothing goes to a device before the first GPU step
        assert pool._best_batched(logits, explore) == pool._best(logits, explore)
        ban = lambda seq: avoid.get(tuple(seq), set())  # noqa: E731
        numpy_way = pool._best_ngram(logits, [], ban)  # the plain argmax ...
        for i in explore:  # ... then the rows the numpy path searches again
            banned = ban(pool.seqs[i])
            if numpy_way[i] in banned:
                y = logits[i].numpy().copy()
                y[list(banned)] = float("-inf")
                numpy_way[i] = int(y.argmax())
        assert pool._best_ngram_batched(logits, explore, ban) == numpy_way
    whole = [n for n in sent if n == 40]
    assert len(whole) == 1  # the penalty once; afterwards two tokens a step
    assert pool._device_penalty is not None and torch.equal(
        torch.isinf(pool._device_penalty), torch.from_numpy(np.isinf(pool.penalty)))


def test_engines_sharing_dictionaries_each_avoid_every_key_either_learned():
    """memory: run at batch size > 1: two requests' engines read one pair of dictionaries; a key one of them
    adds to S_fwd is avoided by the other's pool at its next sync, and neither consumes the other's news."""
    config = SpectraCoreConfig(memory="run")
    a, b = SpectraCoreEngine(config, 0), SpectraCoreEngine(config, 1)
    b.dicts = a.dicts
    a.start([1, 2, 3, 4, 5, 6], keep=True)
    b.start([7, 8, 9, 10, 11, 12], keep=True)
    a.dicts.push_fwd(40, (41, 42))
    a._sync_keys()
    assert a.pool.penalty[40] == -np.inf and (b.pool.penalty.size <= 40 or b.pool.penalty[40] == 0)
    b.dicts.push_fwd(50, (51,))
    b._sync_keys()
    a._sync_keys()
    assert b.pool.penalty[40] == -np.inf and b.pool.penalty[50] == -np.inf and a.pool.penalty[50] == -np.inf
    a.dicts.clear()  # the run's memory forgotten (a repeat): the readers' places start over
    a.dicts.push_fwd(60, (61,))
    b._sync_keys()
    assert b.pool.penalty[60] == -np.inf
