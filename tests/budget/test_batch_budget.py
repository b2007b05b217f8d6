"""budget=auto at batch size > 1: the batched cost curve (measured, cached, interpolated between batch
sizes), the block chosen for all rows, drafting driven to nothing where it does not pay at that batch size,
lossless decoding under it, and a batched job with ``budget=auto``."""

from __future__ import annotations

import json

import pytest
import torch

from specbench.budget.batch import BatchBudget, RowShare, best_block, best_first
from specbench.budget.costs import STAGGERED, CostModel
from specbench.core.decode import Request, decode_batch, generate
from specbench.core.draft import Draft, Drafter
from specbench.core.forward import Target
from specbench.machine import costs
from specbench.machine.costs import batch_sizes, load_or_measure, measure_batch
from specbench.results.rows import load_results
from specbench.run.runner import run
from tests.core.test_batch import Script
from tests.core.test_tree_forward import build
from tests.run.test_batch_run import cfg_for


def curve(batches: dict[int, list[float]], one=(1.0, 1.0)) -> CostModel:
    """t(q) at q = 1 and 64 for batch size 1 and for each of ``batches``."""
    return CostModel([1, 64], [0], [list(one)],
                     batches={b: CostModel([1, 64], [0], [list(s)], rows=STAGGERED) for b, s in batches.items()})


FLAT = curve({4: [1.0, 1.0]})  # a GPU's: 64 tokens a row cost what one does, at batch 4 too
STEEP = curve({4: [4.0, 256.0]}, one=(1.0, 1.05))  # free at batch 1, every token paid for at batch 4


def test_the_batched_curve_interpolates_between_batch_sizes_and_survives_a_round_trip():
    m = curve({2: [2.0, 3.0], 4: [4.0, 8.0]}, one=(1.0, 2.0))
    assert m(1, 0, 2) == 2.0 and m(64, 0, 4) == 8.0
    assert m(1, 0, 3) == pytest.approx(3.0) and m(64, 0, 3) == pytest.approx(5.5)
    assert m(64, 0, 6) == pytest.approx(13.0)  # beyond the largest: along the last two
    back = CostModel.from_dict(m.to_dict())
    assert back == m and back.batches[4](64) == 8.0
    older = m.to_dict()
    older["batches"]["4"]["rows"] = ""  # timed with equal rows, before rows were staggered: dropped, re-timed
    assert sorted(CostModel.from_dict(older).batches) == [2]
    with pytest.raises(ValueError, match="no curve measured at batch size 2"):
        CostModel([1], [0], [[1.0]])(1, 0, 2)
    assert batch_sizes(1) == [] and batch_sizes(8) == [2, 4, 8] and batch_sizes(6) == [2, 4, 6]
    share = RowShare(m)
    share.at(4, 0)
    # a row's quarter of the plain step (4 / 4) and the whole rise its block makes (8 − 4), at the batch's context
    assert share(64, 999) == pytest.approx(5.0) and share(1, 999) == pytest.approx(1.0)
    share.at(1, 0)
    assert share(64, 0) == 2.0


def test_the_block_keeps_every_guess_on_a_flat_curve_and_none_where_none_pays():
    ranked = [[0.9, 0.5, 0.2], [0.3], [], [0.6, 0.6]]
    sizes = [1, 1, 1, 1]
    assert best_block(sizes, ranked, lambda q: 1.0) == 4  # the longest row's guesses all fit
    assert best_block(sizes, ranked, lambda q: 4.0 * q) == 1  # each token costs a step: nothing pays
    # a row's aux nodes set the floor; the other rows fill the padding for free
    assert best_block([6, 1, 1, 1], ranked, lambda q: 4.0 * q) == 6
    assert best_first([0.1, 0.0, 0.7, 0.7]) == [2, 3, 0]


def test_one_good_row_sets_the_block_and_the_others_fill_it():
    # 3 rows with nothing worth sending and one whose guesses are sure: t(q) = 1 + q / 8 for the batch
    ranked = [[1.0, 1.0, 1.0], [], [], []]
    assert best_block([1, 1, 1, 1], ranked, lambda q: 1 + q / 8) == 4
    assert best_block([1, 1, 1, 1], [[0.1, 0.1, 0.1], [], [], []], lambda q: 1 + q / 8) == 1


class WrongChain(Drafter):
    """Three guesses that are never the target's (it proposes tokens outside what the model emits here)."""

    def propose(self, state):
        return Draft.chain([95, 94, 93], "wrong") if state.max_depth >= 3 else None


def decode(target, requests, batch_size, budget):
    queue = requests[::-1]
    return {req.tag: rec for req, rec in decode_batch(target, lambda: queue.pop() if queue else None,
                                                      batch_size=batch_size, plan_rows=budget)}


