"""Speculative sampling with a draft model (Leviathan, Kalman, Matias 2023; Chen et al. 2023).

Each step a draft model proposes ``k`` tokens autoregressively, sampled from
its distribution ``q`` (temperature, top-k and top-p applied as to the
target); the target scores all of them in one forward; verification accepts
token ``i`` with probability ``min(1, p_i(x_i) / q_i(x_i))`` and at the first
rejection samples from ``norm(max(p - q, 0))`` (the shared rule in
``specbench/core/acceptance.py``), which keeps the target's distribution exactly.
Greedy is the one-hot case: the draft's argmax, accepted when it is the
target's argmax.

The draft (``specbench/drafting/draft_model.py``) keeps its own KV cache in step with
the committed tokens: after a rejection its entries for the rejected tokens are
cropped and the target's token is fed at the next step.

Which draft, ``draft_model``:

* a model preset sharing the target's tokenizer (a different tokenizer is
  refused before generation): ``llama-68m`` or ``tinyllama-1.1b`` for
  ``llama2-7b``, ``vicuna-68m`` for ``vicuna-7b``, ``llama2-7b`` for
  ``llama2-70b`` (the SpecDec++ pair), ``llama3.2-1b`` for ``llama3.1-8b``
  (presets ``conf/method/sps-*.yaml``);
* ``self`` (default, the only choice with one model): the target's first
  ``self_first_layers`` layers plus its final norm and LM head, or the target
  without ``self_skip_layers`` (used when ``self_first_layers`` is null).
  The default skips layers 12-15 of SmolLM2's 30, the best layer choice measured on SmolLM2
  (docs/measurements/methods.md, "self-draft layers"); other models need their own measurement.

Drafts are chains (never trees of i.i.d. siblings); ``k`` is capped by the
tokens the generation may still take.
"""

from __future__ import annotations

from dataclasses import dataclass

from methods.registry import register_method
from specbench.drafting.draft_model import DraftModelSettings, ModelDrafter


@dataclass
class SpSConfig(DraftModelSettings):
    k: int = 5  # tokens drafted per step (γ in Leviathan et al.)

    def validate(self) -> None:
        super().validate()
        if self.k < 1:
            raise ValueError(f"sps: k must be >= 1, got {self.k}")


@register_method
class SpeculativeSampling(ModelDrafter):
    name = "sps"
    Config = SpSConfig

    @classmethod
    def preflight(cls, config: SpSConfig, run_cfg) -> None:
        config.preflight()

    def max_length(self) -> int:
        return self.config.k
