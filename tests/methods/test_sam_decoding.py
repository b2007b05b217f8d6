"""SAM-Decoding: which draft a step proposes (dynamic match, static match, Token Recycling below the threshold),
then lossless decoding (tiny models fp32 with and without a store, SmolLM2 fp32, sampling)."""

from __future__ import annotations

import pytest
import torch

from methods.registry import build_method_config, get_method
from methods.sam_decoding import SAMDecoding, SAMDecodingConfig, corpus_automaton
from specbench.core.acceptance import SamplingParams
from specbench.core.draft import (
    SOURCE_PROMPT,
    SOURCE_RECYCLE,
    SOURCE_RETRIEVAL,
    DecodeState,
    Draft,
    VerifyResult,
)
from specbench.core.forward import Target
from specbench.errors import ConfigError
from specbench.run.config import load_preset
from specbench.stores.datastore import tokenizer_identity, write_store
from tests.lossless import (
    CODE_EDIT,
    SMALL_VOCAB,
    assert_eos_inside_accepted_run,
    assert_greedy_lossless,
    assert_max_new_tokens_cuts_accepted_runs,
    assert_sampling_preserves_distribution,
    autoregressive_output,
    chat,
    counting_proposals,
)

IDENT = {"name": "hand", "vocab_size": 40, "vocab_sha256": "h" * 64}


@pytest.fixture
def hand_store(tmp_path):
    docs = [[20, 21, 22, 23, 24, 25, 26, 27, 28, 29], [1, 2, 3, 4, 5, 6, 30, 31]]
    return write_store(tmp_path / "hand", docs, tokenizer=IDENT, source={}, progress=False).path


# ---------------------------------------------------------------- pure parts


def test_config_yaml_and_registry():
    for preset, tree in [("sam_decoding", "paper"), ("sam_decoding-cpu", "cpu")]:
        name, params, _ = load_preset(preset)
        assert name == "sam_decoding"
        assert build_method_config("sam_decoding", params) == SAMDecodingConfig(tree=tree)
    assert get_method("sam_decoding") is SAMDecoding
    for bad in [dict(num_draft=0), dict(auxiliary="medusa"), dict(tree="big"), dict(memory="x"), dict(topk=2)]:
        with pytest.raises(ValueError, match="sam_decoding: "):
            build_method_config("sam_decoding", bad)
    with pytest.raises(ConfigError, match="is a name"):
        SAMDecoding(SAMDecodingConfig(datastore="stdlib"), vocab_size=40)


# Guesses each published script sends after a long match: its n_predicts counts the root token
# (``pred_ids = [start_token] + …``): Spec-Bench's SAMD[EAGLE2] run and SAM-Decoding's inference_samd.sh send
# 40, the reference's default 10.
PUBLISHED_N_PREDICTS = {"sam_decoding": 10, "sam_decoding-cpu": 10, "sam_decoding-eagle": 40,
                        "sam_decoding-eagle-samd": 40}


@pytest.mark.parametrize(("preset", "n_predicts"), PUBLISHED_N_PREDICTS.items())
def test_each_preset_drafts_the_guesses_its_published_script_sends(preset, n_predicts):
    """A text that repeats a 60-token stretch: the match's continuation is longer than any count, so the draft
    holds exactly the preset's guesses, n_predicts − 1 (the root is the step's last committed token)."""
    _, params, _ = load_preset(preset)
    params = {**params, "auxiliary": "none", "datastore": None}  # the dynamic automaton's match alone
    d = SAMDecoding(build_method_config("sam_decoding", params), vocab_size=100)
    stretch = [(7 * i) % 97 + 1 for i in range(60)]
    text = stretch + stretch[:10]
    d.new_turn(text)
    draft = d.propose(DecodeState(text, len(text), 200))
    assert len(draft) == n_predicts - 1 and draft.tokens == stretch[10 : 10 + n_predicts - 1]


def test_the_samd_preset_reads_a_corpus_as_its_evaluation_script_does():
    _, samd, _ = load_preset("sam_decoding-eagle-samd")
    _, spec_bench, _ = load_preset("sam_decoding-eagle")
    assert samd["datastore"] == "auto" and not spec_bench.get("datastore")
    assert {k: samd[k] for k in ("num_draft", "len_threshold", "len_bias", "eagle_depth", "eagle_top_k",
                                 "eagle_total_tokens")} == {k: spec_bench[k] for k in ("num_draft", "len_threshold",
                                 "len_bias", "eagle_depth", "eagle_top_k", "eagle_total_tokens")}


