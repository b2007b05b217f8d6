"""What a step sends of a draft: the guesses it keeps and the first columns of its pool (``budget=auto`` weighs each
pool width; ``budget=replay`` cuts a draft as a recorded run did)."""

from __future__ import annotations

import numpy as np

from specbench.core.draft import Draft


def widths(full: int) -> list[int]:
    """The widths chosen from (a pool's columns, a tree's top-k): ``full``, then halved (rounded up) down to 1."""
    out = [full]
    while out[-1] > 1:
        out.append((out[-1] + 1) // 2)
    return out


def subdraft(draft: Draft, keep: list[int], width: int) -> Draft:
    """``draft`` restricted to the guesses ``keep`` (closed under parents) and the aux nodes of its first
    ``width`` columns (0: none; its :attr:`~Draft.aux_width` or more: all); ``draft`` itself when that is all."""
    if width >= draft.aux_width and len(keep) == len(draft):
        return draft
    out = draft.keep(keep)
    if width >= draft.aux_width:
        out.aux_tokens, out.aux_positions = draft.aux_tokens, draft.aux_positions
        out.aux_visible, out.aux_logit_rows = draft.aux_visible, draft.aux_logit_rows
        out.aux_columns = draft.aux_columns
    elif width > 0:  # the nodes of the first `width` columns, their mask and logit rows re-indexed
        cols = draft.aux_columns
        idx = [j for j, c in enumerate(cols) if c < width]
        at = {old: new for new, old in enumerate(idx)}
        out.aux_tokens = [draft.aux_tokens[j] for j in idx]
        out.aux_positions = [draft.aux_positions[j] for j in idx]
        out.aux_visible = draft.aux_visible[np.ix_(idx, idx)]
        out.aux_columns = [cols[j] for j in idx]
        if draft.aux_logit_rows is not None:
            out.aux_logit_rows = [at[j] for j in draft.aux_logit_rows if j in at]
    return out


def aux_count(draft: Draft, width: int) -> int:
    """Aux nodes of ``draft``'s first ``width`` columns."""
    if width <= 0:
        return 0
    return draft.n_aux if width >= draft.aux_width else sum(c < width for c in draft.aux_columns)
