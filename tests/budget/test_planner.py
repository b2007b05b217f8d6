"""The decision rule under a clock the test controls (:mod:`specbench.budget.simulated`): drafting that never pays
stays within the allowance through cost spikes and a 30% drift, drafting that pays drafts, the depth and the
top-k that pay best are the ones chosen, ``budget=static`` decides alike whatever the clock says, and the
warm-up's calibration measures what drafting costs. Then ``budget=static`` through the runner."""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from pathlib import Path

import pytest

from specbench.budget.costs import CostModel
from specbench.budget.drafting import DraftingCost
from specbench.budget.planner import ALLOWANCE_FLOOR, EXPLORE_EVERY, SPIKE, AutoBudget
from specbench.budget.simulated import CPU, calibrated, level_clock, simulate
from specbench.core.draft import Draft
from specbench.machine.costs import read_table
from specbench.results.rows import load_results
from specbench.run.runner import run
from tests.run.test_config import make_cfg


def test_drafting_that_never_pays_stays_within_the_allowance_through_spikes_and_drift():
    """Guesses never right; drafting 1 ms + 2 ms a level (half a plain step at depth 5), doubled every 97th step
    and 30% dearer by the end of 5,000 steps: the regret never exceeds the allowance, the whole draft is
    explored ever more rarely (what explorations lose grows as the log of the run), and the run loses under 0.5%
    of its time."""
    steps = 5000
    clock = level_clock(base=0.001, drift=0.3, spikes=97, steps=steps)
    planner = calibrated(clock)
    result = simulate(planner, steps, 0.0, clock)
    assert max(result.over) <= 0.0
    why = Counter(planner.why)  # the wait doubles per plain step's worth the explorations lost: log2(steps / 16)
    assert why["explored"] > 3 and planner.explored <= math.log2(steps / EXPLORE_EVERY) + 1
    assert why["plain"] > 0.99 * steps and planner.regret < 0.005 * planner.elapsed


@pytest.mark.parametrize(("factor", "spikes"), [(2.0, 5), (3.0, 1), (3.0, 5), (4.0, 5)])
def test_a_spike_past_spike_overruns_the_allowance_by_at_most_its_excess(factor, spikes):
    """The limit of the allowance: a forced step (a first draft, a probe) is checked with its drafting at SPIKE
    times the model. Drafting that never pays, calibrated on a calm clock, then run on one that takes ``factor``
    times as long every ``spikes``-th step: at SPIKE the regret never passes the allowance; past it, by at most
    one step's drafting beyond SPIKE times the model ((factor − SPIKE) × 11 ms against a 20 ms step), never
    accumulating (after an overrun nothing fits until the allowance has grown past the regret)."""
    planner = calibrated(level_clock(base=0.001))
    result = simulate(planner, 3000, 0.0, level_clock(base=0.001, spikes=spikes, factor=factor))
    limit = (factor - SPIKE) * (0.001 + 0.002 * 5) / CPU(1, 0)
    assert max(result.over) <= limit + 1e-9
    assert (max(result.over) > 0) == (factor > SPIKE)  # the spike past SPIKE does overrun: the limit is real


def test_scores_are_scaled_by_what_the_run_accepted_of_what_the_model_expected():
    """Where the acceptance model is right the realism stays near 1; a run that accepted nothing of what the
    model expected mostly decodes plainly (the options' means catch up within a few steps); the record fades step
    by step, so within ~150 steps the planner drafts again."""
    clock = level_clock()
    planner = calibrated(clock)
    simulate(planner, 2000, 0.8, clock)
    assert 0.9 < planner.realism < 1.1 and planner.realized[1] > 50
    planner.realized = [0.0, 1000.0]  # the model expected 1,000 guesses the run never accepted
    simulate(planner, 3000, 0.8, clock, seed=1)
    why = planner.why[2000:]  # the second run
    assert Counter(why[:100])["plain"] > 60 and Counter(why[200:300])["chosen"] > 90


