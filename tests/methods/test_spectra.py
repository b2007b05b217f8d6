"""Full SPECTRA (methods/spectra.py) and Lookahead + REST (methods/lookahead_rest.py).

Stores are built in a tmp dir with the datastore writer from a few token
sequences (the model's own continuations, so retrieval guesses get accepted).
"""

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from methods.lookahead_rest import LookaheadRest, LookaheadRestConfig, leaf_paths
from methods.registry import build_method_config, get_method
from methods.spectra import Spectra, SpectraConfig
from specbench.core.acceptance import SamplingParams
from specbench.core.decode import generate
from specbench.core.draft import SOURCE_BWD, SOURCE_FWD, SOURCE_POOL, SOURCE_RETRIEVAL, DecodeState
from specbench.core.forward import Target
from specbench.run.config import load_preset
from specbench.stores.datastore import tokenizer_identity, write_store
from tests.lossless import (
    SMALL_VOCAB,
    BigramTarget,
    assert_eos_inside_accepted_run,
    assert_greedy_lossless,
    assert_max_new_tokens_cuts_accepted_runs,
    assert_sampling_preserves_distribution,
    autoregressive_output,
    chat,
    counting_proposals,
    small_vocab_target,
)

ROOT = Path(__file__).resolve().parents[2]
IDENT = {"name": "hand", "vocab_size": 10, "vocab_sha256": "h" * 64}
DOCS = [[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9], [7, 7, 7, 7, 7, 7]]
SMALL = dict(ngram_size=4, pool_size=5, max_guesses=5, max_continuation=4)  # spectra-cpu's budget


def store(path, docs, ident=IDENT):
    return str(write_store(path, docs, tokenizer=ident, source={"kind": "test"}, progress=False).path)


@pytest.fixture
def hand_store(tmp_path):
    return store(tmp_path / "hand", DOCS)


def spectra(path, vocab=10, tokenizer=None, **kw):
    return Spectra(SpectraConfig(datastore=path, refine=False, **kw), vocab_size=vocab, tokenizer=tokenizer)


def lookahead_rest(path, vocab=10, tokenizer=None, **kw):
    cfg = LookaheadRestConfig(datastore=path, **{"window": 4, "ngram": 4, "guesses": 4, "max_nodes": 16, **kw})
    return LookaheadRest(cfg, vocab_size=vocab, tokenizer=tokenizer)


# ---------------------------------------------------------------- presets and settings


@pytest.mark.parametrize(
    "preset,expected",
    [
        ("spectra", SpectraConfig(context_ngrams=False)),  # "auto" under the preset's fixed budget
        ("spectra-cpu", SpectraConfig(**SMALL, context_ngrams=True)),
        ("lookahead_rest", LookaheadRestConfig()),
        ("lookahead_rest-cpu", LookaheadRestConfig(window=5, ngram=4, guesses=5, pool_from_prompt=True, max_nodes=16,
                                                   max_continuation=8)),
    ],
)
def test_presets(preset, expected):
    name, raw, _ = load_preset(preset)
    assert get_method(name).Config is type(expected)
    assert build_method_config(name, raw) == expected
    if name == "spectra":  # the paper's budget and direction of the coverage rule, refined store
        assert (expected.coverage_threshold, expected.coverage_reading, expected.refine) == (0.1, "literal_ngram", True)


@pytest.mark.parametrize(
    "cls,bad",
    [
        (SpectraConfig, dict(max_guesses=0)),
        (SpectraConfig, dict(coverage_reading="lit")),
        (SpectraConfig, dict(min_suffix=0)),
        (LookaheadRestConfig, dict(ngram=2)),
        (LookaheadRestConfig, dict(max_nodes=0)),
    ],
)
def test_bad_settings_fail_in_one_line(cls, bad):
    with pytest.raises(ValueError) as err:
        cls(**bad).validate()
    assert "\n" not in str(err.value)


def test_leaf_paths_read_a_tree_back_as_sequences():
    # 0:1 ─ 1:2 ─ 2:3 ; 1:2 ─ 3:5 ; 4:9 (a second child of the root)
    assert leaf_paths([1, 2, 3, 5, 9], [-1, 0, 1, 1, -1]) == [[1, 2, 3], [1, 2, 5], [9]]
    assert leaf_paths([], []) == []


# ---------------------------------------------------------------- drafts without a model


