"""DFlash (z-lab, 2026): a block of guesses drafted in one forward of a small block-diffusion drafter, verified
as a chain by the shared core.

The drafter (:mod:`specbench.drafting.dflash`) reads the target's hidden states after a few of its layers at
every verified position, and drafts the B − 1 tokens after the root at once: the block is the root followed by
B − 1 mask tokens, embedded with the target's embedding; its final states go through the target's LM head,
and each position's argmax is a guess (a chain, as vLLM verifies it). ``block`` caps the block below the
drafter's own size; ``budget=auto`` trims the chain to what pays. The drafter (``head``): ``auto`` reads the
one the model preset names (``heads: dflash:``), else the one trained here (``trained``: ``make train-dflash``,
:mod:`specbench.drafting.dflash_training`, kept in the cache beside the EAGLE heads); or a directory or a hub
repository in z-lab's or speculators' layout (:mod:`specbench.drafting.dflash_files`).

``tree``: ``chain`` (the default) as above; ``best_first`` reads the block as DDTree does
(:mod:`specbench.drafting.dflash_tree`): positions taken as independent, a tree of ``nodes`` guesses (0: as
many as the chain has) grown best first from each position's ``top_k`` tokens by summed log-probability, and
verified in one forward with the tree mask (``budget=auto`` trims its depth and its top-k). Under sampling the
chain draws each position's guess from the drafter's distribution there (the run's temperature, top-k and
top-p, drawn on the device from the drafter's own generator) and sends those distributions as ``q``, so the
core's min(1, p/q) rule keeps the target's distribution; the tree's guesses stay deterministic (no ``q``, the
core's one-hot rule, as EAGLE's): a top-k is not a sample of ``q``. Greedy drafts are argmaxes either way.
When the target's steps are CUDA graphs, the drafter's forward is one graph a step
(:mod:`specbench.drafting.dflash_graph`).
"""

from __future__ import annotations

import copy
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from methods.registry import register_method
from specbench.core.acceptance import SamplingParams, sample_rows, target_probs
from specbench.core.draft import SOURCE_BLOCK, DecodeState, Draft, Drafter, VerifyResult
from specbench.core.forward import runs_on
from specbench.core.kv import upload
from specbench.drafting.dflash import Context
from specbench.drafting.dflash_files import load_dflash, read_shape
from specbench.drafting.dflash_graph import DFlashGraphs
from specbench.drafting.dflash_tree import best_first
from specbench.errors import ConfigError


@dataclass
class DFlashConfig:
    head: str = "auto"  # auto | trained | a directory | a hub repository (z-lab's or speculators' layout)
    block: int = 0  # the most tokens a block holds, the root included (0: the drafter's own block size)
    tree: str = "chain"  # chain: each position's guess; best_first: a tree over the positions' top-k (DDTree)
    nodes: int = 0  # best_first: the most guesses (0: as many as the chain has, B - 1 unless the depth is capped)
    top_k: int = 4  # best_first: the tokens of each position a node may continue with

    def validate(self) -> None:
        if self.block < 0 or self.block == 1:
            raise ValueError(f"dflash: block must be 0 (the drafter's) or at least 2, got {self.block}")
        if self.tree not in ("chain", "best_first"):
            raise ValueError(f"dflash: tree must be chain or best_first, got {self.tree!r}")
        if self.nodes < 0 or self.top_k < 1:
            raise ValueError(f"dflash: nodes must be >= 0 and top_k >= 1, got {self.nodes} and {self.top_k}")


def drafter_dir(head: str, target: str, published: str | None = None, fetch: bool = True) -> Path:
    """The drafter's directory, found as the EAGLE heads' are (:func:`~specbench.drafting.eagle_drafter.head_dir`):
    ``auto`` the preset's published drafter (``published``) else the one trained here, ``trained``, a directory,
    or a hub repository's snapshot (fetched, or from the cache)."""
    from specbench.drafting.eagle_drafter import AUTO, head_dir

    return head_dir(head or AUTO, target, "dflash", fetch, published)


