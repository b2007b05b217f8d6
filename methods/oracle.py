"""The oracle: a drafter that knows the answer, so its speedup is the limit of any drafter.

Greedy decoding of a prompt is fixed by the model alone: the job's autoregressive output for that prompt
and turn is the continuation every lossless method must produce. The oracle drafts that continuation, as a
chain, from the committed tokens on; every guess is accepted (up to rounding of a wider forward: the
verification may break a near tie otherwise, and the oracle then drafts nothing more that turn). What is
left is what drafting cannot remove: the forwards themselves. Its speedup over the same job's
autoregressive run is the best that any drafter can reach on this model, machine and settings, and a
method's speedup divided by it is the method's share of that limit (the summaries' ``limit`` column).

How many tokens a step:

* ``num_draft: 0`` (the preset's): the k that pays most on the measured cost curve t(q, context), the k
  maximising (1 + k) / t(1 + k, context): on a CPU, where a forward's cost grows with its tokens, a few
  dozen; on a GPU at batch size 1, as many as the curve stays flat.
* ``num_draft: K``: K guesses a step (a given budget, as other methods' presets fix theirs).

The reference comes from ``DrafterContext.reference(prompt)``, which the runner has ready before the timed
generation: the baseline's output when it ran first on that prompt, otherwise an untimed autoregressive
generation of it. Greedy only (``temperature=0``) and one request at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

from methods.registry import register_method
from specbench.core.draft import DecodeState, Draft, Drafter

SOURCE_ORACLE = "oracle"
CONTEXT_BUCKET = 64  # the best k is found again each time the context grows by this many tokens


@dataclass
class OracleConfig:
    num_draft: int = 0  # guesses a step; 0: the number that pays most on the measured cost curve
    most: int = 128  # the deepest draft num_draft: 0 considers

    def validate(self) -> None:
        if self.num_draft < 0:
            raise ValueError(f"oracle: num_draft must be >= 0 (0: what pays most on the cost curve), got "
                             f"{self.num_draft}")
        if self.most < 1:
            raise ValueError(f"oracle: most must be >= 1, got {self.most}")


def best_length(cost, context: int, most: int) -> int:
    """The number of guesses k (1..``most``) with the most tokens per second, (1 + k) / t(1 + k, context),
    every guess accepted; ties go to the shorter draft."""
    best, rate = 1, 2.0 / cost(2, context)
    for k in range(2, most + 1):
        r = (1 + k) / cost(1 + k, context)
        if r > rate:
            best, rate = k, r
    return best


@register_method
class Oracle(Drafter):
    name = "oracle"
    Config = OracleConfig
    tree_drafts = False  # one chain a step
    budget_auto = False  # it sizes its own drafts (num_draft, or the cost curve)
    batchable = False
    needs_reference = True

    def __init__(self, config: OracleConfig | None = None, **kwargs) -> None:
        super().__init__(config, **kwargs)
        self.reference: list[int] = []
        self.prompt_len = 0
        self._best: dict[int, int] = {}  # context bucket → best k (the curve is fixed for a run)

    @classmethod
    def preflight(cls, config: OracleConfig, run_cfg) -> None:
        from specbench.errors import ConfigError

        if float(run_cfg.get("temperature") or 0) > 0:
            raise ConfigError("method=oracle drafts the greedy continuation: use temperature=0")

    def start(self, prompt_ids: list[int]) -> None:
        get = self.context.reference
        if get is None:
            raise ValueError("oracle: no reference outputs (DrafterContext.reference): run it through the runner")
        self.reference, self.prompt_len = list(get(list(prompt_ids))), len(prompt_ids)

    def length(self, context: int) -> int:
        """Guesses to draft at ``context`` tokens: ``num_draft``, or what pays most on the cost curve."""
        if self.config.num_draft:
            return self.config.num_draft
        cost = self.context.forward_cost
        if cost is None:
            raise ValueError("oracle: num_draft: 0 sizes drafts by the measured cost curve, which this run did not "
                             "load: set method.num_draft=<K>")
        bucket = context // CONTEXT_BUCKET
        if bucket not in self._best:
            self._best[bucket] = best_length(cost, bucket * CONTEXT_BUCKET, self.config.most)
        return self._best[bucket]

    def propose(self, state: DecodeState) -> Draft | None:
        done = state.new_tokens
        if state.prompt_len != self.prompt_len or state.tokens[self.prompt_len:] != self.reference[:done]:
            return None  # not the reference's path (another prompt, or a near tie broken otherwise)
        depth = min(self.length(len(state.tokens)), state.max_depth)
        guess = self.reference[done:done + depth] if depth > 0 else []
        return Draft.chain(guess, SOURCE_ORACLE) if guess else None
