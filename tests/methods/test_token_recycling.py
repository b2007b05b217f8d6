"""Token Recycling: the candidate matrix and tree templates by hand and against brute force, then lossless
decoding (tiny models fp32, SmolLM2 fp32, sampling)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from methods.registry import build_method_config, get_method
from methods.token_recycling import TokenRecycling, TokenRecyclingConfig
from specbench.core.acceptance import SamplingParams
from specbench.core.decode import generate
from specbench.core.draft import SOURCE_RECYCLE, DecodeState, Draft, VerifyResult
from specbench.core.forward import Target
from specbench.drafting.recycling import CPU_TREE, PAPER_TREE, CandidateMatrix, TreeTemplate
from specbench.run.config import load_preset
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


def test_paper_template_has_the_papers_shape():
    t = TreeTemplate(PAPER_TREE)
    assert len(t) == 80 and [t.depth.count(d) for d in range(1, 7)] == [8, 21, 25, 15, 8, 3]
    assert t.max_rank == 8
    cpu = TreeTemplate(CPU_TREE)
    assert len(cpu) == 16 and max(cpu.depth) == 5 and set(cpu.paths) <= set(t.paths)


@pytest.mark.parametrize("bad", [[(0, 0)], [(0,), (0,)], [(0,), (0, 1), (1,)], [(-1,)]])
def test_bad_templates_are_rejected(bad):
    with pytest.raises(ValueError, match="tree template"):
        TreeTemplate(bad)


def test_matrix_keeps_the_top_k_of_the_last_occurrence():
    m = CandidateMatrix(vocab_size=10, k=3)
    logits = torch.tensor(
        [
            [0, 9, 8, 7, 0, 0, 0, 0, 0, 0],  # after token 4: 1, 2, 3
            [5, 0, 0, 0, 0, 0, 0, 0, 6, 7],  # after token 2: 9, 8, 0
            [0, 0, 0, 0, 3, 2, 1, 0, 0, 0],  # after token 4 again: 4, 5, 6 (the last one wins)
        ],
        dtype=torch.float32,
    )
    m.update([4, 2, 4], logits)
    assert m.candidates(4) == [4, 5, 6] and m.candidates(2) == [9, 8, 0]
    assert m.candidates(7) == [] and m.candidates(123) == []
    m.update([7], torch.arange(12, dtype=torch.float32)[None])  # wider logits than the vocabulary
    assert m.candidates(7) == [11, 10, 9]
    m.clear()
    assert m.candidates(4) == []
    small = CandidateMatrix(vocab_size=2, k=3)  # fewer tokens than k: no padding candidates
    small.update([0], torch.tensor([[1.0, 2.0]]))
    assert small.candidates(0) == [1, 0]


def test_matrix_memory_per_vocabulary():
    for vocab, mb in [(32_000, 1.0), (128_256, 4.1), (262_144, 8.4)]:
        assert abs(CandidateMatrix(vocab, 8).rows.nbytes / 1e6 - mb) < 0.1


def brute_fill(paths, cands, root, max_depth):
    """Every template path whose ranks resolve through ``cands``, with its token and parent path."""
    out = {}
    for path in paths:
        if len(path) > max_depth:
            continue
        tok = root
        for r in path:
            row = cands.get(tok, [])
            if r >= len(row):
                tok = None
                break
            tok = row[r]
        if tok is not None:
            out[path] = tok
    return out


@pytest.mark.parametrize("tree", [PAPER_TREE, CPU_TREE])
def test_fill_agrees_with_brute_force(tree):
    rng = random.Random(0)
    template = TreeTemplate(tree)
    for _ in range(200):
        vocab = rng.choice([3, 6, 12])
        m = CandidateMatrix(vocab, 8)
        cands = {}
        for tok in rng.sample(range(vocab), rng.randrange(vocab + 1)):
            row = rng.sample(range(vocab), min(8, vocab))
            m.set_rows([tok], np.array([row + [-1] * (8 - len(row))], dtype=np.int32))
            cands[tok] = row
        root, depth = rng.randrange(vocab), rng.randrange(0, 8)
        tokens, parents = template.fill(m, root, depth)
        Draft(tokens=tokens, parents=parents).validate()
        want = brute_fill(template.paths, cands, root, depth)
        got_paths = [p for p in template.paths if p in want]
        assert tokens == [want[p] for p in got_paths]  # template order (breadth-first)
        at = {p: i for i, p in enumerate(got_paths)}
        assert parents == [at[p[:-1]] if len(p) > 1 else -1 for p in got_paths]


def test_config_yaml_and_registry():
    for preset, tree in [("token_recycling", "paper"), ("token_recycling-cpu", "cpu")]:
        name, params, _ = load_preset(preset)
        assert name == "token_recycling"
        assert build_method_config("token_recycling", params) == TokenRecyclingConfig(tree=tree)
    assert get_method("token_recycling") is TokenRecycling
    for bad in [dict(topk=0), dict(tree="big"), dict(memory="forever"), dict(topk=4)]:
        with pytest.raises(ValueError, match="token_recycling: "):
            build_method_config("token_recycling", bad)


def one_hot_rows(tokens, vocab):
    return torch.nn.functional.one_hot(torch.tensor(tokens), vocab).float()


def test_step_learns_from_every_row_and_memory_scopes():
    def learn(d):
        d.propose(DecodeState([1, 2, 3], 3, 10))  # no candidates yet: no draft
        draft = Draft.chain([5, 6], SOURCE_RECYCLE)
        d.update(VerifyResult([], [7], draft, logits=one_hot_rows([7, 8, 9], 16)))

    d = TokenRecycling(TokenRecyclingConfig(tree="cpu"), vocab_size=16)
    assert d.propose(DecodeState([1, 2, 3], 3, 10)) is None
    learn(d)
    # root 3 -> 7 ranks first; guess 5 -> 8, guess 6 -> 9 (rejected guesses teach too)
    assert d.matrix.candidates(3)[0] == 7 and d.matrix.candidates(5)[0] == 8 and d.matrix.candidates(6)[0] == 9
    draft = d.propose(DecodeState([1, 5], 1, 10))
    assert draft.tokens[0] == 8 and draft.parents[0] == -1 and set(draft.sources) == {SOURCE_RECYCLE}
    assert d.propose(DecodeState([1, 5], 1, 3)).tokens == draft.tokens[:4]  # depth cap 1: the first level
    for memory, kept_turn, kept_sample in [("run", True, True), ("sample", True, False), ("turn", False, False)]:
        d = TokenRecycling(TokenRecyclingConfig(tree="cpu", memory=memory), vocab_size=16)
        learn(d)
        d.new_turn([1])
        assert bool(d.matrix.candidates(3)) == kept_turn
        learn(d)
        d.begin_sample()
        assert bool(d.matrix.candidates(3)) == kept_sample
        learn(d)
        d.reset()
        assert d.matrix.candidates(3) == []


# ---------------------------------------------------------------- tiny models, greedy

TEXTS = ["abcabcabcabc", "Hello world. Hello world. Hello", "the quick brown fox"]


@pytest.fixture(scope="module", params=["tiny_llama", "tiny_gemma3"])
def tiny(request):
    lm = request.getfixturevalue(request.param)
    return Target(lm.model), lm


@pytest.mark.parametrize("tree", ["paper", "cpu"])
def test_greedy_lossless_on_tiny_models(tiny, tree):
    target, lm = tiny
    prompts = [lm.tokenizer.encode(t) for t in TEXTS]
    shared = TokenRecycling(TokenRecyclingConfig(tree=tree), vocab_size=lm.vocab_size)  # hot start: one matrix
    recs = assert_greedy_lossless(target, lambda: shared, prompts + prompts[:1], 64)
    assert all(r.steps < r.new_tokens for r in recs[1:])
    assert sum(r.accepted_by_source[SOURCE_RECYCLE] for r in recs) > 0
    assert recs[-1].steps <= recs[0].steps  # the same prompt again starts from a warm matrix


def test_eos_and_max_new_tokens(tiny_llama):
    target = Target(tiny_llama.model)
    shared = TokenRecycling(vocab_size=tiny_llama.vocab_size)  # hot start: later generations draft from the start
    make = lambda: shared  # noqa: E731
    assert_eos_inside_accepted_run(target, make, tiny_llama.tokenizer.encode(TEXTS[1]))
    assert_max_new_tokens_cuts_accepted_runs(target, make, tiny_llama.tokenizer.encode(TEXTS[0]))


# ---------------------------------------------------------------- sampling


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0)], ids=["t1"])  # top-p: tests/core/test_sampling_deep
def test_sampling_preserves_the_target_distribution(params):
    shared = TokenRecycling(TokenRecyclingConfig(tree="cpu"), vocab_size=8)  # warms up over the trials
    proposed: list[int] = []
    counted = counting_proposals(lambda: shared, proposed)()  # wrap the shared drafter once
    assert_sampling_preserves_distribution(lambda: counted, params)
    assert sum(proposed) > 0


# ---------------------------------------------------------------- SmolLM2


@pytest.mark.slow  # a real model: make test-slow (make test keeps the smaller checks)
def test_greedy_lossless_on_smollm2(smollm2):
    target = Target(smollm2.model)
    d = TokenRecycling(TokenRecyclingConfig(tree="cpu"), vocab_size=smollm2.vocab_size)
    prompt = chat(smollm2, CODE_EDIT)  # the same prompt and length as the other methods' (one reference)
    assert_greedy_lossless(target, lambda: d, [prompt], 96, eos=smollm2.eos_token_ids)  # warms the matrix
    rec = assert_greedy_lossless(target, lambda: d, [prompt], 96, eos=smollm2.eos_token_ids)[0]
    assert rec.steps < rec.new_tokens and rec.accepted_by_source[SOURCE_RECYCLE] > 0


def test_generate_reports_the_rows_the_matrix_learns_from(tiny_llama):
    d = TokenRecycling(vocab_size=tiny_llama.vocab_size)
    generate(Target(tiny_llama.model), d, tiny_llama.tokenizer.encode(TEXTS[0]), max_new_tokens=20)
    assert int(d.matrix.filled.sum()) > 1  # roots and guesses of every step have rows
