"""budget=auto: the cost curve, the acceptance statistics and the trim by hand; then lossless decoding
with trimmed drafts (greedy fp32 and the sampling distribution) and a run through the runner."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from methods.lookahead import Lookahead, LookaheadConfig
from methods.registry import get_method
from methods.spectra_core import SpectraCore, SpectraCoreConfig
from methods.token_recycling import TokenRecycling, TokenRecyclingConfig
from specbench.budget.acceptance import PRIOR, AcceptanceStats, fed, node_scores, positions
from specbench.budget.costs import CostModel
from specbench.budget.drafting import WINDOW
from specbench.budget.planner import EXPLORE_EVERY, AutoBudget, Option, Seen, best_prefix
from specbench.budget.pools import subdraft, widths
from specbench.core.acceptance import SamplingParams
from specbench.core.draft import SOURCE_BWD, SOURCE_FWD, SOURCE_RETRIEVAL, Draft
from specbench.core.forward import Target
from specbench.drafting.ngram_dicts import CandidatePool
from specbench.drafting.spectra_engine import SpectraCoreEngine
from specbench.errors import ConfigError
from specbench.machine.costs import (
    CONTEXTS,
    GPU_CONTEXTS,
    contexts_for,
    cost_key,
    load_or_measure,
    measure,
    monotone,
)
from specbench.paths import CONF_DIR
from specbench.results.rows import load_results
from specbench.run.config import load_preset
from specbench.run.runner import run
from tests.lossless import (
    CODE_EDIT,
    SMALL_VOCAB,
    assert_greedy_lossless,
    assert_sampling_preserves_distribution,
    chat,
)
from tests.run.test_config import make_cfg

LINEAR = CostModel(qs=[1, 2], contexts=[0], seconds=[[1.0, 2.0]])  # t(q) = q: no block ever pays
CHEAP = CostModel(qs=[1, 2], contexts=[0], seconds=[[1.0, 1.1]])  # t(q) = 1 + 0.1 (q - 1)
STEP = CostModel(qs=[1, 5, 6], contexts=[0], seconds=[[1.0, 1.0, 3.0]])  # free up to 5 tokens, then 3 steps
FLAT = CostModel.flat()


# ----------------------------------------------------------------------------- the cost curve


def test_cost_model_interpolates_by_hand():
    m = CostModel(qs=[1, 4], contexts=[100, 300], seconds=[[1.0, 4.0], [2.0, 8.0]])
    assert m(2, 100) == pytest.approx(2.0)
    assert m(8, 100) == pytest.approx(8.0)  # the last slope, extended
    assert m(2, 200) == pytest.approx((2.0 + 4.0) / 2)  # halfway between the two contexts
    assert m(1, 50) == pytest.approx(1.0)  # below the first context: its row
    assert m(1, 400) == pytest.approx(2.5) and m(4, 500) == pytest.approx(12.0)  # past the last: the slope goes on
    assert FLAT(120) == FLAT(1)
    assert CostModel.from_dict(json.loads(json.dumps(m.to_dict()))) == m
    with pytest.raises(ValueError, match="increase"):
        CostModel(qs=[4, 1], contexts=[0], seconds=[[1.0, 2.0]])


def test_cost_curves_of_other_placements_never_share_a_key():
    base = cost_key("llama2-70b", "float16", "sdpa", "cuda:0", devices=["cuda:0"])
    keys = {
        base,
        cost_key("llama2-70b", "float16", "sdpa", "cuda:0", devices=["cuda:0"], quantization="int8"),
        cost_key("llama2-70b", "float16", "sdpa", "cuda:0", devices=["cuda:0", "cuda:1"], device_map="auto"),
        cost_key("llama2-70b", "float16", "sdpa", "cuda:0", devices=[f"cuda:{i}" for i in range(4)], device_map="auto"),
        cost_key("llama2-70b", "float16", "eager", "cuda:0", devices=["cuda:0"]),
    }
    assert len(keys) == 5
    assert cost_key("llama2-70b", "float16", "sdpa", "cuda:0", devices=["cuda:0"]) == base


def test_contexts_reach_4k_on_a_gpu_within_the_models_context():
    gpu, cpu = SimpleNamespace(is_cuda=True), SimpleNamespace(is_cuda=False)
    assert contexts_for(gpu) == GPU_CONTEXTS and max(GPU_CONTEXTS) == 4096
    assert contexts_for(gpu, 4096) == (128, 1024, 2048)  # a 4k-context model: 4096 + a block does not fit
    assert contexts_for(cpu, 8192) == CONTEXTS
    assert contexts_for(cpu, 100) == (1,)


def test_measurement_times_the_compaction_too(tiny_llama, monkeypatch):
    target = Target(tiny_llama.model)
    paths = []
    real = target.compact
    monkeypatch.setattr(target, "compact", lambda cache, past, path: paths.append(path) or real(cache, past, path))
    measure(target, tiny_llama.vocab_size, qs=(1, 8), contexts=(16,), repeats=1, warmup=0, small_repeats=1)
    assert paths == [[], [0, 2, 4]]  # q = 8: an accepted path of three guesses down one chain


def test_a_machine_that_halves_its_pace_midway_leaves_the_curve_as_it_was(tiny_llama, monkeypatch):
    """Every forward after the first half of the measurement takes twice as long (a GPU's host slowing down, on a
    clock the test controls): each round times the whole curve, so the plain step's fastest round is the first's,
    each block's ratio to it holds in every round, and every context's row reads its true cost; timed context by
    context, the last row would read double."""
    import specbench.machine.costs as machine_costs

    target, now, calls = Target(tiny_llama.model), [0.0], [0]
    true = {(16, 1): 1.0, (16, 8): 2.0, (64, 1): 3.0, (64, 8): 5.0}  # seconds of a forward at (context, q)
    real = target.forward_draft

    def forward_draft(root, draft, cache, *args, **kwargs):
        calls[0] += 1
        now[0] += true[(cache.get_seq_length(), 1 + len(draft))] * (2.0 if calls[0] > len(true) else 1.0)
        return real(root, draft, cache, *args, **kwargs)

    monkeypatch.setattr(target, "forward_draft", forward_draft)
    monkeypatch.setattr(machine_costs, "perf_counter", lambda: now[0])
    m = measure(target, tiny_llama.vocab_size, qs=(1, 8), contexts=(16, 64), repeats=2, warmup=0)
    assert calls[0] == 6 * len(true) and m.seconds == [[1.0, 2.0], [3.0, 5.0]]  # q = 8 is small: 6 rounds


def test_a_small_block_costs_its_typical_ratio_to_a_plain_step_not_its_luckiest_round(tiny_llama, monkeypatch):
    """On a clock the test controls, a block of 2 takes 1.12 plain steps in most rounds and 0.9 s in a lucky one,
    a block of 24 twice a plain step, a plain step 1.0 s with one round at 0.9: the plain step costs its
    fastest round, the small block the median of its paired ratios (the fastest of its rounds would price it
    as a plain step), the large block (three rounds, not nine) its ratio."""
    import specbench.machine.costs as machine_costs

    target, now = Target(tiny_llama.model), [0.0]
    rounds = {1: [1.0, 1.0, 0.9, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], 2: [1.12, 0.9, 1.008, 1.12, 1.14, 1.12, 1.1, 1.12,
                                                                     1.13], 24: [2.0, 2.0, 1.8]}
    real, seen = target.forward_draft, {1: 0, 2: 0, 24: 0}

    def forward_draft(root, draft, cache, *args, **kwargs):
        q = 1 + len(draft)
        now[0] += rounds[q][seen[q]]
        seen[q] += 1
        return real(root, draft, cache, *args, **kwargs)

    monkeypatch.setattr(target, "forward_draft", forward_draft)
    monkeypatch.setattr(machine_costs, "perf_counter", lambda: now[0])
    m = measure(target, tiny_llama.vocab_size, qs=(1, 2, 24), contexts=(16,), repeats=3, warmup=0)
    assert seen == {1: 9, 2: 9, 24: 3}
    assert m.seconds[0][0] == pytest.approx(0.9) and m.seconds[0][1] == pytest.approx(0.9 * 1.12)
    assert m.seconds[0][2] == pytest.approx(0.9 * 2.0)


def test_a_cached_curve_off_the_machines_pace_is_timed_again(tiny_llama, tmp_path, monkeypatch, capsys):
    """``check``: before a run the cached curve's plain step is timed again (on a clock the test controls). A
    machine a quarter slower (within a busy machine's swings) keeps the curve, the pace kept as ``checked``; one
    at half the pace (another load, another day) has it measured again and stored; the next run keeps it."""
    import specbench.machine.costs as machine_costs

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    now, pace, real = [0.0], [1.0], Target.forward_draft

    def forward_draft(self, root, draft, cache, *args, **kwargs):
        now[0] += pace[0] * (1 + 0.1 * len(draft))  # a plain step 1 s, each guess 0.1 s more
        return real(self, root, draft, cache, *args, **kwargs)

    monkeypatch.setattr(Target, "forward_draft", forward_draft)
    monkeypatch.setattr(machine_costs, "perf_counter", lambda: now[0])

    def load(**kw):
        return load_or_measure(tiny_llama, "tiny-llama", "float32", "sdpa", qs=(1, 4), contexts=(8,), repeats=1,
                               **kw)

    first = load(check=True)  # nothing cached: measured
    assert first.seconds == [[pytest.approx(1.0), pytest.approx(1.3)]] and first.checked == 0.0
    pace[0] = 1.25
    kept = load(check=True)
    assert kept.seconds == first.seconds and kept.checked == pytest.approx(1.25)
    assert "timing the curve again" not in capsys.readouterr().err
    assert load().checked == 0.0  # without the check the curve is read as stored
    pace[0] = 2.0
    again = load(check=True)
    assert again.seconds == [[pytest.approx(2.0), pytest.approx(2.6)]] and again.checked == pytest.approx(2.0)
    assert "a plain step takes 2.00x the cached curve's" in capsys.readouterr().err
    assert load().seconds == again.seconds and load().checked == 0.0 and load(check=True).checked == pytest.approx(1)


def test_monotone_pools_adjacent_violators():
    assert monotone([1.0, 2.7, 1.3, 1.5, 2.0]) == pytest.approx([1.0, 1.8333, 1.8333, 1.8333, 2.0], rel=1e-3)
    assert monotone([1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]


def test_measure_and_cache_on_a_tiny_model(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    target = Target(tiny_llama.model)
    m = measure(target, tiny_llama.vocab_size, qs=(1, 8), contexts=(16, 64), repeats=1, warmup=1)
    assert (m.qs, m.contexts, len(m.seconds)) == ([1, 8], [16, 64], 2)  # the blocks and contexts asked for
    cache = target.new_cache()  # the measurement leaves nothing behind in a model
    assert cache.get_seq_length() == 0
    first = load_or_measure(tiny_llama, "tiny-llama", "float32", "sdpa", qs=(1, 4), contexts=(8,), repeats=1)
    (saved,) = (tmp_path / "costs").glob("tiny-llama-float32-*.json")
    again = load_or_measure(tiny_llama, "tiny-llama", "float32", "sdpa", qs=(1, 2, 3), contexts=(8,))
    assert again == first and again.qs == [1, 4]  # read back, not measured again
    saved.write_text("{broken")
    assert load_or_measure(tiny_llama, "tiny-llama", "float32", "sdpa", qs=(1, 2), contexts=(8,),
                           repeats=1).qs == [1, 2]


# ----------------------------------------------------------------------------- statistics and the trim


def shrink(accepted, drafted, toward):
    return (accepted + PRIOR * toward) / (drafted + PRIOR)


def test_acceptance_rates_by_source_depth_and_rank():
    stats = AcceptanceStats()
    assert stats.rate(SOURCE_FWD, 1) == pytest.approx(0.25)  # nothing seen: the base rate
    stats.observe_output(Draft.chain([5, 6], SOURCE_FWD), [5, 9])  # the first guess followed, the second not
    source = shrink(1, 2, 0.25)  # each guess counts once: a key shrinks toward the coarser rate without it
    assert stats.rate(SOURCE_FWD, 1) == pytest.approx(shrink(1, 1, shrink(0, 1, 0.25)))  # the other depth's miss
    assert stats.rate(SOURCE_FWD, 2) == pytest.approx(shrink(0, 1, shrink(1, 1, 0.25)))  # the other depth's hit
    once = AcceptanceStats()
    once.observe_output(Draft.chain([5], SOURCE_FWD), [6])  # one miss moves a fresh key to 1/6, once (counted at
    assert once.rate(SOURCE_FWD, 1) == pytest.approx(shrink(0, 1, 0.25))  # each of three keys it went to 0.07)
    assert stats.rate(SOURCE_FWD, 3, 0) == pytest.approx(source)  # unseen key: its source's rate
    assert stats.rate(SOURCE_FWD, 3, 2) == pytest.approx(shrink(1, 2, 0.25 / 4))  # a third sibling's prior: 1/16
    shared = Draft.from_sequences([[7], [7]], [SOURCE_FWD, SOURCE_BWD])  # one node, two sources
    stats.observe_output(shared, [7])
    assert stats.accepted[(SOURCE_BWD, 1, 0)] == 1 and stats.accepted[(SOURCE_FWD, 1, 0)] == 2
    siblings = Draft.from_sequences([[1], [2], [3], [4], [5], [6]], [SOURCE_FWD] * 6)
    assert positions(siblings) == [(1, 0), (1, 1), (1, 2), (1, 3), (1, 4), (1, 4)]  # ranks 4+ share a count
    stats.observe_output(siblings, [2])
    assert stats.drafted[(SOURCE_FWD, 1, 4)] == 2 and stats.accepted[(SOURCE_FWD, 1, 1)] == 1
    assert stats.rate(SOURCE_FWD, 1, 1) > stats.rate(SOURCE_FWD, 1, 4)


def test_counts_halve_every_window_and_start_afresh_with_a_category():
    stats = AcceptanceStats()
    for _ in range(WINDOW - 1):
        stats.observe_output(Draft.chain([5], SOURCE_FWD), [5])
    assert stats.drafted[(SOURCE_FWD,)] == WINDOW - 1
    stats.observe_output(Draft.chain([5], SOURCE_FWD), [6])
    assert stats.drafted[(SOURCE_FWD,)] == WINDOW / 2 and stats.accepted[(SOURCE_FWD,)] == (WINDOW - 1) / 2
    planner = AutoBudget(FLAT, stats=stats)
    planner.options[Option(1, 0)] = Seen(1, 1.0, 1.0, 0.0)
    planner.new_category()
    assert not stats.drafted and not planner.options and stats.rate(SOURCE_FWD, 1) == pytest.approx(0.25)


def test_guesses_are_judged_by_the_output_that_followed_them():
    stats = AcceptanceStats()
    d = Draft(tokens=[4, 5, 7, 9], parents=[-1, 0, -1, 2], sources=["a", "a", "b", "b"])
    assert stats.observe_output(d, [4]) == 1  # depth 1 counted at once, depth 2 not known yet
    assert {k for k in stats.drafted if len(k) == 3} == {("a", 1, 0), ("b", 1, 1)} and stats.counted == 0
    assert stats.observe_output(d, [4, 5, 6], counted=1) == 2  # then depth 2 alone: depth 1 is not counted twice
    fine = {k: v for k, v in stats.drafted.items() if len(k) == 3}
    assert fine == {("a", 1, 0): 1, ("a", 2, 0): 1, ("b", 1, 1): 1}  # 9 not counted: its parent was wrong
    assert stats.accepted[("a", 2, 0)] == 1 and stats.accepted[("b",)] == 0 and stats.counted == 1
    assert stats.observe_output(d, [4, 5, 6], counted=2) == 2 and fine == {
        k: v for k, v in stats.drafted.items() if len(k) == 3}  # nothing left to count
    ended = AcceptanceStats()
    assert ended.observe_output(d, [4], final=True) == 2  # the output ended: depth 2 under 4 is unknown
    assert {k for k in ended.drafted if len(k) == 3} == {("a", 1, 0), ("b", 1, 1)}


class FixedRates:
    def __init__(self, table):
        self.table = table

    def rate(self, source, depth, rank=0):
        return self.table.get((source, depth, rank), 0.0)


def test_scores_never_exceed_the_parent_and_take_the_best_source():
    stats = FixedRates({(SOURCE_FWD, 1, 0): 0.3, (SOURCE_FWD, 2, 0): 0.7, (SOURCE_FWD, 1, 1): 0.1,
                        (SOURCE_RETRIEVAL, 1, 1): 0.7})
    d = Draft(tokens=[1, 2, 3], parents=[-1, 0, -1], sources=[SOURCE_FWD, SOURCE_FWD, (SOURCE_FWD, SOURCE_RETRIEVAL)])
    assert node_scores(d, stats) == pytest.approx([0.3, 0.21, 0.7])  # depth 2: its parent's 0.3 × 0.7
    dry = lambda s: fed(s, (SOURCE_FWD,), 0, 3)  # noqa: E731  (no pool column sent)
    assert node_scores(d, stats, dry) == pytest.approx([0.0, 0.0, 0.7])  # fwd@dry: none in the table
    stats.table[(SOURCE_FWD + "@dry", 1, 0)] = 0.2
    assert node_scores(d, stats, dry) == pytest.approx([0.2, 0.0, 0.7])
    # siblings share their parent's chance: four first guesses at 0.4 are one token at most, each 0.25;
    # below the first (0.25) its children at 0.3 and 0.1 add up to less than one: 0.25 × 0.3 and 0.25 × 0.1
    fan = Draft(tokens=[1, 2, 3, 4, 5, 6], parents=[-1, -1, -1, -1, 0, 0], sources=[SOURCE_FWD] * 6)
    rates = FixedRates({(SOURCE_FWD, 1, r): 0.4 for r in range(4)} | {(SOURCE_FWD, 2, 0): 0.3, (SOURCE_FWD, 2, 1): 0.1})
    assert node_scores(fan, rates) == pytest.approx([0.25] * 4 + [0.075, 0.025])


def test_sources_without_their_pool_or_with_less_start_at_the_whole_pools_rate_and_learn_apart():
    stats = AcceptanceStats()
    d = Draft(tokens=[4, 5], parents=[-1, 0], sources=[SOURCE_FWD, SOURCE_FWD])
    assert fed(SOURCE_FWD, (SOURCE_FWD,), 2, 4) == SOURCE_FWD + "@w2" and fed(SOURCE_BWD, (SOURCE_FWD,), 0, 4) == SOURCE_BWD
    assert fed(SOURCE_FWD, (SOURCE_FWD,), 0, 4) == SOURCE_FWD + "@dry" and fed(SOURCE_FWD, (SOURCE_FWD,), 4, 4) == SOURCE_FWD
    for _ in range(12):
        stats.observe_output(d, [6, 5])  # with the whole pool: never right
    whole = stats.rate(SOURCE_FWD, 1)
    assert whole < 0.1 and stats.rate(SOURCE_FWD + "@w2", 1) == stats.rate(SOURCE_FWD + "@dry", 1) == pytest.approx(whole)
    for _ in range(12):
        stats.observe_output(d, [4, 5], name=lambda s: s + "@dry")
    assert stats.rate(SOURCE_FWD + "@dry", 1) > 0.8 and stats.rate(SOURCE_FWD, 1) == whole


def test_best_prefix_by_hand():
    scores = [0.9, 0.5, 0.1]
    assert best_prefix(scores, LINEAR, 1, 0)[0] == []  # 1.9 / 2 < 1 / 1
    assert best_prefix(scores, FLAT, 1, 0)[0] == [0, 1, 2]
    keep, rate = best_prefix(scores, CHEAP, 1, 0)  # 1.9/1.1, 2.4/1.2 (best), 2.5/1.3
    assert keep == [0, 1] and rate == pytest.approx(2.0)
    keep, rate = best_prefix(scores, CHEAP, 1, 0, extra_s=3.0)  # drafting's 3 s beside: 2.5/4.3 is best
    assert keep == [0, 1, 2] and rate == pytest.approx(2.5 / 4.3)
    assert best_prefix(scores, CHEAP, 1, 0, fits=lambda s: s <= 1.15)[0] == [0]  # the forward may take 1.15 at most


def test_subdraft_reindexes_parents_and_drops_aux():
    d = Draft(tokens=[10, 11, 12, 13], parents=[-1, 0, -1, 2], sources=["a", "b", "c", "d"],
              aux_tokens=[1, 2], aux_positions=[1, 2], aux_visible=torch.ones(2, 2, dtype=torch.bool).numpy())
    out = subdraft(d, [2, 3], 0)
    assert out.tokens == [12, 13] and out.parents == [-1, 0] and out.sources == ["c", "d"] and not out.n_aux
    assert subdraft(d, [0], 1).aux_tokens == [1, 2]


def test_a_narrower_pool_is_the_block_of_a_pool_that_wide():
    """The first w columns of a W-wide pool, cut by subdraft, are exactly what a w-wide pool of the
    same sequences sends: tokens, offsets, mask and the rows whose logits come back."""
    wide, narrow = CandidatePool(width=4, n=4), CandidatePool(width=2, n=4)
    wide.seqs = [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]]
    narrow.seqs = wide.seqs[:2]

    def sent(pool):
        return Draft(tokens=[30], parents=[-1], aux_tokens=pool.aux_tokens(), aux_positions=pool.positions,
                     aux_visible=pool.visible, aux_logit_rows=pool.logit_rows, aux_columns=pool.columns)

    whole = sent(wide)
    assert whole.aux_width == 4 and widths(4) == [4, 2, 1] and widths(15) == [15, 8, 4, 2, 1]
    cut, ref = subdraft(whole, [0], 2), sent(narrow)
    assert cut.tokens == [30] and cut.aux_width == 2
    assert cut.aux_tokens == ref.aux_tokens == [1, 4, 2, 5, 3, 6]
    assert cut.aux_positions == ref.aux_positions and cut.aux_logit_rows == ref.aux_logit_rows == [4, 5]
    assert (cut.aux_visible == ref.aux_visible).all() and cut.aux_columns == ref.aux_columns
    cut.validate()
    assert subdraft(whole, [0], 4).aux_tokens == whole.aux_tokens and not subdraft(whole, [0], 0).n_aux


def pool3() -> Draft:
    """Two forward guesses beside a pool of three two-token columns (6 aux nodes)."""
    pool = CandidatePool(width=3, n=3)
    pool.seqs = [[1, 2], [3, 4], [5, 6]]
    return Draft(tokens=[4, 5], parents=[-1, 0], sources=[SOURCE_FWD] * 2, aux_tokens=pool.aux_tokens(),
                 aux_positions=pool.positions, aux_visible=pool.visible, aux_logit_rows=pool.logit_rows,
                 aux_columns=pool.columns)


def seeded(cost, rates: dict[str, float], n: int = 100, option=(1.0, 2.0, 6.0), pool: int = 3) -> AutoBudget:
    """A planner whose counts give each of ``rates``' source names that rate at every depth, and whose method's
    own draft (depth 2, a pool ``pool`` columns wide) was measured at ``option``: tokens accepted, guesses and
    aux nodes verified."""
    planner = AutoBudget(cost, aux_feeds=(SOURCE_FWD, SOURCE_BWD))
    for name, r in rates.items():
        for key in ((name,), (name, 1), (name, 1, 0), (name, 2), (name, 2, 0)):
            planner.stats.drafted[key], planner.stats.accepted[key] = n, r * n
    planner.options[Option(2, 0, pool)] = Seen(1, *option)
    planner.deepest, planner.pool = 2, pool
    return planner


def test_the_pool_width_is_the_one_that_pays_best():
    """CHEAP (0.1 of a step per token): the forward guesses are right 95% of the time when 2 of the 3 columns fed
    them and 5% otherwise: 2 columns go, cut to their own rows. Under LINEAR no pool pays; under FLAT, with
    nothing counted, the whole pool goes."""
    rates = {SOURCE_FWD: 0.05, SOURCE_FWD + "@w2": 0.95, SOURCE_FWD + "@w1": 0.05}
    for cost, width in ((CHEAP, 2), (LINEAR, 0)):
        planner = seeded(cost, rates)
        planner.cap()
        planner.plan(pool3(), [9])  # the step decided before its proposal; every width weighed for the next
        planner.cap()
        out = planner.plan(pool3(), [9])
        assert planner.widths[1] == width and out.aux_width == width
        if width:
            assert out.aux_logit_rows == [2, 3] and out.tokens == [4, 5]
    flat = AutoBudget(FLAT, aux_feeds=(SOURCE_FWD,))
    flat.cap()
    d = pool3()
    assert flat.plan(d, [9]) is d


def pool_draft() -> Draft:
    seqs = [[4, 5, 6], [4, 7]]
    d = Draft.from_sequences(seqs, [SOURCE_FWD, SOURCE_BWD])
    d.aux_tokens, d.aux_positions = [1, 2, 3, 4], [1, 1, 2, 2]
    d.aux_visible = torch.eye(4, dtype=torch.bool).numpy()
    return d


def test_aux_nodes_go_only_when_they_pay():
    steep = AutoBudget(LINEAR, aux_feeds=(SOURCE_FWD, SOURCE_BWD))
    steep.cap()
    out = steep.plan(pool_draft(), [9])
    assert out.tokens == [] and out.n_aux == 0 and steep.widths == [0]  # plain decoding pays best
    flat = AutoBudget(FLAT, aux_feeds=(SOURCE_FWD, SOURCE_BWD))
    flat.cap()
    d = pool_draft()
    assert flat.plan(d, [9]) is d  # a GPU-like curve keeps everything
    for accepted, whole in ((0.95, True), (0.05, False)):  # the dictionaries' guesses mostly right, or not
        cheap = seeded(CHEAP, {SOURCE_FWD: accepted, SOURCE_BWD: accepted, SOURCE_FWD + "@dry": 0.05,
                               SOURCE_BWD + "@dry": 0.05}, pool=1)  # without the pool they are seldom right
        cheap.cap()
        cheap.plan(pool_draft(), [9])  # decided before the proposal; weighed at every width for the next step
        cheap.cap()
        d = pool_draft()
        out = cheap.plan(d, [9])
        if whole:  # 0.95 at every depth, 0.1 of a step per token: all of it pays, pool included
            assert out is d
        else:  # 0.05 at depth 1 caps its subtree: the pool costs more than the guesses it feeds bring
            assert out.tokens == [] and out.n_aux == 0


def test_a_pool_that_never_pays_is_explored_ever_more_rarely_within_the_allowance():
    """A drafter whose guesses are never right, beside a pool (4 nodes: 0.08 of a step under a nearly flat
    curve), its drafting 2% of a step: the first step sends the pool, then the guesses alone are tried, then
    plain steps, with the whole draft explored after 16 steps, the wait doubling for each plain step's worth
    the explorations (the first draft among them) lost. At every step the regret is within the
    allowance, and it spends far less than the allowance. The first misses leave its rate uncertain (each counted
    once): the pool may be chosen again within the first WINDOW steps, never after. A pool whose steps bring 1.5
    tokens is sent throughout and earns negative regret."""
    nearly_flat = CostModel(qs=[1, 2], contexts=[0], seconds=[[1.0, 1.02]])
    for brings, pays in ((0, False), (1, True)):
        budget, tokens = AutoBudget(nearly_flat, aux_feeds=(SOURCE_FWD, SOURCE_BWD)), [9]
        for _ in range(600):
            cap = budget.cap()
            out = budget.plan(pool_draft() if cap != 0 else Draft.chain([], SOURCE_FWD), tokens)
            path = [0] if brings and out.n_aux and out.tokens[:1] == [4] else []  # fed, the first guess is right
            budget.record(out, path, draft_s=0.02 if cap != 0 else 0.0)
            tokens = tokens + [4] * len(path) + [8]
            assert budget.regret <= budget.allowance()
        sent = [i for i, w in enumerate(budget.widths) if w]
        if pays:  # sent but where the guesses alone were tried, while (or once again) their rate without it was
            assert len(sent) > 570 and budget.regret < 0  # not known: the counts halve every WINDOW drafts
        else:
            explored = [i for i, why in enumerate(budget.why) if why == "explored"]
            assert sent[0] == 0 and budget.why[0] == "first" and budget.why[-1] == "plain"
            late = [i for i in sent if i >= WINDOW]  # after a few misses (each counted once), only explorations
            assert late == [i for i in explored if i >= WINDOW] and len(late) > 5
            gaps = [b - a for a, b in zip([0, *explored], explored, strict=False)]
            assert 17 < gaps[0] < 34  # 16 steps, lengthened by what the first draft, the first exploration, lost
            assert gaps == sorted(gaps) and gaps[-1] > 2 * gaps[0]  # ever more rarely
            assert budget.explored <= math.log2(600 / EXPLORE_EVERY) + 1  # lost: the log of the run, in plain steps
            assert budget.regret < budget.allowance() / 2  # a cap, not a target


def test_cpu_presets_trim_and_paper_presets_keep_their_blocks():
    for path in sorted((CONF_DIR / "method").glob("*.yaml")):
        name, _, budget = load_preset(path.stem)
        assert budget == ("auto" if path.stem.endswith("-cpu") else None), path.stem
        if budget == "auto":
            assert get_method(name).budget_auto


# ----------------------------------------------------------------------------- lossless with trimmed drafts

PROMPTS = [[5, 6, 7, 8] * 4, [3, 3, 3, 3, 9], [10, 11, 12, 10, 11, 12, 10, 11], list(range(20, 44))]
DRAFTERS = {
    "spectra_core": lambda v: SpectraCore(SpectraCoreConfig(ngram_size=4, pool_size=5, max_guesses=5), vocab_size=v),
    "lookahead": lambda v: Lookahead(LookaheadConfig(window=4, ngram=4, guesses=4), vocab_size=v),
    "token_recycling": lambda v: TokenRecycling(TokenRecyclingConfig(tree="cpu", memory="turn"), vocab_size=v),
}


@pytest.mark.parametrize("name", list(DRAFTERS))
@pytest.mark.parametrize("cost", [CHEAP, LINEAR, FLAT], ids=["cheap", "linear", "flat"])
def test_trimmed_drafts_are_lossless(tiny_llama, name, cost):
    cls = type(DRAFTERS[name](128))
    budget = AutoBudget(cost, aux_feeds=cls.AUX_FEEDS)
    recs = assert_greedy_lossless(Target(tiny_llama.model), lambda: DRAFTERS[name](128), PROMPTS, 40, budget=budget)
    drafted = sum(sum(r.step_drafted) for r in recs)
    if cost is FLAT:  # every guess and the whole pool are worth their (free) forward
        assert drafted > 0 and budget.kept == budget.proposed and (cls.AUX_FEEDS or not any(budget.widths))
    if cost is LINEAR:  # no guess pays when every token costs a step, nor any pool: it goes only to explore
        assert sum(budget.kept) == 0
        assert all(w == 0 or why in ("first", "explored") for w, why in zip(budget.widths, budget.why, strict=True))


NARROW = {SOURCE_FWD: 0.05, SOURCE_BWD: 0.05, SOURCE_FWD + "@w2": 0.95, SOURCE_BWD + "@w2": 0.95}


def test_narrowed_pools_are_lossless(tiny_llama):
    """Counts that make 2 of a 5-wide pool pay best, under a curve free up to 24 tokens: after the first step
    (the whole pool) 2 columns go, the engine advances only those, and outputs are unchanged."""
    for prompt in PROMPTS:
        budget = seeded(CostModel(qs=[1, 24, 25], contexts=[0], seconds=[[1.0, 1.0, 3.0]]), NARROW, pool=5)
        assert_greedy_lossless(Target(tiny_llama.model), lambda: DRAFTERS["spectra_core"](128), [prompt], 40,
                               budget=budget)
        assert 2 in budget.widths


def test_cpu_preset_under_an_fp32_like_curve_drafts_dry_and_stays_lossless(smollm2):
    """spectra_core-cpu as shipped (context n-grams) under the plain fp32 curve: the whole pool goes only to
    learn (a column of it at times); the dictionaries' context n-grams draft in the steps without it, and
    drafting pays; outputs are unchanged."""
    from methods.registry import build_method_config

    steep = CostModel(qs=[1, 2, 3, 4, 16, 128], contexts=[0], seconds=[[1.0, 1.06, 1.12, 1.55, 2.17, 5.87]])
    name, params, budget_name = load_preset("spectra_core-cpu")
    assert budget_name == "auto" and params["context_ngrams"] is True
    cls = get_method(name)
    budget = AutoBudget(steep, aux_feeds=cls.AUX_FEEDS, static=True)  # decisions from the curve and the tokens
    assert_greedy_lossless(
        Target(smollm2.model), lambda: cls(build_method_config(name, params), vocab_size=smollm2.vocab_size),
        [chat(smollm2, CODE_EDIT)], 96, eos=smollm2.eos_token_ids, budget=budget,
    )
    full = max(budget.widths)  # the whole pool (1.2 steps more) does not pay: it goes to learn, a column at times
    sent = zip(budget.widths, budget.why, strict=True)
    assert full > 1 and all(w < full or why in ("first", "explored") for w, why in sent)
    assert 0 in budget.widths and budget.regret < 0  # the steps without it draft, and drafting pays
    dry = [k for k in budget.stats.drafted if len(k) == 1 and k[0].endswith("@dry")]
    assert dry and sum(budget.stats.drafted[k] for k in dry) > 0  # without it the dictionaries still drafted


def test_trimmed_guesses_still_teach_the_statistics(tiny_llama):
    budget = AutoBudget(LINEAR)  # trims every guess
    assert_greedy_lossless(Target(tiny_llama.model), lambda: DRAFTERS["token_recycling"](128), PROMPTS[:1], 40,
                           budget=budget)
    assert sum(budget.kept) == 0 and sum(budget.proposed) > 0
    assert sum(budget.stats.drafted.values()) > 0 and sum(budget.stats.accepted.values()) > 0


@pytest.mark.parametrize("make_budget", [lambda: AutoBudget(CHEAP, aux_feeds=(SOURCE_FWD, SOURCE_BWD)),
                                         lambda: AutoBudget(LINEAR, aux_feeds=(SOURCE_FWD, SOURCE_BWD)),
                                         lambda: seeded(STEP, NARROW, pool=3)], ids=["cheap", "linear", "narrow-pool"])
def test_trimmed_drafts_keep_the_sampling_distribution(make_budget):
    params = SamplingParams(temperature=1.0)
    assert_sampling_preserves_distribution(
        lambda: SpectraCore(SpectraCoreConfig(ngram_size=3, pool_size=3, max_guesses=3), vocab_size=SMALL_VOCAB),
        params,
        trials=3000,
        make_budget=make_budget,
    )


# ----------------------------------------------------------------------------- through the runner


def test_runner_records_auto_rows_apart_with_their_curve(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    base = ("experiment=smoke", f"results_dir={tmp_path}", "progress=false", "limit=2", "max_new_tokens=12")
    run(make_cfg(*base[:-2], "limit=1", "max_new_tokens=12", "budget=auto"))  # the curve measured …
    run(make_cfg(*base, "budget=auto"))  # … then, resumed, checked against the machine's pace first
    run(make_cfg(*base, "budget=fixed"))
    df = load_results(tmp_path)
    method = df[df.method != "autoregressive"]
    assert set(method.budget) == {"auto", "fixed"}
    auto = method[method.budget == "auto"]
    assert all(p.endswith(":auto") for p in auto.preset)  # its own preset: never merged with fixed rows
    curves = [CostModel.from_dict(json.loads(c)) for c in auto.cost_curve]
    assert curves[0].qs[0] == 1 and len(curves[0].seconds) >= 1
    assert sorted(c.checked > 0 for c in curves) == [False, True]  # the resumed run's curve was checked
    assert (df[df.method == "autoregressive"].budget == "fixed").all()
    ar = {(r.sample_id, r.turn): r.output_ids.tolist() for r in df[df.method == "autoregressive"].itertuples()}
    assert all(r.output_ids.tolist() == ar[(r.sample_id, r.turn)] for r in auto.itertuples())  # greedy, fp32


@pytest.mark.parametrize(
    "extra,message",
    [(("budget=sometimes",), "budget must be one of fixed, auto"),
     (("method=sps", "model=tiny-llama", "budget=auto"), "use budget=fixed")],
)
def test_bad_budget_settings_are_one_line(tmp_path, extra, message, monkeypatch):
    from methods.sps import SpeculativeSampling

    monkeypatch.setattr(SpeculativeSampling, "budget_auto", False)  # a method that sets its own draft length
    with pytest.raises(ConfigError, match=message):
        run(make_cfg("experiment=smoke", f"results_dir={tmp_path}", *extra))


@pytest.mark.slow  # a subprocess measuring a curve; load_or_measure's caching is tested in the fast suite
def test_costs_command_prints_the_curve_and_caches_it(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "SPECBENCH_CACHE": str(tmp_path)}
    cmd = [sys.executable, "-m", "specbench", "costs", "model=tiny-llama"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "q=128" in out.stdout and "×t(1)" in out.stdout and "context" in out.stderr  # measured, with progress
    curve = [ln for ln in out.stdout.splitlines() if not ln.startswith("floor:")]
    (floor,) = [ln for ln in out.stdout.splitlines() if ln.startswith("floor:")]
    assert re.fullmatch(r"floor: [\d,]+ MB of weights read at [\d.]+ GB/s \(\d+ threads\) = [\d.]+ ms a forward; "
                        r"t\(1\) at context \d+ is [\d.]+ ms, [\d.]+ × the floor", floor), floor
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert [ln for ln in again.stdout.splitlines() if not ln.startswith("floor:")] == curve  # read from the cache
    assert "context" not in again.stderr
    bad = subprocess.run([*cmd, "model.dtype=float64"], capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr


def test_a_preset_may_name_its_budget_and_the_command_line_wins():
    from specbench.run.config import effective_budget, method_params

    cfg = make_cfg("experiment=smoke", "method=spectra_core-cpu")
    assert effective_budget(cfg) == "auto" and "budget" not in method_params(cfg)
    assert effective_budget(make_cfg("experiment=smoke", "method=spectra_core-cpu", "budget=fixed")) == "fixed"
    assert effective_budget(make_cfg("experiment=smoke", "method=spectra_core")) == "fixed"  # a paper preset


def test_cache_entries_are_written_through_private_temporary_files(tmp_path):
    from specbench.paths import private_tmp

    a, b = private_tmp(tmp_path / "curve.json"), private_tmp(tmp_path / "curve.json")
    assert a != b and a.parent == b.parent == tmp_path and a.name.startswith(".curve.json.")


@pytest.mark.parametrize("preset", ["spectra_core", "spectra"])
def test_paper_presets_learn_the_context_only_under_budget_auto(preset):
    """The paper presets' dictionaries learn from their pool alone (the paper's rule, what the tables
    reproduce with budget=fixed); under budget=auto, where the pool may be left out, they also learn the
    context's n-grams, so a run that leaves the pool out still drafts. Resolved as a run resolves it."""
    from specbench.run.config import validate

    fixed = validate(make_cfg("experiment=smoke", f"method={preset}"))["method"]
    auto = validate(make_cfg("experiment=smoke", f"method={preset}", "budget=auto"))["method"]
    assert fixed.context_ngrams is False and auto.context_ngrams is True
    pinned = validate(make_cfg("experiment=smoke", f"method={preset}", "budget=auto", "method.context_ngrams=false"))
    assert pinned["method"].context_ngrams is False
    engine = SpectraCoreEngine(dataclasses.replace(fixed, context_ngrams="auto"))  # built without a budget: fixed
    engine.start([1, 2, 3, 4, 5, 6, 1, 2])
    assert engine.dicts.fwd == {}
    with pytest.raises(ValueError, match="context_ngrams must be true, false or auto"):
        dataclasses.replace(fixed, context_ngrams="sometimes").validate()


