"""Sampling keeps the target's distribution through deep drafts of the real drafters.

Each trial generates 3 + 4 tokens and the first three are compared with the
exact joint (:func:`tests.lossless.assert_sampling_preserves_distribution`
with ``extra=4``): drafters that honour ``DecodeState.max_depth`` then draft
trees of depth ≥ 3 inside the compared steps, which the test asserts, so that
sps's q rows at depth ≥ 2 and its draft-cache rollback after a rejection,
SpecDec++'s head-driven stopping, and deep n-gram, suffix, recycling and
dictionary guesses are all decided by the shared acceptance rule under
sampling. A broken rule run through the same helper is caught.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import specbench.core.decode
from methods.pld import PLDConfig, PromptLookup
from methods.specdec_pp import SpecDecPP, SpecDecPPConfig
from methods.spectra_core import SpectraCore, SpectraCoreConfig
from methods.sps import SpeculativeSampling, SpSConfig
from methods.suffix import SuffixConfig, SuffixDecoding
from methods.token_recycling import TokenRecycling, TokenRecyclingConfig
from specbench.core.acceptance import SamplingParams, accept, sample, target_probs
from specbench.core.draft import DrafterContext
from specbench.drafting.acceptance_head import AcceptanceHead, save_head
from tests.lossless import SMALL_VOCAB, assert_sampling_preserves_distribution
from tests.methods.test_sps import small_draft

T1 = SamplingParams(temperature=1.0)
DEEP = dict(extra=4, min_depth=3)
# A prompt whose bigrams repeat, so that copying drafters (prompt lookup, suffix trees) find long matches.
REPEATS = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3]


def test_prompt_lookup_deep():
    assert_sampling_preserves_distribution(
        lambda: PromptLookup(PLDConfig(), vocab_size=SMALL_VOCAB), T1, prompt=REPEATS, trials=3000, **DEEP
    )


@pytest.mark.slow  # a real model: make test-slow (make test keeps the smaller checks)
def test_suffix_decoding_deep():
    shared = SuffixDecoding(SuffixConfig(max_spec_factor=4.0), vocab_size=SMALL_VOCAB)  # learns across trials
    assert_sampling_preserves_distribution(lambda: shared, T1, prompt=REPEATS, trials=3000, **DEEP)


@pytest.mark.slow  # a real model: make test-slow (make test keeps the smaller checks)
def test_token_recycling_deep():
    shared = TokenRecycling(TokenRecyclingConfig(tree="cpu"), vocab_size=SMALL_VOCAB)  # warms up over the trials
    assert_sampling_preserves_distribution(lambda: shared, SamplingParams(temperature=1.0, top_p=0.9),
                                           trials=3000, **DEEP)


@pytest.mark.slow  # a real model: make test-slow (make test keeps the smaller checks)
def test_spectra_core_deep():
    seeds = itertools.count()
    cfg = SpectraCoreConfig(ngram_size=4, pool_size=3, max_guesses=3, context_ngrams=True)
    assert_sampling_preserves_distribution(
        lambda: SpectraCore(cfg, vocab_size=SMALL_VOCAB, seed=next(seeds)), T1, prompt=REPEATS, trials=3000, **DEEP
    )


def _draft_context(params):
    other = small_draft(vocab=SMALL_VOCAB)
    return DrafterContext(sampling=params, load_model=lambda name: other, target_name="bigram")


# Draft-model steps cost a forward of the draft per token: these compare the first two tokens (64 cells),
# the first decode step drafting 4 deep, so that fewer trials suffice.
MODEL_DEEP = dict(extra=5, min_depth=3, length=2, trials=1000)


@pytest.mark.slow  # a real model: make test-slow (make test keeps the smaller checks)
def test_speculative_sampling_deep():
    """A draft model's chain of 4: q rows at depth ≥ 2 and the draft cache cropped after a rejection."""
    ctx = _draft_context(T1)
    seeds = itertools.count()
    accepted: list[int] = []

    def make():
        d = SpeculativeSampling(SpSConfig(k=4, draft_model="small", self_first_layers=None),
                                vocab_size=SMALL_VOCAB, seed=next(seeds), context=ctx)
        update = d.update
        d.update = lambda result: (accepted.append(result.n_accepted), update(result))
        return d

    assert_sampling_preserves_distribution(make, T1, **MODEL_DEEP)
    assert max(accepted) >= 2 and 0 in accepted  # deep acceptances and rejections both happened


@pytest.mark.slow
def test_specdec_pp_deep_with_a_head_whose_length_varies(tmp_path):
    """SpecDec++: the acceptance head decides each step's length (here 1 to 4 tokens)."""
    ctx = _draft_context(T1)
    torch.manual_seed(3)
    head = AcceptanceHead(32, 2)
    with torch.no_grad():
        for p in head.parameters():
            p.mul_(4.0)  # predictions spread over (0, 1): the stopping rule fires at different lengths
    path = tmp_path / "head.pt"
    save_head(path, head, {"target": "bigram", "draft": "small", "temperature": 1.0})
    cfg = SpecDecPPConfig(draft_model="small", self_first_layers=None, max_k=4, threshold=0.5, head_path=str(path))
    seeds = itertools.count()
    lengths: list[int] = []

    def make():
        d = SpecDecPP(cfg, vocab_size=SMALL_VOCAB, seed=next(seeds), context=ctx)
        propose = d.propose
        d.propose = lambda state: (lambda draft: (lengths.append(len(draft)) if draft else None, draft)[1])(
            propose(state))
        return d

    assert_sampling_preserves_distribution(make, T1, **MODEL_DEEP)
    assert len(set(lengths)) >= 3 and max(lengths) >= 3  # the head chose different lengths


def test_a_broken_rule_through_the_shared_helper_is_caught(monkeypatch):
    """After a rejected guess the rule must draw from the residual (p with the rejected token removed);
    drawing from p itself over-weights the rejected token. The shared helper must fail on it."""

    def broken(draft, logits, params, generator=None, argmax=None):
        path, tokens = accept(draft, logits, params, generator)
        if draft.tokens and not path:  # the first guesses were rejected: draw from p, ignoring the rejections
            return [], [sample(target_probs(logits[0], params), generator)]
        return path, tokens

    monkeypatch.setattr(specbench.core.decode, "accept", broken)
    with pytest.raises(AssertionError, match="differs from the target"):
        assert_sampling_preserves_distribution(
            lambda: PromptLookup(PLDConfig(), vocab_size=SMALL_VOCAB), T1, prompt=REPEATS, trials=3000, **DEEP
        )
