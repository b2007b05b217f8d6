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

import numpy as np
import torch

from specbench.core.draft import Draft
from specbench.core.forward import upload


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
    return int(_draw(weights, _uniform(generator)))


def _uniform(generator: torch.Generator | None) -> float:
    return 1.0 - float(torch.rand((), dtype=torch.float64, generator=generator))


def _draw(weights: torch.Tensor, u: float) -> torch.Tensor:
    """The token of :func:`sample` for the uniform ``u``, as a 0-dim tensor on the weights' device."""
    cdf = weights.double().cumsum(-1)
    return torch.searchsorted(cdf, cdf[-1:] * u)[0]


def sample_rows(weights: torch.Tensor, generators: list[torch.Generator | None]) -> list[int]:
    """:func:`sample` for each row of ``weights`` (``[n, V]``) from its own generator, in one read: the tokens
    each row draws alone."""
    return _draw_rows(weights, [_uniform(g) for g in generators])


def _draw_rows(weights: torch.Tensor, us: list[float]) -> list[int]:
    """Each row's :func:`_draw` for its uniform ``us[r]``, the uniforms kept at full precision."""
    cdf = weights.double().cumsum(-1)
    return torch.searchsorted(cdf, cdf[:, -1:] * upload(us, cdf.device, torch.float64)[:, None])[:, 0].tolist()


def _decide(p: torch.Tensor, xs: list[int], q: torch.Tensor | None, generator: torch.Generator | None
            ) -> tuple[int, int]:
    """One node of the sampling walk: the index in ``xs`` (its children's tokens, in priority order) of the
    child accepted, else ``len(xs)`` and the token drawn from what every rejection left. ``q``: the children's
    draft distributions ([len(xs), V]), or None for deterministic guesses (q = δ_x).

    Every child's test and the fallback draw are computed on the device without reading anything back, so a
    node costs one host read whatever its number of children; the uniforms come from the CPU ``generator``
    (len(xs) + 1 per node), so every device draws the same stream."""
    m = len(xs)
    r = torch.rand(m, dtype=torch.float64, generator=generator) if m else None
    u = _uniform(generator)
    if not m:
        return 0, int(_draw(p, u))
    r = upload(r, p.device)
    if q is None:
        # child j sees p renormalised after j rejections: accept when p(x_j) > r_j · (mass not yet tried)
        idx = upload(xs, p.device)
        first_try = [x not in xs[:j] for j, x in enumerate(xs)]  # a repeated token has mass 0 by then
        px = p.double()[idx] * upload(first_try, p.device, torch.float64)
        left = p.double().sum() - (px.cumsum(0) - px)
        ok = px > r * left
        rest = p.index_fill(-1, idx, 0.0)
    else:
        rest, oks = p, []
        for j, x in enumerate(xs):  # accept with probability min(1, p(x)/q(x)); else norm(max(p - q, 0))
            oks.append(rest[x] > r[j] * q[j, x])
            rest = torch.clamp(rest - q[j], min=0.0)
            total = rest.sum()
            rest = torch.where(total > 0, rest / total, p)
        ok = torch.stack(oks)
    rest = torch.where(rest.sum() > 0, rest, p)  # all mass tried: only through rounding
    first = torch.where(ok.any(), ok.int().argmax(), m)
    j, token = torch.stack([first, _draw(rest, u)]).tolist()
    return j, token


def accept(
    draft: Draft,
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    argmax: list[int] | None = None,
) -> tuple[list[int], list[int]]:
    """Decide a step. ``logits[0]`` follows the root, ``logits[1 + i]`` follows guess ``i``; greedy, ``argmax``
    may hold every row's argmax already read (a batch reads all of its rows' at once).

    Returns the accepted guess indices (root to leaf) and the tokens the step
    yields: the accepted guesses' tokens plus one token of the target's own.
    """
    kids = draft.children()
    path: list[int] = []
    if params.greedy:
        if argmax is not None:
            best = argmax.__getitem__
        elif logits.is_cuda:  # one kernel and one transfer for every row
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

    # Sampling: one node at a time along the walked path, each with one host read (see _decide).
    q_all = None if draft.draft_probs is None else draft.draft_probs.to(logits.device, torch.float32)
    node = -1
    while True:
        probs = target_probs(logits[node + 1], params)  # only rows on the walked path
        children = kids[node + 1]
        q = None if q_all is None or not children else q_all[upload(children, logits.device)]
        j, token = _decide(probs, [draft.tokens[c] for c in children], q, generator)
        if j == len(children):
            return path, [draft.tokens[i] for i in path] + [token]
        path.append(children[j])
        node = children[j]