def test_compare_models_each_decode_step_at_its_context():
    """bench/compare.py's model column: each decode step costs t(root + guesses + aux nodes) at the
    context it ran after (the prompt, then every token before it) plus its drafting's seconds; the prefill
    is left out."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from compare import Tally

    from specbench.core.record import GenerationRecord

    grows = CostModel(qs=[1, 2], contexts=[0, 100], seconds=[[1.0, 2.0], [11.0, 12.0]])  # q + context / 10
    rec = GenerationRecord(prompt_len=10, output_ids=[7] * 6, step_tokens=[1, 3, 2], step_times=[0.5, 0.1, 0.1],
                           step_drafted=[0, 4, 1], step_aux=[0, 2, 0], step_draft_s=[9.0, 0.25, 0.5], step_lookup_s=[0, 0, 0])
    tally = Tally()
    tally.add(rec, 1.0, True, grows)
    assert tally.modelled_s == pytest.approx((7 + 1.1 + 0.25) + (2 + 1.4 + 0.5))  # after 11 tokens, then after 14
    plain = Tally()
    plain.add(rec, 1.0, True)
    assert plain.modelled_s == 0.0


def test_compare_splits_a_presets_time_beyond_autoregressive_decoding_by_what_the_planner_decided():
    """bench/compare.py's --split: each decode step against the baseline's step at the same position in the same
    prompt and repeat, summed apart for the steps the planner let draft (its reasons, not whether guesses were
    verified: a probe that verified none drafted) and the plain ones, as shares of the baseline's decode time."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from compare import Tally, promise, spent, time_split

    from specbench.core.record import GenerationRecord

    def record(times, drafted, draft_s):
        n = len(times)
        return GenerationRecord(prompt_len=4, output_ids=[7] * n, step_tokens=[1] * (n + 1),
                                step_times=[0.5, *times], step_drafted=[0, *drafted], step_aux=[0] * (n + 1),
                                step_draft_s=[0.0, *draft_s], step_lookup_s=[0.0] * (n + 1))

    base, method = Tally(), Tally()
    base.add(record([1.0, 1.0, 1.0], [0, 0, 0], [0.0005] * 3), 3.5, True)
    # a probe that drafted for 0.5 s and verified nothing, then two plain steps (one 0.1 s slow)
    method.add(record([2.0, 1.1, 1.0], [0, 0, 0], [0.5, 0.001, 0.002]), 4.6, True, whys=["explored", "plain", "plain"])
    out = time_split(method, base)
    assert out.startswith("drafting +33.33% (1 steps), plain +3.33% (2 steps")
    assert "1.500 ms a step against the loop's 0.500" in out
    unplanned = Tally()  # no planner: a step drafted when it verified guesses
    unplanned.add(record([2.0, 1.1, 1.0], [0, 0, 0], [0.5, 0.001, 0.002]), 4.6, True)
    assert time_split(unplanned, base).startswith("drafting +0.00% (0 steps), plain +36.67% (3 steps")
    # O = D + P: the probe's 1 s over 3 s, and the plain steps' 1.5 ms against the loop's 0.5 ms, twice; A: the
    # allowance of one pass of 3 plain steps, 1% + 2 steps
    o, a = spent(method, base)
    assert o == pytest.approx((1.0 + 2 * 0.001) / 3.0) and a == pytest.approx(0.01 + 2 / 3)
    assert out.endswith("O = D + P +33.40% against A 67.67%; saved 0.00% (0 steps fewer)")
    shorter = Tally()  # a guess accepted on the first step: one step fewer than the baseline, its second saved
    shorter.add(record([1.2, 1.0], [1, 0], [0.1, 0.001]), 2.7, True, whys=["chosen", "plain"])
    assert time_split(shorter, base).endswith("saved 33.33% (1 steps fewer)")
    assert promise(method, base, {"speedup": 0.97}, True) == "kept"  # τ 1: nothing paid, within the allowance
    assert promise(method, base, {"speedup": 0.96}, True) == "broken"  # … but under the point line
    method.gens[(0, 0)][0][0] = 4.0  # the probe's excess 3 s: 100% of the baseline's time, past A
    assert promise(method, base, {"speedup": 0.99}, True) == "broken"
    assert promise(unplanned, base, {"speedup": 1.0}, True) == "-"  # no planner (autoregressive:fixed): calibration
    assert promise(method, base, {"speedup": 1.0}, False) == "-"  # sampled: no step-by-step split
    method.tokens = 2 * method.steps  # τ 2: drafting pays, and the row answers to the interval line instead
    assert promise(method, base, {"speedup": 0.5}, True) == "pays"
    method.match = 0
    assert promise(method, base, {"speedup": 1.0}, True) == "outputs differ"


