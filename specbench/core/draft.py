"""What a drafter proposes, what verification returns, and the drafter protocol.

A step verifies ``[root] + guesses + auxiliary`` in one forward pass, where
*root* is the last committed token (its KV is not yet in the cache).

* **Guesses** form a tree: ``parents[i]`` is the index of the guess that
  precedes guess ``i`` (``-1`` = the root). A guess sees the committed prefix,
  the root and its ancestors, and sits at position ``root_pos + depth``.
  Siblings are tried in index order (priority order for sampling).
* **Auxiliary nodes** are not guesses (Lookahead's Jacobi window, SPECTRA's
  candidate pool): they carry explicit positions (offsets from the root) and
  an explicit visibility matrix among themselves; they always see the
  committed prefix and the root, never a guess. Their logits come back to the
  drafter in :class:`VerifyResult`. They are never accepted and never kept in
  the cache.

An empty draft is a normal answer: the step is plain autoregressive decoding.

Drafts sampled from a draft model (``draft_probs`` set) are kept as chains: two siblings drawn i.i.d. from the
same ``q`` are two guesses, never one, so :meth:`Draft.from_sequences` (which merges equal prefixes) is for
deterministic guesses only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np
import torch

from specbench.core.memory import MEMORY_SCOPES, ScopedMemory, check_memory  # noqa: F401  (re-exported)

# Well-known draft sources, for acceptance-by-source statistics.
SOURCE_PROMPT = "prompt"  # copied from prompt + output (prompt lookup)
SOURCE_NGRAM = "ngram"  # an n-gram table (ANPD)
SOURCE_POOL = "pool"  # Lookahead's n-gram pool
SOURCE_FWD = "fwd_dict"  # SPECTRA forward dictionary
SOURCE_BWD = "bwd_dict"  # SPECTRA backward dictionary
SOURCE_RETRIEVAL = "retrieval"  # an external datastore (REST, SPECTRA-RETRIEVAL)
SOURCE_MODEL = "draft_model"  # a draft language model
SOURCE_RECYCLE = "recycle"  # candidates the target proposed earlier (Token Recycling's matrix)
SOURCE_HISTORY = "history"  # earlier outputs of the same run (SuffixDecoding's global tree)
SOURCE_HEAD = "head"  # a trained head over the target's hidden states (EAGLE, Medusa)
SOURCE_BLOCK = "block"  # a block drafted in one forward from the target's states (DFlash)
# Every source's label in reports and figures: a new source is added here, or its figure label is its id.
SOURCE_LABELS = {SOURCE_PROMPT: "prompt lookup", SOURCE_NGRAM: "n-gram table", SOURCE_POOL: "n-gram pool",
                 SOURCE_FWD: "forward dict", SOURCE_BWD: "backward dict", SOURCE_RETRIEVAL: "retrieval",
                 SOURCE_MODEL: "draft model", SOURCE_RECYCLE: "recycled candidates", SOURCE_HISTORY: "earlier outputs",
                 SOURCE_HEAD: "trained head", SOURCE_BLOCK: "DFlash block drafter"}

@dataclass
class Draft:
    """One step's proposal. All lists of guesses have the same length."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    # Where each guess came from; a node several sources proposed holds a tuple of them
    # (each source is credited, see :meth:`sources_of`).
    sources: list[str | tuple[str, ...]] | None = None
    # Optional draft distribution per guess: [n_guesses, vocab] probabilities q
    # of the distribution the guess was sampled from (draft-model methods).
    draft_probs: torch.Tensor | None = None
    aux_tokens: list[int] = field(default_factory=list)
    aux_positions: list[int] = field(default_factory=list)  # offsets from the root (>= 1)
    aux_visible: np.ndarray | None = None  # bool [n_aux, n_aux]: row i sees column j
    # Which auxiliary nodes' logits the drafter needs (None = all): the output layer
    # then runs only on the root, the guesses and these rows.
    aux_logit_rows: list[int] | None = None
    # The column of each auxiliary node, for drafters whose aux nodes are independent columns (SPECTRA's
    # pool sequences): nodes of columns < w, sent alone, make a valid narrower block (``budget=auto``
    # chooses w). None: the aux nodes go all or none.
    aux_columns: list[int] | None = None
    # Seconds the drafter spent searching external stores (datastore lookups) in this proposal,
    # recorded apart from the rest of drafting.
    lookup_s: float = 0.0
    # A tree drafted level by level with a top-k (EAGLE-2's): the top-k it was drafted with (0: not such a
    # tree), and per guess the narrowest top-k that surely drafts it too (``budget=auto`` learns from them
    # which top-k pays, DecodeState.width_cap).
    tree_width: int = 0
    needs: list[int] | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def n_aux(self) -> int:
        return len(self.aux_tokens)

    @property
    def aux_width(self) -> int:
        """Columns of the aux nodes (1 for aux nodes without columns, 0 without aux nodes)."""
        if not self.aux_tokens:
            return 0
        return max(self.aux_columns) + 1 if self.aux_columns else 1

    @property
    def empty(self) -> bool:
        return not self.tokens and not self.aux_tokens

    @classmethod
    def chain(cls, tokens: list[int], source: str, draft_probs: torch.Tensor | None = None) -> Draft:
        """A single sequence of guesses."""
        return cls(tokens=list(tokens), parents=list(range(-1, len(tokens) - 1)), sources=[source] * len(tokens),
                   draft_probs=draft_probs)

    @classmethod
    def from_sequences(cls, seqs: list[list[int]], sources: list[str]) -> Draft:
        """A tree from several guess sequences, merging shared prefixes (a trie).

        Siblings keep the order in which the sequences are listed (priority
        order). A node that sequences of several sources pass through records
        all of them, in the order they first reached it.
        For deterministic guesses only: merging two sequences sampled from a
        draft model would count two i.i.d. draws as one guess.
        """
        tokens: list[int] = []
        parents: list[int] = []
        node_sources: list[str | tuple[str, ...]] = []
        children: dict[tuple[int, int], int] = {}
        for seq, src in zip(seqs, sources, strict=True):
            parent = -1
            for tok in seq:
                key = (parent, int(tok))
                node = children.get(key)
                if node is None:
                    node = len(tokens)
                    children[key] = node
                    tokens.append(int(tok))
                    parents.append(parent)
                    node_sources.append(src)
                else:
                    have = node_sources[node]
                    have_t = have if isinstance(have, tuple) else (have,)
                    if src not in have_t:
                        node_sources[node] = (*have_t, src)
                parent = node
        return cls(tokens=tokens, parents=parents, sources=node_sources)

    def sources_of(self, i: int) -> tuple[str, ...]:
        """Every source that proposed guess ``i`` (``("unknown",)`` when the drafter named none)."""
        if self.sources is None:
            return ("unknown",)
        src = self.sources[i]
        return src if isinstance(src, tuple) else (src,)

    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def depths(self) -> list[int]:
        """Depth of every guess (1 for a child of the root)."""
        depth: list[int] = []
        for i, p in enumerate(self.parents):
            if p >= i:
                raise ValueError(f"draft parent {p} of node {i} must precede it")
            depth.append(1 if p < 0 else depth[p] + 1)
        return depth

    def children(self) -> list[list[int]]:
        """children[0] are the root's children; children[i + 1] those of guess i."""
        kids: list[list[int]] = [[] for _ in range(len(self.tokens) + 1)]
        for i, p in enumerate(self.parents):
            kids[p + 1].append(i)
        return kids

    def keep(self, nodes: list[int]) -> Draft:
        """The guesses ``nodes`` (ascending, closed under parents), re-indexed; no aux nodes."""
        new_index = {old: new for new, old in enumerate(nodes)}
        return Draft(
            tokens=[self.tokens[i] for i in nodes],
            parents=[-1 if self.parents[i] < 0 else new_index[self.parents[i]] for i in nodes],
            sources=None if self.sources is None else [self.sources[i] for i in nodes],
            draft_probs=None if self.draft_probs is None else self.draft_probs[nodes],
            lookup_s=self.lookup_s,
            tree_width=self.tree_width,
            needs=None if self.needs is None else [self.needs[i] for i in nodes],
        )

    def cut(self, max_depth: int) -> Draft:
        """The guesses no deeper than ``max_depth`` (a depth-d guess needs d tokens of budget); no aux nodes."""
        return self.keep([i for i, d in enumerate(self.depths()) if d <= max_depth])

    def validate(self) -> None:
        n = len(self.tokens)
        if len(self.parents) != n:
            raise ValueError("draft: tokens and parents differ in length")
        if self.sources is not None and len(self.sources) != n:
            raise ValueError("draft: tokens and sources differ in length")
        if self.draft_probs is not None and self.draft_probs.shape[0] != n:
            raise ValueError("draft: draft_probs must have one row per guess")
        if self.needs is not None and len(self.needs) != n:
            raise ValueError("draft: needs must name one top-k per guess")
        self.depths()
        m = len(self.aux_tokens)
        if len(self.aux_positions) != m:
            raise ValueError("draft: aux_tokens and aux_positions differ in length")
        if m and (self.aux_visible is None or self.aux_visible.shape != (m, m)):
            raise ValueError("draft: aux_visible must be a [n_aux, n_aux] bool matrix")
        if self.aux_columns is not None and len(self.aux_columns) != m:
            raise ValueError("draft: aux_columns must name one column per aux node")


