"""The decode loop every method runs: prefill, then propose → verify → commit → update.

:func:`decode_batch` runs up to ``batch_size`` requests together (continuous batching): each row has its own
drafter, draft, sampling stream and record; one forward verifies every row's draft; when a row finishes, the
next request is prefilled into its slot. :func:`generate` is one request at batch size 1, through the same
code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

import torch

from specbench.core.acceptance import SamplingParams, accept, accept_rows
from specbench.core.clock import Clock
from specbench.core.draft import DecodeState, Draft, Drafter, Planner, VerifyResult
from specbench.core.forward import Target
from specbench.core.record import TARGET_TOKEN, GenerationRecord
from specbench.core.steps import _accepted_rows, _check, _commit, _record_step

_EMPTY = Draft()

# Plans every row's draft of a batched step together (``budget=auto`` at batch size > 1): the rows' planners,
# their proposed drafts and their tokens so far (root last) in, the drafts to verify out.
PlanRows = Callable[[list[Planner], list[Draft], list[list[int]]], list[Draft]]


@dataclass
class Request:
    """One generation to run: a prompt, its drafter (state for this request alone), its sampling stream."""

    prompt_ids: list[int]
    max_new_tokens: int
    drafter: Drafter
    generator: torch.Generator | None = None
    planner: Planner | None = None
    tag: Any = None  # the caller's key, handed back with the record
    arrival_s: float | None = None  # when it arrived, on the batch's clock (None: when it is admitted)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class _Row:
    request: Request
    record: GenerationRecord
    seq: list[int]
    layers: tuple[int, ...]
    name: str
    step: int = 0
    draft: Draft = field(default_factory=Draft)
    draft_s: float = 0.0
    record_s: float = 0.0  # the planner's last record(): priced with the next step's drafting (its own is running)


class _Loop:
    """The rows decoding now (slot ``i`` holds ``rows[i]``) and what every step shares."""

    def __init__(self, target: Target, batch_size: int, sampling: SamplingParams, eos: set[int],
                 limit: int | None, clock: Clock | None, plan_rows: PlanRows | None = None) -> None:
        self.target, self.sampling, self.eos, self.plan_rows = target, sampling, eos, plan_rows
        self.cache = target.new_cache(batch_size, limit)
        self.rows: list[_Row | None] = []
        self.clock = clock or Clock()

    def start(self, admitted: list[tuple[int, Request]]) -> list[_Row]:
        """Prefill each request into its slot (step 0: its first token): slots in a contiguous run share one
        forward (up to :data:`PREFILL_MASK` mask entries), so a batch's first prompts cost one pass."""
        rows = []
        for group in _runs(admitted):
            rows += self._start_group(group)
        return rows

    def _start_group(self, group: list[tuple[int, Request]]) -> list[_Row]:
        target, cache = self.target, self.cache
        t0 = perf_counter()
        prompts = [list(request.prompt_ids) for _, request in group]
        layers = tuple(group[0][1].drafter.feature_layers)
        for (slot, request), prompt in zip(group, prompts, strict=True):
            request.drafter.new_turn(prompt)
            cache.clear(slot)
            cache.reserve(len(prompt) + request.max_new_tokens + 64)  # room for the whole answer, and a block
        logits = target.prefill_rows(prompts, cache, group[0][0], features=layers)
        rows = []
        for r, ((slot, request), prompt) in enumerate(zip(group, prompts, strict=True)):
            drafter = request.drafter
            record = GenerationRecord(prompt_len=len(prompt), slot=slot)
            record.started_s = self.clock.at(t0)
            record.arrival_s = record.started_s if request.arrival_s is None else request.arrival_s
            if layers:
                drafter.prefilled(target.row_features[r])
            begin = getattr(request.planner, "start", None)
            if begin is not None:
                begin(len(prompt))
            _, tokens = accept(_EMPTY, logits[r : r + 1], self.sampling, request.generator)
            kept = _commit(record, tokens, self.eos, request.max_new_tokens)
            record.dropped = len(tokens) - kept
            record.token_sources.extend([TARGET_TOKEN] * kept)
            name = getattr(drafter, "name", type(drafter).__name__)
            rows.append(_Row(request, record, prompt + record.output_ids, layers, name))
        target.sync()
        seconds = perf_counter() - t0
        for row in rows:  # a shared prefill is each of its requests' prefill time
            row.record.prefill_s = seconds
            row.record.step_ends.append(self.clock.at(t0 + seconds))
            _record_step(row.record, len(row.record.output_ids), seconds, 0, 0, 0, 0, 0.0, 0.0)
        return rows

    def state(self, row: _Row) -> DecodeState:
        """The row's next step as its drafter sees it, with the planner's caps (asked first)."""
        row.step += 1
        request = row.request
        cap = getattr(request.planner, "cap", None)
        depth_cap = cap() if cap is not None else None
        return DecodeState(row.seq, row.record.prompt_len, request.max_new_tokens, row.step, depth_cap=depth_cap,
                           width_cap=getattr(request.planner, "width_cap", None))

    def take(self, row: _Row, draft: Draft | None, seconds: float) -> None:
        """The row's proposal, checked and (a planner alone) planned; ``seconds`` already spent drafting it."""
        start = perf_counter()
        if draft is None:
            draft = _EMPTY
        elif draft is not _EMPTY:
            _check(draft, row.name, row.step)
        if row.request.planner is not None and self.plan_rows is None:
            draft = row.request.planner.plan(draft, row.seq)
        row.draft, row.draft_s = draft, seconds + perf_counter() - start

    def propose(self, rows: list[_Row]) -> None:
        """Every row's draft: one call for all rows when their drafters share a class that drafts for a batch
        at once (``propose_rows``: a head's forward per tree level for every row, one read of the trees), its
        time shared among them; else each drafter alone."""
        kinds = {type(row.request.drafter) for row in rows}
        batched = getattr(kinds.pop(), "propose_rows", None) if len(kinds) == 1 and len(rows) > 1 else None
        if batched is None:
            for row in rows:
                start = perf_counter()
                state = self.state(row)
                self.take(row, row.request.drafter.propose(state), perf_counter() - start)
            return
        start = perf_counter()
        drafts = batched([row.request.drafter for row in rows], [self.state(row) for row in rows])
        share = (perf_counter() - start) / len(rows)
        for row, draft in zip(rows, drafts, strict=True):
            self.take(row, draft, share)

    def plan(self, rows: list[_Row]) -> None:
        """The rows' drafts planned together; the planning time shared among them."""
        planned = [row for row in rows if row.request.planner is not None]
        if self.plan_rows is None or not planned:
            return
        start = perf_counter()
        drafts = self.plan_rows([row.request.planner for row in planned], [row.draft for row in planned],
                                [row.seq for row in planned])
        share = (perf_counter() - start) / len(planned)
        for row, draft in zip(planned, drafts, strict=True):
            row.draft, row.draft_s = draft, row.draft_s + share

    def step(self) -> None:
        """One step of every row: propose, one forward for all, accept, compact, update, record."""
        rows: list[_Row] = self.rows  # type: ignore[assignment]  (no holes between steps)
        target, cache = self.target, self.cache
        start = perf_counter()
        self.propose(rows)
        self.plan(rows)
        target.sync()  # a draft model's kernels count as draft time, not forward time
        proposed = perf_counter()
        layers = rows[0].layers if len({row.layers for row in rows}) == 1 else None
        if layers is None:
            raise ValueError("rows of one batch must read the same target layers")
        logits = target.forward_rows([row.seq[-1] for row in rows], [row.draft for row in rows], cache,
                                     features=layers)
        best = None  # greedy on a GPU: one argmax and one read for every row
        if self.sampling.greedy and logits[0].is_cuda and len(rows) > 1:
            flat = target.rows_logits.argmax(-1).tolist()
            cuts = [0]
            for part in logits:
                cuts.append(cuts[-1] + part.shape[0])
            best = [flat[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]
        if self.sampling.greedy or (len(rows) == 1 and not logits[0].is_cuda):  # a CPU reads for free
            walks = [accept(row.draft, logits[r][: 1 + len(row.draft.tokens)], self.sampling,
                            row.request.generator, argmax=None if best is None else best[r])
                     for r, row in enumerate(rows)]
        else:  # sampling in a batch or on a GPU: every row's walk on the device, one read for all
            walks = accept_rows([row.draft for row in rows], [logits[r][: 1 + len(row.draft.tokens)]
                                for r, row in enumerate(rows)], self.sampling,
                                [row.request.generator for row in rows])
        settled = [(path, tokens, _accepted_rows(target.row_features[r], path) if layers else {})
                   for r, (path, tokens) in enumerate(walks)]
        cache.commit(0, [[0] + [1 + i for i in path] for path, _, _ in settled])
        target.sync()
        verified = perf_counter()
        update_s = []
        for r, (row, (path, tokens, features)) in enumerate(zip(rows, settled, strict=True)):
            t0 = perf_counter()
            if row.request.planner is not None:  # timed as drafting: the step's, and the planner's next price
                row.request.planner.record(row.draft, path, draft_s=row.draft_s + row.record_s)
                row.record_s = perf_counter() - t0
            n = len(row.draft.tokens)
            aux_logits = logits[r][1 + n :] if row.draft.n_aux else None
            row.request.drafter.update(VerifyResult(path, tokens, row.draft, aux_logits=aux_logits,
                                                    root_logits=logits[r][0], logits=logits[r][: 1 + n],
                                                    features=features))
            update_s.append(perf_counter() - t0)
        target.sync()
        updated = perf_counter()
        for row, (path, tokens, _), own_update in zip(rows, settled, update_s, strict=True):
            self.settle(row, path, tokens, (proposed - start) + (updated - verified), row.draft_s + own_update)
        end = perf_counter()  # a step's time covers all of its work: bookkeeping and the planner too
        for row in rows:
            row.record.step_times[-1] = end - start
            row.record.step_ends.append(self.clock.at(end))
            if row.record.finish_reason:
                row.record.finished_s = self.clock.at(end)

    def settle(self, row: _Row, path: list[int], tokens: list[int], batch_draft_s: float, own_draft_s: float) -> None:
        record, draft, request = row.record, row.draft, row.request
        kept = _commit(record, tokens, self.eos, request.max_new_tokens)
        row.seq.extend(tokens[:kept])
        accepted = min(kept, len(path))  # guesses committed: EOS or max_new_tokens may cut the run
        n = len(draft.tokens)
        for i in range(n):  # a node several sources proposed counts for each of them
            record.drafted_by_source.update(draft.sources_of(i))
        for i in path[:accepted]:
            record.accepted_by_source.update(draft.sources_of(i))
            record.token_sources.append("+".join(draft.sources_of(i)))
        record.token_sources.extend([TARGET_TOKEN] * (kept - accepted))
        depth = max(draft.depths(), default=0) if n else 0
        if record.finish_reason:
            record.dropped = len(tokens) - kept
            if request.planner is not None:
                request.planner.finish(row.seq)
        # at batch size 1 the step's drafting is this row's; in a batch, each row is charged its own
        draft_s = batch_draft_s if len(self.rows) == 1 else own_draft_s
        _record_step(record, kept, 0.0, n, draft.n_aux, accepted, depth, draft_s, draft.lookup_s)


@torch.inference_mode()
def decode_batch(
    target: Target,
    next_request: Callable[[], Request | None],
    *,
    batch_size: int,
    sampling: SamplingParams | None = None,
    eos_token_ids: list[int] | tuple[int, ...] = (),
    limit: int | None = None,
    clock: Clock | None = None,
    plan_rows: PlanRows | None = None,
) -> Iterator[tuple[Request, GenerationRecord]]:
    """Decode the requests ``next_request`` hands out (None: none ready), up to ``batch_size`` at once, and
    yield each with its record as it finishes. A slot that frees takes the next request at once, so the
    caller may queue a request that depends on a finished one (a conversation's next turn) when it is
    yielded. ``limit``: the most cache entries a row will need, if known; ``clock``: the
    :class:`~specbench.core.clock.Clock` the records' timestamps count from (default: one started now), paused
    while the caller holds a yielded record; ``plan_rows``: plans the rows' drafts together (``budget=auto``),
    instead of each request's planner alone. A caller whose requests arrive over time hands out None until one
    has arrived, and, when none is live, skips the clock to the next arrival rather than returning None."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    loop = _Loop(target, batch_size, sampling or SamplingParams(), set(eos_token_ids), limit, clock, plan_rows)
    rows = loop.rows
    free = list(range(batch_size))
    while True:
        while free:  # fill every free slot that a request is ready for
            admitted = []
            for slot in list(free):
                request = next_request()
                if request is None:
                    break
                admitted.append((slot, request))
                free.remove(slot)
            if not admitted:
                break
            for row in loop.start(admitted):
                slot = row.record.slot
                if row.record.finish_reason:  # done at its first token
                    row.record.finished_s = row.record.started_s + row.record.prefill_s
                    free.append(slot)
                    yield from _paused(loop.clock, row)
                    continue
                while len(rows) <= slot:
                    rows.append(None)
                rows[slot] = row
            free.sort()
        if free and rows:  # nothing left to refill: pack the live rows to the front
            free = _pack(loop)
        if not rows:
            return
        loop.step()
        done = [i for i, row in enumerate(rows) if row.record.finish_reason]
        for i in done:
            row, rows[i] = rows[i], None
            free.append(i)
            row.record.decode_s = sum(row.record.step_times[1:])
            yield from _paused(loop.clock, row)
        free.sort()


def _paused(clock: Clock, row: _Row) -> Iterator[tuple[Request, GenerationRecord]]:
    """Yield a finished row, the clock stopped while the caller holds it (writing its row is not serving)."""
    clock.pause()
    yield row.request, row.record
    clock.resume()


# The most mask entries (rows × prompt length × prompt length) one prefill forward builds: prompts beyond it
# are prefilled in further forwards.
PREFILL_MASK = 1 << 24


def _runs(admitted: list[tuple[int, Request]]) -> list[list[tuple[int, Request]]]:
    """Requests admitted together, grouped into runs of consecutive slots that read the same target layers,
    each run's mask within :data:`PREFILL_MASK`."""
    groups: list[list[tuple[int, Request]]] = []
    for slot, request in sorted(admitted, key=lambda pair: pair[0]):
        group = groups[-1] if groups else None
        longest = max([len(request.prompt_ids)] + [len(r.prompt_ids) for _, r in group or []])
        if (group and group[-1][0] + 1 == slot
                and tuple(group[0][1].drafter.feature_layers) == tuple(request.drafter.feature_layers)
                and (len(group) + 1) * longest * longest <= PREFILL_MASK):
            group.append((slot, request))
        else:
            groups.append([(slot, request)])
    return groups


def _pack(loop: _Loop) -> list[int]:
    """Move the last live rows into the holes before them, so that the live rows are slots 0..n; the free
    slots left."""
    rows = loop.rows
    while True:
        while rows and rows[-1] is None:
            rows.pop()
        if None not in rows:
            return list(range(len(rows), loop.cache.slots))
        hole = rows.index(None)
        loop.cache.move(len(rows) - 1, hole)
        rows[hole] = rows.pop()


def generate(
    target: Target,
    drafter: Drafter,
    prompt_ids: list[int],
    *,
    max_new_tokens: int,
    sampling: SamplingParams | None = None,
    eos_token_ids: list[int] | tuple[int, ...] = (),
    generator: torch.Generator | None = None,
    planner: Planner | None = None,
) -> GenerationRecord:
    """Generate up to ``max_new_tokens`` tokens after ``prompt_ids`` with ``drafter`` (batch size 1).

    The output is the target's own (greedy: token for token the autoregressive
    output; sampling: the target's distribution) whatever the drafter proposes,
    and whatever part of it ``planner`` keeps (``budget=auto``: :class:`specbench.budget.planner.AutoBudget`).
    """
    queue = [Request(list(prompt_ids), max_new_tokens, drafter, generator, planner)]
    ((_, record),) = decode_batch(target, lambda: queue.pop() if queue else None, batch_size=1,
                                  sampling=sampling, eos_token_ids=eos_token_ids,
                                  limit=len(prompt_ids) + max_new_tokens)  # a block's tail: the cache's margin
    return record