def test_drafting_that_pays_drafts_nearly_every_step():
    """Guesses right 80% of the time, over five texts: nearly every step drafts. One text (seed 0) opens with its
    first three first-level guesses wrong (a 1-in-125 start), and waits for two explorations to draft again."""
    clock, plain, tokens, elapsed = level_clock(), 0, 0, 0.0
    for seed in range(5):
        planner = calibrated(clock)
        result = simulate(planner, 2000, 0.8, clock, seed=seed)
        assert planner.regret < 0 and Counter(planner.why)["plain"] < 0.05 * 2000
        plain += Counter(planner.why)["plain"]
        tokens, elapsed = tokens + result.tokens, elapsed + planner.elapsed
    assert plain < 0.02 * 5 * 2000
    assert tokens / elapsed > 2.0  # tokens per plain step's worth of modelled time


@pytest.mark.parametrize(("accept", "best"), [(0.95, 5), (0.5, 1)])
def test_the_depth_that_pays_best_is_the_one_drafted(accept, best):
    """Drafting 4 ms a level against a 20 ms step: guesses right 95% of the time pay to the method's own depth 5;
    at 50% only the first level pays ((1 + 0.5) / (21 + 4.2) ms beats deeper drafts and plain decoding)."""
    clock = level_clock(per_level=0.004)
    planner = calibrated(clock)
    result = simulate(planner, 1500, accept, clock)
    depths = Counter(d for d, _ in result.caps[500:])
    assert depths.most_common(1)[0][0] == best


def test_the_narrowest_top_k_that_keeps_the_accepted_path_is_drafted():
    """A tree at top-k 4 whose right token is always the first sibling, drafting costing 2 ms per level and per
    top-k: top-k 1 keeps every accepted token at a quarter of the drafting, so it is what the steps draft."""
    clock = lambda step, d, w: 0.0002 + 0.002 * d * w if d else 0.0001  # noqa: E731
    planner = calibrated(clock, depth=4, top_k=4)
    result = simulate(planner, 1500, 0.9, clock, depth=4, top_k=4, rank=lambda rng: 0)
    assert Counter(w for _, w in result.caps[500:]).most_common(1)[0][0] == 1
    assert planner.top_k == 4


def test_static_decisions_do_not_follow_the_clock():
    """Two runs under budget=static from one drafting table, their drafting clocks 0.5 ms and 3 ms a level with
    spikes: the same decisions, step for step. Under budget=auto the same two clocks decide differently."""
    table = calibrated(level_clock()).drafting.to_dict()
    runs = {}
    for static in (True, False):
        for name, clock in (("fast", level_clock(per_level=0.0005)), ("slow", level_clock(per_level=0.003, spikes=7))):
            planner = AutoBudget(CPU, drafting=DraftingCost.from_dict(table, frozen=static), static=static)
            runs[static, name] = (simulate(planner, 800, 0.6, clock).caps, planner.why, planner.kept)
    assert runs[True, "fast"] == runs[True, "slow"]
    assert runs[False, "fast"] != runs[False, "slow"]


def test_the_warm_up_measures_what_drafting_costs():
    """A warm-up drafts the method's own draft, no draft, depth 1 and the deepest at top-k 1 and the full one:
    the fit through them is the clock's own a + b·d + c·d·w, and a stopped step's seconds."""
    clock = lambda step, d, w: 0.001 + 0.002 * d + 0.0005 * d * w if d else 0.0003  # noqa: E731
    warm = AutoBudget(CPU, calibrating=True)
    simulate(warm, 16, 0.5, clock, depth=4, top_k=4, rank=lambda rng: 0)
    fit = warm.drafting
    assert fit.coef == pytest.approx([0.001, 0.002, 0.0005, 0.0], abs=1e-9) and fit.stopped == pytest.approx(0.0003)
    assert set(warm.why) == {"calibrating"} and warm.elapsed > 16  # it decides nothing, but counts the time


def catching_up_clock(base: float = 0.001, per_level: float = 0.002, per_token: float = 0.00005):
    """A head that catches up: each drafting step also pays ``per_token`` for every token the plain steps since
    it last drafted committed (one each); ``clock.drafted``: the seconds of each step that drafted."""
    behind = [0]

    def clock(step: int, depth: int, top_k: int = 0) -> float:
        if not depth:
            behind[0] += 1
            return 0.0001
        seconds, behind[0] = base + per_level * depth + per_token * behind[0], 0
        clock.drafted.append(seconds)
        return seconds
    clock.drafted = []
    return clock