@dataclass
class VerifyResult:
    """What one verification step decided."""

    accepted_nodes: list[int]  # guess indices on the accepted path, root first to last
    tokens: list[int]  # accepted guess tokens + the target's own next token
    draft: Draft
    # logits of the auxiliary nodes: [n_aux, vocab], or one row per draft.aux_logit_rows entry
    aux_logits: torch.Tensor | None = None
    root_logits: torch.Tensor | None = None  # [vocab] logits after the root (for drafters that want them)
    # [1 + n_guesses, vocab]: the rows the acceptance rule read (row 0 follows the root, row 1 + i
    # follows guess i), a view of the forward's output, not a copy. Drafters that learn from the
    # target's predictions at every guess (Token Recycling) read it.
    logits: torch.Tensor | None = None
    # The target's hidden states of the root and the accepted guesses, in that order ({layer: [1 + n_accepted,
    # hidden]}), for the layers the drafter's ``feature_layers`` names; {} for a drafter that names none.
    features: dict[int, torch.Tensor] = field(default_factory=dict)

    @property
    def n_accepted(self) -> int:
        return len(self.accepted_nodes)


@dataclass
class DecodeState:
    """What a drafter may read when proposing.

    ``tokens`` is the source of truth for what has been committed: it includes
    the prefill's token (which no ``update`` reports) and reflects truncation at
    EOS or ``max_new_tokens``.
    """

    tokens: list[int]  # prompt + committed output; tokens[-1] is the root
    prompt_len: int
    max_new_tokens: int
    step: int = 0
    depth_cap: int | None = None  # budget=auto: the deepest guess worth drafting this step (0: none)
    width_cap: int | None = None  # budget=auto: the widest top-k worth drafting a tree with (None: the method's)

    @property
    def new_tokens(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def remaining(self) -> int:
        """Tokens the generation may still take."""
        return self.max_new_tokens - self.new_tokens

    @property
    def max_depth(self) -> int:
        """The deepest guess that can still be kept (the target adds one token after the accepted ones), and
        that is worth drafting: a drafter that finds it below 1 drafts nothing and skips what it can."""
        deepest = self.remaining - 1
        return deepest if self.depth_cap is None else min(deepest, self.depth_cap)

    def top_k(self, full: int) -> int:
        """The top-k to draft a tree with, of the method's ``full``: narrower where ``budget=auto`` found it pays."""
        return full if self.width_cap is None else max(1, min(full, self.width_cap))


class Planner(Protocol):
    """What the decode loop asks of a draft planner (``budget=auto``): trim each draft to what pays, learn from
    what was accepted, close the generation (``start(prompt_len)``, optional, opens it). It imports no planner."""

    def cap(self) -> int | None: ...  # before the step's proposal: its DecodeState.depth_cap (then width_cap,
    # when the planner has one, is read as DecodeState.width_cap)

    def plan(self, draft: Draft, seq: list[int]) -> Draft: ...
    def record(self, draft: Draft, path: list[int], draft_s: float = 0.0) -> None: ...  # draft_s: the drafting
    def finish(self, seq: list[int]) -> None: ...


@dataclass
class DrafterContext:
    """What a drafter that runs a model of its own may need beyond its config (built by the runner and tests).

    * ``sampling``: the run's :class:`specbench.core.acceptance.SamplingParams` (a draft model's ``q`` uses them).
    * ``device``, ``dtype``, ``hardware``, ``graphs``: where, in which precision and on what hardware the target
      runs, and whether its steps are CUDA graphs (``forward=compiled`` on a GPU: a head's forward is one too).
    * ``load_model(name)``: a model preset (``conf/model/<name>.yaml``) loaded through
      :func:`specbench.models.load_model` on the target's hardware and dtype, with the same one-line errors.
    * ``target_model``, ``target_name``, ``target_heads``: the target itself (self-drafting shares its weights),
      its preset name (the identity of trained heads), the heads published for it ({kind: hub repo}).
    * ``forward_cost(q, context)``, ``reference(prompt)``: the run's cost curve and a prompt's greedy output, made
      before the timed generation, for a drafter that drafts the answer (``needs_reference``: the oracle).
    """

    sampling: Any = None
    device: torch.device | None = None
    dtype: torch.dtype | None = None
    load_model: Callable[[str], Any] | None = None
    target_model: torch.nn.Module | None = None
    target_name: str = ""
    hardware: Any = None
    graphs: bool = False
    target_heads: dict[str, str] = field(default_factory=dict)
    forward_cost: Callable[[int, int], float] | None = None
    reference: Callable[[list[int]], list[int]] | None = None


class Drafter:
    """Base class of every method: ``propose`` a draft, ``update`` from the result.

    Subclasses set ``name`` and ``Config`` (a dataclass of hyperparameters that
    the method's YAML fills) and are registered with
    :func:`methods.registry.register_method`. A drafter never touches the
    target's KV cache; it sees tokens and, for auxiliary nodes, logits.
    """

    name: ClassVar[str] = "base"
    Config: ClassVar[type] = object
    # True when drafts may branch or carry auxiliary nodes: they need a custom 4-D attention mask,
    # which flash_attention_2 cannot express. Methods that only ever propose one chain set False.
    tree_drafts: ClassVar[bool] = True
    # budget=auto (specbench.budget) may trim this method's drafts before the forward; the sources
    # its auxiliary nodes feed (their worth is judged by those sources' acceptance).
    budget_auto: ClassVar[bool] = True
    AUX_FEEDS: ClassVar[tuple[str, ...]] = ()
    # The target's hidden states this drafter reads (``output_hidden_states`` indices: -1 the final norm's), from
    # the verification forward itself, accepted rows only (VerifyResult.features, the prompt's in prefilled).
    feature_layers: tuple[int, ...] = ()
    batchable: ClassVar[bool] = True  # False: its drafts cannot be made per request beside others (batch > 1)
    HOST_READS: ClassVar[int] = 0  # device→host reads drafting adds to a step (GPU syncs; specbench.gpucheck.syncs)
    needs_reference: ClassVar[bool] = False  # the oracle: DrafterContext.reference and forward_cost are given
    catches_up: bool = False  # after steps it did not draft, its next draft first feeds it the tokens they committed

    @classmethod
    def host_reads(cls, config: Any, drafted: int) -> int:
        """The most host reads drafting adds to a greedy step that drafted ``drafted`` guesses (:data:`HOST_READS`
        unless a subclass counts them from its settings)."""
        return cls.HOST_READS

    def __init__(
        self,
        config: Any = None,
        *,
        vocab_size: int,
        seed: int = 0,
        tokenizer: Any = None,
        context: DrafterContext | None = None,
    ) -> None:
        """``config`` defaults to ``Config()`` and is validated here (its ``validate()``, when it has one):
        a subclass's ``__init__`` calls this first and reads ``self.config``."""
        if config is None and dataclasses.is_dataclass(self.Config):
            config = self.Config()
        check = getattr(config, "validate", None)
        if callable(check):
            check()
        self.config = config
        self.vocab_size = vocab_size
        self.seed = seed
        self.tokenizer = tokenizer
        self.context = context or DrafterContext()

    @classmethod
    def preflight(cls, config: Any, run_cfg: Any) -> None:
        """Checks that need no model (files exist, settings agree), run before the model loads.
        Raise specbench.run.config.ConfigError with one line naming the fix."""

    def spawn(self) -> Drafter:
        """A drafter for another request decoded beside this one's (batch > 1): same settings, own state."""
        return type(self)(self.config, vocab_size=self.vocab_size, seed=self.seed, tokenizer=self.tokenizer,
                          context=self.context)

    def provenance(self) -> dict[str, Any]:
        """Columns this drafter adds to its result rows: what it read besides the model (a store's name,
        fingerprint and size). None by default."""
        return {}

    def new_turn(self, prompt_ids: list[int]) -> None:
        """What the decode loop calls as a generation begins (each turn of each sample): turn-scoped
        memory is forgotten (:meth:`begin_turn`), then :meth:`start` sees the prompt. Not overridden."""
        self.begin_turn()
        self.start(prompt_ids)

    def begin_turn(self) -> None:
        """Forget what is kept for one turn only (:class:`ScopedMemory` with ``memory: turn``)."""

    def start(self, prompt_ids: list[int]) -> None:
        """A new generation begins (each sample and each turn), after :meth:`begin_turn`."""

    def begin_sample(self) -> None:
        """A new sample begins (before its first turn): per-sample memory may be forgotten."""

    def reset(self) -> None:
        """Forget everything learned (the runner calls it after warm-up: run-long memory starts empty)."""

    def prefilled(self, features: dict[int, torch.Tensor]) -> None:
        """The prompt's hidden states ({layer: [prompt_len, hidden]}) for the layers :attr:`feature_layers`
        names, after the prefill and before the first :meth:`propose`. Called only when it names some."""

    def propose(self, state: DecodeState) -> Draft | None:
        return None

    def update(self, result: VerifyResult) -> None:
        """Learn from a step's outcome (pools, n-gram tables, statistics)."""
