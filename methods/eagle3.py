"""EAGLE-3 (Li et al. 2025): a head over fused low, middle and high target features, with a reduced draft
vocabulary, and EAGLE-2's dynamic tree, verified by the shared core.

The head (:mod:`specbench.drafting.eagle_head`, ``kind: eagle3``) fuses the target's states at the inputs
of layers 2, L/2 and L-3 (or those its config names), predicts over its own vocabulary (mapped to the target's by ``d2t``) and feeds
its own output back for deeper levels; the tree is EAGLE-2's (:mod:`specbench.drafting.dynamic_tree`).
The budget EAGLE-3's and Spec-Bench's evaluation scripts run: 6 levels (their ``depth`` 5 plus the first),
top-k 10, 60 tokens with the root (the reference loader's own default is 8 levels).
"""

from __future__ import annotations

from dataclasses import dataclass

from methods.registry import register_method
from specbench.drafting.eagle_drafter import EagleSettings, HeadDrafter


@dataclass
class Eagle3Config(EagleSettings):
    depth: int = 6  # as conf/method/eagle3.yaml: the evaluation scripts' depth 5 plus the first level


@register_method
class Eagle3(HeadDrafter):
    name = "eagle3"
    Config = Eagle3Config
    KIND = "eagle3"