def test_a_heads_catching_up_after_a_pause_is_priced():
    """Guesses never right, so the head drafts only to explore, after ever longer pauses, and each exploration
    pays 0.05 ms for every token since: the fit learns that price, each exploration's predicted drafting seconds
    meet the measured ones, and the regret stays within the allowance."""
    clock = catching_up_clock()
    planner = calibrated(clock, catches_up=True)
    clock.drafted.clear()
    predicted, plan = [], planner.plan

    def watched(draft, tokens):  # what the planner expects each drafting step's drafting to take
        out = plan(draft, tokens)
        if planner.why[-1] != "plain":
            predicted.append(planner.step.predicted[1] - planner.cost(1 + len(out) + out.n_aux, len(tokens)))
        return out

    planner.plan = watched
    result = simulate(planner, 4000, 0.0, clock)
    assert planner.drafting.coef[3] == pytest.approx(0.00005, rel=0.05)
    assert Counter(planner.why)["explored"] >= 3 and len(predicted) == len(clock.drafted)
    assert predicted[-1] == pytest.approx(clock.drafted[-1], rel=0.05)  # after a pause of hundreds of tokens
    assert clock.drafted[-1] > 2 * (0.001 + 0.002 * 5)  # more than twice what drafting right after a draft costs
    assert max(result.over) <= 0.0


def test_auto_follows_a_30_percent_drift_in_drafting_cost():
    steps = 3000
    clock = level_clock(drift=0.3, steps=steps)
    planner = calibrated(clock)
    simulate(planner, steps, 0.8, clock)
    assert planner.drafting(5, 0) == pytest.approx(clock(steps, 5), rel=0.05)
    frozen = calibrated(clock, static=True)
    simulate(frozen, steps, 0.8, clock)
    assert frozen.drafting(5, 0) == pytest.approx(clock(0, 5), rel=0.05)  # static: the table, whatever happens


def test_an_uncalibrated_first_draft_is_the_only_step_that_can_overrun():
    """With no table, the first step drafts the method's own draft at a cost nobody knew: 30 plain steps' worth.
    It overruns the floor; nothing drafts again until the run's allowance covers that."""
    clock = level_clock(per_level=0.12)
    planner = AutoBudget(CPU)
    result = simulate(planner, 400, 0.0, clock)
    assert result.over[0] > 0 and result.caps[0] == (5, 0) and set(result.caps[1:]) == {(0, 0)}
    assert ALLOWANCE_FLOOR < planner.regret


# ----------------------------------------------------------------------------- budget=static through the runner


def test_budget_static_runs_decide_alike_and_share_one_stored_table(tmp_path, monkeypatch, capsys):
    """Two sampled runs of a preset under budget=static on one machine: the first measures and stores the drafting
    table, the second reads it; their plans, tokens and steps are equal; ``bench/prediction_error.py`` tables the
    plans' predictions against the steps."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    base = ("experiment=smoke", "method=spectra_core-cpu", "budget=static", "temperature=1", "progress=false")
    for name in ("one", "two"):
        run(make_cfg(*base, f"results_dir={tmp_path / name}"))
    one, two = (load_results(tmp_path / n) for n in ("one", "two"))
    mine = [df[df.method == "spectra_core"].sort_values(["sample_id", "turn"]) for df in (one, two)]
    assert (mine[0].budget == "static").all() and all(p.endswith(":static") for p in mine[0].preset)
    assert list(mine[0].step_plans) == list(mine[1].step_plans)
    assert [list(x) for x in mine[0].output_ids] == [list(x) for x in mine[1].output_ids]
    path = mine[0].drafting_table.iloc[0]
    assert mine[1].drafting_table.iloc[0] == path and read_table(__import__("pathlib").Path(path)) is not None
    assert json.loads(mine[0].budget_calibration.iloc[0]) == json.loads(mine[1].budget_calibration.iloc[0])
    # bench/prediction_error.py reads the plans' predictions against what each step measured
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import prediction_error

    kinds = prediction_error.ratios(mine[0])
    assert kinds and all(s > 0 and t > 0 for pairs in kinds.values() for s, t in pairs)
    monkeypatch.setattr(sys, "argv", ["prediction_error.py", str(tmp_path / "one")])
    prediction_error.main()
    out = capsys.readouterr().out
    assert ":static: 2 generations; cost curve" in out and out.count("seconds ×") == len(kinds) + 1, out[-600:]


def test_acceptance_is_learned_afresh_with_each_dataset_category(tmp_path, monkeypatch):
    """Three questions, the first two of one category: the run's planner starts afresh once, at the third."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    rows = [{"question_id": i, "category": c, "turns": [f"Question {i}: say something about {c}."]}
            for i, c in ((1, "writing"), (2, "writing"), (3, "math"))]
    data = tmp_path / "questions.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    fresh = []
    monkeypatch.setattr(AutoBudget, "new_category", lambda self: fresh.append(len(self.why)))
    run(make_cfg("experiment=smoke", "method=spectra_core-cpu", "dataset=mtbench", f"dataset.path={data}",
                 "limit=3", "max_new_tokens=8", "baseline=false", "progress=false", f"results_dir={tmp_path / 'r'}"))
    assert len(fresh) == 1 and fresh[0] > 0  # after the two writing questions' steps, before the math one's


