"""gpu-check's stages: what each is, the order they run in, and how long each is expected to take, so that a run
under a deadline (a lent GPU gives one command ten minutes) starts only the stages that will finish before it
and names the rest.

The order puts each kind of check on both shapes before the next kind: fp32 (exact losslessness) first, then
fp16, bf16 and the speed table. The expected seconds come from a run on one H100 (:data:`H100_SECONDS`), scaled
by the tokens each stage decodes and, once stages have finished, by how the finished ones compared with their
estimates (a slower host, a larger vocabulary)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Row = tuple[str, str, str, bool, str]
KINDS = ("fp32", "fp16", "bf16", "speed")

# Seconds per stage of the Llama-2-7B shape on one H100 80GB HBM3 (2026-11-27, driver 580.159.04, torch 2.11), at
# 32 new tokens per prompt in the correctness stages and 24 in the speed table with 24 per sync count; fp16
# includes 39 s of device_map (save, two loads, the CPU split), which does not shrink with the tokens.
H100_SECONDS = {"plan": 1.0, "sdpa": 7.0, "fp32": 74.0, "fp16": 157.0, "bf16": 76.0, "speed": 208.0}
H100_TOKENS = {"fp32": 32, "fp16": 32, "bf16": 32, "speed": 24 + 2 * 24}
FIXED = {"fp16": 39.0, "speed": 20.0}  # device_map's loads; the cost curve
SHAPE_FACTOR = {"llama2-7b": 1.0, "llama3-8b": 1.3}  # 4× the vocabulary, grouped-query heads: a guess until measured


@dataclass
class Stage:
    """One part of the check that runs and is written on its own: ``plan`` (the 70B placement, on ``meta``),
    ``sdpa`` (the tree mask under each attention backend), ``<model>-<dtype>`` (correctness in fp32, fp16 or
    bf16) or ``<model>-speed`` (the cost curve, the speed table, host syncs per step against each method's
    ceiling). ``timings``: seconds per check; ``profiles``: torch.profiler's tables per method (speed)."""

    model: str
    kind: str
    rows: list[Row] = field(default_factory=list)
    speed: list[dict[str, Any]] = field(default_factory=list)
    curves: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    profiles: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    skipped: str = ""  # why it did not run (a deadline)

    @property
    def name(self) -> str:
        return self.kind if self.model == "" else f"{self.model}-{self.kind}"

    def matches(self, selector: str) -> bool:
        return selector in (self.name, self.model, self.kind)


def plan_stages(shapes: list[str], dtypes: tuple[str, ...] | None = None,
                stages: tuple[str, ...] | None = None) -> list[Stage]:
    """The stages in the order they run, those ``stages`` selects (a stage's name, a model's or a kind's: ``plan``,
    ``llama3-8b``, ``fp16``, ``speed`` …), or every one; an unknown selector is refused in one line."""
    every = [Stage("", "plan"), Stage("", "sdpa")]
    every += [Stage(m, k) for k in KINDS if k == "speed" or dtypes is None or k in dtypes for m in shapes]
    if not stages:
        return every
    for sel in stages:
        if not any(st.matches(sel) for st in every):
            names = sorted({st.name for st in every} | {st.model for st in every if st.model} | set(KINDS))
            raise ValueError(f"no gpu-check stage '{sel}': choose among {', '.join(names)}")
    return [st for st in every if any(st.matches(sel) for sel in stages)]


def estimate(stage: Stage, tokens: int, speed_tokens: int, sync_tokens: int) -> float:
    """The seconds ``stage`` is expected to take on one H100 at these token counts (see :data:`H100_SECONDS`)."""
    base = H100_SECONDS[stage.kind]
    if stage.kind in ("plan", "sdpa"):
        return base
    fixed = FIXED.get(stage.kind, 0.0)
    used = speed_tokens + 2 * sync_tokens if stage.kind == "speed" else tokens
    return (fixed + (base - fixed) * used / H100_TOKENS[stage.kind]) * SHAPE_FACTOR.get(stage.model, 1.0)


def pace(done: list[Stage], estimates: dict[str, float]) -> float:
    """How this machine compares with the estimates so far: the finished stages' seconds over their estimates (1
    before any finished)."""
    ran = [st for st in done if not st.skipped and st.kind not in ("plan", "sdpa")]
    if not ran:
        return 1.0
    return sum(st.seconds for st in ran) / sum(estimates[st.name] for st in ran)
