"""REST and SPECTRA-RETRIEVAL (methods/rest.py, methods/spectra_retrieval.py): drafts from a store,
greedy losslessness on tiny models, EOS and max_new_tokens inside accepted runs, sampling."""

import pytest

from methods.registry import build_method_config, get_method
from methods.rest import REST, RESTConfig
from methods.spectra_retrieval import SpectraRetrieval, SpectraRetrievalConfig
from specbench.core.acceptance import SamplingParams
from specbench.core.draft import SOURCE_RETRIEVAL, DecodeState
from specbench.core.forward import Target
from specbench.errors import ConfigError
from specbench.run.config import load_preset
from specbench.stores.datastore import tokenizer_identity, write_store
from tests.lossless import (
    SMALL_VOCAB,
    assert_eos_inside_accepted_run,
    assert_greedy_lossless,
    assert_max_new_tokens_cuts_accepted_runs,
    assert_sampling_preserves_distribution,
    autoregressive_output,
    counting_proposals,
    small_vocab_target,
)

IDENT = {"name": "hand", "vocab_size": 10, "vocab_sha256": "h" * 64}
DOCS = [[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9], [7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7]]


@pytest.fixture
def hand_store(tmp_path):
    return write_store(tmp_path / "hand", DOCS, tokenizer=IDENT, source={"kind": "hand"}, progress=False).path


# ---------------------------------------------------------------- configs


@pytest.mark.parametrize("preset,cls,config", [
    ("rest", REST, RESTConfig()),
    ("rest-cpu", REST, RESTConfig(max_nodes=16, max_continuation=8)),
    ("spectra_retrieval", SpectraRetrieval, SpectraRetrievalConfig()),
    ("spectra_retrieval-cpu", SpectraRetrieval, SpectraRetrievalConfig(max_guesses=5, max_continuation=4)),
])
def test_presets(preset, cls, config):
    name, params, _ = load_preset(preset)
    assert get_method(name) is cls
    assert build_method_config(name, params) == config


@pytest.mark.parametrize("bad", [dict(max_nodes=0), dict(min_suffix=0), dict(max_suffix=1, min_suffix=2),
                                 dict(max_occurrences=0), dict(max_continuation=0)])
def test_bad_settings(bad):
    with pytest.raises(ValueError, match="RESTConfig|rest:"):
        build_method_config("rest", bad)


def test_a_store_name_needs_the_runner(hand_store):
    with pytest.raises(ConfigError, match="is a name"):
        REST(RESTConfig(datastore="stdlib"), vocab_size=10)


# ---------------------------------------------------------------- drafts by hand


def test_rest_draft_is_the_top_trie_nodes(hand_store):
    d = REST(RESTConfig(datastore=str(hand_store)), vocab_size=10)
    draft = d.propose(DecodeState([0, 1, 2], 3, max_new_tokens=100))
    # after [1 2]: 3 4 (x2), 3 5, 9 -> nodes 3 (3), 3-4 (2), 3-5 (1), 9 (1)
    assert (draft.tokens, draft.parents) == ([3, 4, 5, 9], [-1, 0, 0, -1])
    assert draft.sources == [SOURCE_RETRIEVAL] * 4 and draft.lookup_s > 0
    small = REST(RESTConfig(datastore=str(hand_store), max_nodes=2), vocab_size=10)
    assert small.propose(DecodeState([0, 1, 2], 3, max_new_tokens=100)).tokens == [3, 4]
    # depth cap: two tokens left -> guesses of depth 1 only
    capped = d.propose(DecodeState([0, 1, 2], 1, max_new_tokens=4))
    assert (capped.tokens, capped.parents) == ([3, 9], [-1, -1])
    assert d.propose(DecodeState([0, 1, 2], 2, max_new_tokens=2)) is None  # one token left: nothing to guess
    # no match: an empty draft that still reports its lookup time
    empty = d.propose(DecodeState([0, 8, 8], 3, max_new_tokens=100))
    assert empty.empty and len(empty) == 0 and empty.lookup_s > 0


def test_spectra_retrieval_draft_is_the_best_sequences(hand_store):
    cfg = SpectraRetrievalConfig(datastore=str(hand_store), max_guesses=2, refine=False)
    draft = SpectraRetrieval(cfg, vocab_size=10).propose(DecodeState([0, 1, 2], 3, max_new_tokens=100))
    # sequences 3-4 (score 5) and 3-5 (score 4) merged: 3, 4, 5
    assert (draft.tokens, draft.parents) == ([3, 4, 5], [-1, 0, 0])
    assert draft.sources == [SOURCE_RETRIEVAL] * 3
    seven = SpectraRetrieval(cfg, vocab_size=10).propose(DecodeState([7, 7, 7], 3, max_new_tokens=100))
    assert seven.tokens == [7] * 9  # twelve 7s: at most nine follow a match of three
    # refine: true reads the refined store beside the given one
    with pytest.raises(ConfigError, match="hand-refined"):
        SpectraRetrieval(SpectraRetrievalConfig(datastore=str(hand_store)), vocab_size=10)


