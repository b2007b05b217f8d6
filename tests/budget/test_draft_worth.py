"""budget=auto counts what drafting costs: a drafter whose drafting takes more time than its tokens save is
driven to drafting nothing (and explored again, within a bounded regret); a cheap one keeps drafting. The
drafter's cost is measured (a slowed drafter), not assumed."""

from __future__ import annotations

import time

import pytest

from specbench.budget.costs import CostModel
from specbench.budget.planner import AutoBudget
from specbench.budget.worth import MIN_WARM, DraftWorth
from specbench.core.decode import generate
from specbench.core.draft import Draft, Drafter
from specbench.core.forward import Target
from tests.core.test_batch import Script
from tests.core.test_tree_forward import build


def test_drafting_that_costs_more_than_it_brings_stops_and_is_explored_with_a_growing_wait():
    worth = DraftWorth(explore_every=4)
    for _ in range(MIN_WARM):  # 1 token in 3 plain steps' time: drafting only slows decoding
        assert worth.drafts(allowance=100.0)
        worth.record(1, 3.0, 1.0)
    pattern = [worth.drafts(allowance=100.0) for _ in range(12)]
    assert pattern == [False] * 3 + [True] + [False] * 7 + [True]  # explored after 4, then after 8
    assert worth.why == ["warm-up"] * MIN_WARM + (["plain"] * 3 + ["explored"]) + ["plain"] * 7 + ["explored"]
    assert worth.regret == pytest.approx(MIN_WARM * 2.0)  # each drafting step lost two plain steps
    worth.record(20, 3.0, 1.0)  # the exploration paid very well: drafting resumes (the running mean reaches 1)
    assert worth.drafting and worth.drafts(allowance=100.0)


def test_a_drafter_that_pays_keeps_drafting_and_regret_caps_one_that_does_not():
    good = DraftWorth()
    for _ in range(50):
        assert good.drafts(allowance=1.0)
        good.record(3, 1.5, 1.0)
    assert good.regret < 0 and not any(good.capped)
    bad = DraftWorth(explore_every=1)  # exploring at every chance: only the regret stops it
    drafted = 0
    for _ in range(50):
        if bad.drafts(allowance=2.0):
            drafted += 1
            bad.record(1, 2.0, 1.0)
    assert drafted <= 3 + 1  # the allowance, then the step that crossed it


class Slowed(Script):
    """The scripted drafter (right guesses), taking ``delay`` seconds a proposal; it counts the proposals it
    was asked to draft."""

    def __init__(self, future, delay):
        super().__init__(future)
        self.delay, self.asked = delay, 0

    def propose(self, state):
        if state.max_depth < 1:
            return None
        self.asked += 1
        time.sleep(self.delay)
        return super().propose(state)


@pytest.mark.parametrize(("delay", "drafts"), [(0.03, False), (0.0, True)])
def test_the_drafters_measured_time_decides_whether_it_drafts(delay, drafts):
    """A forward priced at 2 ms: a drafter taking 30 ms a step cannot pay whatever it guesses, and is driven to
    drafting nothing after a few steps; the same drafter without the delay drafts throughout. Outputs equal
    autoregressive decoding either way."""
    target = Target(build("llama"))
    prompt, n = [5, 17, 33, 2, 71, 9], 40
    expected = generate(target, Drafter(vocab_size=0), prompt, max_new_tokens=n).output_ids
    planner = AutoBudget(CostModel([1, 64], [0], [[0.002, 0.0022]]))
    drafter = Slowed(expected, delay)
    rec = generate(target, drafter, prompt, max_new_tokens=n, planner=planner)
    assert rec.output_ids == expected
    steps = len(rec.step_tokens) - 1
    if drafts:
        assert drafter.asked == steps and not any(planner.worth.capped)
        assert all(cap is None for cap in planner.worth.caps)  # every level pays: the method's own depth
    else:
        assert drafter.asked <= MIN_WARM + 2 and sum(planner.worth.capped) >= steps - MIN_WARM - 2


class Shallow(Drafter):
    """Six levels a step, each costing ``per_level`` seconds: the first two are the target's next tokens, the
    deeper four never are. It keeps the depth it was allowed at each proposal."""

    def __init__(self, future, per_level):
        super().__init__(vocab_size=96)
        self.future, self.per_level, self.allowed = future, per_level, []

    def propose(self, state):
        depth = min(6, state.max_depth)
        if depth < 1:
            return None
        self.allowed.append(depth)
        time.sleep(self.per_level * depth)
        done = state.new_tokens
        right = self.future[done : done + 2]
        chain = (right + [(t + 1) % 96 for t in self.future[done + 2 : done + 6]])[:depth]
        return Draft.chain(chain, "t") if chain else None