@register_method
class DFlash(Drafter):
    name = "dflash"
    Config = DFlashConfig
    KIND = "dflash"  # the kind of head it reads (tests and gpu-check write a random one of this kind)
    HOST_READS = 1  # the block's guesses (argmaxes, samples, or every position's top-k), read once
    catches_up = True  # the states of every position verified while it did not draft join its next forward

    @classmethod
    def host_reads(cls, config: DFlashConfig, drafted: int) -> int:
        return 1 if drafted else 0

    @classmethod
    def preflight(cls, config: DFlashConfig, run_cfg: Any) -> None:
        from specbench.drafting.eagle_drafter import published_head

        path = drafter_dir(config.head, run_cfg.model.name, published_head(run_cfg.model, "dflash"), fetch=False)
        if path != Path():  # a hub repository not in the cache: the run fetches it
            read_shape(path)

    def __init__(self, config: DFlashConfig | None = None, **kwargs) -> None:
        super().__init__(config, **kwargs)
        target = self.context.target_model
        if target is None:
            raise ConfigError("dflash: needs the target model (DrafterContext.target_model)")
        text = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
        self.embed, self.lm_head = target.get_input_embeddings(), target.get_output_embeddings()
        self.device = runs_on(self.lm_head)
        self.dtype = self.embed.weight.dtype
        from specbench.drafting.eagle_drafter import head_provenance

        published = self.context.target_heads.get("dflash")
        path = drafter_dir(self.config.head, self.context.target_name, published)
        self.head_columns = head_provenance(self.config.head or "auto", path, published)
        self.net = load_dflash(path, text.vocab_size, text.num_hidden_layers, dtype=self.dtype, device=self.device)
        if self.net.s.hidden != text.hidden_size:
            raise ConfigError(f"dflash: the drafter in {self.config.head} reads states of width {self.net.s.hidden}, "
                              f"the target's are {text.hidden_size}: it was trained for another model")
        self.block = min(self.config.block, self.net.s.block) if self.config.block else self.net.s.block
        # the output of target layer t is the input of layer t + 1: what the forward hands over as feature t + 1
        self.feature_layers = tuple(t + 1 for t in self.net.s.taps)
        self.params = self.context.sampling or SamplingParams()
        self.generator = torch.Generator()  # the sampled chain's draws (CPU uniforms, drawn on the device)
        self.graphs = DFlashGraphs(self.net, self.embed, self.lm_head) if self.context.graphs and runs_on(
            self.embed) == self.device else None  # under graphs: a step one graph (specbench/drafting/dflash_graph)
        self.static = self.graphs.new_context() if self.graphs else None
        self.start([])

    def provenance(self) -> dict[str, Any]:
        return self.head_columns

    def spawn(self) -> DFlash:
        """Another request's drafter: the same network (shared weights), a context of its own."""
        twin = copy.copy(self)
        twin.generator = torch.Generator()
        twin.static = self.graphs.new_context() if self.graphs else None
        twin.start([])
        return twin

    def start(self, prompt_ids: list[int]) -> None:
        self.context: Context | None = None
        if self.graphs is not None:  # its buffers kept (the graphs read them), emptied
            self.static = self.static or self.graphs.new_context()
            self.static.length = 0
        self.pending: list[torch.Tensor] = []  # the target's tapped states at positions not yet in the context
        self.generator.manual_seed(self.seed * 1_000_003 + zlib.crc32(np.asarray(prompt_ids, np.int64).tobytes()))

    def _tapped(self, features: dict[int, torch.Tensor]) -> torch.Tensor:
        return torch.cat([features[i].to(self.device, self.dtype, non_blocking=True) for i in self.feature_layers], -1)

    def prefilled(self, features: dict[int, torch.Tensor]) -> None:
        self.pending = [self._tapped(features)]

    def update(self, result: VerifyResult) -> None:
        """The root's and the accepted guesses' states join the context at the next draft (a step that drafts
        nothing costs the drafter no work)."""
        if result.features:
            self.pending.append(self._tapped(result.features))

    @torch.inference_mode()
    def propose(self, state: DecodeState) -> Draft | None:
        depth = min(self.block - 1, state.max_depth)
        if depth < 1 or not self.pending:
            return None
        features = torch.cat(self.pending)
        if self.static is not None and not self.graphs.fits(self.static, features.shape[0], depth + 1):
            self.context, self.static = self.graphs.unpack(self.static), None  # past the buffers: eager from here
        seen = self.static.length if self.static is not None else self.context.length if self.context else 0
        root = len(state.tokens) - 1  # the root's position: every position before it is verified
        if seen + features.shape[0] != root:
            raise RuntimeError(f"dflash: the context covers {seen + features.shape[0]} positions, the root is at {root}")
        ids = upload([state.tokens[-1]] + [self.net.s.mask_token] * depth, runs_on(self.embed))
        self.pending = []
        if self.static is not None:
            logits = self.graphs(self.static, features, ids)
        else:
            block = self.embed(ids).to(self.device, self.dtype)
            positions = torch.arange(seen, root + depth + 1, device=self.device)
            hidden, self.context = self.net(features, block, positions, self.context)
            logits = self.lm_head(hidden[1:])
        if self.config.tree == "best_first":
            top_k = state.top_k(self.config.top_k)
            tree = best_first(logits.float().log_softmax(-1), self.config.nodes or depth, top_k)  # the one read
            return Draft(tokens=tree.tokens, parents=tree.parents, sources=[SOURCE_BLOCK] * len(tree.tokens),
                         tree_width=top_k, needs=tree.needs)
        chain = list(range(-1, depth - 1))
        if self.params.greedy:
            guesses = logits.argmax(-1).tolist()  # the one read of the step
            return Draft(tokens=guesses, parents=chain, sources=[SOURCE_BLOCK] * depth)
        q = target_probs(logits, self.params)  # [depth, V]: position k's guess is drawn from row k - 1
        guesses = sample_rows(q, [self.generator] * depth)  # the one read of the step
        return Draft(tokens=guesses, parents=chain, sources=[SOURCE_BLOCK] * depth, draft_probs=q)