def accept_rows(drafts: list[Draft], logits: list[torch.Tensor], params: SamplingParams,
                generators: list[torch.Generator | None]) -> list[tuple[list[int], list[int]]]:
    """:func:`accept` of a batch's rows (or of one row on a GPU), sampling: every row's walk decided on the device,
    one host read for all.

    Row ``r`` walks its tree level by level exactly as :func:`_decide` walks it alone and takes the same
    uniforms from its own generator (drawn before the walk, then the generator is set to where the walk alone
    would have left it), so each row decides what it decides alone. Rows whose draft sends ``q`` for a node
    with several children (the multi-draft rule) are walked one by one."""
    many = any(d.draft_probs is not None and not d.is_chain() for d in drafts)
    if params.greedy or many or any(g is None for g in generators):
        return [accept(d, x, params, g) for d, x, g in zip(drafts, logits, generators, strict=True)]
    device = logits[0].device
    n_rows = len(drafts)
    kids = [d.children() for d in drafts]
    nodes = max(len(d.tokens) for d in drafts) + 1
    width = max(1, max(len(k) for ks in kids for k in ks))
    levels = max((max(d.depths(), default=0) for d in drafts), default=0) + 1
    child = np.zeros((n_rows, nodes, width), dtype=np.int64)  # a node's children (guess index), priority order
    token = np.zeros((n_rows, nodes, width), dtype=np.int64)
    first = np.zeros((n_rows, nodes, width), dtype=np.float64)  # 1 where a child's token is new at its node
    count = np.zeros((n_rows, nodes), dtype=np.int64)
    base = np.zeros(n_rows, dtype=np.int64)  # a row's first logits row among every row's
    q_base = np.full(n_rows, -1, dtype=np.int64)  # its first q row (-1: deterministic guesses)
    uniforms, states, at, q_at = [], [], 0, 0
    for r, (d, ks) in enumerate(zip(drafts, kids, strict=True)):
        for node, cs in enumerate(ks):
            xs = [d.tokens[c] for c in cs]
            child[r, node, : len(cs)], token[r, node, : len(cs)], count[r, node] = cs, xs, len(cs)
            first[r, node, : len(cs)] = [x not in xs[:j] for j, x in enumerate(xs)]
        base[r], at = at, at + 1 + len(d.tokens)
        if d.draft_probs is not None and d.tokens:
            q_base[r], q_at = q_at, q_at + len(d.tokens)
        states.append(generators[r].get_state())
        uniforms.append(torch.rand(sum(len(k) + 1 for k in ks), dtype=torch.float64, generator=generators[r]))
    u_all = torch.nn.utils.rnn.pad_sequence(uniforms, batch_first=True, padding_value=0.5)
    flat = torch.cat([x[: 1 + len(d.tokens)] for d, x in zip(drafts, logits, strict=True)])
    qs = [d.draft_probs for d in drafts if d.draft_probs is not None and d.tokens]
    q_flat = torch.cat(qs).to(device, torch.float32) if qs else None
    child, token, first, count, base, q_base, u_all = (
        upload(a, device) for a in (child, token, first, count, base, q_base, u_all))
    rows = torch.arange(n_rows, device=device)
    cur = torch.zeros(n_rows, dtype=torch.int64, device=device)  # the node each row stands on (0: the root)
    used = torch.zeros(n_rows, dtype=torch.int64, device=device)  # uniforms taken so far
    live = torch.ones(n_rows, dtype=torch.bool, device=device)
    out = torch.zeros(n_rows, dtype=torch.int64, device=device)  # the token each row draws at its last node
    path = torch.full((n_rows, levels), -1, dtype=torch.int64, device=device)
    slots = torch.arange(width, device=device)
    for level in range(levels):
        p = target_probs(flat.index_select(0, base + cur), params)
        m, xs, cs = count[rows, cur], token[rows, cur], child[rows, cur]
        valid = slots[None] < m[:, None]
        r_j = u_all.gather(1, (used[:, None] + slots[None]).clamp_max(u_all.shape[1] - 1))
        u = 1.0 - u_all.gather(1, (used + m).clamp_max(u_all.shape[1] - 1)[:, None])[:, 0]
        pd = p.double()
        px = pd.gather(1, xs) * first[rows, cur] * valid
        ok_d = (px > r_j * (pd.sum(-1, keepdim=True) - (px.cumsum(1) - px))) & valid
        hits = torch.zeros_like(p).scatter_add_(1, xs, valid.to(p.dtype))
        rest_d = p.masked_fill(hits > 0, 0.0)
        with_q = (q_base >= 0) & (m > 0)
        if q_flat is not None:
            q = q_flat.index_select(0, torch.where(q_base >= 0, q_base + cs[:, 0], 0))  # a chain: node k's child is guess k
            x0 = xs[:, :1]
            ok_q = (p.gather(1, x0) > r_j[:, :1] * q.gather(1, x0)) & valid[:, :1]
            left = torch.clamp(p - q, min=0.0)
            total = left.sum(-1, keepdim=True)
            rest_q = torch.where(total > 0, left / total, p)
            ok = torch.where(with_q[:, None], torch.nn.functional.pad(ok_q, (0, width - 1)), ok_d)
            rest = torch.where(with_q[:, None], rest_q, rest_d)
        else:
            ok, rest = ok_d, rest_d
        rest = torch.where(rest.sum(-1, keepdim=True) > 0, rest, p)
        hit = ok.any(1)
        pick = ok.int().argmax(1)
        cdf = rest.double().cumsum(-1)
        drawn = torch.searchsorted(cdf, cdf[:, -1:] * u[:, None])[:, 0]
        nxt = cs.gather(1, pick[:, None])[:, 0]
        stop = live & ~hit
        out = torch.where(stop, drawn, out)
        path[:, level] = torch.where(live & hit, nxt, -1)
        used = torch.where(live, used + m + 1, used)
        cur = torch.where(live & hit, nxt + 1, cur)
        live = live & hit
    read = torch.cat([used[:, None], out[:, None], path], 1).tolist()  # the one host read
    results = []
    for r, (d, row) in enumerate(zip(drafts, read, strict=True)):
        taken, tok, steps = row[0], row[1], [i for i in row[2:] if i >= 0]
        if taken != len(uniforms[r]):  # the walk stopped early: the generator moves on by what it took
            generators[r].set_state(states[r])
            torch.rand(taken, dtype=torch.float64, generator=generators[r])
        results.append((steps, [d.tokens[i] for i in steps] + [tok]))
    return results
