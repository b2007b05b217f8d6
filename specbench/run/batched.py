"""A job at ``batch_size`` > 1: each method decodes every selected sample, ``batch_size`` requests at a time.

Continuous batching (:func:`specbench.core.decode.decode_batch`): samples enter in order; when a request
finishes, its row is written at once and the slot takes the next request: the same sample's next turn
(built on the answer just written) or the next sample. A sample keeps one drafter for all of its turns
(``memory: sample`` keeps its meaning); drafters are spawned from the method's own as samples run side by
side, and handed to the next sample when one ends; under ``memory: run`` they share what the run keeps
(:mod:`specbench.core.memory`). Under ``budget=auto`` each sample has its own planner too (their acceptance
statistics shared), and one step's block is planned for every row (:mod:`specbench.budget.batch`). Each
request samples from its own stream (the same as at batch size 1), and a re-run resumes: a recorded turn is
not decoded again, its text feeds the next turn.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from specbench import data as datasets_
from specbench.core.decode import Request, decode_batch
from specbench.core.draft import Drafter


@dataclass
class _Sample:
    sample: datasets_.Sample
    turn: int = 0
    answers: list[str] = field(default_factory=list)
    drafter: Drafter | None = None
    planner: Any = None


class _Pool:
    """Drafters (or ``budget=auto`` planners) of one method for the samples decoding side by side."""

    def __init__(self, first: Any) -> None:
        self.first, self.idle, self.made = first, [first] if first is not None else [], 1

    def take(self) -> Any:
        if self.first is None:
            return None
        if not self.idle:
            self.idle.append(self.first.spawn())
            self.made += 1
        return self.idle.pop()

    def give(self, item: Any) -> None:
        if item is not None:
            self.idle.append(item)


def warm_up(m: Any, name: str, prompt: list[int], tokens: int) -> None:
    """A batch of ``batch_size`` copies of ``prompt`` (planned as a run plans, for the drafting cost it
    measures): nothing recorded."""
    pool, planners = _Pool(m.drafters[name]), _Pool(m.budgets.get(name))
    queue = [Request(prompt, tokens, pool.take(), m.generator("warmup", 0, 0), planners.take())
             for _ in range(m.job.batch_size)]
    for _ in decode_batch(m.target, lambda: queue.pop() if queue else None, batch_size=m.job.batch_size,
                          sampling=m.job.sampling, eos_token_ids=m.loaded.eos_token_ids,
                          plan_rows=m.plan_rows if name in m.budgets else None):
        pass


def measure(m: Any, name: str, samples: list[datasets_.Sample], repeat: int, bar: Any, done: set) -> None:
    """Every turn of every sample with method ``name``, ``batch_size`` at a time (``m``: the job's
    :class:`specbench.run.runner.Measurement`)."""
    pool, planners = _Pool(m.drafters[name]), _Pool(m.budgets.get(name))
    waiting = iter(samples)
    ready: deque[Request] = deque()

    def advance(state: _Sample) -> Request | None:
        """The sample's next turn to decode (recorded turns feed their text on), or None when it is done."""
        sample = state.sample
        while state.turn < len(sample.turns):
            ids = m.next_prompt(name, sample, state.turn, repeat, state.answers, bar, done)
            if ids is None:
                if len(state.answers) == state.turn:  # the dataset skips this turn: the sample ends
                    break
                state.turn += 1
                continue
            if state.drafter is None:
                state.drafter, state.planner = pool.take(), planners.take()
                state.drafter.begin_sample()
            return Request(ids, m.max_new(ids), state.drafter, m.generator(sample.sample_id, state.turn, repeat),
                           planner=state.planner, tag=state)
        if state.drafter is not None:
            pool.give(state.drafter)
            planners.give(state.planner)
            state.drafter = state.planner = None
        return None

    def next_request() -> Request | None:
        if ready:
            return ready.popleft()
        for sample in waiting:
            request = advance(_Sample(sample))
            if request is not None:
                return request
        return None

    m.target.reset_peak_memory()
    clock = time.perf_counter()
    tokens = 0
    for request, rec in decode_batch(m.target, next_request, batch_size=m.job.batch_size, sampling=m.job.sampling,
                                     eos_token_ids=m.loaded.eos_token_ids, clock=clock,
                                     limit=m.loaded.context_length,
                                     plan_rows=m.plan_rows if name in m.budgets else None):
        state: _Sample = request.tag
        state.answers.append(m.write(name, state.sample, state.turn, repeat, rec, m.target.peak_memory_gb()))
        state.turn += 1
        follow = advance(state)
        if follow is not None:
            ready.append(follow)
        tokens += rec.new_tokens
        bar.set_postfix(method=name, tok_s=f"{tokens / max(time.perf_counter() - clock, 1e-9):.1f}",
                        batch=m.job.batch_size)
        bar.update(1)