def test_compare_reads_the_speed_line_exactly():
    """bench/compare.py's line column: at least 0.97× with an interval reaching 1.00, the top read unrounded, and
    the margin: the added cost a row could take and stay on the line, exact for times scaled by 1 + c."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from compare import Tally, margin, on_the_line, speedups

    assert on_the_line({"speedup": 0.98, "lo": 0.95, "hi": 1.0}) == "on +0.0%"
    assert on_the_line({"speedup": 0.98, "lo": 0.95, "hi": 0.996}) == "off -0.4%"  # the top prints as 1.00
    assert on_the_line({"speedup": 0.968, "lo": 0.9, "hi": 1.2}) == "off -0.2%"  # 0.968 / 0.97 − 1
    assert on_the_line({"speedup": 1.0, "lo": float("nan"), "hi": float("nan")}) == "-"
    rng = np.random.default_rng(3)
    base, row = Tally(), Tally()
    for prompt in range(4):
        for repeat in range(3):
            base.runs.append((prompt, repeat, 128, 6.0 * rng.uniform(0.95, 1.05)))
            row.runs.append((prompt, repeat, 128, 6.0 * rng.uniform(0.95, 1.05)))
    c = margin(speedups(row, base))
    assert c > 0.005  # room to spend: the row must still be on the line, and leave it just past the margin
    for scale, side in ((1 + c - 1e-6, "on"), (1 + c + 1e-6, "off")):
        scaled = Tally()
        scaled.runs = [(p, r, n, s * scale) for p, r, n, s in row.runs]
        assert on_the_line(speedups(scaled, base)).split()[0] == side


def test_compare_measures_a_second_autoregressive_run_as_the_null_control(tiny_llama):
    """``autoregressive:fixed`` in bench/compare.py: a second autoregressive run, timed and tallied apart from the
    baseline (its own generations, the same tokens), so the speed line can be read for a method that costs
    nothing."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from compare import bench, preset

    assert preset("autoregressive:fixed")[0::2] == ("autoregressive", "fixed")
    prompts = [[1, 5, 9, 4], [2, 7, 3, 3, 8]]
    tallies = bench(tiny_llama, prompts, ["autoregressive:fixed"], 6, cost=FLAT, hf_pld=False, repeats=2)
    base, null = tallies["autoregressive"], tallies["autoregressive:fixed"]
    assert base is not null and len(null.runs) == len(base.runs) == 4 and null.match == 4
    assert [r[:3] for r in null.runs] == [r[:3] for r in base.runs]  # (prompt, repeat, tokens): its own timings


