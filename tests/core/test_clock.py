"""The serving clock: the harness's own time (a yielded record held by the caller) and idle gaps stay off it,
with a clock the test drives."""

from __future__ import annotations

import pytest

import specbench.core.clock as clock_module
import specbench.core.decode as decode_module
from specbench.core.clock import Clock
from specbench.core.decode import Request, decode_batch
from specbench.core.draft import Drafter
from specbench.core.forward import Target
from tests.core.test_tree_forward import build


class FakeTime:
    """perf_counter for the clock and the decode loop: each reading advances 1 ms; the test adds more."""

    def __init__(self) -> None:
        self.t, self.step = 100.0, 0.001

    def __call__(self) -> float:
        self.t += self.step
        return self.t


@pytest.fixture
def fake(monkeypatch):
    time = FakeTime()
    monkeypatch.setattr(clock_module, "perf_counter", time)
    monkeypatch.setattr(decode_module, "perf_counter", time)
    return time


def test_pauses_and_idle_gaps_are_left_off(fake):
    fake.step = 0.0
    clock = Clock()
    fake.t += 2.0
    assert clock.now() == pytest.approx(2.0)
    clock.pause()
    fake.t += 50.0  # the harness writes a row
    assert clock.now() == pytest.approx(2.0)
    clock.resume()
    fake.t += 1.0
    assert clock.now() == pytest.approx(3.0) and clock.paused_s == pytest.approx(50.0)
    clock.skip_to(10.0)  # nothing live, the next request arrives at 10 s
    assert clock.now() == pytest.approx(10.0) and clock.idle_s == pytest.approx(7.0)
    clock.skip_to(3.0)  # in the past: nothing to skip
    assert clock.now() == pytest.approx(10.0) and clock.at(fake.t) == pytest.approx(10.0)


def test_a_record_held_by_the_caller_costs_the_batch_nothing(fake):
    """Writing a finished request's row (here: 30 s) while others decode is not the engine's time: the rows
    still decoding finish as if it took none, and their steps' ends show no gap."""
    target = Target(build("llama"))
    queue = [Request([1, 2, 3], 2, Drafter(vocab_size=0), tag="short"),
             Request([4, 5, 6, 7], 12, Drafter(vocab_size=0), tag="long")][::-1]
    seen = {}
    for req, rec in decode_batch(target, lambda: queue.pop() if queue else None, batch_size=2):
        seen[req.tag] = rec
        fake.t += 30.0  # the caller's I/O
    long = seen["long"]
    assert long.finished_s < 5.0  # not 30 s later
    gaps = [b - a for a, b in zip(long.step_ends, long.step_ends[1:], strict=False)]
    assert len(long.step_ends) == long.steps and max(gaps) < 1.0
    assert long.step_ends[-1] == long.finished_s and long.arrival_s == long.started_s  # no arrival given: admitted


def test_a_request_s_arrival_is_kept_for_its_queueing_time(fake):
    target = Target(build("llama"))
    clock = Clock()
    queue = [Request([1, 2, 3], 3, Drafter(vocab_size=0), arrival_s=0.0, tag="a"),
             Request([4, 5], 3, Drafter(vocab_size=0), arrival_s=0.0, tag="b")][::-1]
    seen = {req.tag: rec for req, rec in decode_batch(target, lambda: queue.pop() if queue else None,
                                                      batch_size=1, clock=clock)}
    assert seen["b"].arrival_s == 0.0 and seen["b"].started_s >= seen["a"].finished_s  # it waited for a's slot
