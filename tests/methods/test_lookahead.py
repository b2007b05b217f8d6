"""Lookahead decoding: the pool, the window and its layout, then lossless decoding (CPU, fp32)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from methods.lookahead import Lookahead, LookaheadConfig
from methods.registry import build_method_config, get_method
from specbench.core.acceptance import SamplingParams
from specbench.core.decode import generate
from specbench.core.draft import SOURCE_POOL, DecodeState, VerifyResult
from specbench.core.forward import Target
from specbench.drafting.lookahead_window import NgramPool, advance_window, harvest, window_layout
from tests.conftest import CONF
from tests.lossless import (
    SMALL_VOCAB,
    assert_greedy_lossless,
    assert_sampling_preserves_distribution,
    autoregressive_output,
)

# ---------------------------------------------------------------- pure parts


def test_pool_caps_each_key_and_evicts_least_recently_harvested():
    pool = NgramPool(cap=2)
    pool.add(1, (2, 3))
    pool.add(1, (4, 5))
    pool.add(9, (2, 3))
    assert pool.get(1) == [(2, 3), (4, 5)] and pool.get(9) == [(2, 3)]
    assert pool.get(7) == [] and len(pool) == 3
    pool.add(1, (2, 3))  # harvested again: newest
    assert pool.get(1) == [(4, 5), (2, 3)]
    pool.add(1, (6, 7))  # over the cap: (4, 5) is the least recently harvested
    assert pool.get(1) == [(2, 3), (6, 7)]
    assert pool.get(9) == [(2, 3)] and len(pool) == 3


def test_layout_w3_n3_by_hand():
    # Aux order: level 0 = a0 (offset 1), a1 (offset 2); level 1 = b0, b1, b2 (offsets 1, 2, 3).
    # Columns: (root, b0), (a0, b1), (a1, b2). Self included.
    vis, offsets = window_layout(3, 2)
    expected = np.array(
        [
            # a0 a1 b0 b1 b2
            [1, 0, 0, 0, 0],  # a0: root
            [1, 1, 0, 0, 0],  # a1: root, a0
            [0, 0, 1, 0, 0],  # b0: root (its key)
            [1, 0, 0, 1, 0],  # b1: root, a0 (its key)
            [1, 1, 0, 0, 1],  # b2: root, a0, a1 (its key)
        ],
        dtype=bool,
    )
    np.testing.assert_array_equal(vis, expected)
    assert offsets == (1, 2, 1, 2, 3)


@pytest.mark.parametrize("columns,levels", [(15, 4), (7, 4), (9, 2), (1, 2), (5, 3)])
def test_every_window_token_sees_a_chain_at_consecutive_offsets(columns, levels):
    vis, offsets = window_layout(columns, levels)
    assert vis.shape == (columns - 1 + (levels - 1) * columns,) * 2
    for row in range(len(offsets)):
        seen = sorted(offsets[j] for j in np.flatnonzero(vis[row]))
        assert seen == list(range(1, offsets[row] + 1))
    assert window_layout(columns, levels)[0] is vis and not vis.flags.writeable  # built once, shared


def test_window_fill_then_steady_shift_and_harvest():
    # N = 4, W = 2: level 0 starts with W + N - 3 = 3 tokens (4 columns with the root).
    levels = [[10, 11, 12]]
    levels = advance_window(levels, [20, 21, 22], ngram=4)  # fill 1: predictions of level 0
    assert levels == [[11, 12], [20, 21, 22]]
    levels = advance_window(levels, [30, 31, 32], ngram=4)  # fill 2: predictions of level 1
    assert levels == [[12], [21, 22], [31, 32]]  # N - 1 levels, W columns: steady
    new = [40, 41]
    assert harvest(levels, root=99, new=new) == [(99, (21, 31, 40)), (12, (22, 32, 41))]
    assert advance_window(levels, new, ngram=4) == [[22], [31, 32], [40, 41]]


@pytest.mark.parametrize(
    "field,value", [("window", 0), ("ngram", 2), ("guesses", 0)], ids=["window", "ngram", "guesses"]
)
def test_config_rejects_bad_values_in_one_line(field, value):
    with pytest.raises(ValueError, match=field) as err:
        LookaheadConfig(**{field: value}).validate()
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("choice,wng", [("lookahead", (15, 5, 15)), ("lookahead-readme", (7, 5, 7))])
def test_yaml_settings(choice, wng):
    raw = OmegaConf.to_container(OmegaConf.load(CONF / "method" / f"{choice}.yaml"))
    name = raw.pop("name")
    assert name == "lookahead" and get_method(name) is Lookahead
    cfg = build_method_config(name, raw)
    assert (cfg.window, cfg.ngram, cfg.guesses) == wng and cfg.pool_from_prompt is False


def _one_hot(tokens: list[int], vocab: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(tokens), vocab).float()


def test_drafter_cycle_without_a_model():
    d = Lookahead(LookaheadConfig(window=2, ngram=3, guesses=4), vocab_size=50, seed=3)
    prompt = [1, 2, 3, 4]
    d.new_turn(prompt)
    level0 = list(d.levels[0])
    assert len(level0) == 2 and set(level0) <= set(prompt)
    d.new_turn(prompt)
    assert d.levels == [level0]  # seeded: the same window for the same seed
    state = DecodeState(prompt + [7], len(prompt), max_new_tokens=10)
    draft = d.propose(state)
    assert draft is not None and not draft.tokens and draft.aux_tokens == level0 and draft.aux_positions == [1, 2]
    assert draft.aux_logit_rows == [0, 1]  # the top level: the only logits the window reads
    d.update(VerifyResult([], [8], draft, aux_logits=_one_hot([30, 31], 50)))  # fill: no harvest
    assert len(d.pool) == 0 and d.levels == [[level0[1]], [30, 31]]
    state = DecodeState(prompt + [7, 8], len(prompt), max_new_tokens=10)
    draft = d.propose(state)
    assert draft.aux_tokens == [level0[1], 30, 31] and draft.aux_positions == [1, 1, 2]
    assert draft.aux_logit_rows == [1, 2]
    d.update(VerifyResult([], [9], draft, aux_logits=_one_hot([40, 41], 50)))
    assert d.pool.get(8) == [(30, 40)] and d.pool.get(level0[1]) == [(31, 41)]
    assert d.levels == [[31], [40, 41]]
    # Guesses for the root, cut to what the generation may still take.
    draft = d.propose(DecodeState(prompt + [7, 8], len(prompt), max_new_tokens=10))
    assert draft.tokens == [30, 40] and draft.parents == [-1, 0] and draft.sources == [SOURCE_POOL] * 2
    draft = d.propose(DecodeState(prompt + [7, 8], len(prompt), max_new_tokens=4))  # 2 left after the root
    assert draft.tokens == [30]


def test_pool_from_prompt_indexes_prompt_and_output_once():
    d = Lookahead(LookaheadConfig(window=2, ngram=3, guesses=4, pool_from_prompt=True), vocab_size=50)
    d.new_turn([1, 2, 3, 1, 2, 4])
    assert d.pool.get(1) == [(2, 3), (2, 4)] and d.pool.get(2) == [(3, 1)] and d.pool.get(3) == [(1, 2)]
    d.propose(DecodeState([1, 2, 3, 1, 2, 4, 1, 2], 6, max_new_tokens=10))
    assert d.pool.get(4) == [(1, 2)] and d.pool.get(2) == [(3, 1), (4, 1)] and len(d.pool) == 6


# ---------------------------------------------------------------- tiny models


@pytest.fixture(scope="module", params=["tiny_llama", "tiny_gemma3"])
def target(request):
    return Target(request.getfixturevalue(request.param).model)


def _plain(model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens])).logits[0, -1]


def test_window_logits_equal_their_documented_ancestry_alone(target):
    """Each window token's logits = the prefix + its key chain + its column, run alone."""
    cfg = LookaheadConfig(window=4, ngram=4, guesses=3)
    prompt = [5, 17, 33, 2, 71, 9, 40, 12, 61, 3, 5, 17]  # longer than Gemma's sliding window
    d = Lookahead(cfg, vocab_size=128, seed=1)
    rec = generate(target, d, prompt, max_new_tokens=6)  # past the fill: N - 1 levels, W columns
    assert [len(lv) for lv in d.levels] == [3, 4, 4]
    seq = prompt + rec.output_ids
    d.pool = NgramPool(cfg.guesses)
    d.pool.add(seq[-1], (7, 8, 9))
    draft = d.propose(DecodeState(seq, len(prompt), max_new_tokens=50))
    assert draft.tokens == [7, 8, 9]
    draft.aux_logit_rows = None  # every window row's logits, to check the whole layout
    cache = target.new_cache()
    with torch.no_grad():
        target.prefill(seq[:-1], cache)
        logits = target.forward_draft(seq[-1], draft, cache)
    n, (first, *upper) = len(draft.tokens), d.levels
    ancestry = [first[: k + 1] for k in range(len(first))]
    ancestry += [first[:i] + [lv[i] for lv in upper[: up + 1]] for up in range(len(upper)) for i in range(4)]
    assert len(ancestry) == draft.n_aux
    for row, chain in enumerate(ancestry):
        torch.testing.assert_close(
            logits[1 + n + row], _plain(target.model, seq + chain), atol=1e-4, rtol=1e-4
        )
    torch.testing.assert_close(logits[3], _plain(target.model, seq + [7, 8, 9]), atol=1e-4, rtol=1e-4)