@pytest.mark.parametrize(("cost", "drafts"), [(FLAT, True), (STEEP, False)])
def test_a_batch_drafts_under_a_flat_curve_and_nothing_where_tokens_are_paid_for(cost, drafts):
    """Greedy outputs equal autoregressive decoding either way; a steep batched curve drives a batch of 4 to
    blocks of one token (no guesses) while the same drafts at batch size 1 on its near-flat curve are kept."""
    target = Target(build("llama"))
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 90, (n,), generator=gen).tolist() for n in (5, 9, 3, 7, 4, 6)]
    expected = [generate(target, Drafter(vocab_size=0), p, max_new_tokens=24).output_ids for p in prompts]
    budget = BatchBudget(cost)
    first = budget.planner()
    requests = [Request(p, 24, Script(e) if i % 2 else WrongChain(vocab_size=96),
                        planner=first if i == 0 else first.spawn(), tag=i)
                for i, (p, e) in enumerate(zip(prompts, expected, strict=True))]
    got = decode(target, requests, 4, budget)
    assert [got[i].output_ids for i in range(len(prompts))] == expected
    at_four = [q for b, q in budget.blocks if b == 4]
    assert len(at_four) > 5
    if drafts:
        assert max(at_four) >= 4 and sum(got[1].step_accepted) > 0
    else:
        assert at_four[-5:] == [1] * 5
        alone = BatchBudget(cost)  # at batch size 1 (t(64) = 1.05 t(1)) the scripted drafts pay
        rec = generate(target, Script(expected[1]), prompts[1], max_new_tokens=24, planner=alone.planner())
        assert rec.output_ids == expected[1] and sum(rec.step_accepted) > 0


def test_a_batch_step_is_priced_at_its_longest_row():
    """Attention reads up to the longest row: the step's context is the longest row's, not the mean."""
    m = CostModel([1, 64], [0], [[1.0, 1.0]], batches={2: CostModel([1, 64], [0, 100], [[1.0, 2.0], [3.0, 9.0]],
                                                                    rows=STAGGERED)})
    budget = BatchBudget(m)
    planners = [budget.planner(), budget.planner().spawn()]
    for p in planners:
        p.cap()
    budget(planners, [Draft(), Draft()], [[1] * 10, [1] * 90])
    assert budget.share.context == 90 and budget.share(1) == pytest.approx(m(1, 90, 2) / 2)


def test_planners_spawned_for_a_batch_share_what_they_learn():
    first = BatchBudget(FLAT).planner()
    other = first.spawn()
    assert other.stats is first.stats and other.cost is first.cost and other is not first


class Clock:
    """The measurements' clock (``costs.perf_counter``), moved on only by the forwards the test times."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_batched_curve_is_measured_and_joins_the_cached_one(tiny_llama, tmp_path, monkeypatch):
    """Each batched forward costs 1 ms per token on the test's clock: the curve holds those times for the blocks
    timed, extends their slope beyond, and joins the cached curve without re-timing batch size 1."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    clock, forward_rows = Clock(), Target.forward_rows

    lengths = []

    def timed(self, roots, drafts, cache, *args, **kwargs):
        lengths.append(list(cache.lengths[: len(roots)]))
        clock.now += 0.001 * len(roots) * (1 + len(drafts[0]))
        return forward_rows(self, roots, drafts, cache, *args, **kwargs)

    monkeypatch.setattr(costs, "perf_counter", clock)
    monkeypatch.setattr(Target, "forward_rows", timed)
    target = Target(tiny_llama.model)
    m = measure_batch(target, tiny_llama.vocab_size, 3, qs=(1, 4, 8), contexts=(8,), repeats=1, most_tokens=12)
    # q = 1 and 4 timed (3 and 12 tokens); q = 8 (24 tokens, over 12) along their slope: 12 + 4 × 3 ms
    assert m.qs == [1, 4, 8] and m.seconds[0] == pytest.approx([0.003, 0.012, 0.024])
    assert lengths[0] == [8, 7, 6] and all(seen == lengths[0] for seen in lengths)  # staggered, restored each time
    assert m.rows == STAGGERED
    one = load_or_measure(tiny_llama, "tiny-llama", "float32", "sdpa", qs=(1, 4), contexts=(8,), repeats=1)
    assert one.batches == {}
    four = load_or_measure(tiny_llama, "tiny-llama", "float32", "sdpa", qs=(1, 4), contexts=(8,), repeats=1,
                           batch_size=4)
    assert sorted(four.batches) == [2, 4] and four.seconds == one.seconds  # batch 1's curve read, not re-timed
    assert four.batches[4].seconds[0] == pytest.approx([0.004, 0.016]) and four(4, 8, 3) == pytest.approx(0.012)
    again = load_or_measure(tiny_llama, "tiny-llama", "float32", "sdpa", qs=(1, 2), contexts=(8,), batch_size=2)
    assert again == four  # everything asked for was cached


def test_a_batched_job_runs_budget_auto_with_the_outputs_of_batch_one(tmp_path, monkeypatch):
    """… and at either batch size the planners start from the drafting table the warm-up measured."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    run(cfg_for(tmp_path / "b1", "method=spectra_core-cpu", "limit=3"))
    run(cfg_for(tmp_path / "b3", "method=spectra_core-cpu", "limit=3", "batch_size=3"))
    one, three = load_results(tmp_path / "b1"), load_results(tmp_path / "b3")
    keys = ["sample_id", "turn", "method"]
    merged = three.merge(one, on=keys, suffixes=("", "_b1"))
    assert len(merged) == len(three) == len(one)
    assert (merged.output_ids.map(list) == merged.output_ids_b1.map(list)).all()
    ours = three[three.method == "spectra_core"]
    assert (ours.budget == "auto").all() and (ours.batch_size == 3).all()
    assert sorted(CostModel.from_dict(json.loads(ours.cost_curve.iloc[0])).batches) == [2, 3]
    for rows in (one, three):
        table = json.loads(rows[rows.method == "spectra_core"].budget_calibration.iloc[0])
        assert table["points"] > 0 and table["stops"] > 0  # drafting steps and stopped ones were timed
