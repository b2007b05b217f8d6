"""SpecDec++ (methods/specdec_pp.py) and its acceptance head (specbench/drafting/acceptance_head.py).

The stopping rule on hand-made predictions; the drafter stops where the rule
says with a head whose predictions are set by hand; training on a tiny pair
runs end to end in seconds and lowers the held-out loss; a run without a head
stops before any model loads with the training command; greedy output equals
autoregressive output on the tiny models and on SmolLM2 (self-draft, with an
untrained head: the head only changes how many tokens are proposed).
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from methods.registry import build_method_config
from methods.specdec_pp import SpecDecPP, SpecDecPPConfig
from specbench.cli.acceptance_head import main
from specbench.core.acceptance import SamplingParams
from specbench.core.draft import DecodeState, DrafterContext
from specbench.core.forward import Target
from specbench.drafting.acceptance_head import (
    AcceptanceHead,
    head_file,
    save_head,
    stop_length,
    train_command,
)
from specbench.drafting.draft_model import build_draft_lm
from specbench.drafting.head_training import collect, train, weighted_bce
from specbench.errors import ConfigError
from specbench.results.rows import load_results
from specbench.run import runner
from tests.conftest import CONF
from tests.lossless import CODE_EDIT, assert_greedy_lossless, assert_sampling_preserves_distribution, chat
from tests.run.test_runner import cfg_for

# ---------------------------------------------------------------- the stopping rule


@pytest.mark.parametrize(
    "predictions,expected",
    [
        ([0.2, 0.9], 1),  # 1 - 0.2 = 0.8 > 0.7 at once
        ([0.9, 0.8, 0.4, 0.9], 3),  # 1 - 0.288 = 0.712 > 0.7 at the third
        ([0.9, 0.8, 0.5, 0.9], 4),  # 0.676 at the fourth: never crosses, all kept
        ([0.3], 1),
        ([0.99] * 30, 20),  # the hard cap
    ],
)
def test_stop_length_on_hand_made_predictions(predictions, expected):
    assert stop_length(predictions, 0.7, 20) == expected


def test_head_shape_and_residual_blocks():
    head = AcceptanceHead(16, depth=3)
    assert len(head.blocks) == 3 and head(torch.zeros(5, 16)).shape == (5,)
    assert head(torch.zeros(16)).shape == ()


def test_preset_and_bad_settings():
    params = OmegaConf.to_container(OmegaConf.load(CONF / "method" / "specdec_pp.yaml"))
    assert params.pop("name") == "specdec_pp"
    assert build_method_config("specdec_pp", params) == SpecDecPPConfig()
    assert SpecDecPPConfig().threshold == 0.7 and SpecDecPPConfig().max_k == 20
    for bad in (dict(threshold=1.0), dict(max_k=0)):
        with pytest.raises(ValueError, match="specdec_pp"):
            build_method_config("specdec_pp", bad)


# ---------------------------------------------------------------- heads for tests


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    return tmp_path


def random_head(lm, config: SpecDecPPConfig, seed: int = 0, greedy: bool = True):
    torch.manual_seed(seed)
    head = AcceptanceHead(lm.model.config.hidden_size, 2)
    path = head_file(lm.name, config.identity(), greedy)
    save_head(path, head, {"target": lm.name, "draft": config.identity(), "temperature": 0.0 if greedy else 1.0})
    return path


def drafter(lm, config, sampling=None, seed=0):
    ctx = DrafterContext(sampling=sampling, target_model=lm.model, target_name=lm.name)
    return SpecDecPP(config, vocab_size=lm.vocab_size, seed=seed, tokenizer=lm.tokenizer, context=ctx)


def test_drafter_stops_where_the_rule_says(tiny_llama, cache):
    config = SpecDecPPConfig(self_first_layers=1)
    random_head(tiny_llama, config)
    d = drafter(tiny_llama, config)
    predictions = [0.9, 0.8, 0.4, 0.99, 0.99]
    logit = torch.tensor(predictions).logit()
    calls = iter(range(100))
    d.head = lambda hidden: logit[next(calls) % len(predictions)].expand(hidden.shape[:-1])  # a verdict per row
    prompt = tiny_llama.tokenizer.encode("abcabc")
    d.new_turn(prompt)
    draft = d.propose(DecodeState(prompt, len(prompt), max_new_tokens=100))
    assert len(draft) == stop_length(predictions, 0.7, 20) == 3


# ---------------------------------------------------------------- missing head, training


def test_missing_head_fails_before_the_model_loads(cache, tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    cfg = cfg_for(tmp_path, "method=specdec_pp", "method.self_first_layers=1")
    with pytest.raises(ConfigError, match="no acceptance head .* train one with `specbench train-acceptance-head") as err:
        runner.run(cfg)
    assert "\n" not in str(err.value)
    assert train_command("tiny-llama", SpecDecPPConfig(self_first_layers=1), greedy=True) in str(err.value)
    assert "--temperature 0" in str(err.value)  # a greedy run needs a head trained on greedy labels


def test_greedy_and_sampling_runs_read_their_own_heads(tiny_llama, cache):
    config = SpecDecPPConfig(self_first_layers=1)
    sampled = random_head(tiny_llama, config, greedy=False)
    with pytest.raises(ConfigError, match="greedy labels.*--temperature 0"):
        drafter(tiny_llama, config)  # greedy: the T = 1 head is not read
    assert drafter(tiny_llama, config, SamplingParams(temperature=1.0)).head is not None
    greedy = random_head(tiny_llama, config)
    assert greedy != sampled and drafter(tiny_llama, config).head is not None
    wrong = SpecDecPPConfig(self_first_layers=1, head_path=str(sampled))  # a head given by path is checked too
    with pytest.raises(ConfigError, match="trained on sampled labels, this run decodes greedily"):
        drafter(tiny_llama, wrong)


def test_training_runs_end_to_end_and_lowers_the_heldout_loss(cache, tmp_path):
    out = tmp_path / "head.pt"
    main(["--prompts", "5", "--offset", "0", "--max-new-tokens", "48", "--epochs", "15", "--mix", "0.3",
          "--heldout", "0.4", "--out", str(out), "model=tiny-llama", "dataset=prompts",
          "method.self_first_layers=1"])
    saved = torch.load(out, weights_only=True)
    assert saved["target"] == "tiny-llama" and saved["draft"] == "self-first1"
    history = saved["heldout_history"]
    assert history[-1] < history[0]


def test_training_keeps_the_best_epoch_on_the_heldout_set():
    gen = torch.Generator().manual_seed(0)
    data = [(torch.randn(40, 8, generator=gen), torch.randint(0, 2, (40,), generator=gen).float()) for _ in range(4)]
    head = AcceptanceHead(8, 2)
    history = train(head, data[:2], data[2:], epochs=30, lr=3e-2, batch=8, progress=False)  # labels are noise
    assert min(history) < history[-1]  # it overfits ...
    hx, hy = torch.cat([h for h, _ in data[2:]]), torch.cat([y for _, y in data[2:]])
    with torch.no_grad():
        assert float(weighted_bce(head(hx), hy, 6.0)) == pytest.approx(min(history))  # ... and keeps the best


def test_greedy_labels_are_whether_the_target_argmax_is_the_drafted_token(tiny_llama, cache):
    settings = SpecDecPPConfig(self_first_layers=1)
    context = DrafterContext(target_model=tiny_llama.model, target_name=tiny_llama.name)
    draft_lm = build_draft_lm(settings, context, tiny_llama.tokenizer, tiny_llama.vocab_size)
    prompt = tiny_llama.tokenizer.encode("abcabcab")
    answer = [int(t) for t in torch.randint(0, tiny_llama.vocab_size, (24,), generator=torch.Generator().manual_seed(1))]
    gen = torch.Generator().manual_seed(0)
    [(hidden, labels)] = collect(tiny_llama.model, draft_lm, [prompt], [answer], SamplingParams(), 0.0, gen)
    assert hidden.shape == (24, tiny_llama.model.config.hidden_size)  # mix 0: every position is the draft's
    assert set(labels.tolist()) <= {0.0, 1.0} and 0 < labels.sum() < 24
    draft_lm.reset()
    logits, _ = draft_lm.forward(prompt + answer[:-1], every_position=True)
    drafted = logits[len(prompt) - 1 :].argmax(-1)  # mix 0, greedy: the draft's argmax at each position
    with torch.no_grad():
        seq = torch.tensor([prompt + drafted.tolist()])
        target_top = tiny_llama.model(input_ids=seq).logits[0, len(prompt) - 1 : -1].argmax(-1)
    assert labels.tolist() == (target_top == drafted).float().tolist()


def test_run_end_to_end_with_a_head(tiny_llama, cache, tmp_path):
    config = SpecDecPPConfig(self_first_layers=1)
    random_head(tiny_llama, config)
    summary = runner.run(cfg_for(tmp_path, "method=specdec_pp", "method.self_first_layers=1"))
    df = load_results(tmp_path)
    assert set(df.method) == {"specdec_pp", "autoregressive"}
    assert summary.set_index("method").loc["specdec_pp"].greedy_match == 1.0


# ---------------------------------------------------------------- lossless


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_gemma3"])
def test_greedy_lossless_on_tiny_models(request, name, cache):
    lm = request.getfixturevalue(name)
    config = SpecDecPPConfig(self_first_layers=1, max_k=8)
    random_head(lm, config)
    prompts = [lm.tokenizer.encode(t) for t in ["abcabcabcabc", "Hello world. Hello world. Hello"]]
    recs = assert_greedy_lossless(Target(lm.model), lambda: drafter(lm, config), prompts, 64)
    assert all(r.steps < r.new_tokens for r in recs)


@pytest.mark.slow
def test_sampling_keeps_the_target_distribution(cache):
    from tests.lossless import small_vocab_target

    target = small_vocab_target()
    lm = type("LM", (), {"model": target.model, "name": "small", "vocab_size": 8, "tokenizer": None})
    config = SpecDecPPConfig(self_first_layers=1, max_k=4)
    random_head(lm, config, greedy=False)
    params = SamplingParams(temperature=1.0)
    seeds = iter(range(10**6))
    assert_sampling_preserves_distribution(lambda: drafter(lm, config, params, next(seeds)), params,
                                           target=target, trials=1500)


@pytest.mark.slow  # a real model: make test-slow (make test keeps the smaller checks)
def test_greedy_lossless_on_smollm2(smollm2, cache):
    config = SpecDecPPConfig(max_k=8)
    random_head(smollm2, config)
    rec = assert_greedy_lossless(Target(smollm2.model), lambda: drafter(smollm2, config),
                                 [chat(smollm2, CODE_EDIT)], 48, eos=smollm2.eos_token_ids)[0]
    assert rec.steps < rec.new_tokens