def test_core_guesses_first_then_retrieval_fills_the_budget(hand_store):
    d = spectra(hand_store, ngram_size=3, max_guesses=3, max_continuation=3)
    d.new_turn([6, 1, 2])
    d.engine.dicts.push_fwd(2, (8, 8))  # one CORE guess for root 2
    state = DecodeState([6, 1, 2], 3, max_new_tokens=20)
    seqs, sources, lookup = d.guesses(state)
    # the store's continuations of (1, 2): (3, 4) twice, (3, 5), (9,): the best two fill G - 1 = 2
    assert seqs == [[8, 8], [3, 4], [3, 5]] and sources == [SOURCE_FWD, SOURCE_RETRIEVAL, SOURCE_RETRIEVAL]
    assert lookup > 0
    draft = d.propose(state)
    assert draft.tokens == [8, 8, 3, 4, 5] and draft.parents == [-1, 0, -1, 2, 2]
    assert draft.lookup_s > 0 and draft.n_aux == 15 * 2  # CORE's pool rides along as auxiliary nodes
    # G filled by CORE alone: no lookup at all
    for i in range(3):
        d.engine.dicts.push_fwd(2, (i, i))
    seqs, sources, lookup = d.guesses(state)
    assert sources == [SOURCE_FWD] * 3 and lookup == 0.0
    # retrieval guesses are cut to what the generation may still take
    d2 = spectra(hand_store, ngram_size=3, max_guesses=3)
    d2.new_turn([6, 1, 2])
    assert d2.guesses(DecodeState([6, 1, 2], 3, max_new_tokens=2))[0] == [[3], [9]]


def test_lookahead_rest_unites_pool_guesses_and_rest_tree(hand_store):
    d = lookahead_rest(hand_store, window=2, ngram=3, guesses=2)
    d.new_turn([6, 1, 2])
    d.engine.pool.add(2, (3, 7))  # a pool n-gram for root 2 sharing its first token with the store's
    draft = d.propose(DecodeState([6, 1, 2], 3, max_new_tokens=20))
    assert draft.tokens == [3, 7, 4, 5, 9] and draft.parents == [-1, 0, 0, 0, -1]
    assert draft.sources == [(SOURCE_POOL, SOURCE_RETRIEVAL), SOURCE_POOL, SOURCE_RETRIEVAL, SOURCE_RETRIEVAL,
                             SOURCE_RETRIEVAL]
    assert draft.lookup_s > 0 and draft.n_aux == len(d.engine.levels[0])  # the window, level 0


def test_a_node_shared_by_a_core_and_a_retrieval_guess_counts_for_both(tmp_path):
    """One step on a bigram target: CORE guesses (x1, x2), the store continues with (x1, y); x1 is
    accepted once and credited to both sources, x2 to the forward dictionary alone."""
    target = BigramTarget()
    prompt = [1, 2, 3, 1, 2, 3, 4, 1, 2]
    x0, x1, x2, x3 = autoregressive_output(target, prompt, 4)
    y = (x2 + 1) % SMALL_VOCAB
    path = store(tmp_path / "s", [[prompt[-1], x0, x1, y]], {"name": "b", "vocab_size": SMALL_VOCAB,
                                                             "vocab_sha256": "b" * 64})

    class Seeded(Spectra):
        def start(self, prompt_ids):
            super().start(prompt_ids)
            self.engine.dicts.push_fwd(x0, (x1, x2))

    d = Seeded(SpectraConfig(datastore=path, refine=False, use_backward_dict=False, ngram_size=3, pool_size=2,
                             max_guesses=3), vocab_size=SMALL_VOCAB)
    rec = generate(target, d, prompt, max_new_tokens=4)
    assert rec.output_ids == [x0, x1, x2, x3] and rec.step_tokens == [1, 3]
    assert rec.drafted_by_source == {SOURCE_FWD: 2, SOURCE_RETRIEVAL: 2}
    assert rec.accepted_by_source == {SOURCE_FWD: 2, SOURCE_RETRIEVAL: 1}
    assert rec.step_lookup_s[1] > 0


# ---------------------------------------------------------------- lossless on tiny models

TEXTS = ["The quick brown fox jumps over the lazy dog.", "def add(a, b):\n    return a + b\n", "Once upon a time"]


@pytest.fixture(scope="module", params=["tiny_llama", "tiny_gemma3"])
def tiny(request, tmp_path_factory):
    """A tiny model and a store of its own greedy continuations of the first two prompts."""
    lm = request.getfixturevalue(request.param)
    target = Target(lm.model)
    prompts = [lm.tokenizer.encode(t) for t in TEXTS]
    docs = [p + autoregressive_output(target, p, 48) for p in prompts[:2]]
    path = tmp_path_factory.mktemp("store") / request.param
    store(path, docs, tokenizer_identity(lm.tokenizer, request.param))
    return target, lm, prompts, str(path)


