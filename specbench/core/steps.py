"""What the decode loop does to one row at each step, apart from the loop: a draft's check, the step's entry in
the record, the accepted rows' target states, and the committed tokens cut at EOS or the answer's length."""

from __future__ import annotations

import torch

from specbench.core.draft import Draft
from specbench.core.forward import upload
from specbench.core.record import GenerationRecord


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
