"""Plans on the record, replayed: a generation under ``budget=auto`` (drafting's measured seconds priced, so its
decisions follow the clock) keeps each step's plan; replaying those plans gives the same tokens, steps and τ,
greedy and sampled, for a copying method, a method with an auxiliary pool, an EAGLE-3 head and SAM-Decoding
with EAGLE-2 below its threshold. A replay that meets another drafter says so."""

import copy

import pytest
import torch

from specbench.budget.costs import CostModel
from specbench.budget.planner import AutoBudget
from specbench.budget.replay import Recorder, Replay, ReplayMismatch
from specbench.core.acceptance import SamplingParams
from specbench.core.decode import generate
from specbench.core.forward import Target
from tests.methods.test_simulated_gpus import heads, maker, prompt, saved, store  # noqa: F401 - fixtures

# Blocks cost more as they grow (128 tokens: 1.5 steps), so auto trims some steps and keeps others
CURVE = CostModel(qs=[1, 2, 8, 32, 128], contexts=[0], seconds=[[0.02, 0.0202, 0.021, 0.023, 0.03]])


def run(case, lm, sampling, store, heads, planner, tokens=24):  # noqa: F811
    make, _ = maker(case, lm.model, sampling, store, heads)
    return generate(Target(lm.model), make(), prompt(lm), max_new_tokens=tokens, sampling=sampling,
                    eos_token_ids=(), generator=torch.Generator().manual_seed(3), planner=planner)


class Careless(Replay):
    """A replay that reads the record's length but applies none of its plans: every step drafts and verifies all."""

    def cap(self) -> None:
        self._current()

    @property
    def width_cap(self) -> None:
        return None

    def plan(self, draft, tokens):
        self._current()
        self.step += 1
        return draft


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("case", ["pld", "spectra_core", "eagle3", "sam_decoding-eagle"])
def test_a_replay_gives_the_recorded_tokens_and_steps(case, temperature, saved, store, heads):  # noqa: F811
    lm, sampling = saved[2], SamplingParams(temperature=temperature)
    _, cls = maker(case, lm.model, sampling, store, heads)
    recorder = Recorder(AutoBudget(CURVE, aux_feeds=cls.AUX_FEEDS))
    recorded = run(case, lm, sampling, store, heads, recorder)
    plans = copy.deepcopy(recorder.plans)
    assert len(plans) == recorded.steps - 1 and all({"depth", "top_k", "n", "keep", "aux", "why"} <= set(p) for p in plans)
    assert any(p["keep"] is None or p["keep"] or p["aux"] for p in plans)  # it verified guesses or sent a pool
    assert all(p["pred_tokens"] >= 1 and p["pred_s"] >= CURVE(1, 0) * 0.99 for p in plans)  # expected, beside measured
    if not temperature and case in ("eagle3", "sam_decoding-eagle"):  # a stopped step and a trimmed one on record:
        assert any(p["depth"] == 0 for p in plans), [p["why"] for p in plans]  # a replay that applied no plan
        assert any(p["keep"] is not None and len(p["keep"]) < p["n"] for p in plans if p["depth"] != 0)  # differs
        try:
            careless = run(case, lm, sampling, store, heads, Careless(copy.deepcopy(plans), case))
            assert (careless.step_tokens, careless.step_drafted) != (recorded.step_tokens, recorded.step_drafted)
        except ReplayMismatch:
            pass
    again = run(case, lm, sampling, store, heads, Replay(plans, case))
    assert again.output_ids == recorded.output_ids
    assert again.step_tokens == recorded.step_tokens and again.steps == recorded.steps
    assert again.step_drafted == recorded.step_drafted


def test_a_replay_that_meets_another_drafter_says_so(saved, store, heads):  # noqa: F811
    lm, sampling = saved[2], SamplingParams()
    recorder = Recorder(AutoBudget(CURVE))
    run("pld", lm, sampling, store, heads, recorder)
    plans = copy.deepcopy(recorder.plans)
    first = next(p for p in plans if p["keep"] is None or p["keep"])
    first["keep"] = [*(first["keep"] or []), 99]  # a guess the drafter never proposes
    with pytest.raises(ReplayMismatch, match="recorded run's code, settings and seed"):
        run("pld", lm, sampling, store, heads, Replay(plans, "pld"))
    with pytest.raises(ReplayMismatch, match="steps recorded"):
        run("pld", lm, sampling, store, heads, Replay(copy.deepcopy(recorder.plans)[:3], "pld"))


def test_budget_replay_through_the_runner_gives_the_recorded_rows(tmp_path):
    """``budget=auto`` rows carry each step's plan; ``budget=replay replay=<their folder>`` decodes the same
    tokens and steps at T = 1, its rows labelled as a replay; a replay that cannot be one is refused in one line."""
    from specbench.errors import ConfigError
    from specbench.results.rows import load_results
    from specbench.run.runner import run as run_job
    from tests.run.test_config import make_cfg

    def cfg(*extra):
        return make_cfg("experiment=smoke", "method=spectra_core-cpu", "limit=2", "max_new_tokens=20",
                        "temperature=1", f"results_dir={tmp_path}", "progress=false", *extra)

    run_job(cfg("budget=auto", "experiment_name=rec"))
    run_job(cfg("budget=replay", f"replay={tmp_path}/rec", "experiment_name=rep"))
    rec, rep = (load_results(tmp_path / e) for e in ("rec", "rep"))
    rec, rep = (d[d["method"] == "spectra_core"].sort_values(["sample_id", "turn"]) for d in (rec, rep))
    assert len(rec) == len(rep) == 2 and set(rep["preset"]) == {"spectra_core:replay"}  # (outside Hydra: the method)
    assert [list(x) for x in rec["output_ids"]] == [list(x) for x in rep["output_ids"]]
    assert [list(x) for x in rec["step_tokens"]] == [list(x) for x in rep["step_tokens"]]
    assert rec["step_plans"].str.startswith('[{"depth"').all() and set(rep["budget"]) == {"replay"}
    for extra, said in ((("budget=replay", "experiment_name=x"), "name its results folder with replay="),
                        (("budget=replay", f"replay={tmp_path}/none", "experiment_name=x"), "no such folder"),
                        (("budget=fixed", f"replay={tmp_path}/rec", "experiment_name=x"), "read by budget=replay"),
                        (("budget=replay", f"replay={tmp_path}/rec", "limit=3", "experiment_name=x"),
                         "were not recorded there")):
        with pytest.raises(ConfigError, match=said) as err:
            run_job(cfg(*extra))
        assert "\n" not in str(err.value)