def makers(lm, path, **kw):
    return {
        "spectra": lambda: spectra(path, lm.vocab_size, lm.tokenizer, **{**SMALL, **kw}),
        "lookahead_rest": lambda: lookahead_rest(path, lm.vocab_size, lm.tokenizer),
    }


@pytest.mark.parametrize("method", ["spectra", "lookahead_rest"])
def test_greedy_lossless_on_tiny_models(tiny, method):
    target, lm, prompts, path = tiny
    recs = assert_greedy_lossless(target, makers(lm, path)[method], prompts, 64)
    assert recs[0].accepted_by_source[SOURCE_RETRIEVAL] > 0 and recs[0].steps < recs[0].new_tokens / 2
    internal = {"spectra": {SOURCE_FWD, SOURCE_BWD}, "lookahead_rest": {SOURCE_POOL}}[method]
    assert any(set(r.drafted_by_source) & internal for r in recs)
    assert all(set(r.drafted_by_source) <= internal | {SOURCE_RETRIEVAL} for r in recs)
    assert all(len(r.step_lookup_s) == r.steps and sum(r.step_lookup_s[1:]) > 0 for r in recs)
    assert all(max(r.step_aux) > 0 for r in recs)  # pool / window in the same forward


@pytest.mark.parametrize("method", ["spectra", "lookahead_rest"])
def test_eos_and_max_new_tokens_inside_accepted_runs(tiny, method, tmp_path):
    target, lm, prompts, _ = tiny
    text = prompts[0]
    prompt = text + autoregressive_output(target, text, 30)
    doc = prompt + autoregressive_output(target, prompt, 60)
    path = store(tmp_path / "s", [doc], tokenizer_identity(lm.tokenizer))
    make = makers(lm, path)[method]
    assert_eos_inside_accepted_run(target, make, text)
    assert_max_new_tokens_cuts_accepted_runs(target, make, prompts[0])


@pytest.mark.parametrize(
    "fwd,bwd,sub,cov", list(itertools.product([True, False], repeat=4)), ids=lambda v: "TF"[not v]
)
def test_every_ablation_of_spectra_is_lossless(tiny_llama, tmp_path_factory, fwd, bwd, sub, cov):
    target = Target(tiny_llama.model)
    prompts = [tiny_llama.tokenizer.encode(t) for t in TEXTS[:2]]
    path = tmp_path_factory.mktemp("abl") / "s"
    store(path, [prompts[0] + autoregressive_output(target, prompts[0], 48)], tokenizer_identity(tiny_llama.tokenizer))
    kw = dict(use_forward_dict=fwd, use_backward_dict=bwd, sub_ngrams=sub, coverage=cov)
    recs = assert_greedy_lossless(target, makers(tiny_llama, str(path), **kw)["spectra"], prompts, 40)
    for r in recs:
        assert (SOURCE_FWD in r.drafted_by_source) <= fwd and (SOURCE_BWD in r.drafted_by_source) <= bwd
    assert recs[0].accepted_by_source[SOURCE_RETRIEVAL] > 0


@pytest.mark.parametrize("reading", ["epsilon", "literal_key", "literal_ngram"])
def test_every_coverage_reading_of_spectra_is_lossless(tiny, reading):
    target, lm, prompts, path = tiny
    assert_greedy_lossless(target, makers(lm, path, coverage_reading=reading)["spectra"], prompts, 48)


# ---------------------------------------------------------------- sampling


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    ident = {"name": "small", "vocab_size": SMALL_VOCAB, "vocab_sha256": "s" * 64}
    docs = [[1, 2, 3, 1, 2, 3, 4, 1, 2, 3], [2, 3, 4, 5, 6], [3, 1, 2, 0, 7, 1], [1, 2, 5, 5, 5]]
    docs.append([t for a in range(SMALL_VOCAB) for b in range(SMALL_VOCAB) for t in (a, b)])  # every bigram
    return store(tmp_path_factory.mktemp("small") / "s", docs, ident)