PROMPTS = [
    [7, 8, 9] * 6,  # repetitive
    [3] * 5,  # repetitive
    list(range(5, 25)),
    [11, 40, 2, 99, 63, 17, 5],
]


def _make(cfg: LookaheadConfig, seed: int = 0, vocab_size: int = 128, tokenizer=None):
    return lambda: Lookahead(cfg, vocab_size=vocab_size, seed=seed, tokenizer=tokenizer)


def test_greedy_lossless_tiny(target):
    recs = assert_greedy_lossless(target, _make(LookaheadConfig(window=4, ngram=4, guesses=4)), PROMPTS, 48)
    assert sum(r.accepted_by_source[SOURCE_POOL] for r in recs[:2]) > 0  # repetitive prompts hit
    assert all(r.drafted_by_source[SOURCE_POOL] > 0 for r in recs)
    assert all(r.step_aux[1] == 4 + 4 - 3 and r.step_aux[-1] == 3 + 2 * 4 for r in recs)


def test_greedy_lossless_long_generation(target):
    (rec,) = assert_greedy_lossless(
        target, _make(LookaheadConfig(window=5, ngram=3, guesses=5), 7), [PROMPTS[3]], 260
    )
    assert rec.new_tokens == 260 and rec.steps < 260


def test_eos_and_truncation(target):
    cfg = LookaheadConfig(window=3, ngram=3, guesses=3)
    prompt = PROMPTS[0]
    ar = autoregressive_output(target, prompt, 40)
    (rec,) = assert_greedy_lossless(target, _make(cfg), [prompt], 13)
    assert rec.new_tokens == 13 and rec.finish_reason == "length"
    eos = ar[9]
    (rec,) = assert_greedy_lossless(target, _make(cfg), [prompt], 40, eos=[eos])
    assert rec.output_ids == ar[: ar.index(eos) + 1] and rec.finish_reason == "eos"


