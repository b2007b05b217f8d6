"""gpu-check's stages: what each is, the order they run in, and how long each is expected to take, so that a run
under a deadline (a lent GPU gives one command ten minutes) starts only the stages that will finish before it
and names the rest.

The order puts each kind of check on both shapes before the next kind: fp32 (exact losslessness) first, then
fp16, bf16 and the speed table. The expected seconds come from runs on one H100 (:data:`H100_SECONDS`), scaled
by the tokens each stage decodes and, once stages have finished, by how the finished ones compared with their
estimates (a slower host, a larger vocabulary)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ROUNDS = 3  # the speed table's rounds of one prompt each (specbench.gpucheck.speed)

Row = tuple[str, str, str, bool, str]
KINDS = ("fp32", "fp16", "bf16", "speed", "forward")

# Seconds per stage measured on one H100 80GB HBM3 (driver 580.159.04, torch 2.11) and the new tokens per prompt
# they decoded: the Llama-2-7B shape's correctness stages at 32 (2026-11-27, a2116bb), the Llama-3-8B shape's at
# the defaults, 16, and both speed stages at 3 rounds × 24 + 2 × 12 with two methods profiled (2026-11-27, b228431).
# FIXED is what does not shrink with the tokens: device_map's save and loads (fp16); the heads and the cost curve.
H100_SECONDS = {"plan": 1.0, "sdpa": 7.0, "llama2-7b-fp32": 74.0, "llama2-7b-fp16": 157.0, "llama2-7b-bf16": 76.0,
                "llama2-7b-speed": 200.0, "llama3-8b-fp32": 81.0, "llama3-8b-fp16": 129.0, "llama3-8b-bf16": 65.0,
                "llama3-8b-speed": 299.0}
H100_TOKENS = {"llama2-7b-fp32": 32, "llama2-7b-fp16": 32, "llama2-7b-bf16": 32, "llama2-7b-speed": 3 * 24 + 2 * 12,
               "llama3-8b-fp32": 16, "llama3-8b-fp16": 16, "llama3-8b-bf16": 16, "llama3-8b-speed": 3 * 24 + 2 * 12}
FIXED = {"fp16": 39.0, "speed": 40.0}
# The forward stage (forward=compiled's CUDA graphs against eager) has not run on a GPU yet: its seconds are an
# estimate from the stages above (the fp32 stage's lossless part, one timed curve, two profiled decodes), to be
# replaced by a measurement.
FORWARD_GUESS = 150.0


@dataclass
class Stage:
    """One part of the check that runs and is written on its own: ``plan`` (the 70B placement, on ``meta``),
    ``sdpa`` (the tree mask under each attention backend), ``<model>-<dtype>`` (correctness in fp32, fp16 or
    bf16), ``<model>-speed`` (the cost curve, the speed table, host syncs per step against each method's
    ceiling) or ``<model>-forward`` (``forward=compiled``'s CUDA graphs against eager:
    :mod:`specbench.gpucheck.forward`). ``timings``: seconds per check; ``profiles``: torch.profiler's tables per method (speed)."""

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
    every += [Stage(m, k) for k in KINDS if k in ("speed", "forward") or dtypes is None or k in dtypes for m in shapes]
    if not stages:
        return every
    for sel in stages:
        if not any(st.matches(sel) for st in every):
            names = sorted({st.name for st in every} | {st.model for st in every if st.model} | set(KINDS))
            raise ValueError(f"no gpu-check stage '{sel}': choose among {', '.join(names)}")
    return [st for st in every if any(st.matches(sel) for sel in stages)]


def estimate(stage: Stage, tokens: int, speed_tokens: int, sync_tokens: int) -> float:
    """The seconds ``stage`` is expected to take on one H100 at these token counts: its own measurement
    (:data:`H100_SECONDS`) scaled by the tokens it decodes beyond its fixed part."""
    if stage.kind in ("plan", "sdpa"):
        return H100_SECONDS[stage.kind]
    if stage.kind == "forward":
        return FORWARD_GUESS * tokens / 32
    base, fixed = H100_SECONDS[stage.name], FIXED.get(stage.kind, 0.0)
    used = ROUNDS * speed_tokens + 2 * sync_tokens if stage.kind == "speed" else tokens
    return fixed + (base - fixed) * used / H100_TOKENS[stage.name]


def pace(done: list[Stage], estimates: dict[str, float]) -> float:
    """How this machine compares with the estimates so far: the finished stages' seconds over their estimates (1
    before any finished)."""
    ran = [st for st in done if not st.skipped and st.kind not in ("plan", "sdpa")]
    if not ran:
        return 1.0
    return sum(st.seconds for st in ran) / sum(estimates[st.name] for st in ran)