def test_levels_that_cost_more_than_they_bring_are_not_drafted():
    """Forward 2 ms, 0.5 ms a drafted level: levels 1-2 pay, 3-6 are never accepted. The cap settles at depth 2
    (the full depth only on exploration steps), measured from the drafter's own time; outputs unchanged."""
    target = Target(build("llama"))
    prompt, n = [5, 17, 33, 2, 71, 9], 60
    expected = generate(target, Drafter(vocab_size=0), prompt, max_new_tokens=n).output_ids
    planner = AutoBudget(CostModel([1, 64], [0], [[0.002, 0.0022]]))
    drafter = Shallow(expected, 0.0005)
    rec = generate(target, drafter, prompt, max_new_tokens=n, planner=planner)
    assert rec.output_ids == expected
    later = [d for d in drafter.allowed[MIN_WARM:] if d >= 2]  # (the last steps' room is shorter)
    assert later.count(2) >= 0.7 * len(later) and 6 in drafter.allowed[:MIN_WARM]
    assert not any(planner.worth.capped)  # drafting itself pays
    why = planner.worth.why  # each step's reason: the full depth on every 16th drafting step
    assert why[:MIN_WARM] == ["warm-up"] * MIN_WARM and why.count("full tree") == len(why) // 16
    assert all(d == 6 for w, d in zip(why[:-6], drafter.allowed, strict=False) if w == "full tree")


def test_a_calibration_that_no_draft_could_pay_for_starts_without_drafting():
    """Calibrated at 10 ms a level against a 2 ms forward (flat), no depth pays even if every guess is accepted:
    drafting starts off and its explorations are passed over; at 0.1 ms a level it warms up and drafts as
    usual. Only the cost is carried: no acceptance."""
    flat = CostModel([1, 64], [0], [[0.002, 0.002]])
    for per_level, drafts in ((0.01, False), (0.0001, True)):
        measured = DraftWorth()
        for depth in (3, 5, 4, 5):
            measured.record(2, 0.002 + per_level * depth, 0.002, Draft.chain([1] * depth, "t"), depth,
                            per_level * depth)
        planner = AutoBudget(flat, explore_every=4, calibration=measured.calibration())
        assert not planner.worth.tried  # acceptance starts empty
        pattern = [planner.cap() != 0 for _ in range(12)]
        assert pattern == [drafts] * 12  # and no exploration either: it measures acceptance, which cannot help
        assert planner.spawn().worth.drafting == drafts  # a batch's other rows start from it too


@pytest.mark.parametrize(("delay", "drafts"), [(0.03, False), (0.0, True)])
def test_the_calibration_is_the_drafters_measured_time(delay, drafts):
    """A warm-up generation with the slowed drafter measures its 30 ms a step; a planner calibrated from it
    drafts nothing from the first step of the next generation, while the unslowed drafter's calibration
    lets it draft every step. Outputs equal autoregressive decoding."""
    target = Target(build("llama"))
    prompt, n = [5, 17, 33, 2, 71, 9], 30
    expected = generate(target, Drafter(vocab_size=0), prompt, max_new_tokens=n).output_ids
    curve = CostModel([1, 64], [0], [[0.002, 0.0022]])
    warm = AutoBudget(curve)
    generate(target, Slowed(expected, delay), prompt, max_new_tokens=8, planner=warm)
    measured = warm.worth.calibration()
    assert measured is not None and (measured[0][1] >= delay / 2 if delay else measured[0][1] < 0.005)
    planner, drafter = AutoBudget(curve, calibration=measured), Slowed(expected, delay)
    rec = generate(target, drafter, prompt, max_new_tokens=n, planner=planner)
    assert rec.output_ids == expected
    assert (drafter.asked >= len(rec.step_tokens) - 2) if drafts else drafter.asked <= 1


def test_an_exploration_goes_ahead_while_acceptance_could_still_pay_and_is_passed_over_when_it_could_not():
    """Drafting judged not to pay after 4 steps of 1 token each: with drafting cheap against the forward
    (1 ms a level, forward 2 ms) more acceptance could pay, so it is explored after 4 steps; with 10 ms a
    level it could not even at full acceptance, and the exploration is passed over (the wait still doubles)."""
    flat = lambda q: 0.002  # noqa: E731
    for per_level, explored in ((0.001, True), (0.01, False)):
        worth = DraftWorth(explore_every=4)
        for _ in range(MIN_WARM):
            assert worth.drafts(100.0, flat)
            worth.record(1, 0.002 + 3 * per_level, 0.002, Draft.chain([1, 2, 3], "t"), 3, 3 * per_level)
        pattern = [worth.drafts(100.0, flat) for _ in range(4)]
        assert pattern == [False] * 3 + [explored] and worth.next_explore == 8


