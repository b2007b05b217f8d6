"""Prompt lookup (methods/pld.py): the n-gram search by hand, then lossless decoding.

Tiny random models (fp32) cover greedy equality, long generations, EOS and
max_new_tokens; SmolLM2 covers a real code-editing prompt; a bigram target
covers sampling.
"""

import random

import pytest
from omegaconf import OmegaConf

from methods.pld import NgramIndex, PLDConfig, PromptLookup, find_continuation
from methods.registry import build_method_config, get_method
from specbench.core.acceptance import SamplingParams
from specbench.core.draft import SOURCE_PROMPT, DecodeState
from specbench.core.forward import Target
from tests.conftest import CONF
from tests.lossless import (
    CODE_EDIT,
    LONG,
    MORE,
    assert_eos_inside_accepted_run,
    assert_greedy_lossless,
    assert_max_new_tokens_cuts_accepted_runs,
    assert_sampling_preserves_distribution,
    chat,
    counting_proposals,
)

# ---------------------------------------------------------------- pure parts


def test_yaml_holds_exactly_the_config_defaults():
    params = OmegaConf.to_container(OmegaConf.load(CONF / "method" / "pld.yaml"))
    assert params.pop("name") == "pld"
    assert get_method("pld") is PromptLookup
    assert build_method_config("pld", params) == PLDConfig()
    assert PLDConfig() == PLDConfig(max_ngram=3, min_ngram=1, num_draft=10, match="earliest")


@pytest.mark.parametrize(
    "bad", [dict(min_ngram=0), dict(max_ngram=1, min_ngram=2), dict(num_draft=0), dict(match="first")]
)
def test_bad_settings_are_rejected(bad):
    with pytest.raises(ValueError, match="pld: "):
        build_method_config("pld", bad)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 10])
def test_hand_worked_match(k):
    toks = [1, 2, 3, 4, 1, 2]  # trailing [1, 2] occurs at 0; what follows runs to the end
    assert find_continuation(toks, 2, 1, k) == [3, 4, 1, 2][:k]
    index = NgramIndex(1, 2)
    index.extend(toks)
    assert index.continuation(k) == [3, 4, 1, 2][:k]


def test_earliest_and_latest_differ():
    toks = [5, 1, 2, 7, 1, 2, 8, 1, 2]
    assert find_continuation(toks, 2, 1, 10, "earliest") == [7, 1, 2, 8, 1, 2]
    assert find_continuation(toks, 2, 1, 10, "latest") == [8, 1, 2]
    index = NgramIndex(1, 2)
    index.extend(toks)
    assert index.continuation(10) == [7, 1, 2, 8, 1, 2]
    assert index.continuation(10, latest=True) == [8, 1, 2]


def test_longest_ngram_wins_and_backs_off():
    # The 1-gram [3] first occurs at 0 (→ 9), the 2-gram [2, 3] only at 4 (→ 6).
    toks = [3, 9, 9, 9, 2, 3, 6, 5, 2, 3]
    assert find_continuation(toks, 2, 1, 2) == [6, 5]
    assert find_continuation(toks, 1, 1, 2) == [9, 9]
    # min_ngram 2 forbids the back-off to a single token: [7, 3] never occurred before.
    assert find_continuation([3, 9, 7, 3], 2, 2, 2) == []
    assert find_continuation([3, 9, 7, 3], 2, 1, 2) == [9, 7]


def test_overlapping_occurrence_and_no_match():
    assert find_continuation([1, 1, 1, 1], 3, 1, 5) == [1]  # [1,1,1] at 0 overlaps the tail
    assert find_continuation([1, 2, 3, 4], 3, 1, 5) == []
    assert find_continuation([7], 3, 1, 5) == []
    index = NgramIndex(1, 3)
    index.extend([1, 2, 3, 4])
    assert index.continuation(5) == []


def test_incremental_index_agrees_with_the_scan():
    rng = random.Random(0)
    for _ in range(300):
        toks = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
        lo, hi = rng.choice([(1, 3), (2, 4), (1, 1), (3, 3)])
        index = NgramIndex(lo, hi)
        cut = rng.randrange(len(toks) + 1)
        index.extend(toks[:cut])
        index.extend(toks[cut:])
        for match in ("earliest", "latest"):
            got = index.continuation(7, latest=match == "latest")
            assert got == find_continuation(toks, hi, lo, 7, match), (toks, lo, hi, match)