def test_the_drafting_fit_prices_by_hand_and_survives_its_stored_table():
    """a + b·d + c·d·w + e·p from the fit, as stored and read back; a table stored before p was a column (three
    terms) prices p at nothing; a stopped step costs the stopped seconds."""
    cost = DraftingCost()
    for d, w, p in ((1, 0, 0), (2, 2, 0), (4, 1, 8), (3, 3, 2), (5, 0, 1)):
        cost.observe(d, w, 0.001 + 0.002 * d + 0.0005 * d * w + 0.0001 * p, behind=p)
    cost.observe(0, 0, 0.0003)
    assert cost(6, 2, 4) == pytest.approx(0.001 + 0.012 + 0.006 + 0.0004, rel=1e-6)
    assert cost(0) == pytest.approx(0.0003)
    back = DraftingCost.from_dict(json.loads(json.dumps(cost.to_dict())))
    assert back(6, 2, 4) == pytest.approx(cost(6, 2, 4)) and back(0) == cost(0)
    old = DraftingCost.from_dict({"coef": [0.001, 0.002, 0.0005], "stopped": 0.0})
    assert old(2, 2, 100) == pytest.approx(0.001 + 0.004 + 0.002)


def test_a_first_draft_pays_for_catching_up_on_the_prompt():
    """A generation's first draft catches up on the whole prompt, priced by the fit's per-token term (1 ms a token
    here): after a short prompt the first draft fits the allowance, after a long one it does not."""
    table = {"coef": [0.001, 0.001, 0.0, 0.001], "stopped": 0.0}
    for prompt_len, why in ((10, "first"), (2000, "plain")):
        planner = AutoBudget(CPU, drafting=DraftingCost.from_dict(table, frozen=True), static=True, catches_up=True)
        planner.start(prompt_len)
        planner.cap()
        assert planner.why[-1] == why and planner.behind == prompt_len


def test_static_prices_a_forced_steps_drafting_at_its_tables_seconds():
    """Under ``budget=static`` the regret counts the table's seconds, never the clock's: a first draft is checked
    with its drafting at STATIC_SPIKE (1) × the table, under ``auto`` at SPIKE (2) ×. A first draft costing 1.5
    plain steps fits the allowance's two plain steps under the one and not under the other."""
    table = {"coef": [1.5 * CPU(1, 10), 0.0, 0.0, 0.0], "stopped": 0.0}
    for static, why in ((True, "first"), (False, "plain")):
        planner = AutoBudget(CPU, drafting=DraftingCost.from_dict(table, frozen=True), static=static)
        planner.start(10)
        planner.cap()
        assert planner.why[-1] == why


