"""The acceptance rule every method shares.

Given the target's logits at the root and at every guess of a draft tree, walk
the tree from the root and decide which guesses to keep:

* **greedy** (temperature 0): follow the child whose token is the target's
  argmax; at the first miss (or after a full match) append the argmax itself.
* **sampling**: at each node, try its children in priority order. Child ``c``
  with token ``x`` drawn from draft distribution ``q`` is accepted with
  probability ``min(1, p(x) / q(x))``; on rejection the target distribution
  becomes ``norm(max(p - q, 0))`` and the next child is tried. When every child
  fails (or there is none), a token is sampled from what is left.
  Deterministic drafts (n-gram, pool, retrieval) are the one-hot case
  ``q = δ_x``: accept with probability ``p(x)``, on rejection zero ``p(x)`` and
  renormalise (SPECTRA Alg. 4, Lookahead, SpecInfer). Draft-model chains are
  Leviathan et al. / Chen et al. speculative sampling. Either way the output
  follows the target distribution exactly.

Temperature, top-k and top-p shape ``p`` exactly as plain sampling does, so the
autoregressive baseline (an empty draft) samples through the same code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.core.draft import Draft


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Rows of logits → the sampling distribution (temperature, then top-k, then top-p).

    Top-p keeps every token at least as probable as the one at which the
    descending cumulative mass first reaches ``top_p`` (ties at that boundary
    are all kept, so the set does not depend on how a sort orders ties). On a
    CPU only the head of the distribution is ranked (``topk`` of a growing
    size: the nucleus is usually a few dozen tokens, a full sort of the
    vocabulary costs far more); on other devices one full sort, which needs no
    host synchronisation. Greedy (temperature 0) is its limit: one-hot at the
    argmax.
    """
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    scores = logits.float() / params.temperature
    if params.top_k and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = scores.softmax(-1)
    if params.top_p < 1.0:
        size = probs.shape[-1]
        k = min(size, 64) if probs.device.type == "cpu" else size
        while True:
            head = torch.topk(probs, k, dim=-1).values  # sorted, most probable first
            mass = head.cumsum(-1)
            if k == size or bool((mass[..., -1] >= params.top_p).all()):
                break
            k = min(size, k * 8)
        last = (mass < params.top_p).sum(-1, keepdim=True).clamp_max(k - 1)
        probs = probs.masked_fill(probs < head.gather(-1, last), 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(weights: torch.Tensor, generator: torch.Generator | None = None) -> int:
    """One token drawn from non-negative ``weights`` (any scale) on their own device.

    Inverse CDF with one uniform from ``generator`` (a CPU generator): the same
    random stream on every device and one host synchronisation (the result).
    ``u`` lies in (0, 1] and the search takes the first index whose cumulative
    weight reaches ``u`` × total, so a zero-weight token is never drawn.
    """
    u = 1.0 - float(torch.rand((), dtype=torch.float64, generator=generator))
    cdf = weights.double().cumsum(-1)
    return int(torch.searchsorted(cdf, cdf[-1:] * u))


def accept(
    draft: Draft,
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
) -> tuple[list[int], list[int]]:
    """Decide a step. ``logits[0]`` follows the root, ``logits[1 + i]`` follows guess ``i``.

    Returns the accepted guess indices (root to leaf) and the tokens the step
    yields: the accepted guesses' tokens plus one token of the target's own.
    """
    kids = draft.children()
    path: list[int] = []
    if params.greedy:
        if logits.is_cuda:  # one kernel and one transfer for every row
            rows = logits.argmax(-1).tolist()
            best = rows.__getitem__
        else:  # on a CPU only the rows on the walked path (a whole-block argmax costs ms)

            def best(row: int) -> int:
                return int(logits[row].argmax())

        node = -1
        while True:
            target = best(node + 1)
            nxt = next((c for c in kids[node + 1] if draft.tokens[c] == target), None)
            if nxt is None:
                return path, [draft.tokens[i] for i in path] + [target]
            path.append(nxt)
            node = nxt

    # Sampling. Per-node work stays where the logits are; the only host syncs are one
    # bool per accept/reject decision and the final sampled token.
    q_all = None if draft.draft_probs is None else draft.draft_probs.to(logits.device, torch.float32)
    node = -1
    while True:
        p = probs = target_probs(logits[node + 1], params)  # only rows on the walked path
        nxt = None
        for c in kids[node + 1]:
            x = draft.tokens[c]
            q = None if q_all is None else q_all[c]  # None: a deterministic guess, q = δ_x
            r = float(torch.rand((), generator=generator))
            if bool(p[x] > r * (1.0 if q is None else q[x])):  # accept with probability min(1, p(x)/q(x))
                nxt = c
                break
            if q is None:
                p = p.clone()
                p[x] = 0.0
            else:
                p = torch.clamp(p - q, min=0.0)
            total = p.sum()
            p = torch.where(total > 0, p / total, probs)  # total 0 only through rounding (p was q)
        if nxt is None:
            return path, [draft.tokens[i] for i in path] + [sample(p, generator)]
        path.append(nxt)
        node = nxt
