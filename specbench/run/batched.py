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

A served run's clock (:class:`specbench.core.clock.Clock`) stops while a finished request's row is written.
Requests arrive all at once (``request_rate`` null: every sample's first turn at time 0) or at a rate, a
Poisson process seeded by the run's seed and the repeat (the same arrival times for the method and its
baseline); a later turn arrives when the turn before it has been answered. ``max_concurrency`` caps the
requests in flight (default: ``batch_size``). When nothing is in flight and the next request arrives later,
the clock skips to it (nothing runs in between).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specbench import data as datasets_
from specbench.core.clock import Clock
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


def check_memory(job: Any) -> None:
    """Before any weights load: the batch's weights, heads or draft and KV cache against the device's memory
    (:mod:`specbench.models.memory`), refused in one line naming a batch size that fits. Batch size 1: the
    weights' own check when they load."""
    if job.batch_size == 1:
        return
    import transformers

    from methods.registry import get_method
    from specbench.models.config import DTYPES, _available_bytes, _hardware, _plain
    from specbench.models.load import load_tokenizer
    from specbench.models.memory import Shape, check_batch_memory
    from specbench.models.weights import _weights_source

    cfg, hw = _plain(job.model_cfg), _hardware(job.hardware)
    if cfg.get("tiny"):
        tiny = {k: v for k, v in cfg["tiny"].items() if k not in ("seed", "model_type")}
        shape = Shape.of(transformers.AutoConfig.for_model(cfg["tiny"]["model_type"], **tiny))
    else:
        src, kw, _ = _weights_source(cfg)
        shape = Shape.of(transformers.AutoConfig.from_pretrained(src, **kw))
    itemsize = DTYPES[cfg.get("dtype", "float32")].itemsize
    params = float(cfg["params_b"]) * 1e9 if cfg.get("params_b") else shape.params()
    extra = getattr(get_method(job.method), "extra_params", None)
    params += extra(job.method_config, shape) if extra is not None else 0
    weights = params * (1 if cfg.get("quantization") == "int8" else itemsize)
    tokenizer, longest = load_tokenizer(job.model_cfg), 0
    for sample in job.samples:
        try:
            prompt = job.dataset.build_prompt(tokenizer, sample, 0, [], job.dataset_cfg, job.chat)
        except datasets_.SampleSkipped:
            continue
        longest = max(longest, len(sample.turns) * (len(prompt) + job.max_new_tokens))
    have, where = _available_bytes(hw, cfg.get("quantization"))
    check_batch_memory(f"model '{cfg['name']}' with {job.preset}", weights,
                       longest * shape.kv_bytes_per_token(itemsize), job.batch_size, have, where)


def arrivals(n: int, rate: float | None, seed: int, repeat: int) -> list[float]:
    """When each of ``n`` samples' first turn arrives (seconds): all at 0, or a seeded Poisson process of
    ``rate`` requests per second (exponential gaps)."""
    if rate is None:
        return [0.0] * n
    gaps = np.random.default_rng([seed, repeat]).exponential(1.0 / rate, size=n)
    return list(np.cumsum(gaps) - gaps[0])  # the first arrives at 0


def measure(m: Any, name: str, samples: list[datasets_.Sample], repeat: int, bar: Any, done: set) -> None:
    """Every turn of every sample with method ``name``, ``batch_size`` at a time (``m``: the job's
    :class:`specbench.run.runner.Measurement`)."""
    pool, planners = _Pool(m.drafters[name]), _Pool(m.budgets.get(name))
    job = m.job
    waiting = deque(zip(arrivals(len(samples), job.request_rate, job.seed, repeat), samples, strict=True))
    ready: deque[Request] = deque()
    clock, cap, flight = Clock(), job.max_concurrency or job.batch_size, [0]

    def advance(state: _Sample, arrival: float) -> Request | None:
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
                           planner=state.planner, tag=state, arrival_s=arrival)
        if state.drafter is not None:
            pool.give(state.drafter)
            planners.give(state.planner)
            state.drafter = state.planner = None
        return None

    def next_request() -> Request | None:
        if flight[0] >= cap:
            return None
        request = ready.popleft() if ready else None
        while request is None and waiting:
            if waiting[0][0] > clock.now():  # not arrived yet: wait for it, or skip to it when nothing runs
                if flight[0]:
                    return None
                clock.skip_to(waiting[0][0])
            arrival, sample = waiting.popleft()
            request = advance(_Sample(sample), arrival)
        flight[0] += request is not None
        return request

    m.target.reset_peak_memory()
    tokens = 0
    for request, rec in decode_batch(m.target, next_request, batch_size=m.job.batch_size, sampling=m.job.sampling,
                                     eos_token_ids=m.loaded.eos_token_ids, clock=clock,
                                     limit=m.loaded.context_length,
                                     plan_rows=m.plan_rows if name in m.budgets else None):
        state: _Sample = request.tag
        state.answers.append(m.write(name, state.sample, state.turn, repeat, rec, m.target.peak_memory_gb()))
        state.turn += 1
        flight[0] -= 1
        follow = advance(state, rec.finished_s)
        if follow is not None:
            ready.append(follow)
        tokens += rec.new_tokens
        bar.set_postfix(method=name, tok_s=f"{tokens / max(clock.now(), 1e-9):.1f}", batch=m.job.batch_size)
        bar.update(1)
