"""Drafting with an EAGLE head: what ``eagle`` and ``eagle3`` share.

The head reads the target's features of the committed positions, taken from the verification forward
itself (``feature_layers``): after the prefill, the prompt's; after each step, the root's and the accepted
guesses'. Feature ``f_t`` paired with the embedding of token ``t+1`` sits at head position ``t``; the head
keeps a KV cache over those pairs. A step first feeds the pairs committed since the last one (one head
forward), whose last output predicts the feature at the root, hence the first level's tokens; the dynamic
tree (:mod:`specbench.drafting.dynamic_tree`) then grows on the device (:mod:`specbench.drafting.device_tree`:
one head forward per level, one read of the tree a step; one CUDA graph when the target's steps are graphs,
:mod:`specbench.drafting.head_graph`), each node's children reading the node's own predicted feature at
position ``root + depth - 1``. The tree's cache entries are cropped at the next step, when true features
replace them.

The draft is deterministic (top-k tokens, no ``q``): sampling verifies it with the core's multi-candidate
rule for deterministic trees, so the target's distribution is kept; greedy output is the target's.

Where the head is read from (``head``): ``auto`` is the head its authors published for this target when the
model preset names one (``heads:`` in ``conf/model/<model>.yaml``, e.g. ``yuhuili/EAGLE-Vicuna-7B-v1.3``),
else the head trained here; ``trained`` is the head trained here (``make train-eagle-head``, kept in
``$SPECBENCH_CACHE/eagle_heads/<model>__<kind>/``); a directory; or a hub repository (``owner/name``) in
the published format, fetched when the hub is reachable.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from specbench.core.draft import SOURCE_HEAD, DecodeState, Draft, Drafter, VerifyResult
from specbench.core.forward import runs_on, upload
from specbench.drafting.device_tree import ancestors, grow_tensor, read_picked
from specbench.drafting.eagle_head import EagleHead
from specbench.drafting.head_formats import load_head
from specbench.drafting.head_graph import GRAPHED_CONTEXT, TreeGraphs, tree_visibility
from specbench.drafting.head_parts import HeadCache
from specbench.errors import ConfigError
from specbench.models.packed import PackedLinear, pack_linears
from specbench.paths import cache_root

AUTO = "auto"
TRAINED = "trained"
DRAFT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class EagleSettings:
    """The head and EAGLE-2's dynamic tree: ``depth`` levels, the ``top_k`` best children of the ``top_k``
    best nodes per level, the ``total_tokens - 1`` best nodes kept (the reference counts the root)."""

    head: str = AUTO  # auto | trained | a directory | a hub repository (owner/name)
    depth: int = 6
    top_k: int = 10
    total_tokens: int = 60
    draft_dtype: str | None = None  # the head's precision (null: the target's); see draft_head_dtype

    def validate(self) -> None:
        if self.depth < 1 or self.top_k < 1 or self.total_tokens < 2:
            raise ValueError(f"eagle: need depth >= 1, top_k >= 1 and total_tokens >= 2, got {self.depth}, "
                             f"{self.top_k}, {self.total_tokens}")
        check_draft_dtype(self.draft_dtype)


def check_draft_dtype(name: str | None) -> None:
    if name is not None and name not in DRAFT_DTYPES:
        raise ValueError(f"draft_dtype must be null or one of {', '.join(DRAFT_DTYPES)}, got '{name}'")


def draft_head_dtype(name: str | None, lm_head: torch.nn.Module) -> torch.dtype:
    """The precision a head drafts in: ``draft_dtype`` when set, else the target's. Drafting in bfloat16
    under an fp32 target halves the bytes each LM-head call reads (on a CPU, where those reads bound a
    drafting step); verification stays in the target's precision, so the output does not change."""
    return DRAFT_DTYPES[name] if name else lm_head.weight.dtype