def test_corpus_automaton_is_capped():
    sam = corpus_automaton([[1, 2, 3], [4, 5, 6]], max_tokens=4)
    assert sam.tokens == [1, 2, 3, -1, 4]


def test_dynamic_match_above_the_threshold_else_recycling():
    d = SAMDecoding(SAMDecodingConfig(num_draft=3, len_threshold=3, tree="cpu"), vocab_size=40)
    text = [1, 2, 3, 4, 5, 9, 1, 2]
    d.new_turn(text)
    assert d.propose(DecodeState(text, len(text), 50)) is None  # match [1, 2] < 3, matrix empty
    d.update(VerifyResult([], [7], Draft(), logits=torch.nn.functional.one_hot(torch.tensor([7]), 40).float()))
    draft = d.propose(DecodeState(text, len(text), 50))  # the root 2 now has candidates
    assert draft.tokens[0] == 7 and set(draft.sources) == {SOURCE_RECYCLE}
    text = text + [3]
    draft = d.propose(DecodeState(text, 8, 50))  # [1, 2, 3] matched: 4, 5, 9 followed
    assert draft.tokens == [4, 5, 9] and draft.is_chain() and set(draft.sources) == {SOURCE_PROMPT}
    assert d.propose(DecodeState(text, 8, 3)).tokens == [4]  # one guess left under max_new_tokens
    none = SAMDecoding(SAMDecodingConfig(auxiliary="none"), vocab_size=40)
    none.new_turn([1, 2])
    assert none.propose(DecodeState([1, 2], 2, 50)) is None


def test_static_match_needs_the_bias_to_win(hand_store):
    d = SAMDecoding(SAMDecodingConfig(datastore=str(hand_store), num_draft=4, len_threshold=2, len_bias=2),
                    vocab_size=40)
    prompt = [9, 1, 2, 3, 4, 5]  # the corpus matches 5 tokens, counted as 3; the text's own match is 0
    d.new_turn(prompt)
    draft = d.propose(DecodeState(prompt, len(prompt), 50))
    assert draft.tokens == [6, 30, 31] and set(draft.sources) == {SOURCE_RETRIEVAL}  # stops at the document end
    prompt = [1, 2, 3, 7, 1, 2, 3]  # the text matches 3 tokens; the corpus 3 - 2: the text wins
    d.new_turn(prompt)
    draft = d.propose(DecodeState(prompt, len(prompt), 50))
    assert draft.tokens == [7, 1, 2, 3] and set(draft.sources) == {SOURCE_PROMPT}


def test_memory_scopes_of_the_matrix():
    one = torch.nn.functional.one_hot(torch.tensor([7]), 40).float()
    for memory, kept_turn, kept_sample in [("run", True, True), ("sample", True, False), ("turn", False, False)]:
        d = SAMDecoding(SAMDecodingConfig(memory=memory), vocab_size=40)
        d.new_turn([1, 2])
        d.propose(DecodeState([1, 2], 2, 50))
        d.update(VerifyResult([], [7], Draft(), logits=one))
        d.new_turn([3])
        assert bool(d.matrix.candidates(2)) == kept_turn
        d.update(VerifyResult([], [7], Draft(), logits=one))
        d.begin_sample()
        assert bool(d.matrix.candidates(2)) == kept_sample
        d.reset()
        assert d.matrix.candidates(2) == []


# ---------------------------------------------------------------- tiny models, greedy

TEXTS = ["abcabcabcabc", "Hello world. Hello world. Hello", "the quick brown fox"]


@pytest.fixture(scope="module", params=["tiny_llama", "tiny_gemma3"])
def tiny(request, tmp_path_factory):
    """A tiny model and a store holding its own greedy continuation of the first prompt."""
    lm = request.getfixturevalue(request.param)
    target = Target(lm.model)
    prompts = [lm.tokenizer.encode(t) for t in TEXTS]
    docs = [prompts[2] + autoregressive_output(target, prompts[2], 64)]
    path = tmp_path_factory.mktemp("store") / request.param
    write_store(path, docs, tokenizer=tokenizer_identity(lm.tokenizer, request.param), source={}, progress=False)
    return target, lm, prompts, path


