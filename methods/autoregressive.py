"""Autoregressive decoding: the drafter that proposes nothing.

Every step is one target forward yielding one token; it is the baseline every
speedup is measured against, and it runs through the same decode loop as the
other methods so that the comparison is like for like.
"""

from __future__ import annotations

from dataclasses import dataclass

from methods.registry import register_method
from specbench.core.draft import Drafter


@dataclass
class AutoregressiveConfig:
    """No hyperparameters."""


@register_method
class Autoregressive(Drafter):
    name = "autoregressive"
    Config = AutoregressiveConfig
    tree_drafts = False  # one chain per step: plain causal attention