def test_a_drafter_that_does_not_catch_up_is_never_priced_for_a_pause():
    """A pool or a lookup is fed every step, drafting or not. A drafting table whose per-token term came out at
    0.7 ms (a warm-up's steps after a stopped one happened to be slow) would price its draft after 250 plain
    steps at 175 ms, so a drafter whose guesses follow would never be tried again. Priced without that term, the
    long prompt's first draft fits, and after a long stretch of guesses that never follow, a probe finds the
    guesses that now do and the rule drafts them."""
    table = {"coef": [0.0005, 0.0001, 0.0, 0.0007], "stopped": 0.0}
    for catches_up, why in ((True, "plain"), (False, "first")):
        planner = AutoBudget(CPU, drafting=DraftingCost.from_dict(table, frozen=True), static=True,
                             catches_up=catches_up)
        planner.start(2000)
        planner.cap()
        assert planner.why[-1] == why
    planner = AutoBudget(CPU, drafting=DraftingCost.from_dict(table, frozen=True), static=True)
    simulate(planner, 800, lambda step: 0.0 if step < 400 else 0.9, level_clock(base=0.0005, per_level=0.0001))
    assert Counter(planner.why[300:400])["plain"] > 95  # nothing paid: it stopped
    assert Counter(planner.why[-200:])["chosen"] > 150  # a probe found the guesses that follow now




def test_a_drafts_levels_are_learned_from_as_the_output_reaches_them():
    """A first draft of five levels, all wrong: the next step has counted its first level (the acceptance model
    learns from the very next token, not five steps later), and the draft counts once, when it is through."""
    planner = calibrated(level_clock())
    assert planner.cap() is None and planner.why == ["first"]
    planner.record(planner.plan(Draft.chain([-1, -2, -3, -4, -5], "sim"), [7]), [], draft_s=0.01)
    planner.cap()
    planner.plan(Draft.chain([], "sim"), [7, 8])
    assert planner.stats.drafted[("sim", 1)] == 1 and planner.stats.accepted[("sim", 1)] == 0
    assert ("sim", 2) not in planner.stats.drafted and planner.stats.counted == 0  # depth 2: its parent was wrong
    assert [p[-1] for p in planner._pending if len(p[0]) == 5] == [1]  # still pending, counted to depth 1
    planner.finish([7, 8, 9])
    assert planner.stats.counted == 1 and planner.stats.drafted[("sim", 1)] == 1


def test_an_exploration_probes_one_level_past_what_the_rule_takes():
    """Guesses never right: each exploration drafts one level (what it teaches, the first level's rate, is what
    the rule would next take; a proposal teaches whether or not its guesses are verified), not the whole draft.
    Guesses right half the time at 4 ms a level: depth 1 pays best, and explorations probe depth 2."""
    clock = level_clock()
    planner = calibrated(clock)
    result = simulate(planner, 3000, 0.0, clock)
    probes = [d for (d, _), why in zip(result.caps, planner.why, strict=True) if why == "explored"]
    assert result.caps[0][0] == 5 and len(probes) > 3 and set(probes) == {1}
    clock = level_clock(per_level=0.004)
    planner = calibrated(clock)
    result = simulate(planner, 3000, 0.5, clock)
    probes = Counter(d for (d, _), why in zip(result.caps, planner.why, strict=True) if why == "explored")
    assert probes.most_common(1)[0][0] == 2


def test_an_exploration_that_pays_starts_the_waits_over():
    """Guesses never right for 400 steps (the wait between probes grows to ~52 steps with what they lose), then
    right 90% of the time: each probe that pays sets the wait back to ``EXPLORE_EVERY``, so the acceptance
    model is taught every 16 steps and the method's own depth is drafted within three grown waits (about 130
    steps; about 250 while only the rule's taking the method's own draft started the waits over)."""
    clock = level_clock()
    planner = calibrated(clock)
    simulate(planner, 400, 0.0, clock)
    grown = EXPLORE_EVERY * 2 ** planner.explored
    assert grown > 3 * EXPLORE_EVERY
    result = simulate(planner, 400, 0.9, clock, seed=1)
    assert [d for d, _ in result.caps].index(5) < 3 * grown