class Caterpillar(Drafter):
    """A tree drafted level by level with a top-k (``state.top_k(4)``): each level holds the top-k children of
    one node, and the target's next token sits at sibling rank ``rank`` of every level (absent when the top-k
    is narrower). Drafting costs ``per_row`` seconds per level and per top-k, as an EAGLE head's does."""

    def __init__(self, future, rank, per_row):
        super().__init__(vocab_size=96)
        self.future, self.rank, self.per_row, self.top_ks = future, rank, per_row, []

    def propose(self, state):
        depth, k = min(4, state.max_depth), state.top_k(4)
        if depth < 1:
            return None
        self.top_ks.append(k)
        time.sleep(self.per_row * depth * k)
        done, tokens, parents, needs, spine, need = state.new_tokens, [], [], [], -1, 1
        for level in range(depth):
            right = self.future[done + level] if done + level < len(self.future) else 0
            wrong = [t for t in range(96) if t != right][: k]
            row = wrong[: self.rank] + [right] + wrong[self.rank :]
            first = len(tokens)
            for r, tok in enumerate(row[:k]):
                tokens.append(tok), parents.append(spine), needs.append(max(need, r + 1))
            if self.rank >= k:
                break
            spine, need = first + self.rank, needs[first + self.rank]
        return Draft(tokens=tokens, parents=parents, sources=["t"] * len(tokens), tree_width=k, needs=needs)


@pytest.mark.parametrize(("rank", "best"), [(0, 1), (1, 2)])
def test_a_tree_is_drafted_at_the_narrowest_top_k_that_keeps_its_accepted_path(rank, best):
    """Forward 2 ms; drafting 0.4 ms per level and per top-k. The target's tokens sit at sibling rank 0 (top-1
    drafts them all, at a quarter of top-4's drafting time) or rank 1 (top-1 drafts none, top-2 all): the steps
    after the first settle at top-k 1 or 2, learned from the full top-4 steps' needs and the measured seconds
    (top-4 only on explorations); outputs equal autoregressive decoding."""
    target = Target(build("llama"))
    prompt, n = [5, 17, 33, 2, 71, 9], 90
    expected = generate(target, Drafter(vocab_size=0), prompt, max_new_tokens=n).output_ids
    planner = AutoBudget(CostModel([1, 64], [0], [[0.002, 0.0022]]))
    drafter = Caterpillar(expected, rank, 0.0004)
    rec = generate(target, drafter, prompt, max_new_tokens=n, planner=planner)
    assert rec.output_ids == expected
    assert 4 in drafter.top_ks[:2] and any(k < 4 for k in drafter.top_ks[:4])  # measured: full, then narrower
    later = drafter.top_ks[8:]
    assert later.count(best) >= 0.7 * len(later), drafter.top_ks
    assert not any(planner.worth.capped)  # drafting itself pays at every top-k that holds the path


def test_the_chance_at_a_narrower_top_k_comes_from_the_full_steps_needs():
    """Two full-top-4 steps: a tree whose accepted path needed top-3, and a SAM-Decoding-style chain (no needs:
    any top-k drafts it), both accepted to depth 2. Top-4 and top-3 keep both paths, top-2 and top-1 only
    the chain's; a step drafted at top-2 teaches no acceptance."""
    worth = DraftWorth()
    tree = Draft(tokens=[1, 2, 3, 4, 5], parents=[-1, -1, -1, -1, 2], tree_width=4, needs=[1, 2, 3, 4, 3])
    worth.record(3, 1.0, 1.0, tree, 2, 0.1, accepted=[2, 4])
    worth.record(3, 1.0, 1.0, Draft.chain([7, 8], "prompt"), 2, 0.1, accepted=[0, 1])
    assert worth.full_width == 4
    assert [worth._reach(2, w) for w in (4, 2, 1)] == [1.0, 0.5, 0.5]
    narrow = Draft(tokens=[1, 2], parents=[-1, -1], tree_width=2, needs=[1, 2])
    worth.record(1, 1.0, 1.0, narrow, 1, 0.05, accepted=[])
    assert worth.tried[1] == 2 and worth.reached[1] == 2  # unchanged
    assert worth.kept_narrow[(1, 2)] == pytest.approx(1.5) and worth.kept[1] == pytest.approx(2.5)