SAMPLERS = {
    "spectra": lambda path, seed: Spectra(
        SpectraConfig(datastore=path, refine=False, ngram_size=3, pool_size=3, max_guesses=3, max_continuation=3),
        vocab_size=SMALL_VOCAB,
        seed=seed,
    ),
    "lookahead_rest": lambda path, seed: LookaheadRest(
        LookaheadRestConfig(datastore=path, window=3, ngram=3, guesses=3, max_nodes=6, max_continuation=3),
        vocab_size=SMALL_VOCAB,
        seed=seed,
    ),
}


@pytest.mark.parametrize("method", list(SAMPLERS))
@pytest.mark.parametrize(
    "params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9)], ids=["t1", "p09"]
)
def test_sampling_preserves_the_target_distribution(small_store, method, params):
    proposed: list[int] = []
    seeds = itertools.count()
    make = counting_proposals(lambda: SAMPLERS[method](small_store, next(seeds)), proposed)
    assert_sampling_preserves_distribution(make, params, trials=2500)
    assert sum(proposed) > 1000


@pytest.mark.parametrize("method", list(SAMPLERS))
def test_sampling_through_the_real_mask(small_store, method):
    """The same test through a real tiny transformer: guesses, pool/window and the 4-D mask."""
    proposed: list[int] = []
    seeds = itertools.count()
    make = counting_proposals(lambda: SAMPLERS[method](small_store, next(seeds)), proposed)
    assert_sampling_preserves_distribution(make, SamplingParams(temperature=1.0), target=small_vocab_target(),
                                           trials=600)
    assert sum(proposed) > 300


# ---------------------------------------------------------------- SmolLM2 (fp32)

SMOL_TEXTS = [
    "Rewrite this function to use a list comprehension:\n\ndef even_squares(numbers):\n    result = []\n"
    "    for n in numbers:\n        if n % 2 == 0:\n            result.append(n * n)\n    return result\n",
    "List the days of the week, one per line.",
]


@pytest.mark.slow  # a real model over long outputs: tests/methods/test_contract.py covers the method on tiny ones
def test_smollm2_greedy_lossless(smollm2, tmp_path):
    target, tok = Target(smollm2.model), smollm2.tokenizer
    prompts = [chat(smollm2, t) for t in SMOL_TEXTS]
    # the store: the model's answer to the first prompt, and some Python (not the second prompt's answer)
    docs = [prompts[0] + autoregressive_output(target, prompts[0], 40), tok.encode("def f(x):\n    return [x * x]\n")]
    path = store(tmp_path / "s", docs, tokenizer_identity(tok, "smollm2-135m"))
    eos = [tok.eos_token_id]
    for method in ("spectra", "lookahead_rest"):
        recs = assert_greedy_lossless(target, makers(smollm2, path)[method], prompts, 40, eos)
        assert recs[0].accepted_by_source[SOURCE_RETRIEVAL] > 0


# ---------------------------------------------------------------- run.py


def test_run_py_without_a_store_names_the_build_command_before_loading(tmp_path):
    env = {**os.environ, "SPECBENCH_CACHE": str(tmp_path / "cache")}
    args = [sys.executable, "run.py", "experiment=smoke", "method=spectra", f"results_dir={tmp_path}/r",
            "progress=false", "build_budget=0"]  # no building on demand: the one-line refusal
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: spectra: building the stdlib store (~") and "its perplexity-refined copy" in last
    assert last.endswith("build it first with `make datastore MODEL=tiny-llama SOURCE=stdlib && "
                         "make datastore-refine MODEL=tiny-llama STORE=stdlib` (or set build_budget=)")
    assert not list(tmp_path.rglob("*.parquet"))


@pytest.mark.parametrize("reading", ["epsilon", "literal_key", "literal_ngram"])
@pytest.mark.parametrize("ablation", ["core", "no_fwd", "no_bwd", "no_sub", "no_coverage"])
@pytest.mark.parametrize("method", ["spectra_core", "spectra"])
def test_table2_ablations_compose_for_every_reading(method, ablation, reading):
    from hydra import compose, initialize_config_dir

    from specbench.paths import CONF_DIR
    from specbench.run.config import validate

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"method={method}", f"+ablation={ablation}",
                                           f"method.coverage_reading={reading}"])
    settings = validate(cfg)["method"]
    assert type(settings) is get_method(method).Config and settings.coverage_reading == reading
    off = {"core": None, "no_fwd": "use_forward_dict", "no_bwd": "use_backward_dict", "no_sub": "sub_ngrams",
           "no_coverage": "coverage"}[ablation]
    for field in ("use_forward_dict", "use_backward_dict", "sub_ngrams", "coverage"):
        assert getattr(settings, field) is (field != off)