# ---------------------------------------------------------------- tiny models, greedy

TEXTS = ["abcabcabcabc", "Hello world. Hello world. Hello", "the quick brown fox"]


@pytest.fixture(scope="module", params=["tiny_llama", "tiny_gemma3"])
def tiny(request, tmp_path_factory):
    """A tiny model and a store of its own greedy continuations (plus noise), so drafts hit and miss."""
    lm = request.getfixturevalue(request.param)
    target = Target(lm.model)
    prompts = [lm.tokenizer.encode(t) for t in TEXTS]
    docs = [p + autoregressive_output(target, p, 40) for p in prompts[:2]]
    docs += [lm.tokenizer.encode("Hello there, the quick red fox. abcabd")]
    path = tmp_path_factory.mktemp("store") / request.param
    write_store(path, docs, tokenizer=tokenizer_identity(lm.tokenizer, request.param), source={}, progress=False)
    return target, lm, prompts, path


def _makers(lm, path):
    return {
        "rest": lambda: REST(RESTConfig(datastore=str(path)), vocab_size=lm.vocab_size, tokenizer=lm.tokenizer),
        "spectra_retrieval": lambda: SpectraRetrieval(
            SpectraRetrievalConfig(datastore=str(path), refine=False), vocab_size=lm.vocab_size,
            tokenizer=lm.tokenizer),
    }


@pytest.mark.parametrize("method", ["rest", "spectra_retrieval"])
def test_greedy_lossless_on_tiny_models(tiny, method):
    target, lm, prompts, path = tiny
    recs = assert_greedy_lossless(target, _makers(lm, path)[method], prompts, 64)
    assert recs[0].steps < recs[0].new_tokens  # the store holds this continuation: drafts accepted
    assert recs[0].accepted_by_source[SOURCE_RETRIEVAL] > 0
    assert all(set(r.drafted_by_source) <= {SOURCE_RETRIEVAL} for r in recs)
    assert all(len(r.step_lookup_s) == r.steps and sum(r.step_lookup_s[1:]) > 0 for r in recs)


@pytest.mark.parametrize("method", ["rest", "spectra_retrieval"])
def test_eos_and_max_new_tokens_inside_accepted_runs(tiny, method, tmp_path):
    target, lm, prompts, _ = tiny
    # a store of the continuation that assert_eos_inside_accepted_run decodes
    text = prompts[0]
    prompt = text + autoregressive_output(target, text, 30)
    doc = prompt + autoregressive_output(target, prompt, 60)
    write_store(tmp_path / "s", [doc], tokenizer=tokenizer_identity(lm.tokenizer), source={}, progress=False)
    make = _makers(lm, tmp_path / "s")[method]
    assert_eos_inside_accepted_run(target, make, text)
    assert_max_new_tokens_cuts_accepted_runs(target, make, prompts[0])


# ---------------------------------------------------------------- sampling


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    ident = {"name": "small", "vocab_size": SMALL_VOCAB, "vocab_sha256": "s" * 64}
    docs = [[1, 2, 3, 1, 2, 3, 4, 1, 2, 3], [2, 3, 4, 5, 6], [3, 1, 2, 0, 7, 1], [1, 2, 5, 5, 5]]
    docs.append([t for a in range(SMALL_VOCAB) for b in range(SMALL_VOCAB) for t in (a, b)])  # every bigram
    return write_store(tmp_path_factory.mktemp("small") / "s", docs, tokenizer=ident, source={},
                       progress=False).path


@pytest.mark.parametrize("method,params", [
    ("rest", SamplingParams(temperature=1.0)),
    ("spectra_retrieval", SamplingParams(temperature=1.0)),
    ("rest", SamplingParams(temperature=0.7, top_p=0.9)),
], ids=["rest-t1", "spectra_retrieval-t1", "rest-top_p"])
def test_sampling_preserves_the_target_distribution(small_store, method, params):
    proposed: list[int] = []
    cfgs = {"rest": lambda: REST(RESTConfig(datastore=str(small_store)), vocab_size=SMALL_VOCAB),
            "spectra_retrieval": lambda: SpectraRetrieval(
                SpectraRetrievalConfig(datastore=str(small_store), refine=False, max_guesses=3),
                vocab_size=SMALL_VOCAB)}
    assert_sampling_preserves_distribution(counting_proposals(cfgs[method], proposed), params)
    assert sum(proposed) > 0


@pytest.mark.slow
@pytest.mark.parametrize("method", ["rest", "spectra_retrieval"])
def test_sampling_through_the_real_mask(small_store, method):
    proposed: list[int] = []
    cfgs = {"rest": lambda: REST(RESTConfig(datastore=str(small_store)), vocab_size=SMALL_VOCAB),
            "spectra_retrieval": lambda: SpectraRetrieval(
                SpectraRetrievalConfig(datastore=str(small_store), refine=False), vocab_size=SMALL_VOCAB)}
    assert_sampling_preserves_distribution(counting_proposals(cfgs[method], proposed),
                                           SamplingParams(temperature=1.0), target=small_vocab_target(),
                                           trials=3000)
    assert sum(proposed) > 0