def draft_lm_head(lm_head: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """The target's LM head for drafting in ``dtype``: itself, or a copy in that precision (prepacked like it)."""
    if lm_head.weight.dtype == dtype:
        return lm_head
    copy = torch.nn.Linear(lm_head.weight.shape[1], lm_head.weight.shape[0], bias=lm_head.bias is not None,
                           device=lm_head.weight.device, dtype=dtype)
    with torch.no_grad():
        copy.weight.copy_(lm_head.weight)
        if lm_head.bias is not None:
            copy.bias.copy_(lm_head.bias)
    holder = torch.nn.Sequential(copy.requires_grad_(False))
    if isinstance(lm_head, PackedLinear):
        pack_linears(holder)
    return holder[0]


def trained_head_dir(target: str, kind: str) -> Path:
    return cache_root() / "eagle_heads" / f"{target}__{kind}"


def train_command(target: str, kind: str) -> str:
    if kind == "dflash":
        return f"make train-dflash MODEL={target}"
    return f"make train-eagle-head MODEL={target}" + ("" if kind == "eagle" else f" KIND={kind}")


def published_head(model_cfg, kind: str) -> str | None:
    """The hub repository of the head published for this model preset (its ``heads.<kind>``), if any."""
    heads = (model_cfg.get("heads") if model_cfg is not None else None) or {}
    return heads.get(kind) or None


def head_dir(head: str, target: str, kind: str, fetch: bool = True, published: str | None = None) -> Path:
    """The directory to read the head from; a hub repository is fetched (``fetch``) or found in the hub's cache.
    ``published``: the head the model preset names for ``kind`` (what ``auto`` reads first)."""
    if head == AUTO and published:
        return head_dir(published, target, kind, fetch)
    if head in (AUTO, TRAINED):
        path = trained_head_dir(target, kind)
        if not (path / "config.json").is_file():
            raise ConfigError(f"{kind}: no head trained for '{target}' ({path}): train one with "
                              f"`{train_command(target, kind)}` (or set method.head=<dir or hub repo>)")
        return path
    path = Path(head).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ConfigError(f"{kind}: {path} holds no config.json: point method.head at a head's directory")
        return path
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", head):  # a path that is not there, or no repository name
        raise ConfigError(f"{kind}: head '{head}' is neither a directory that exists nor a hub repository "
                          "(owner/name): point method.head at a head's directory, a hub repository, or trained")
    return hub_head(head, kind, fetch)


def hub_head(repo: str, kind: str, fetch: bool) -> Path:
    from huggingface_hub import snapshot_download

    patterns = ["config.json", "*.safetensors", "pytorch_model.bin", "medusa_lm_head.pt"]
    try:
        return Path(snapshot_download(repo, allow_patterns=patterns, local_files_only=True))
    except Exception:  # noqa: BLE001 - not in the cache: fetch it below
        pass
    from specbench import hub

    if not fetch:
        return Path()  # preflight: the run fetches it
    if hub.offline_forced() or not hub.reachable():
        raise ConfigError(f"{kind}: head '{repo}' is not in the hub cache and the hub is unreachable: download it "
                          f"where there is internet (hf download {repo}), or set method.head=trained or =<dir>")
    try:
        return Path(snapshot_download(repo, allow_patterns=patterns))
    except Exception as err:  # noqa: BLE001 - one line for a missing or gated repository
        raise ConfigError(f"{kind}: could not fetch head '{repo}' from the hub ({type(err).__name__}): "
                          "check the name, or set method.head=<dir>") from None


def head_provenance(setting: str, path: Path, published: str | None = None) -> dict[str, str]:
    """What a result row says of the head it read: the setting, where it came from (a hub repository, the
    head trained here, or a directory's name) and a fingerprint of its files (config, training record,
    weights' names and sizes), which a re-trained head changes."""
    import hashlib

    digest = hashlib.sha256()
    for f in sorted(path.iterdir()):
        if f.is_file():
            digest.update(f.name.encode())
            digest.update(f.read_bytes() if f.suffix == ".json" else str(f.stat().st_size).encode())
    if path.parent == cache_root() / "eagle_heads":
        source = "trained here"
    elif setting == AUTO and published:
        source = published
    else:
        source = setting if setting.count("/") == 1 and not Path(setting).expanduser().exists() else path.name
    return {"head": setting, "head_source": source, "head_fingerprint": digest.hexdigest()[:16]}


def preflight_head(setting: str, run_cfg: Any, kind: str) -> None:
    """A run's check, before any model loads, that its head of ``kind`` can be found (fetched at load time)."""
    head_dir(setting, run_cfg.model.name, kind, fetch=False, published=published_head(run_cfg.model, kind))


def resolve_head(name: str, setting: str, context, kind: str) -> tuple[torch.nn.Module, Path, dict[str, str]]:
    """What a head drafter (``name``) reads: the target, its head's directory, and the rows' head columns."""
    if context.target_model is None:
        raise ConfigError(f"{name}: needs the target model (DrafterContext.target_model)")
    published = context.target_heads.get(kind)
    path = head_dir(setting, context.target_name, kind, published=published)
    return context.target_model, path, head_provenance(setting, path, published)


def random_head(kind: str, target_config, directory: Path, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu") -> Path:
    """An untrained head of ``kind`` (eagle, eagle3, medusa, dflash) for a target, saved in its published layout
    in ``dtype`` (initialised on ``device``): what checks of losslessness use (what verification keeps does not
    depend on the head)."""
    if kind == "dflash":
        from specbench.drafting.dflash_files import random_dflash

        return random_dflash(target_config, directory, dtype=dtype, device=device)
    from specbench.drafting.eagle_head import EagleHead, HeadConfig, save_head
    from specbench.drafting.medusa_head import MedusaHeads, save_medusa

    torch.manual_seed(0)
    c = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
    with torch.device(device):
        if kind == "medusa":
            heads = MedusaHeads(c.hidden_size, c.vocab_size, 3).to(dtype)
            return save_medusa(heads, directory, {"accuracy": [[0.5, 0.3, 0.1], [0.4, 0.2], [0.3]]})
        return save_head(EagleHead(HeadConfig.for_target(kind, c)).to(dtype), directory)


class HeadDrafter(Drafter):
    """EAGLE-2's drafting with an EAGLE-1/2 or EAGLE-3 head (``KIND``)."""

    KIND: ClassVar[str] = "eagle"
    catches_up = True  # the head feeds on the features of every token committed while it did not draft

    @classmethod
    def host_reads(cls, config: EagleSettings, drafted: int) -> int:
        return 1 if drafted else 0  # the tree, grown on the device, read once

    @classmethod
    def preflight(cls, config: EagleSettings, run_cfg: Any) -> None:
        preflight_head(config.head, run_cfg, cls.KIND)

    @classmethod
    def extra_params(cls, config: EagleSettings, shape: Any) -> int:
        """The head beside the target (a batch's memory check): one decoder layer and the fusing ``fc`` (two
        hidden widths in for EAGLE, three for EAGLE-3, whose head also has an LM head of its own)."""
        h = shape.hidden
        return shape.layer_params() + (2 * h * h if cls.KIND == "eagle" else 3 * h * h + h * shape.vocab)

    def __init__(self, config: EagleSettings | None = None, **kwargs) -> None:
        super().__init__(config, **kwargs)
        target, path, self.head_columns = resolve_head(self.name, self.config.head, self.context, self.KIND)
        head = load_head(path, target.config)
        if head.c.kind != self.KIND:
            raise ConfigError(f"{self.name}: the head in {self.config.head} is an {head.c.kind} head: "
                              f"use method={head.c.kind}")
        self.embed = target.get_input_embeddings()
        target_lm = target.get_output_embeddings()
        device = runs_on(target_lm)  # beside the LM head it reads (features are brought here)
        self.dtype = draft_head_dtype(self.config.draft_dtype, target_lm)
        self.lm_head = draft_lm_head(target_lm, self.dtype) if head.c.kind == "eagle" else target_lm
        self.head: EagleHead = head.to(device=device, dtype=self.dtype).eval()
        if head.c.own_embedding:  # a speculators head's own table (vLLM embeds with it), else the target's
            self.embed = self.head.embed_tokens
        if isinstance(target_lm, PackedLinear):  # the target's layers are prepacked (hardware.linear): the head's too
            pack_linears(self.head)
        self.device = device
        self.feature_layers = self.head.feature_layers
        self.trees: TreeGraphs | None = None  # the tree as a graph a step, when the target's steps are graphs
        c = self.head.c
        if self.context.graphs and not c.sliding_window and (c.rope_scaling or {}).get("rope_type") != "dynamic":
            positions = min(GRAPHED_CONTEXT, int(getattr(target.config, "max_position_embeddings", 4096)))
            self.trees = TreeGraphs(c.num_key_value_heads, c.head_dim, positions + self.config.depth * self.config.top_k,
                                    self.dtype, device)
        self.cache = self.trees.new_cache() if self.trees else HeadCache()
        # the target's states of positions start … start + n - 1, fused when the head next drafts
        self.pending: list[dict[int, torch.Tensor]] | None = None
        self.start_pos = 0
        self.root_pos = 0

    def provenance(self) -> dict[str, Any]:
        return self.head_columns

    def spawn(self) -> HeadDrafter:
        """Another request's drafter: the same head and LM head (shared weights), a head cache of its own."""
        twin = copy.copy(self)
        twin.cache = self.trees.new_cache() if self.trees else HeadCache()
        twin.start([])
        return twin

    def start(self, prompt_ids: list[int]) -> None:
        if self.trees:  # its buffers kept (the tree's graphs read them), emptied
            self.cache.crop(0)
        else:
            self.cache = HeadCache()
        self.pending, self.start_pos = None, 0

    def _fuse(self, features: dict[int, torch.Tensor]) -> torch.Tensor:
        # a sharded target's layers hand their states over on their own GPUs: the head reads them on its own
        return self.head.fuse({i: f.to(self.device, self.dtype, non_blocking=True) for i, f in features.items()})

    def prefilled(self, features: dict[int, torch.Tensor]) -> None:
        self.pending, self.start_pos = [features], 0

    def update(self, result: VerifyResult) -> None:
        """Keep the step's states unfused: a step that drafts nothing (``budget=auto``) costs the head no work;
        it fuses and catches up on them all at once when it drafts again."""
        if self.pending is None:
            self.pending, self.start_pos = [result.features], self.root_pos
        else:
            self.pending.append(result.features)

    def _embed(self, tokens: list[int]) -> torch.Tensor:
        ids = upload(tokens, runs_on(self.embed))
        return self.embed(ids).to(self.device, self.dtype, non_blocking=True)

    def _logprobs(self, hidden: torch.Tensor) -> torch.Tensor:
        """[n, V] log-probabilities over the target's vocabulary (EAGLE-3's draft vocabulary scattered into it)."""
        lp = torch.log_softmax(self.head.logits(hidden, self.lm_head).float(), -1)
        if self.head.c.kind == "eagle":
            return lp
        full = torch.full((lp.shape[0], self.vocab_size), float("-inf"), device=lp.device)
        ids = self.head.to_target_ids(torch.arange(lp.shape[1], device=lp.device))
        return full.index_copy_(1, ids, lp)

    def catch_up(self, tokens: list[int]) -> torch.Tensor | None:
        """Feed the head the pairs committed since the last step (``tokens``: the sequence, its root last);
        returns its predicted feature at the root ([1, H]), or None before any feature came. A drafter that
        drafts otherwise this step (SAM-Decoding's long matches) calls it alone, to keep the head's cache whole."""
        self.root_pos = len(tokens) - 1
        if self.pending is None:
            return None
        s, pending = self.start_pos, self.pending
        self.pending = None
        states = pending[0] if len(pending) == 1 else {i: torch.cat([p[i] for p in pending]) for i in pending[0]}
        feats = self._fuse(states)[: self.root_pos - s]
        self.cache.crop(s)  # the last tree's entries go; true features follow
        m = feats.shape[0]
        vis = upload(torch.ones(m, s + m, dtype=torch.bool).tril(s), self.device)
        positions = torch.arange(s, s + m, device=self.device)
        return self.head(feats, self._embed(tokens[s + 1 : s + m + 1]), positions, self.cache, vis)[-1:]

    def propose(self, state: DecodeState) -> Draft | None:
        return self.propose_rows([self], [state])[0]

    @staticmethod
    def propose_rows(drafters: list[HeadDrafter], states: list[DecodeState]) -> list[Draft | None]:
        """The drafts of several requests (a batch) whose drafters share one head, grown in lockstep on the device
        (:meth:`_grow`): each tree level of every row in one head forward (projections over all rows, attention
        over each row's cache), the tree read to the host once a step; alone, under graphs, the tree is one
        graph's replay (:mod:`specbench.drafting.head_graph`). A row drafts what it would alone."""
        out: list[Draft | None] = [None] * len(drafters)
        rows = []  # (index, drafter, state, the head's feature at its root)
        for i, (d, state) in enumerate(zip(drafters, states, strict=True)):
            if state.max_depth < 1:  # nothing worth drafting: the head catches up when it drafts again
                d.root_pos = len(state.tokens) - 1
                continue
            root = d.catch_up(state.tokens)
            if root is not None:
                rows.append((i, d, state, root))
        if not rows:
            return out
        first, c = rows[0][1], rows[0][1].config
        top_ks = [state.top_k(c.top_k) for _, _, state, _ in rows]
        width = min(max(top_ks), first.vocab_size)
        shape = ([min(c.depth, state.max_depth) for _, _, state, _ in rows], [min(k, width) for k in top_ks],
                 c.total_tokens - 1)  # depths, top-ks, nodes
        d = rows[0][1]
        if len(rows) == 1 and first.trees is not None and first.trees.fits(d.cache, width, shape[0][0]):
            core = copy.copy(first)  # the weights without a request's state: a graph keeps what it closes over
            core.cache = core.pending = None

            def grow(root, prefix, start, make_rows, span):  # the tree's device part, in a graph
                return core._grow(root, [(prefix, start, make_rows(start), span)], width, *shape)

            picked = first.trees.run(grow, d.cache, rows[0][3], d.root_pos, (width, shape[0][0], shape[2], shape[1][0]))
        else:
            seqs = [(d.root_pos, len(d.cache), d.cache, None) for _, d, _, _ in rows]
            picked = first._grow(torch.cat([root for *_, root in rows]), seqs, width, *shape)
        drafts = read_picked(picked)
        for (i, *_), (toks, parents, needs), top_k in zip(rows, drafts, top_ks, strict=True):
            out[i] = Draft(tokens=toks, parents=parents, sources=[SOURCE_HEAD] * len(toks), tree_width=top_k,
                           needs=needs)
        return out

    def _grow(self, feats: torch.Tensor, seqs: list[tuple], width: int, depths: list[int], top_ks: list[int],
              nodes: int) -> torch.Tensor:
        """The trees of ``seqs`` from their roots' predicted features ``feats`` [R, H], on the device
        (:func:`~specbench.drafting.device_tree.grow_tensor`), a level of every row in one head forward. Per row:
        its committed prefix's length, where its tree starts in its cache, the cache, and the span a level attends
        over (None: the entries so far; a graph's fixed span otherwise)."""
        n, own = len(seqs), torch.eye(width, dtype=torch.bool, device=self.device)
        seen = feats.new_zeros(n, width, 0, dtype=torch.bool)  # each node's ancestors among the tree's entries

        def expand(level: int, parent_slots: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
            nonlocal feats, seen
            if level:  # a node reads its parent's predicted feature
                feats = feats.gather(1, parent_slots[..., None].expand(-1, -1, feats.shape[-1]))
                seen = ancestors(seen, parent_slots, width)
            else:
                feats = feats[:, None].expand(-1, width, -1)
            parts = [(width, cache, tree_visibility(prefix, start, torch.cat([seen[r], own], -1),
                                                    span or start + (level + 1) * width))
                     for r, (prefix, start, cache, span) in enumerate(seqs)]
            positions = torch.cat([torch.zeros(width, dtype=torch.long, device=self.device) + prefix + level
                                   for prefix, *_ in seqs])
            ids = tokens.reshape(-1).to(runs_on(self.embed))
            made = self.head(self.head.feed(feats.reshape(n * width, -1)),
                             self.embed(ids).to(self.device, self.dtype, non_blocking=True), positions,
                             parts[0][1], parts[0][2], parts if n > 1 else None)
            feats = made.view(n, width, -1)
            return self._logprobs(made)

        return grow_tensor(self._logprobs(feats), expand, depths=depths, top_ks=top_ks, nodes=nodes)
