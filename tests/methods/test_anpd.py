"""ANPD (methods/anpd.py): the n-gram table by hand, then lossless decoding.

Tiny random models (fp32) cover greedy equality, long generations, EOS and
max_new_tokens; SmolLM2 covers a real code-editing prompt; a bigram target
covers sampling.
"""

import pytest
from omegaconf import OmegaConf

from methods.anpd import ANPD, ANPDConfig, NgramTable
from methods.registry import build_method_config, get_method
from specbench.core.acceptance import SamplingParams
from specbench.core.draft import SOURCE_NGRAM, DecodeState
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
    params = OmegaConf.to_container(OmegaConf.load(CONF / "method" / "anpd.yaml"))
    assert params.pop("name") == "anpd"
    assert get_method("anpd") is ANPD
    assert build_method_config("anpd", params) == ANPDConfig()
    assert ANPDConfig() == ANPDConfig(max_order=4, min_order=2, num_draft=6, next_token="frequent")


@pytest.mark.parametrize(
    "bad", [dict(min_order=1), dict(max_order=2, min_order=3), dict(num_draft=0), dict(next_token="random")]
)
def test_bad_settings_are_rejected(bad):
    with pytest.raises(ValueError, match="anpd: "):
        build_method_config("anpd", bad)


TEXT = [1, 2, 3, 1, 2, 4, 1, 2, 3]


def test_table_counts_every_order_and_prefers_the_most_frequent():
    table = NgramTable(2, 4)
    table.add(TEXT)
    assert table.counts[(1, 2)] == {3: 2, 4: 1} and table.best[(1, 2)] == 3
    assert table.counts[(1,)] == {2: 3}
    assert table.best[(3, 1, 2)] == 4 and table.best[(4, 1, 2)] == 3 and table.best[(1, 2, 3)] == 1
    assert (2, 4, 1, 2) not in table.best  # no context longer than max_order - 1
    assert () not in table.best  # nor shorter than min_order - 1
    # A tie goes to the most recent continuation.
    tie = NgramTable(2, 2)
    tie.add([1, 5, 1, 6])
    assert tie.best[(1,)] == 6


def test_frequent_and_latest_differ():
    toks = [1, 2, 3, 1, 2, 3, 1, 2, 4]
    frequent, latest = NgramTable(2, 3, frequent=True), NgramTable(2, 3, frequent=False)
    frequent.add(toks)
    latest.add(toks)
    assert frequent.predict([1, 2]) == (3, 3)
    assert latest.predict([1, 2]) == (4, 3)


def test_back_off_from_the_longest_context():
    table = NgramTable(2, 4)
    table.add(TEXT)
    assert table.predict([2, 3, 1]) == (2, 4)  # the full context of 3 tokens
    assert table.predict([5, 1, 2]) == (3, 3)  # (5, 1, 2) unseen → (1, 2)
    assert table.predict([9, 4]) == (1, 2)  # (9, 4) unseen → (4,)
    assert table.predict([7, 9]) is None
    only_long = NgramTable(3, 4)
    only_long.add(TEXT)
    assert only_long.predict([9, 4]) is None  # no back-off below min_order


def test_draft_chains_lookups_and_stops_without_continuation():
    table = NgramTable(2, 4)
    table.add(TEXT)
    # (1,2)→3, (1,2,3)→1, (2,3,1)→2, (3,1,2)→4, (1,2,4)→1
    assert table.draft([5, 1, 2], 5) == [3, 1, 2, 4, 1]
    assert table.draft([5, 1, 2], 2) == [3, 1]
    short = NgramTable(2, 4)
    short.add([1, 2, 3])
    assert short.draft([1], 5) == [2, 3]  # nothing ever followed 3
    assert short.draft([7], 5) == []


def test_propose_learns_committed_tokens_caps_depth_and_restarts():
    d = ANPD(ANPDConfig(num_draft=6), vocab_size=16)
    d.new_turn([1, 2, 3])
    # From the prompt alone nothing ever followed (1, 2, 3), (2, 3) or (3,).
    assert d.propose(DecodeState([1, 2, 3], 3, max_new_tokens=100)) is None
    state = DecodeState([1, 2, 3, 1, 2], 3, max_new_tokens=100)
    draft = d.propose(state)  # the committed 1, 2 taught it that 3 is followed by 1, 2
    assert draft.tokens == [3, 1, 2, 3, 1, 2] and draft.is_chain()
    assert draft.sources == [SOURCE_NGRAM] * 6
    assert d.table.tokens == [1, 2, 3, 1, 2]
    # Three tokens still allowed: two guesses + the target's own token.
    assert d.propose(DecodeState([1, 2, 3, 1, 2], 3, max_new_tokens=5)).tokens == [3, 1]
    assert d.propose(DecodeState([1, 2, 3, 1, 2], 3, max_new_tokens=3)) is None
    d.new_turn([8, 9])
    assert d.propose(DecodeState([8, 9, 8], 2, max_new_tokens=100)).tokens == [9, 8, 9, 8, 9, 8]


