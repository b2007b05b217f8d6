"""The decode loop's own duties: it refuses malformed drafts, a step's time covers all of its work (the
drafter's and the budget's included), and every count derives from one per-step record."""

import time

import pytest

from specbench.core.decode import generate
from specbench.core.draft import Draft, Drafter
from specbench.core.forward import Target
from tests.lossless import BigramTarget

PAUSE = 0.03


class SlowUpdate(Drafter):
    """Proposes the bigram target's greedy chain of two tokens; its update takes PAUSE seconds."""

    name = "slow_update"

    def __init__(self, target):
        super().__init__(vocab_size=8)
        self.table = target.table

    def propose(self, state):
        a = int(self.table[state.tokens[-1]].argmax())
        return Draft.chain([a, int(self.table[a].argmax())], "chain")

    def update(self, result):
        time.sleep(PAUSE)


class SlowFinish:
    """A budget=auto stand-in: keeps every draft; its end-of-generation work takes PAUSE seconds."""

    def plan(self, draft, seq):
        return draft

    def record(self, draft, path, draft_s=0.0):
        pass

    def finish(self, seq):
        time.sleep(PAUSE)


def test_a_steps_time_covers_the_update_and_the_budget_finish():
    target = BigramTarget()
    rec = generate(target, SlowUpdate(target), [1, 2, 3], max_new_tokens=9, planner=SlowFinish())
    decode = rec.step_times[1:]
    assert all(t >= PAUSE for t in decode)  # the drafter's update is inside every step
    assert decode[-1] >= 2 * PAUSE  # the budget's finish is inside the last one
    assert rec.decode_s == sum(decode) and rec.wall_s == rec.prefill_s + rec.decode_s


def test_greedy_output_and_counts_agree_when_the_last_step_is_cut():
    """max_new_tokens cuts the last step's accepted run: its guesses past the cut are neither kept nor
    counted as accepted, and every count derives from the same per-step record."""
    target = BigramTarget()
    rec = generate(target, SlowUpdate(target), [1, 2, 3], max_new_tokens=5)
    assert rec.new_tokens == 5 and rec.finish_reason == "length"
    # prefill 1 token, then steps of 3 (two guesses + the target's own): 1 + 3 = 4, then 1 more of 3
    assert rec.step_tokens == [1, 3, 1] and rec.step_accepted == [0, 2, 1] and rec.dropped == 2
    assert rec.accepted_per_step == [2, 1]
    assert dict(rec.accepted_by_position) == {1: 2, 2: 1}
    assert sum(rec.accepted_by_source.values()) == sum(rec.step_accepted) == 3
    assert rec.step_depth == [0, 2, 2]


class Misordered(Drafter):
    """Lists a child before its parent: verified as is, its forward would be silently wrong."""

    name = "misordered"

    def propose(self, state):
        return Draft(tokens=[1, 2], parents=[1, -1], sources=["x", "x"])


class Uneven(Drafter):
    name = "uneven"

    def propose(self, state):
        return Draft(tokens=[1, 2], parents=[-1], sources=["x", "x"])


@pytest.mark.parametrize("make,why", [(Misordered, "must precede"), (Uneven, "differ in length")])
def test_the_core_refuses_a_malformed_draft_naming_the_method(make, why):
    with pytest.raises(ValueError, match=f"method '{make.name}' proposed an invalid draft at step 1: .*{why}"):
        generate(BigramTarget(), make(vocab_size=8), [1, 2, 3], max_new_tokens=5)
    well_formed = generate(BigramTarget(), SlowUpdate(BigramTarget()), [1, 2, 3], max_new_tokens=3)
    assert well_formed.new_tokens == 3


def test_every_output_token_names_who_produced_it():
    """token_sources: one per output token; a step's accepted guesses carry their drafter's source, then the
    target's own token; steps without guesses are all the target's (at batch size 1 and in a batch)."""
    from specbench.core.decode import Request, decode_batch
    from specbench.core.record import TARGET_TOKEN
    from tests.core.test_batch import Script
    from tests.core.test_tree_forward import build

    target = Target(build("llama"))
    prompt = [5, 17, 33, 2, 71, 9]
    expected = generate(target, Drafter(vocab_size=0), prompt, max_new_tokens=30).output_ids
    solo = generate(target, Script(expected), prompt, max_new_tokens=30)
    queue = [Request(prompt, 30, Script(expected)), Request(prompt, 30, Drafter(vocab_size=0))]
    batched = [rec for _, rec in decode_batch(target, lambda: queue.pop() if queue else None, batch_size=2)]
    for rec in (solo, *batched):
        assert len(rec.token_sources) == len(rec.output_ids)
        at = 0
        for n, accepted in zip(rec.step_tokens, rec.step_accepted, strict=True):
            step = rec.token_sources[at : at + n]
            assert step[:accepted] == ["t"] * accepted and set(step[accepted:]) <= {TARGET_TOKEN}
            at += n
    assert solo.token_sources.count("t") == sum(solo.step_accepted) > 0


class Opened(SlowFinish):
    """A planner that hears of each generation's prompt (``start``) and keeps every draft."""

    def __init__(self):
        self.started = []

    def start(self, prompt_len):
        self.started.append(prompt_len)

    def finish(self, seq):
        pass


def test_the_loop_tells_a_planner_the_prompts_length_once_a_generation():
    target, planner = BigramTarget(), Opened()
    for prompt in ([1, 2, 3], [4, 5, 6, 7, 1]):
        generate(target, SlowUpdate(target), prompt, max_new_tokens=4, planner=planner)
    assert planner.started == [3, 5]
