"""EAGLE-2 (Li et al. 2024): an EAGLE-1 head and a dynamic draft tree, verified by the shared core.

The head (EAGLE-1's: one decoder layer over ``[embedding of the next token, target feature]``, the
target's frozen LM head) predicts the target's next feature from its features so far; EAGLE-2 grows a tree
from it by cumulative draft confidence and keeps the best nodes (:mod:`specbench.drafting.eagle_drafter`,
:mod:`specbench.drafting.dynamic_tree`). The paper's budget: 6 levels (the reference's ``depth`` 5 plus
its first level), top-k 10, 60 tokens with the root. ``head: auto`` reads the head EAGLE's authors
published for the model (``heads.eagle`` of its preset), else the one trained here (``make
train-eagle-head``); ``trained``, a directory or a hub repository in EAGLE's format also work.
"""

from __future__ import annotations

from dataclasses import dataclass

from methods.registry import register_method
from specbench.drafting.eagle_drafter import EagleSettings, HeadDrafter


@dataclass
class EagleConfig(EagleSettings):
    pass


@register_method
class Eagle(HeadDrafter):
    name = "eagle"
    Config = EagleConfig
    KIND = "eagle"