@pytest.mark.parametrize("store", [False, True])
def test_greedy_lossless_on_tiny_models(tiny, store):
    target, lm, prompts, path = tiny
    cfg = SAMDecodingConfig(datastore=str(path) if store else None, tree="cpu", len_threshold=2)
    shared = SAMDecoding(cfg, vocab_size=lm.vocab_size, tokenizer=lm.tokenizer)
    recs = assert_greedy_lossless(target, lambda: shared, prompts, 64)
    assert all(r.steps < r.new_tokens for r in recs)
    sources = set().union(*(r.accepted_by_source for r in recs))
    assert {SOURCE_PROMPT, SOURCE_RECYCLE} <= sources
    assert (SOURCE_RETRIEVAL in sources) == store  # the store holds the third prompt's continuation


def test_eos_and_max_new_tokens(tiny_llama):
    target = Target(tiny_llama.model)
    make = lambda: SAMDecoding(SAMDecodingConfig(auxiliary="none", len_threshold=2), vocab_size=128)  # noqa: E731
    assert_eos_inside_accepted_run(target, make, tiny_llama.tokenizer.encode(TEXTS[1]))
    assert_max_new_tokens_cuts_accepted_runs(target, make, tiny_llama.tokenizer.encode(TEXTS[0]))


@pytest.mark.parametrize(
    "params", [SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, top_p=0.9)], ids=["t1", "top_p"]
)
def test_sampling_preserves_the_target_distribution(params):
    shared = SAMDecoding(SAMDecodingConfig(tree="cpu", len_threshold=2), vocab_size=SMALL_VOCAB)
    proposed: list[int] = []
    counted = counting_proposals(lambda: shared, proposed)()
    assert_sampling_preserves_distribution(lambda: counted, params)
    assert sum(proposed) > 0


@pytest.mark.slow  # a real model: make test-slow (make test keeps the smaller checks)
def test_greedy_lossless_on_smollm2(smollm2):
    target = Target(smollm2.model)
    d = SAMDecoding(SAMDecodingConfig(tree="cpu"), vocab_size=smollm2.vocab_size)
    rec = assert_greedy_lossless(target, lambda: d, [chat(smollm2, CODE_EDIT)], 96, eos=smollm2.eos_token_ids)[0]
    assert rec.steps < rec.new_tokens and rec.accepted_by_source[SOURCE_PROMPT] > 0


def test_preflight_names_the_build_command_before_the_model_loads(tmp_path, hand_store, monkeypatch):
    from tests.run.test_config import make_cfg

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    run_cfg = make_cfg("method=sam_decoding", "model=tiny-llama", "method.datastore=nostore")
    with pytest.raises(ConfigError, match="make datastore MODEL=tiny-llama SOURCE=nostore") as err:
        SAMDecoding.preflight(SAMDecodingConfig(datastore="nostore"), run_cfg)
    assert "\n" not in str(err.value)
    cfg = SAMDecodingConfig(datastore=str(hand_store))
    SAMDecoding.preflight(cfg, run_cfg)  # a path: found, and the drafter reads it from there
    assert SAMDecoding(cfg, vocab_size=40).static.tokens[:3] == [20, 21, 22]
    SAMDecoding.preflight(SAMDecodingConfig(), run_cfg)  # no store: nothing to check


def test_recycled_candidates_are_filed_under_the_steps_own_root():
    """A step that drafts a suffix-automaton chain still teaches the recycler, under that step's root (not the
    root of the last step the recycler drafted)."""
    sam = SAMDecoding(SAMDecodingConfig(len_threshold=2, num_draft=2, topk=4, tree="cpu"), vocab_size=40)
    state = lambda tokens: DecodeState(tokens, 1, 64, 1)  # noqa: E731
    first = sam.propose(state([7]))  # nothing matched: the recycler's turn (and nothing known yet)
    assert first is None and sam.recycler.root == 7
    chain = sam.propose(state([7, 1, 2, 3, 9, 1, 2]))  # "1 2" seen before: the automaton copies "3 9 ..."
    assert chain is not None and chain.sources[0] == SOURCE_PROMPT
    logits = torch.zeros(1 + len(chain.tokens), 40)
    logits[0, 33], logits[0, 34] = 2.0, 1.0  # what the target predicted after the root (2)
    sam.update(VerifyResult([], [33], chain, logits=logits, root_logits=logits[0]))
    assert sam.recycler.matrix.candidates(2)[:2] == [33, 34]
    assert sam.recycler.matrix.candidates(7) == []
