"""What one generation records: tokens, steps, per-step timings and acceptance.

Counting follows one definition for every method (see the README):

* ``new_tokens``: tokens appended after the prompt, up to and including EOS,
  capped at ``max_new_tokens``;
* ``steps``: target forward passes that produced tokens; the prefill counts as
  one, so autoregressive decoding has τ = new_tokens / steps = 1 exactly;
* ``step_tokens[i]`` / ``step_times[i]``: tokens yielded and seconds taken by
  step ``i`` (step 0 is the prefill); a step's time covers all of its work
  (drafting, the forward, acceptance, the drafter's update, bookkeeping);
* ``step_accepted[i]``: guesses of step ``i`` that were accepted *and* kept
  (EOS or ``max_new_tokens`` may cut an accepted run); ``step_depth[i]``: the
  depth of its deepest verified guess (0: no guess);
* ``token_sources[j]``: who produced output token ``j``: the source(s) that drafted it when it was an
  accepted guess (``+``-joined when several proposed it), ``target`` for the target's own token (the
  prefill's, a step's bonus token, every token of a step without an accepted guess).

Every acceptance figure (acceptance length, acceptance rate, acceptance by
position) derives from these per-step lists, so no two can disagree.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

TARGET_TOKEN = "target"  # token_sources: a token the target produced itself


@dataclass
class GenerationRecord:
    prompt_len: int
    output_ids: list[int] = field(default_factory=list)
    step_tokens: list[int] = field(default_factory=list)  # tokens yielded per step (prefill first)
    step_times: list[float] = field(default_factory=list)  # seconds per step (prefill first)
    step_drafted: list[int] = field(default_factory=list)  # guesses verified per step (0 for prefill)
    step_aux: list[int] = field(default_factory=list)  # auxiliary nodes per step
    step_accepted: list[int] = field(default_factory=list)  # guesses accepted and kept per step (0 for prefill)
    step_depth: list[int] = field(default_factory=list)  # deepest verified guess per step (0: none)
    step_draft_s: list[float] = field(default_factory=list)  # seconds in propose + update per step
    step_lookup_s: list[float] = field(default_factory=list)  # of which: external-store lookups (0 for prefill)
    drafted_by_source: Counter = field(default_factory=Counter)  # guesses on the verified tree, by source
    accepted_by_source: Counter = field(default_factory=Counter)  # accepted guesses, by source
    token_sources: list[str] = field(default_factory=list)  # per output token: its drafting source or "target"
    prefill_s: float = 0.0
    decode_s: float = 0.0
    finish_reason: str = ""  # "eos" | "length"
    dropped: int = 0  # tokens the last step produced beyond EOS or max_new_tokens (cut away)
    # When the generation began (its prefill) and ended, on its batch's serving clock (core/clock.py: seconds
    # since the batch began, the harness's own row writing left off): in a batch, a request's latency
    # includes the other rows' prefills.
    started_s: float = 0.0
    finished_s: float = 0.0
    arrival_s: float = 0.0  # when the request arrived (queueing before ``started_s`` is a serving delay)
    step_ends: list[float] = field(default_factory=list)  # when each step ended (prefill first): its tokens' time
    slot: int = 0  # the batch row it decoded in (0 at batch size 1)

    @property
    def new_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def steps(self) -> int:
        return len(self.step_tokens)

    @property
    def wall_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def tau(self) -> float:
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def accepted_per_step(self) -> list[int]:
        """Guesses accepted and kept per decode step (the target's own token not counted)."""
        return list(self.step_accepted[1:])

    @property
    def accepted_by_position(self) -> Counter:
        """Decode steps that kept at least d guesses, by depth d (1 = the first guess)."""
        counts: Counter = Counter()
        for a in self.step_accepted[1:]:
            counts.update(range(1, a + 1))
        return counts
