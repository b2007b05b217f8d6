"""Draft-model speculative sampling (methods/sps.py) and the draft model behind it (specbench/drafting/draft_model.py).

The draft runs a model part by part with its own cache: with every layer it
must be the model itself (and then, greedy or not, every drafted token is
accepted, which also shows its cache follows the committed tokens). Greedy
output equals autoregressive output on the tiny models (self-draft and a
separate draft model) and on SmolLM2 (self-draft); sampling keeps the target's
distribution with a separate small random draft whose vocabulary is shorter
than the target's (q padded) and with a self-draft.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, LlamaConfig

from methods.registry import build_method_config, get_method
from methods.sps import SpeculativeSampling, SpSConfig
from specbench.budget.costs import CostModel
from specbench.budget.planner import AutoBudget
from specbench.core.acceptance import SamplingParams
from specbench.core.draft import SOURCE_MODEL, DecodeState, DrafterContext
from specbench.core.forward import Target
from specbench.drafting.draft_model import DraftLM, DraftModelSettings
from specbench.errors import ConfigError, ModelLoadError, UnknownNameError
from specbench.models import build_tiny_tokenizer, load_model, model_preset
from tests.conftest import CONF
from tests.lossless import (
    CODE_EDIT,
    LONG,
    SMALL_VOCAB,
    assert_eos_inside_accepted_run,
    assert_greedy_lossless,
    assert_max_new_tokens_cuts_accepted_runs,
    assert_sampling_preserves_distribution,
    chat,
    small_vocab_target,
)

TEXTS = ["abcabcabcabc", "Hello world. Hello world. Hello", "the quick brown fox"]


def self_context(lm, sampling=None) -> DrafterContext:
    return DrafterContext(sampling=sampling, target_model=lm.model, target_name=lm.name)


def sps(lm, sampling=None, seed=0, **cfg):
    return SpeculativeSampling(
        SpSConfig(**cfg), vocab_size=lm.vocab_size, seed=seed, tokenizer=lm.tokenizer,
        context=self_context(lm, sampling),
    )


# ---------------------------------------------------------------- configs and early errors


def test_presets_hold_valid_configs():
    params = OmegaConf.to_container(OmegaConf.load(CONF / "method" / "sps.yaml"))
    assert params.pop("name") == "sps" and get_method("sps") is SpeculativeSampling
    assert build_method_config("sps", params) == SpSConfig()
    assert SpSConfig().k == 5 and SpSConfig().draft_model == "self"
    assert SpSConfig().identity() == "self-skip12-13-14-15"
    assert SpSConfig(self_first_layers=3).identity() == "self-first3"  # the first layers win when set
    for path in sorted((CONF / "method").glob("sps-*.yaml")):
        params = OmegaConf.to_container(OmegaConf.load(path))
        params.pop("name")
        config = build_method_config("sps", params)
        config.preflight()  # the draft model preset exists and is well formed
        assert config.draft_model != "self"


@pytest.mark.parametrize(
    "bad",
    [dict(k=0), dict(self_first_layers=0), dict(self_first_layers=None, self_skip_layers=None),
     dict(self_skip_layers=[-1])],
)
def test_bad_settings_are_rejected(bad):
    with pytest.raises(ValueError, match="sps|self-draft"):
        build_method_config("sps", bad)


def test_unknown_draft_model_fails_in_preflight():
    config = build_method_config("sps", {"draft_model": "llama-86m"})
    with pytest.raises(UnknownNameError, match="unknown model 'llama-86m'; did you mean 'llama-68m'"):
        SpeculativeSampling.preflight(config, None)


def test_hub_draft_unavailable_offline_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelLoadError, match="hf download JackFram/llama-68m") as err:
        load_model(model_preset("llama-68m"), {"device": "cpu"})
    assert "\n" not in str(err.value)


def test_self_draft_layer_choice_must_exist(tiny_llama):
    with pytest.raises(ConfigError, match="keeps 3 layers but the target has 2"):
        sps(tiny_llama, self_first_layers=3)
    with pytest.raises(ConfigError, match="skips every layer"):
        sps(tiny_llama, self_first_layers=None, self_skip_layers=[0, 1])
    assert DraftModelSettings(self_first_layers=None, self_skip_layers=[3, 1]).identity() == "self-skip1-3"


def test_draft_with_another_tokenizer_is_refused_before_generation(tiny_llama):
    other = SimpleNamespace(model=tiny_llama.model, tokenizer=build_tiny_tokenizer(130))
    ctx = DrafterContext(load_model=lambda name: other)
    with pytest.raises(ConfigError, match="does not share the target's tokenizer"):
        SpeculativeSampling(SpSConfig(draft_model="other", self_first_layers=None), vocab_size=128,
                            tokenizer=tiny_llama.tokenizer, context=ctx)


# ---------------------------------------------------------------- the draft model


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_gemma3"])
def test_draft_lm_with_every_layer_is_the_model(request, name):
    lm = request.getfixturevalue(name)
    ids = lm.tokenizer.encode("hello world, long enough to pass the sliding window")
    with torch.no_grad():
        ref = lm.model(input_ids=torch.tensor([ids])).logits[0]
        d = DraftLM(lm.model, None, lm.vocab_size)
        logits, _ = d.forward(ids[:5], every_position=True)
        torch.testing.assert_close(logits, ref[:5], atol=1e-5, rtol=1e-5)
        for i in range(5, len(ids)):
            torch.testing.assert_close(d.forward([ids[i]])[0], ref[i], atol=1e-5, rtol=1e-5)
        d.catch_up(ids[:8] + [40, 41, 42])  # a wrong continuation, as after a rejection
        assert d.tokens == ids[:8] + [40, 41, 42]
        torch.testing.assert_close(d.catch_up(ids)[0], ref[-1], atol=1e-5, rtol=1e-5)  # cropped back
        assert d.tokens == ids


def test_q_is_padded_to_the_target_vocabulary():
    torch.manual_seed(1)
    small = AutoModelForCausalLM.from_config(
        LlamaConfig(vocab_size=6, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1)).eval()
    d = DraftLM(small, None, vocab_size=8)
    with torch.no_grad():
        logits, _ = d.forward([1, 2, 3])
    q = d.q(logits, SamplingParams(temperature=1.0))
    assert q.shape == (8,) and float(q[6:].abs().sum()) == 0 and abs(float(q.sum()) - 1) < 1e-6


def test_proposal_is_a_chain_of_at_most_k_within_the_budget(tiny_llama):
    d = sps(tiny_llama, SamplingParams(temperature=1.0), self_first_layers=1, k=4)
    prompt = tiny_llama.tokenizer.encode(TEXTS[0])
    d.new_turn(prompt)
    draft = d.propose(DecodeState(prompt, len(prompt), max_new_tokens=50))
    assert len(draft) == 4 and draft.is_chain() and draft.sources == [SOURCE_MODEL] * 4
    assert draft.draft_probs.shape == (4, tiny_llama.vocab_size)
    assert torch.allclose(draft.draft_probs.sum(-1), torch.ones(4))
    assert len(d.propose(DecodeState(prompt, len(prompt), max_new_tokens=3))) == 2
    assert d.propose(DecodeState(prompt, len(prompt), max_new_tokens=1)) is None


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("lm_name", ["tiny_llama", "tiny_gemma3"])
def test_a_batch_drafts_what_each_request_drafts_alone(request, lm_name, temperature):
    """Requests drafting together (rows at their own lengths, a new prompt among short catch-ups, rejected
    tokens cut from the draft's cache, rows that stop early) propose the chains, and ``q`` (to rounding), they
    propose alone."""
    lm = request.getfixturevalue(lm_name)
    sampling = SamplingParams(temperature=temperature)
    prompts = [lm.tokenizer.encode(t) for t in TEXTS] + [lm.tokenizer.encode(TEXTS[1] * 3)]
    first = sps(lm, sampling, self_first_layers=None, self_skip_layers=[0], k=4)
    together = [first] + [first.spawn() for _ in prompts[1:]]
    alone = [sps(lm, sampling, self_first_layers=None, self_skip_layers=[0], k=4) for _ in prompts]
    assert len({d.lm.slot for d in together}) == len(prompts)  # one cache, a slot each
    seqs = [list(p) for p in prompts]
    for d, a, p in zip(together, alone, seqs, strict=True):
        d.new_turn(p)
        a.new_turn(p)
    rng = torch.Generator().manual_seed(1)
    for step in range(6):
        caps = [None, 2, None, 0 if step % 2 else None]  # one row capped, one skipping every other step
        states = [DecodeState(s, len(p), 40, depth_cap=c) for s, p, c in zip(seqs, prompts, caps, strict=True)]
        got = SpeculativeSampling.propose_rows(together, states)
        want = [a.propose(s) for a, s in zip(alone, states, strict=True)]
        for g, w in zip(got, want, strict=True):
            assert (g is None) == (w is None)
            if g is not None:
                assert g.tokens == w.tokens
                assert (g.draft_probs is None) == (w.draft_probs is None)
                # equal up to rounding: a batched forward sums in another order than a row alone
                assert g.draft_probs is None or torch.allclose(g.draft_probs, w.draft_probs, atol=1e-6)
        for s, g in zip(seqs, got, strict=True):  # commit a random prefix of each chain, then a token of its own
            kept = int(torch.randint(0, len(g.tokens) + 1, (), generator=rng)) if g else 0
            s.extend((g.tokens[:kept] if g else []) + [int(torch.randint(0, 50, (), generator=rng))])
    assert any(g is not None and len(g.tokens) == 4 for g in got)


def test_a_drafts_slot_is_freed_when_it_goes(tiny_llama):
    first = sps(tiny_llama, self_first_layers=1)
    twin = first.spawn()
    slot = twin.lm.slot
    assert slot != first.lm.slot and first.lm.rows is twin.lm.rows
    del twin
    import gc

    gc.collect()
    assert first.spawn().lm.slot == slot and first.lm.rows.cache.slots == 2  # reused: the cache did not grow


# ---------------------------------------------------------------- greedy


@pytest.fixture(scope="module", params=["tiny_llama", "tiny_gemma3"])
def tiny(request):
    lm = request.getfixturevalue(request.param)
    return Target(lm.model), lm


@pytest.mark.parametrize("layers", [dict(self_first_layers=1), dict(self_first_layers=None, self_skip_layers=[0])])
def test_greedy_lossless_self_draft_on_tiny_models(tiny, layers):
    target, lm = tiny
    prompts = [lm.tokenizer.encode(t) for t in TEXTS]
    recs = assert_greedy_lossless(target, lambda: sps(lm, **layers), prompts, 64)
    assert all(set(r.drafted_by_source) == {SOURCE_MODEL} for r in recs)


def test_every_layer_kept_accepts_every_draft(tiny_llama):
    """q = p: every drafted token is accepted, greedy or sampled (the draft cache follows the output)."""
    target = Target(tiny_llama.model)
    prompt = tiny_llama.tokenizer.encode(TEXTS[1])
    recs = assert_greedy_lossless(target, lambda: sps(tiny_llama, self_first_layers=2, k=5), [prompt], 64)
    assert recs[0].step_tokens[1:-1] == [6] * (len(recs[0].step_tokens) - 2)
    from specbench.core.decode import generate

    params = SamplingParams(temperature=1.0)
    rec = generate(target, sps(tiny_llama, params, self_first_layers=2, k=5), prompt, max_new_tokens=64,
                   sampling=params, generator=torch.Generator().manual_seed(0))
    assert rec.step_tokens[1:-1] == [6] * (len(rec.step_tokens) - 2)


def test_greedy_lossless_with_a_separate_draft_model(tiny_llama):
    draft = load_model(OmegaConf.load(CONF / "model" / "tiny-llama-draft.yaml"), {"device": "cpu"})
    ctx = DrafterContext(load_model=lambda name: draft)

    def make():
        return SpeculativeSampling(SpSConfig(draft_model="tiny-llama-draft", self_first_layers=None),
                                   vocab_size=128, tokenizer=tiny_llama.tokenizer, context=ctx)

    prompts = [tiny_llama.tokenizer.encode(t) for t in TEXTS]
    assert_greedy_lossless(Target(tiny_llama.model), make, prompts, 48)


def test_eos_and_max_new_tokens_inside_accepted_runs(tiny_llama):
    target = Target(tiny_llama.model)
    text = tiny_llama.tokenizer.encode(TEXTS[1])
    assert_eos_inside_accepted_run(target, lambda: sps(tiny_llama, self_first_layers=1), text)
    assert_max_new_tokens_cuts_accepted_runs(target, lambda: sps(tiny_llama, self_first_layers=1), text)


# ---------------------------------------------------------------- sampling


def small_draft(vocab: int = 6, seed: int = 1):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    return SimpleNamespace(model=model, tokenizer=None)


@pytest.mark.parametrize(
    "params", [SamplingParams(temperature=1.0), pytest.param(SamplingParams(temperature=1.0, top_p=0.9),
                                                           marks=pytest.mark.slow)], ids=["t1", "top_p"]
)
@pytest.mark.parametrize("draft", ["separate", pytest.param("self", marks=pytest.mark.slow)])
def test_sampling_keeps_the_target_distribution(params, draft):
    target = small_vocab_target()
    other = small_draft()
    if draft == "separate":
        settings = dict(draft_model="small", self_first_layers=None)
        ctx = DrafterContext(sampling=params, load_model=lambda name: other)
    else:
        settings = dict(self_first_layers=1)
        ctx = DrafterContext(sampling=params, target_model=target.model)
    seeds = itertools.count()
    accepted = []

    def make():
        d = SpeculativeSampling(SpSConfig(k=3, **settings), vocab_size=SMALL_VOCAB, seed=next(seeds), context=ctx)
        update = d.update
        d.update = lambda result: (accepted.append(result.n_accepted), update(result))
        return d

    assert_sampling_preserves_distribution(make, params, target=target, trials=1500)
    assert sum(accepted) > 0  # drafts were accepted, not only rejected


# ---------------------------------------------------------------- budget=auto


def recording(drafter):
    """The drafter, recording the length of every chain it proposes (0: nothing drafted)."""
    lengths, propose = [], drafter.propose

    def wrapped(state):
        draft = propose(state)
        lengths.append(0 if draft is None else len(draft))
        return draft

    drafter.propose = wrapped
    return drafter, lengths


@pytest.mark.parametrize(("forward_s", "pays"), [(1.0, True), (1e-6, False)])
def test_budget_auto_keeps_a_chain_that_pays_and_drops_one_that_cannot(tiny_llama, forward_s, pays):
    """A draft that is the target itself (every drafted token accepted), its draft forwards measured: priced
    at 1 s a target forward, every step drafts its k = 5 (from the third step on); priced at 1 µs, its milliseconds can never be paid
    back: after the first draft (its cost not yet known) the chain is cut to nothing, and no exploration fits
    the allowance that draft overran. Greedy output equals autoregressive decoding either way."""
    target = Target(tiny_llama.model)
    prompt = tiny_llama.tokenizer.encode(TEXTS[1])
    planner = AutoBudget(CostModel([1, 64], [0], [[forward_s, forward_s]]))
    drafter, lengths = recording(sps(tiny_llama, self_first_layers=2, k=5))
    rec = assert_greedy_lossless(target, lambda: drafter, [prompt], 64, budget=planner)[0]
    if pays:
        # the second step plans from the first draft scored at the prior (a guess in four, deeper ones less):
        # then every level is seen right, and every step drafts the whole chain
        assert lengths[0] == 5 and lengths[2:-2] == [5] * (len(lengths) - 4) and "plain" not in planner.why
        assert all(t == 1 + n for t, n in zip(rec.step_tokens[1:-1], lengths, strict=False))  # all accepted
    else:
        assert lengths[0] == 5 and set(lengths[1:]) == {0} and planner.regret > planner.allowance()


def test_budget_auto_sampling_keeps_the_target_distribution():
    """Sampled chains trimmed by budget=auto (a curve where every guess costs): the target's distribution."""
    target, other = small_vocab_target(), small_draft()
    params = SamplingParams(temperature=1.0)
    ctx = DrafterContext(sampling=params, load_model=lambda name: other)
    seeds = itertools.count()

    def make():
        return SpeculativeSampling(SpSConfig(k=4, draft_model="small", self_first_layers=None),
                                   vocab_size=SMALL_VOCAB, seed=next(seeds), context=ctx)

    steep = CostModel([1, 2, 3, 4, 5], [0], [[1.0, 1.05, 1.1, 1.2, 1.3]])
    assert_sampling_preserves_distribution(make, params, target=target, trials=1500, min_depth=1,
                                           make_budget=lambda: AutoBudget(steep, static=True))


# ---------------------------------------------------------------- SmolLM2


@pytest.mark.slow  # a real model over long outputs: tests/methods/test_contract.py covers the method on tiny ones
def test_greedy_lossless_self_draft_on_smollm2(smollm2):
    target = Target(smollm2.model)
    recs = assert_greedy_lossless(target, lambda: sps(smollm2), [chat(smollm2, CODE_EDIT)], 64,
                                  eos=smollm2.eos_token_ids)
    recs += assert_greedy_lossless(target, lambda: sps(smollm2, self_first_layers=6, k=3), [chat(smollm2, LONG)], 48)
    assert all(r.steps < r.new_tokens for r in recs)  # the self-draft's guesses are accepted


# ---------------------------------------------------------------- through the runner


def test_run_with_a_separate_draft_model_preset(tmp_path):
    from specbench.run.runner import run
    from tests.run.test_runner import cfg_for

    summary = run(cfg_for(tmp_path, "method=sps", "method.draft_model=tiny-llama-draft",
                          "method.self_first_layers=null"))
    row = summary.set_index("method").loc["sps"]
    assert row.greedy_match == 1.0


def test_run_with_an_unknown_draft_fails_before_the_model_loads(tmp_path, monkeypatch):
    from specbench.run import runner
    from tests.run.test_runner import cfg_for

    monkeypatch.setattr(runner, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(UnknownNameError, match="unknown model 'tiny-lama-draft'"):
        runner.run(cfg_for(tmp_path, "method=sps", "method.draft_model=tiny-lama-draft"))
