"""The decode loop every method runs: prefill, then propose → verify → commit → update."""

from __future__ import annotations

from time import perf_counter

import torch

from specbench.core.acceptance import SamplingParams, accept
from specbench.core.draft import DecodeState, Draft, Drafter, Planner, VerifyResult
from specbench.core.forward import Target, upload
from specbench.core.record import GenerationRecord

_EMPTY = Draft()


def _check(draft: Draft, name: str, step: int) -> None:
    """A malformed draft (a child listed before its parent, lists of unequal length) is an error naming
    the method: verifying it would run a silently wrong forward."""
    try:
        draft.validate()
    except ValueError as err:
        raise ValueError(f"method '{name}' proposed an invalid draft at step {step}: {err}") from None


def _record_step(record: GenerationRecord, kept: int, seconds: float, drafted: int, aux: int,
                 accepted: int, depth: int, draft_s: float, lookup_s: float) -> None:
    record.step_tokens.append(kept)
    record.step_times.append(seconds)
    record.step_drafted.append(drafted)
    record.step_aux.append(aux)
    record.step_accepted.append(accepted)
    record.step_depth.append(depth)
    record.step_draft_s.append(draft_s)
    record.step_lookup_s.append(lookup_s)


def _accepted_rows(features: dict[int, torch.Tensor], path: list[int]) -> dict[int, torch.Tensor]:
    """The block's hidden states of the root and the accepted guesses (rows 0 and 1 + i), where they live."""
    rows = [0] + [1 + i for i in path]
    if rows == list(range(len(rows))):
        return {layer: h[: len(rows)] for layer, h in features.items()}
    index: dict[torch.device, torch.Tensor] = {}
    out = {}
    for layer, h in features.items():
        if h.device not in index:
            index[h.device] = upload(rows, h.device)
        out[layer] = h.index_select(0, index[h.device])
    return out


def _commit(record: GenerationRecord, tokens: list[int], eos: set[int], max_new: int) -> int:
    """Append a step's tokens, stopping at EOS (kept) or at max_new_tokens. Returns tokens kept."""
    kept = 0
    for tok in tokens:
        record.output_ids.append(tok)
        kept += 1
        if tok in eos:
            record.finish_reason = "eos"
            break
        if record.new_tokens >= max_new:
            record.finish_reason = "length"
            break
    return kept


@torch.inference_mode()
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
    """Generate up to ``max_new_tokens`` tokens after ``prompt_ids`` with ``drafter``.

    The output is the target's own (greedy: token for token the autoregressive
    output; sampling: the target's distribution) whatever the drafter proposes,
    and whatever part of it ``planner`` keeps (``budget=auto``: :class:`specbench.budget.planner.AutoBudget`).
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    sampling = sampling or SamplingParams()
    eos = set(eos_token_ids)
    record = GenerationRecord(prompt_len=len(prompt_ids))
    cache = target.new_cache()

    t0 = perf_counter()
    drafter.new_turn(list(prompt_ids))
    layers = tuple(drafter.feature_layers)
    logits = target.prefill(list(prompt_ids), cache, features=layers)
    if layers:
        drafter.prefilled(target.features)
    _, tokens = accept(_EMPTY, logits[None], sampling, generator)
    kept = _commit(record, tokens, eos, max_new_tokens)
    target.sync()
    record.prefill_s = perf_counter() - t0
    record.dropped = len(tokens) - kept
    _record_step(record, kept, record.prefill_s, 0, 0, 0, 0, 0.0, 0.0)

    seq = list(prompt_ids) + record.output_ids
    step = 0
    name = getattr(drafter, "name", type(drafter).__name__)
    while not record.finish_reason:
        step += 1
        start = perf_counter()
        draft = drafter.propose(DecodeState(seq, len(prompt_ids), max_new_tokens, step))
        if draft is None:
            draft = _EMPTY
        elif draft is not _EMPTY:
            _check(draft, name, step)
        if planner is not None:
            draft = planner.plan(draft, seq)
        target.sync()  # a draft model's kernels count as draft time, not forward time
        proposed = perf_counter()
        past_len = cache.get_seq_length()
        logits = target.forward_draft(seq[-1], draft, cache, features=layers)
        n = len(draft.tokens)
        rows = logits[: 1 + n]
        path, tokens = accept(draft, rows, sampling, generator)
        features = _accepted_rows(target.features, path) if layers else {}
        if planner is not None:
            planner.record(draft, path)
        target.compact(cache, past_len, path)
        target.sync()
        verified = perf_counter()
        aux_logits = logits[1 + n :] if draft.n_aux else None
        drafter.update(
            VerifyResult(path, tokens, draft, aux_logits=aux_logits, root_logits=logits[0], logits=rows,
                         features=features)
        )
        target.sync()
        updated = perf_counter()

        kept = _commit(record, tokens, eos, max_new_tokens)
        seq.extend(tokens[:kept])
        accepted = min(kept, len(path))  # guesses committed: EOS or max_new_tokens may cut the run
        for i in range(n):  # a node several sources proposed counts for each of them
            record.drafted_by_source.update(draft.sources_of(i))
        for i in path[:accepted]:
            record.accepted_by_source.update(draft.sources_of(i))
        depth = max(draft.depths(), default=0) if n else 0
        if record.finish_reason:
            record.dropped = len(tokens) - kept
            if planner is not None:
                planner.finish(seq)
        end = perf_counter()  # the step's time covers all of its work: bookkeeping and the planner too
        _record_step(record, kept, end - start, n, draft.n_aux, accepted, depth,
                     (proposed - start) + (updated - verified), draft.lookup_s)
    record.decode_s = sum(record.step_times[1:])
    return record