def test_machine_noise_reads_a_drift_as_a_spread_that_grows_with_the_lag():
    """bench/machine_noise.py's reading of repeated timings of the same work: steady timings have no spread; a
    pace that wanders leaves neighbours close and runs far apart far apart; an alternating jitter is the other way."""
    import random
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from machine_noise import spread

    steady = spread([2.0] * 20)
    assert steady["cv"] == 0 and steady["range"] == (2.0, 2.0) and steady["lags"][1] == 0
    rng, walk = random.Random(0), [0.0]
    for _ in range(199):
        walk.append(walk[-1] + rng.gauss(0, 0.01))  # a pace that wanders: log-time a random walk
    drift = spread([math.exp(w) for w in walk])
    assert drift["lags"][16] > 2.5 * drift["lags"][1]  # √16 = 4 for a true walk
    jitter = spread([1.0 if i % 2 else 1.2 for i in range(40)])
    assert jitter["lags"][1] > 0.1 and jitter["lags"][2] == pytest.approx(0.0, abs=1e-12)


def test_compare_runs_a_compiled_forward_alone(tiny_llama, monkeypatch):
    """bench/compare.py with ``--forward compiled`` only: every row (the baseline too) is ``<row>@compiled``, over
    ``autoregressive@compiled``, and nothing reads an eager baseline the run never made. The static-shape path
    runs uncompiled (Inductor's own compilation is tests/core/test_engine.py's)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import compare
    from compare import bench

    from specbench.core.engine import make_target

    monkeypatch.setattr(compare, "make_target", lambda model, mode, **_: make_target(model, mode, backend="eager"))

    prompts = [[1, 5, 9, 4, 1, 5, 9], [2, 7, 3, 3, 8]]
    tallies = bench(tiny_llama, prompts, ["pld"], 6, cost=FLAT, hf_pld=False, forwards=("compiled",))
    assert set(tallies) == {"autoregressive@compiled", "pld@compiled"}
    assert tallies["pld@compiled"].match == 2 and len(tallies["autoregressive@compiled"].runs) == 2