def test_propose_caps_depth_sets_sources_and_restarts():
    d = PromptLookup(PLDConfig(max_ngram=2, num_draft=10), vocab_size=16)
    prompt = [1, 2, 3, 4, 5, 6, 1, 2]
    d.new_turn(prompt)
    draft = d.propose(DecodeState(list(prompt), len(prompt), max_new_tokens=100))
    assert draft.tokens == [3, 4, 5, 6, 1, 2] and draft.is_chain()
    assert draft.sources == [SOURCE_PROMPT] * 6
    # Three tokens still allowed: two guesses + the target's own token.
    seq = prompt + [3, 4, 5, 6, 1, 2]
    draft = d.propose(DecodeState(seq, len(prompt), max_new_tokens=9))
    assert draft.tokens == [3, 4]
    assert d.propose(DecodeState(seq, len(prompt), max_new_tokens=7)) is None  # one token left
    # Tokens committed since the last call are indexed: [6, 1, 2, 9] makes [2, 9] new.
    assert d.propose(DecodeState(seq + [9], len(prompt), max_new_tokens=100)) is None
    d.new_turn([8, 9, 8])  # a new generation forgets the old one
    assert d.propose(DecodeState([8, 9, 8], 3, max_new_tokens=100)).tokens == [9, 8]


# ---------------------------------------------------------------- tiny models, greedy

TEXTS = ["abcabcabcabc", "Hello world. Hello world. Hello", "the quick brown fox"]


@pytest.fixture(scope="module", params=["tiny_llama", "tiny_gemma3"])
def tiny(request):
    lm = request.getfixturevalue(request.param)
    return Target(lm.model), lm


def test_greedy_lossless_on_tiny_models(tiny):
    target, lm = tiny
    prompts = [lm.tokenizer.encode(t) for t in TEXTS]
    recs = assert_greedy_lossless(
        target, lambda: PromptLookup(PLDConfig(), vocab_size=lm.vocab_size), prompts, 64
    )
    long = assert_greedy_lossless(
        target, lambda: PromptLookup(PLDConfig(), vocab_size=lm.vocab_size), prompts[:1], 256
    )[0]
    assert long.new_tokens == 256
    for rec in recs + [long]:
        assert rec.steps < rec.new_tokens  # drafts were accepted
        assert rec.accepted_by_source[SOURCE_PROMPT] > 0
        assert set(rec.drafted_by_source) == {SOURCE_PROMPT}


def test_latest_match_is_lossless_too(tiny_llama):
    target = Target(tiny_llama.model)
    prompts = [tiny_llama.tokenizer.encode(t) for t in TEXTS]
    recs = assert_greedy_lossless(
        target, lambda: PromptLookup(PLDConfig(match="latest"), vocab_size=128), prompts, 64
    )
    assert all(r.steps < r.new_tokens for r in recs)


def test_eos_inside_an_accepted_run(tiny_llama):
    text = tiny_llama.tokenizer.encode(TEXTS[1])
    assert_eos_inside_accepted_run(Target(tiny_llama.model), lambda: PromptLookup(vocab_size=128), text)


def test_max_new_tokens_cuts_accepted_runs(tiny_llama):
    prompt = tiny_llama.tokenizer.encode(TEXTS[0])
    assert_max_new_tokens_cuts_accepted_runs(
        Target(tiny_llama.model), lambda: PromptLookup(vocab_size=128), prompt
    )


# ---------------------------------------------------------------- sampling


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0, top_p=0.9)], ids=["top_p"])  # T=1: deep
def test_sampling_preserves_the_target_distribution(params):
    proposed: list[int] = []
    make = counting_proposals(lambda: PromptLookup(PLDConfig(), vocab_size=8), proposed)
    assert_sampling_preserves_distribution(make, params)
    assert sum(proposed) > 0  # the default prompt is repetitive: drafts must fire


# ---------------------------------------------------------------- SmolLM2


def make(lm, **cfg):
    return lambda: PromptLookup(PLDConfig(**cfg), vocab_size=lm.vocab_size, tokenizer=lm.tokenizer)


@pytest.mark.slow  # a real model over long outputs: tests/methods/test_contract.py covers the method on tiny ones
def test_greedy_lossless_on_smollm2(smollm2):
    target = Target(smollm2.model)
    eos = smollm2.eos_token_ids
    edit = assert_greedy_lossless(target, make(smollm2), [chat(smollm2, CODE_EDIT)], 256, eos=eos)[0]
    assert edit.steps < edit.new_tokens  # the answer copies the code
    # Without EOS, so that the generation is long whatever the model says.
    long = assert_greedy_lossless(target, make(smollm2), [chat(smollm2, LONG)], 256)[0]
    assert long.new_tokens == 256 and long.steps < long.new_tokens


@pytest.mark.slow
@pytest.mark.parametrize("match", ["earliest", "latest"])
def test_greedy_lossless_on_smollm2_sweep(smollm2, match):
    target = Target(smollm2.model)
    prompts = [chat(smollm2, t) for t in [CODE_EDIT, LONG, *MORE]]
    recs = assert_greedy_lossless(target, make(smollm2, match=match), prompts, 512, eos=smollm2.eos_token_ids)
    assert sum(r.steps for r in recs) < sum(r.new_tokens for r in recs)