def test_a_stopped_step_prices_one_forward():
    """While drafting is off a step is bookkeeping: after the first step's decision, the decision, the plan and
    the record ask the cost curve twice between them, and a proposal the drafter made anyway is not sent."""
    calls = []

    class Counted(CostModel):
        def __call__(self, q, context=0, batch=1):
            calls.append(q)
            return super().__call__(q, context, batch)

    never = DraftingCost.from_dict({"coef": [10.0, 0.0, 0.0], "stopped": 1e-4}, frozen=True)
    planner = AutoBudget(Counted(CPU.qs, CPU.contexts, CPU.seconds), drafting=never, static=True)
    for step in range(40):
        calls.clear()
        assert planner.cap() == 0
        planned = planner.plan(Draft.chain([1, 2, 3], "sim"), list(range(10 + step)))
        planner.record(planned, [])
        assert len(planned) == 0 and len(calls) <= (3 if step == 0 else 2) and planner.why[-1] == "plain"
    assert planner.regret == 0 and planner.elapsed == pytest.approx(40 * (1 + 1e-4 / 0.020))


def test_a_first_draft_that_waits_for_room_leaves_no_stale_wait_behind():
    """A draft costing more than the allowance's two plain steps at its worst case (12 ms + 2 ms a level, 44 ms
    at SPIKE against a 20 ms step) waits for the run's 1% to grow the room (20 steps); once taken, drafting that
    pays (80% of guesses right) is decided afresh every step, not held plain by the room the first draft
    needed: over five texts under 30% of the steps plain (44% while that room outlived the first draft)."""
    clock, plain = level_clock(base=0.012), 0
    for seed in range(5):
        planner = calibrated(clock)
        simulate(planner, 400, 0.8, clock, seed=seed)
        assert planner.why.index("first") == 20
        plain += Counter(planner.why)["plain"]
    assert plain < 0.3 * 5 * 400


def test_the_exploration_study_reads_the_planners_trade(capsys, monkeypatch):
    """bench/explore_sim.py: on the simulated loop a drafter that never pays runs a little under plain decoding's
    speed (its probes), one right 80% of the time far above; a constant set with ``--set`` changes the cells and
    is put back afterwards; a name the planner has not is refused with what to write."""
    import sys
    from pathlib import Path

    import specbench.budget.planner as planner

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import explore_sim

    never = explore_sim.speed(0.0, 512, explore_sim.HEAD, 0, seeds=2)
    assert 0.98 < never < 1.0 and explore_sim.speed(0.8, 512, (0.002, 0.002), 0, seeds=2) > 1.5
    monkeypatch.setattr(explore_sim, "CASES", [("never pays", 0.0, 512, explore_sim.HEAD, 0)])
    monkeypatch.setattr(sys, "argv", ["explore_sim.py", "--set", "EXPLORE_EVERY=16,64", "--seeds", "2"])
    explore_sim.main()
    row = capsys.readouterr().out.splitlines()[-1].split()
    assert float(row[-2]) == pytest.approx(never, abs=1e-4) and float(row[-1]) > never  # rarer probes lose less
    assert planner.EXPLORE_EVERY == EXPLORE_EVERY
    monkeypatch.setattr(sys, "argv", ["explore_sim.py", "--losses", "--set", "SPIKE=1,2", "--spikes", "3",
                                      "--factor", "1.5"])
    explore_sim.main()  # where nothing pays, under drafting spikes of 1.5 times the model every third step
    out = capsys.readouterr().out.split("SPIKE=2.0")
    dear = [[float(line.rsplit(";", 1)[1]) for line in part.splitlines() if line.startswith("dear")] for part in out]
    assert max(dear[0]) > 0 >= max(dear[1])  # priced at its expectation a probe overruns; at SPIKE × it does not
    assert planner.SPIKE == SPIKE
    monkeypatch.setattr(sys, "argv", ["explore_sim.py", "--set", "EXPLORE_SOMETIMES=3"])
    with pytest.raises(SystemExit, match="name a constant of specbench/budget/planner.py, acceptance.py or"):
        explore_sim.main()
    import specbench.budget.acceptance as acceptance
    import specbench.budget.drafting as drafting

    window, fade = planner.WINDOW, planner.FADE
    try:  # WINDOW reaches every module that reads it, and the realism's fade follows it
        explore_sim.put("WINDOW", 8)
        assert planner.WINDOW == acceptance.WINDOW == drafting.WINDOW == 8 and planner.FADE == 1 - 1 / 8
    finally:
        explore_sim.put("WINDOW", window)
    assert planner.FADE == fade and drafting.WINDOW == window