# ---------------------------------------------------------------- sampling


def test_sampling_keeps_the_target_distribution():
    cfg = LookaheadConfig(window=3, ngram=3, guesses=3, pool_from_prompt=True)  # guesses from step 1 on
    drafted: list[int] = []

    def make():
        d = Lookahead(cfg, vocab_size=SMALL_VOCAB, seed=len(drafted))
        propose = d.propose

        def counted(state):
            draft = propose(state)
            drafted.append(len(draft.tokens))
            return draft

        d.propose = counted
        return d

    assert_sampling_preserves_distribution(make, SamplingParams(temperature=1.0, top_p=0.9), trials=3000)
    assert sum(drafted) > 500


# ---------------------------------------------------------------- SmolLM2


def _smol_prompts(tok) -> list[list[int]]:
    """A code-editing prompt and a list prompt, in the chat template."""
    code = (
        "Rename the variable `x` to `count` in this function:\n\n"
        "def total(items):\n    x = 0\n    for item in items:\n        x += item.price * item.qty\n    return x\n"
    )
    texts = [code, "List the days of the week, one per line."]
    ids = [
        tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True) for t in texts
    ]
    return [list(i["input_ids"] if hasattr(i, "keys") else i) for i in ids]


def _smol_lossless(smollm2, cfg: LookaheadConfig, max_new_tokens: int) -> list:
    make = _make(cfg, vocab_size=smollm2.vocab_size, tokenizer=smollm2.tokenizer)
    prompts = _smol_prompts(smollm2.tokenizer)
    return assert_greedy_lossless(
        Target(smollm2.model), make, prompts, max_new_tokens, eos=smollm2.eos_token_ids
    )


@pytest.mark.slow  # a real model: make test-slow (make test keeps the smaller checks)
def test_greedy_lossless_smollm2_cpu_budget(smollm2):
    recs = _smol_lossless(smollm2, LookaheadConfig(window=5, ngram=3, guesses=5), 32)
    assert sum(r.drafted_by_source[SOURCE_POOL] for r in recs) > 0


@pytest.mark.slow
def test_greedy_lossless_smollm2_paper_budget(smollm2):
    recs = _smol_lossless(smollm2, LookaheadConfig(window=15, ngram=5, guesses=15), 128)
    assert sum(r.accepted_by_source[SOURCE_POOL] for r in recs) > 0


@pytest.mark.parametrize("memory,kept_turn,kept_sample", [("run", 1, 1), ("sample", 1, 0), ("turn", 0, 0)])
def test_memory_scopes_of_the_pool(memory, kept_turn, kept_sample):
    with pytest.raises(ValueError, match="memory must be one of"):
        LookaheadConfig(memory="forever").validate()
    d = Lookahead(LookaheadConfig(window=2, ngram=3, guesses=4, memory=memory), vocab_size=50)
    d.new_turn([1, 2, 3])
    d.pool.add(3, (30, 40))
    d.new_turn([5, 3])  # the next turn: a new window either way
    assert d.levels and set(d.levels[0]) <= {5, 3}
    assert (d.pool.get(3) == [(30, 40)]) == kept_turn
    assert bool(d.propose(DecodeState([5, 3], 2, max_new_tokens=10)).tokens) == kept_turn
    d.begin_sample()
    assert bool(len(d.pool)) == kept_sample
    d.reset()
    assert len(d.pool) == 0


def test_run_memory_is_lossless(target):
    shared = Lookahead(LookaheadConfig(window=4, ngram=4, guesses=4, memory="run"), vocab_size=128)
    recs = assert_greedy_lossless(target, lambda: shared, PROMPTS + PROMPTS[:1], 40)
    assert recs[-1].step_tokens[1] > 1 and recs[-1].tau > recs[0].tau  # the kept pool knows the text
