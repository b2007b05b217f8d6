"""The oracle: drafts the true continuation; its greedy output is autoregressive decoding's, every step brings
the tokens it was allowed, its draft length is the cost curve's best, and a job runs it like any method."""

from __future__ import annotations

import pytest

from methods.oracle import Oracle, OracleConfig, best_length
from specbench.budget.costs import CostModel
from specbench.core.decode import generate
from specbench.core.draft import DecodeState, DrafterContext
from specbench.core.forward import Target
from specbench.core.reference import References
from specbench.errors import ConfigError
from specbench.results.rows import load_results
from specbench.run.runner import run
from tests.lossless import autoregressive_output
from tests.run.test_runner import cfg_for

PROMPTS = [[1, 2, 3, 4, 5], [7, 7, 9, 11, 3, 2]]


def oracle(target, num_draft=0, cost=None, tokens=64) -> Oracle:
    context = DrafterContext(forward_cost=cost, reference=References(target, tokens))
    return Oracle(OracleConfig(num_draft=num_draft), vocab_size=target.model.config.vocab_size, context=context)


def test_the_best_length_is_the_curves_best_tokens_per_second():
    # CPU-like: one token 1.0, flat to 8 tokens, then 0.2 a token more: (1+k)/t peaks where the plateau ends
    curve = CostModel([1, 8, 64], [0], [[1.0, 1.0, 12.2]])
    assert best_length(curve, 0, 128) == 7
    assert best_length(CostModel.flat(), 0, 40) == 40  # a GPU at batch 1: as long as allowed
    rising = CostModel([1, 2, 64], [0], [[1.0, 2.5, 160.0]])  # each guess costs more than it brings
    assert best_length(rising, 0, 64) == 1  # the shortest draft at least (a step that drafts nothing is AR)


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_output_is_autoregressive_and_every_step_brings_what_it_was_allowed(tiny_llama, k):
    target = Target(tiny_llama.model)
    for prompt in PROMPTS:
        rec = generate(target, oracle(target, num_draft=k), prompt, max_new_tokens=40)
        assert rec.output_ids == autoregressive_output(target, prompt, 40)
        decode_steps = rec.step_tokens[1:]  # the prefill's token first
        assert all(n == k + 1 for n in decode_steps[:-1]), decode_steps
        assert 1 <= decode_steps[-1] <= k + 1
        assert rec.new_tokens / rec.steps == pytest.approx(40 / (1 + -(-39 // (k + 1))))


def test_with_no_draft_length_given_it_drafts_what_the_curve_says(tiny_llama):
    target = Target(tiny_llama.model)
    curve = CostModel([1, 5, 64], [0], [[1.0, 1.0, 30.5]])  # best: 4 guesses a step
    rec = generate(target, oracle(target, cost=curve), PROMPTS[0], max_new_tokens=21)
    assert rec.output_ids == autoregressive_output(target, PROMPTS[0], 21)
    assert rec.step_tokens[1:] == [5, 5, 5, 5]


def test_it_drafts_nothing_off_the_references_path(tiny_llama):
    target = Target(tiny_llama.model)
    drafter = oracle(target, num_draft=4)
    drafter.new_turn(PROMPTS[0])
    truth = drafter.reference
    on = DecodeState(tokens=PROMPTS[0] + truth[:3], prompt_len=len(PROMPTS[0]), max_new_tokens=40)
    assert drafter.propose(on).tokens == truth[3:7]
    off = DecodeState(tokens=PROMPTS[0] + truth[:2] + [truth[2] + 1], prompt_len=len(PROMPTS[0]), max_new_tokens=40)
    assert drafter.propose(off) is None


def test_without_a_cost_curve_it_asks_for_a_draft_length(tiny_llama):
    target = Target(tiny_llama.model)
    drafter = oracle(target)
    drafter.new_turn(PROMPTS[0])
    with pytest.raises(ValueError, match="num_draft"):
        drafter.propose(DecodeState(tokens=PROMPTS[0], prompt_len=len(PROMPTS[0]), max_new_tokens=8))


def test_a_job_runs_the_oracle_beside_its_baseline_in_both_orders(tmp_path):
    # limit=2: the oracle runs first on one sample (its reference generated untimed) and second on the other
    summary = run(cfg_for(tmp_path, "method=oracle", "limit=2", "max_new_tokens=24"))
    df = load_results(tmp_path)
    rows = df[df.method == "oracle"]
    assert len(rows) == len(df[df.method == "autoregressive"]) >= 2
    row = summary.set_index("method").loc["oracle"]
    assert row.greedy_match == 1.0 and row.tau > 2  # most tokens of a step come from the drafts


@pytest.mark.parametrize(("override", "message"), [("temperature=1", "temperature=0"),
                                                   ("batch_size=2", "batch_size=1"),
                                                   ("budget=auto", "budget=fixed")])
def test_settings_the_oracle_cannot_take_are_refused_before_loading(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        run(cfg_for(tmp_path, "method=oracle", override))
