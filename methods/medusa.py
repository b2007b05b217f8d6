"""Medusa (Cai et al. 2024): K heads on the target's last hidden state, a sparse tree of their top-k tokens.

Head i reads the last hidden state of the position that produced the root (handed over by the
verification forward, :attr:`Drafter.feature_layers`) and ranks candidates for the token i + 1 places
after the root; the tree (:mod:`specbench.drafting.medusa_head`) takes, for each path of ranks
``(r1, …, rd)``, head d's r_d-th token under the node of ``(r1, …, r_{d-1})``. One heads pass per step,
no draft forward per level (under ``forward=compiled`` on a GPU, one CUDA graph per rows × depth × width, as the
verification's steps are). ``tree: auto`` builds the ``nodes`` best paths from the head's measured
per-rank accuracies (the paper's construction; a head without them takes ``mc_sim_7b_63``);
``mc_sim_7b_63`` is the paper's tree for Vicuna-7B. Deterministic guesses: lossless for greedy and
sampling alike.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from methods.registry import register_method
from specbench.core.draft import SOURCE_HEAD, DecodeState, Draft, Drafter, VerifyResult
from specbench.core.forward import runs_on
from specbench.core.graphs import StepGraph
from specbench.drafting.eagle_drafter import (
    check_draft_dtype,
    draft_head_dtype,
    draft_lm_head,
    preflight_head,
    resolve_head,
)
from specbench.drafting.medusa_head import MC_SIM_7B_63, best_paths, load_medusa, tree_draft
from specbench.models.packed import PackedLinear, pack_linears

TREES = ("auto", "mc_sim_7b_63")


@dataclass
class MedusaConfig:
    head: str = "auto"  # auto (published for the model, else trained) | trained | a directory | a hub repo
    tree: str = "auto"  # auto: built from the head's measured accuracies | mc_sim_7b_63
    nodes: int = 63  # the tree's size under tree=auto
    draft_dtype: str | None = None  # the heads' precision (null: the target's; bfloat16 halves a CPU's LM-head reads)

    def validate(self) -> None:
        if self.tree not in TREES:
            raise ValueError(f"medusa: tree must be one of {', '.join(TREES)}, got '{self.tree}'")
        if self.nodes < 1:
            raise ValueError(f"medusa: nodes must be >= 1, got {self.nodes}")
        check_draft_dtype(self.draft_dtype)


@register_method
class Medusa(Drafter):
    name = "medusa"
    HOST_READS = 1  # the heads' top-k, read once
    Config = MedusaConfig
    KIND = "medusa"  # the head it reads
    feature_layers = (-1,)

    @classmethod
    def preflight(cls, config: MedusaConfig, run_cfg: Any) -> None:
        preflight_head(config.head, run_cfg, cls.KIND)

    @classmethod
    def extra_params(cls, config: MedusaConfig, shape: Any) -> int:
        """The heads beside the target (a batch's memory check), counted as Medusa-1 publishes them: 5 heads,
        each a residual block and an LM head of its own."""
        return 5 * (shape.hidden * shape.hidden + shape.hidden * shape.vocab)

    def __init__(self, config: MedusaConfig | None = None, **kwargs) -> None:
        super().__init__(config, **kwargs)
        target, path, self.head_columns = resolve_head(self.name, self.config.head, self.context, self.KIND)
        heads, meta = load_medusa(path, target.config)
        target_lm = target.get_output_embeddings()
        self.dtype = draft_head_dtype(self.config.draft_dtype, target_lm)
        self.lm_head = draft_lm_head(target_lm, self.dtype) if heads.tied else None
        self.device = runs_on(target_lm)  # beside the LM head it reads (the final states are brought here)
        self.heads = heads.to(device=self.device, dtype=self.dtype).eval()
        if isinstance(target_lm, PackedLinear):  # the target's layers are prepacked: the heads' too
            pack_linears(self.heads)
        accuracy = meta.get("accuracy")
        if self.config.tree == "auto" and accuracy:
            self.paths = best_paths(accuracy[: len(heads)], self.config.nodes)
        else:
            self.paths = [p for p in MC_SIM_7B_63 if len(p) <= len(heads)]
        self.ranks = [1 + max((p[d] for p in self.paths if len(p) > d), default=-1) for d in range(len(heads))]
        self.features: dict[int, torch.Tensor] | None = None  # the last step's states (the root's row last)
        self.graphs: dict[tuple, StepGraph] | None = {} if self.context.graphs else None  # shared by spawns

    def provenance(self) -> dict[str, Any]:
        return self.head_columns

    def spawn(self) -> Medusa:
        twin = copy.copy(self)  # the same heads (shared weights); the last state is per request
        twin.features = None
        return twin

    def start(self, prompt_ids: list[int]) -> None:
        self.features = None

    def _last(self, features: dict[int, torch.Tensor]) -> torch.Tensor:
        """The final state of the row whose next token is the root, on the heads' device."""
        return features[-1][-1:].to(self.device, self.dtype, non_blocking=True)

    def prefilled(self, features: dict[int, torch.Tensor]) -> None:
        self.features = features

    def update(self, result: VerifyResult) -> None:
        """Keep the step's states: they are brought to the heads when they draft, so a stopped step
        (``budget=auto``) costs the heads nothing."""
        self.features = result.features

    def propose(self, state: DecodeState) -> Draft | None:
        return self.propose_rows([self], [state])[0]

    @staticmethod
    def propose_rows(drafters: list[Medusa], states: list[DecodeState]) -> list[Draft | None]:
        """The trees of several requests (a batch) sharing the heads: every row's heads in one pass over their
        final states and every row's candidates in one read; each row keeps its own depth cap."""
        out: list[Draft | None] = [None] * len(drafters)
        rows = [(i, d, min(len(d.heads), s.max_depth)) for i, (d, s) in enumerate(zip(drafters, states, strict=True))]
        rows = [row for row in rows if row[1].features is not None and row[2] >= 1]
        if not rows:
            return out
        first, deepest = rows[0][1], max(depth for *_, depth in rows)
        widest = max(first.ranks[:deepest])
        # every head's candidates for every row in one read (the first r of a sorted top-R are the top r)
        hidden = torch.cat([d._last(d.features) for _, d, _ in rows])
        ranked = first._ranked(hidden, deepest, widest).tolist() if widest else [[[]] * len(rows)] * deepest
        for k, (i, d, depth) in enumerate(rows):
            top = [ranked[h][k][: d.ranks[h]] for h in range(depth)]
            tokens, parents = tree_draft(d.paths, top)
            out[i] = Draft(tokens=tokens, parents=parents, sources=[SOURCE_HEAD] * len(tokens))
        return out

    def _ranked(self, hidden: torch.Tensor, deepest: int, widest: int) -> torch.Tensor:
        """The ``widest`` best tokens of the first ``deepest`` heads for each row of ``hidden``: [deepest, rows,
        widest]; with graphs, the heads' pass replayed from a graph per (rows, depth, width), its output read
        before the next replay."""
        def step(h: torch.Tensor) -> tuple[torch.Tensor]:
            return (self.heads.logits(h, self.lm_head, first=deepest).topk(widest, dim=-1).indices,)

        if self.graphs is None:
            return step(hidden)[0]
        key = (hidden.shape[0], deepest, widest)
        if key not in self.graphs:
            self.graphs[key] = StepGraph(step, (hidden.clone(),))
        return self.graphs[key](hidden)[0]