# ---------------------------------------------------------------- tiny models, greedy

TEXTS = ["abcabcabcabc", "Hello world. Hello world. Hello", "the quick brown fox"]


@pytest.fixture(scope="module", params=["tiny_llama", "tiny_gemma3"])
def tiny(request):
    lm = request.getfixturevalue(request.param)
    return Target(lm.model), lm


def test_greedy_lossless_on_tiny_models(tiny):
    target, lm = tiny
    prompts = [lm.tokenizer.encode(t) for t in TEXTS]
    recs = assert_greedy_lossless(target, lambda: ANPD(ANPDConfig(), vocab_size=lm.vocab_size), prompts, 64)
    long = assert_greedy_lossless(
        target, lambda: ANPD(ANPDConfig(), vocab_size=lm.vocab_size), prompts[:1], 256
    )[0]
    assert long.new_tokens == 256
    for rec in recs + [long]:
        assert rec.steps < rec.new_tokens  # drafts were accepted
        assert rec.accepted_by_source[SOURCE_NGRAM] > 0
        assert set(rec.drafted_by_source) == {SOURCE_NGRAM}


def test_latest_rule_and_longer_orders_are_lossless_too(tiny_llama):
    target = Target(tiny_llama.model)
    prompts = [tiny_llama.tokenizer.encode(t) for t in TEXTS]
    cfg = ANPDConfig(max_order=6, min_order=3, num_draft=8, next_token="latest")
    recs = assert_greedy_lossless(target, lambda: ANPD(cfg, vocab_size=128), prompts, 64)
    assert all(r.steps < r.new_tokens for r in recs)


def test_eos_inside_an_accepted_run(tiny_llama):
    text = tiny_llama.tokenizer.encode(TEXTS[1])
    assert_eos_inside_accepted_run(Target(tiny_llama.model), lambda: ANPD(vocab_size=128), text)


def test_max_new_tokens_cuts_accepted_runs(tiny_llama):
    prompt = tiny_llama.tokenizer.encode(TEXTS[0])
    assert_max_new_tokens_cuts_accepted_runs(Target(tiny_llama.model), lambda: ANPD(vocab_size=128), prompt)


# ---------------------------------------------------------------- sampling


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, top_p=0.9)],
    ids=["t1", "top_p"],
)
def test_sampling_preserves_the_target_distribution(params):
    proposed: list[int] = []
    make = counting_proposals(lambda: ANPD(ANPDConfig(), vocab_size=8), proposed)
    assert_sampling_preserves_distribution(make, params)
    assert sum(proposed) > 0  # the default prompt is repetitive: drafts must fire


# ---------------------------------------------------------------- SmolLM2


def make(lm, **cfg):
    return lambda: ANPD(ANPDConfig(**cfg), vocab_size=lm.vocab_size, tokenizer=lm.tokenizer)


@pytest.mark.slow  # 30 s here; ANPD's fast lossless checks run on the tiny models
def test_greedy_lossless_on_smollm2(smollm2):
    target = Target(smollm2.model)
    eos = smollm2.eos_token_ids
    edit = assert_greedy_lossless(target, make(smollm2), [chat(smollm2, CODE_EDIT)], 256, eos=eos)[0]
    assert edit.steps < edit.new_tokens  # the answer copies the code
    # Without EOS, so that the generation is long whatever the model says.
    long = assert_greedy_lossless(target, make(smollm2), [chat(smollm2, LONG)], 256)[0]
    assert long.new_tokens == 256 and long.steps < long.new_tokens


@pytest.mark.slow
@pytest.mark.parametrize("next_token", ["frequent", "latest"])
def test_greedy_lossless_on_smollm2_sweep(smollm2, next_token):
    target = Target(smollm2.model)
    prompts = [chat(smollm2, t) for t in [CODE_EDIT, LONG, *MORE]]
    recs = assert_greedy_lossless(
        target, make(smollm2, next_token=next_token), prompts, 512, eos=smollm2.eos_token_ids
    )
    assert sum(r.steps for r in recs) < sum(r.new_tokens for r in recs)
