"""SuffixDecoding: the counted suffix trie and its scored speculation against brute force, then lossless
decoding (tiny models fp32, SmolLM2 fp32, sampling) and the memory scopes."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from omegaconf import OmegaConf

from methods.registry import build_method_config, get_method
from methods.suffix import SuffixConfig, SuffixDecoding
from specbench.core.acceptance import SamplingParams
from specbench.core.draft import SOURCE_HISTORY, SOURCE_PROMPT, DecodeState, Draft
from specbench.core.forward import Target
from specbench.drafting.suffix_trie import SuffixTrie
from specbench.run.config import load_preset
from tests.conftest import CONF
from tests.lossless import (
    CODE_EDIT,
    assert_eos_inside_accepted_run,
    assert_greedy_lossless,
    assert_max_new_tokens_cuts_accepted_runs,
    assert_sampling_preserves_distribution,
    chat,
    counting_proposals,
)

# ---------------------------------------------------------------- pure parts


def occurrences(seqs: list[list[int]], depth: int) -> Counter:
    """Every substring of at most ``depth`` tokens, with its number of occurrences."""
    c: Counter = Counter()
    for s in seqs:
        for i in range(len(s)):
            for j in range(i + 1, min(len(s), i + depth) + 1):
                c[tuple(s[i:j])] += 1
    return c


def brute_best_score(seqs, context, depth, max_tokens, factor, min_prob):
    """max over match lengths m of the summed probabilities of the ``budget(m)`` most probable continuations."""
    occ = occurrences(seqs, depth)
    best = 0.0
    context = context[-depth:]
    for m in range(1, len(context) + 1):
        w = tuple(context[len(context) - m :])
        if not occ[w]:
            break
        probs = sorted(
            (n / occ[w] for s, n in occ.items() if len(s) > m and s[:m] == w and n / occ[w] >= min_prob),
            reverse=True,
        )
        best = max(best, sum(probs[: min(max_tokens, int(m * factor + 1e-6))]))
    return best


def test_counts_agree_with_brute_force():
    rng = random.Random(0)
    for _ in range(50):
        depth = rng.randrange(1, 6)
        trie = SuffixTrie(depth)
        seqs = []
        for _ in range(rng.randrange(1, 4)):
            seq, s = trie.new_sequence(), []
            for _ in range(rng.randrange(1, 5)):  # grows in chunks
                chunk = [rng.randrange(3) for _ in range(rng.randrange(0, 6))]
                trie.extend(seq, chunk)
                s += chunk
            seqs.append(s)
        for sub, n in occurrences(seqs, depth).items():
            assert trie.count[trie.find(sub)] == n
        assert trie.n_nodes == len(occurrences(seqs, depth)) + 1  # no node without an occurrence
        assert trie.find([7]) == -1


def test_hand_worked_speculation():
    trie = SuffixTrie(8)
    trie.extend(trie.new_sequence(), [1, 2, 3, 1, 2, 4, 1, 2, 3, 9, 1, 2])
    # [1, 2] occurs 4 times: followed by 3 (twice), 4 (once), nothing (the end); [2] the same.
    spec = trie.speculate([5, 1, 2], max_tokens=8, max_spec_factor=1.0, min_token_prob=0.2)
    assert spec.match_len == 2 and spec.tokens == [3, 4] and spec.parents == [-1, -1]
    assert spec.probs == [0.5, 0.25] and spec.score == 0.75
    chain = trie.speculate([5, 1, 2], max_tokens=8, max_spec_factor=2.0, min_token_prob=0.1, tree=False)
    # the most frequent child each time (the first seen on ties): [1,2] -> 3 (2/4), [1,2,3] -> 1 (1/2), then
    # [1,2,3,1] -> 2 -> 4 (1/1 each); the budget is 2 x 2 tokens
    assert chain.tokens == [3, 1, 2, 4] and chain.parents == [-1, 0, 1, 2]
    assert chain.probs == [0.5, 0.25, 0.25, 0.25] and chain.match_len == 2
    assert trie.speculate([7], max_tokens=8).tokens == []


@pytest.mark.parametrize("tree", [True, False])
def test_speculation_agrees_with_brute_force(tree):
    rng = random.Random(1)
    for _ in range(150):
        depth = rng.randrange(2, 7)
        trie = SuffixTrie(depth)
        seqs = [[rng.randrange(3) for _ in range(rng.randrange(1, 30))] for _ in range(rng.randrange(1, 3))]
        for s in seqs:
            trie.extend(trie.new_sequence(), s)
        context = [rng.randrange(3) for _ in range(rng.randrange(1, 8))]
        max_tokens, factor, min_prob = rng.randrange(1, 8), rng.choice([0.5, 1.0, 2.0]), rng.choice([0.0, 0.1, 0.3])
        spec = trie.speculate(context, max_tokens=max_tokens, max_spec_factor=factor, min_token_prob=min_prob, tree=tree)
        Draft(tokens=spec.tokens, parents=spec.parents).validate()
        occ = occurrences(seqs, depth)
        assert len(spec.tokens) <= max_tokens and all(p >= min_prob for p in spec.probs)
        # every node's probability is its count ratio below the matched suffix
        w = tuple(context[len(context) - spec.match_len :])
        for i, p in enumerate(spec.probs):
            path, j = [], i
            while j >= 0:
                path.append(spec.tokens[j])
                j = spec.parents[j]
            assert p == pytest.approx(occ[w + tuple(reversed(path))] / occ[w])
        if tree:
            assert spec.score == pytest.approx(
                brute_best_score(seqs, context, depth, max_tokens, factor, min_prob)
            )
        else:
            assert spec.parents == list(range(-1, len(spec.tokens) - 1))


def test_cut_depth():
    cut = Draft(tokens=[5, 6, 7, 8], parents=[-1, 0, 1, -1], sources=list("abcd")).cut(2)
    assert (cut.tokens, cut.parents, cut.sources) == ([5, 6, 8], [-1, 0, -1], ["a", "b", "d"])
    assert len(Draft(tokens=[5, 6], parents=[-1, 0]).cut(0)) == 0


def test_config_yaml_and_registry():
    for preset in ["suffix", "suffix-cpu"]:
        name, params, _ = load_preset(preset)
        assert name == "suffix"
        build_method_config("suffix", params)
    assert get_method("suffix") is SuffixDecoding
    params = OmegaConf.to_container(OmegaConf.load(CONF / "method" / "suffix.yaml"))
    params.pop("name")
    assert build_method_config("suffix", params) == SuffixConfig()
    for bad in [dict(max_depth=0), dict(min_token_prob=2.0), dict(memory="forever")]:
        with pytest.raises(ValueError, match="suffix: "):
            build_method_config("suffix", bad)


def test_local_and_global_trees_and_memory_scopes():
    def generation(d, prompt, output):
        d.new_turn(prompt)
        seq = list(prompt)
        for tok in output:  # commit one token a step
            seq.append(tok)
            d.propose(DecodeState(list(seq), len(prompt), 100))

    d = SuffixDecoding(SuffixConfig(memory="run"), vocab_size=50)
    generation(d, [1, 2], [10, 11, 12, 13, 14])
    d.new_turn([3, 4])
    draft = d.propose(DecodeState([3, 4, 10, 11], 2, 100))  # the earlier output continues [10, 11]
    assert draft.tokens[:2] == [12, 13] and set(draft.sources) == {SOURCE_HISTORY}
    d2 = SuffixDecoding(SuffixConfig(), vocab_size=50)
    d2.new_turn([7, 8, 9, 7, 8])  # the prompt itself: local tree
    draft = d2.propose(DecodeState([7, 8, 9, 7, 8], 5, 100))
    assert draft.tokens[0] == 9 and set(draft.sources) == {SOURCE_PROMPT}
    for memory, after_turn, after_sample in [("run", True, True), ("sample", True, False), ("turn", False, False)]:
        d = SuffixDecoding(SuffixConfig(memory=memory), vocab_size=50)
        generation(d, [1, 2], [10, 11, 12, 13, 14])
        d.new_turn([3, 4])
        assert (d.global_trie.find([10, 11]) >= 0) == after_turn
        d.begin_sample()
        assert (d.global_trie.find([10, 11]) >= 0) == after_sample
        d.reset()
        assert d.global_trie.find([10, 11]) == -1


# ---------------------------------------------------------------- tiny models, greedy

TEXTS = ["abcabcabcabc", "Hello world. Hello world. Hello", "the quick brown fox"]


@pytest.fixture(scope="module", params=["tiny_llama", "tiny_gemma3"])
def tiny(request):
    lm = request.getfixturevalue(request.param)
    return Target(lm.model), lm


@pytest.mark.parametrize("tree", [True, False])
def test_greedy_lossless_on_tiny_models(tiny, tree):
    target, lm = tiny
    prompts = [lm.tokenizer.encode(t) for t in TEXTS]
    shared = SuffixDecoding(SuffixConfig(tree=tree), vocab_size=lm.vocab_size)
    recs = assert_greedy_lossless(target, lambda: shared, prompts + prompts[:1], 64)
    assert sum(r.steps < r.new_tokens for r in recs) >= 3
    assert recs[-1].accepted_by_source[SOURCE_HISTORY] > 0  # the repeated prompt's answer is in the global tree


def test_eos_and_max_new_tokens(tiny_llama):
    target = Target(tiny_llama.model)
    make = lambda: SuffixDecoding(SuffixConfig(memory="turn"), vocab_size=tiny_llama.vocab_size)  # noqa: E731
    assert_eos_inside_accepted_run(target, make, tiny_llama.tokenizer.encode(TEXTS[1]))
    assert_max_new_tokens_cuts_accepted_runs(target, make, tiny_llama.tokenizer.encode(TEXTS[0]))


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0, top_p=0.9)], ids=["top_p"])  # T=1: deep
def test_sampling_preserves_the_target_distribution(params):
    shared = SuffixDecoding(SuffixConfig(max_spec_factor=2.0), vocab_size=8)
    proposed: list[int] = []
    counted = counting_proposals(lambda: shared, proposed)()
    assert_sampling_preserves_distribution(lambda: counted, params)
    assert sum(proposed) > 0


@pytest.mark.slow  # a real model: make test-slow (make test keeps the smaller checks)
def test_greedy_lossless_on_smollm2(smollm2):
    target = Target(smollm2.model)
    d = SuffixDecoding(SuffixConfig(max_spec_tokens=12), vocab_size=smollm2.vocab_size)
    rec = assert_greedy_lossless(target, lambda: d, [chat(smollm2, CODE_EDIT)], 96, eos=smollm2.eos_token_ids)[0]
    assert rec.steps < rec.new_tokens
