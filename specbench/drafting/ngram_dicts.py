"""SPECTRA's internal-speculation structures: the two n-gram dictionaries and the candidate pool.

Pure Python (plus two vectorised argmaxes per step in
:meth:`CandidatePool.advance`), no model and no cache, so that SPECTRA-CORE and full SPECTRA (CORE + RETRIEVAL)
share them and they can be tested with hand-worked answers.

**Dictionaries** (:class:`NgramDicts`), fed with completed sequences
``c_0 .. c_{L-1}``:

* ``fwd`` (S_fwd): token → list of continuations (tuples), most recently
  inserted first, at most ``cap`` of them, kept *prefix-free*: inserting ``s``
  when an entry ``e`` starts with ``s`` (or equals it) moves ``e`` to the front;
  when ``s`` extends an entry ``e``, ``s`` replaces ``e`` at the front;
  otherwise ``s`` goes to the front and the oldest entry beyond ``cap`` drops.
  (Guesses that are prefixes of other guesses would cost a slot of the budget G
  and add nothing to the merged tree.)
* ``bwd`` (S_bwd): tuple of 1 .. N−1 tokens → the single next token, the most
  recent insertion winning.
* With ``sub_ngrams``: ``fwd[c_j] ← c_{j+1..}`` for every j ≤ L−2 and
  ``bwd[c_{0..j}] = c_{j+1}`` for every j ≤ L−2. Without: only
  ``fwd[c_0] ← c_{1..}`` and ``bwd[c_{0..L-2}] = c_{L-1}``.

**Backward guess**: token by token, look up the last k tokens of
``context + guess so far`` for k from N−1 down to 1 (the concatenation counts,
so once the guess is long enough its own tokens form the key); append the first
hit; stop at the first token with no hit or at ``length`` tokens.

**Coverage rule, three readings** (``READINGS``; r ~ U(0,1) per pool sequence,
τ = ``threshold``): ``epsilon`` explores when r < τ and avoids the keys of
S_fwd; ``literal_key`` explores when r > τ (the paper's stated direction) and
avoids the keys of S_fwd; ``literal_ngram`` explores when r > τ and avoids, for
each sequence, the tokens whose completed n-gram is already stored under the
sequence's first token (:meth:`NgramDicts.completions`), so only a sequence
whose argmax completes a known n-gram changes its token. "Explore" = the most
probable token not avoided (the argmax when every token is avoided).

**Candidate pool** (:class:`CandidatePool`): W sequences of N−1 known tokens,
sent as auxiliary nodes *level-major* (all first tokens, then all second
tokens, …) so that the rows predicting each sequence's next token are the last
W rows (``logit_rows``: the output layer need run only there, and they are the
last W rows of ``aux_logits`` either way, a view, no copy). A sequence's token at level l sits
at offset l+1 from the root and sees the levels below it of its own sequence
only. The layout is built once per (W, N).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from functools import lru_cache

import numpy as np
import torch

from specbench.core.forward import upload


class NgramDicts:
    """S_fwd and S_bwd of SPECTRA-CORE for n-grams of length ``n``."""

    def __init__(self, n: int, cap: int, sub_ngrams: bool = True) -> None:
        self.n, self.cap, self.sub_ngrams = n, cap, sub_ngrams
        self.fwd: dict[int, list[tuple[int, ...]]] = {}
        self.bwd: dict[tuple[int, ...], int] = {}
        self.keys_added: list[int] = []  # every key S_fwd gained, in order (never cut): each reader keeps its place

    def clear(self) -> None:
        self.fwd.clear()
        self.bwd.clear()  # keys_added stays: a reader's place in it stays right

    def push_fwd(self, key: int, cont: tuple[int, ...]) -> None:
        """Insert one continuation of ``key`` (prefix-free, most recent first, at most ``cap``)."""
        entries = self.fwd.get(key)
        if entries is None:
            self.fwd[key] = [cont]
            self.keys_added.append(key)
            return
        ls = len(cont)
        for i, e in enumerate(entries):
            le = len(e)
            if le >= ls:
                if e[:ls] != cont:
                    continue
                keep = e  # cont adds nothing beyond e: refresh e
            elif cont[:le] == e:
                keep = cont  # cont extends e: replace it
            else:
                continue
            del entries[i]
            entries.insert(0, keep)
            return
        entries.insert(0, cont)
        del entries[self.cap :]

    def add(self, seq: Sequence[int]) -> None:
        """Learn from one completed sequence ``c_0 .. c_{L-1}`` (L >= 2)."""
        seq = tuple(seq)
        last = len(seq) - 1
        if last < 1:
            return
        if self.sub_ngrams:
            for j in range(last):
                self.push_fwd(seq[j], seq[j + 1 :])
                self.bwd[seq[: j + 1]] = seq[j + 1]
        else:
            self.push_fwd(seq[0], seq[1:])
            self.bwd[seq[:last]] = seq[last]

    def forward_guesses(self, token: int) -> list[tuple[int, ...]]:
        return self.fwd.get(token, [])

    def completions(self, seq: Sequence[int]) -> set[int]:
        """Tokens ``t`` such that the n-gram ``seq + (t,)`` is stored under ``seq[0]`` in S_fwd.

        An entry that extends it counts (lists are prefix-free: a stored n-gram
        may live inside a longer continuation). At most ``cap`` tokens.
        """
        mid = tuple(seq[1:])
        k = len(mid)
        return {e[k] for e in self.fwd.get(seq[0], ()) if len(e) > k and e[:k] == mid}

    def backward_guess(self, context: Sequence[int], length: int) -> list[int]:
        """Build a guess token by token from S_bwd, longest matching context first."""
        ctx = list(context[-(self.n - 1) :]) if self.n > 1 else []
        guess: list[int] = []
        bwd = self.bwd
        for _ in range(length):
            tok = None
            for k in range(min(self.n - 1, len(ctx)), 0, -1):
                tok = bwd.get(tuple(ctx[-k:]))
                if tok is not None:
                    break
            if tok is None:
                break
            guess.append(tok)
            ctx.append(tok)
        return guess


def _read_back(first: torch.Tensor, rest: torch.Tensor) -> tuple[list[int], list[list[int]]]:
    """Two integer tensors of one device brought to the host in one copy (one sync): ``first`` [w] and
    ``rest`` [k, e], as lists."""
    w = first.shape[0]
    both = torch.cat([first.to(torch.int64), rest.to(torch.int64).reshape(-1)]).tolist()
    e = rest.shape[-1]
    return both[:w], [both[w + j * e : w + (j + 1) * e] for j in range(rest.shape[0])]


@lru_cache(maxsize=16)
def pool_layout(width: int, n: int) -> tuple[list[int], np.ndarray]:
    """Positions (offsets from the root) and visibility of a level-major pool of ``width`` × (n−1)."""
    levels = n - 1
    positions = [lvl + 1 for lvl in range(levels) for _ in range(width)]
    seq_of = np.tile(np.arange(width), levels)
    lvl_of = np.repeat(np.arange(levels), width)
    visible = (seq_of[:, None] == seq_of[None, :]) & (lvl_of[None, :] <= lvl_of[:, None])
    visible.flags.writeable = False
    return positions, visible


READINGS = ("epsilon", "literal_key", "literal_ngram")


def exploring(draws: Sequence[float] | None, threshold: float, reading: str) -> list[int]:
    """The pool sequences that take the coverage branch: r < τ (``epsilon``) or r > τ (the literal readings)."""
    if draws is None:
        return []
    if reading == "epsilon":
        return [i for i, r in enumerate(draws) if r < threshold]
    if reading in READINGS:
        return [i for i, r in enumerate(draws) if r > threshold]
    raise ValueError(f"unknown coverage reading {reading!r}; choose one of {', '.join(READINGS)}")


class CandidatePool:
    """W sequences of N−1 tokens whose next token the target predicts in every step's forward.

    Key readings: the coverage rule avoids the tokens passed to :meth:`exclude`
    (SPECTRA: the keys of S_fwd), kept as a 0 / −inf penalty over the vocabulary
    so that one vectorised add + argmax over the exploring rows finds each one's
    most probable token not excluded. On CPU the argmaxes run in numpy: torch's
    CPU argmax over [15, 49152] costs ~1.2 ms, numpy's ~0.06 ms. N-gram reading:
    each row has its own small set of avoided tokens (at most G); only the rows
    whose plain argmax is in its set search again, on a copy of that one row.

    On a GPU both rules run batched over the exploring rows and read their answers back at once (one
    host sync a step), and the penalty lives on the device, where only newly excluded tokens are sent.
    """

    def __init__(self, width: int, n: int) -> None:
        self.width, self.n = width, n
        self.seqs: list[list[int]] = []
        self.positions, self.visible = pool_layout(width, n)
        self.logit_rows = list(range((n - 2) * width, (n - 1) * width))  # each sequence's last token
        self.columns = [j for _ in range(n - 1) for j in range(width)]  # each aux node's sequence
        self.penalty = np.zeros(0, dtype=np.float32)  # −inf at excluded tokens
        self._buf = torch.empty(0)  # float32 copy of half-precision rows
        self._ybuf = np.empty((0, 0), dtype=np.float32)  # the exploring rows + penalty
        self._device_penalty: torch.Tensor | None = None  # the penalty on a GPU ...
        self._unsent: list[int] = []  # ... and the tokens excluded since it was last brought up to date

    def reset(self, prompt: Sequence[int], rng: random.Random) -> None:
        """Fill every sequence with tokens drawn uniformly (with replacement) from the prompt."""
        self.seqs = [[rng.choice(prompt) for _ in range(self.n - 1)] for _ in range(self.width)]
        self.penalty[:] = 0.0
        self._device_penalty, self._unsent = None, []

    def exclude(self, tokens: Sequence[int]) -> None:
        if not tokens:
            return
        idx = np.asarray(tokens, dtype=np.int64)
        self._grow(int(idx.max()) + 1)
        self.penalty[idx] = -np.inf
        if self._device_penalty is not None:
            self._unsent.extend(int(t) for t in tokens)

    def _grow(self, size: int) -> None:
        if size > self.penalty.size:
            self.penalty = np.concatenate([self.penalty, np.zeros(size - self.penalty.size, np.float32)])

    def aux_tokens(self) -> list[int]:
        return [s[lvl] for lvl in range(self.n - 1) for s in self.seqs]

    def _best(self, rows: torch.Tensor, explore: list[int]) -> list[int]:
        """Each row's argmax; rows listed in ``explore`` take their best token not excluded instead
        (their argmax if every token is excluded)."""
        vocab = rows.shape[-1]
        self._grow(vocab)
        on_cpu = rows.device.type == "cpu"
        x = self._rows(rows)  # bf16/fp16 go through a kept buffer (a fresh 3 MB array page-faults every step)
        plain = x.argmax(-1).tolist()
        if not explore:
            return plain
        if on_cpu:
            if self._ybuf.shape != x.shape:
                self._ybuf = np.empty(x.shape, dtype=np.float32)
            y = self._ybuf[: len(explore)]
            np.take(x, explore, axis=0, out=y)
            np.add(y, self.penalty[:vocab], out=y)
            best = y.argmax(-1)
            ok = np.isfinite(y[np.arange(len(best)), best]).tolist()
        else:
            return self._best_batched(x, explore)
        for i, b, good in zip(explore, best.tolist(), ok, strict=True):
            if good:
                plain[i] = b
        return plain

    def penalty_on(self, device: torch.device, vocab: int) -> torch.Tensor:
        """The penalty as a tensor on ``device``: sent whole once, then only the tokens excluded since."""
        penalty = self._device_penalty
        if penalty is None or penalty.device != device or penalty.numel() < vocab:
            self._grow(vocab)
            penalty = self._device_penalty = upload(self.penalty, device)
        elif self._unsent:
            penalty.index_fill_(0, upload(self._unsent, device), float("-inf"))
        self._unsent = []
        return penalty[:vocab]

    def _best_batched(self, x: torch.Tensor, explore: list[int]) -> list[int]:
        """:meth:`_best` in torch over every row at once, one read back (the GPU path)."""
        y = x[upload(explore, x.device)] + self.penalty_on(x.device, x.shape[-1])
        best = y.argmax(-1)
        ok = torch.isfinite(y.gather(-1, best[:, None])[:, 0]).to(best.dtype)
        plain, (best_l, ok_l) = _read_back(x.argmax(-1), torch.stack([best, ok]))
        for i, b, good in zip(explore, best_l, ok_l, strict=True):
            if good:
                plain[i] = b
        return plain

    def _best_ngram_batched(self, x: torch.Tensor, explore: list[int], avoid) -> list[int]:
        """:meth:`_best_ngram` in torch: every exploring row's own tokens masked at once, one read back.
        A row whose argmax is not avoided keeps it (its masked copy's argmax is the same token)."""
        banned = [sorted(avoid(self.seqs[i])) for i in explore]
        y = x[upload(explore, x.device)].clone()
        rows = [r for r, ban in enumerate(banned) for _ in ban]
        if rows:
            cols = [t for ban in banned for t in ban]
            y[upload(rows, x.device), upload(cols, x.device)] = float("-inf")
        plain, (best,) = _read_back(x.argmax(-1), y.argmax(-1)[None])
        for i, b, ban in zip(explore, best, banned, strict=True):
            if plain[i] in ban and ban:
                plain[i] = b
        return plain

    def _rows(self, rows: torch.Tensor):
        """The rows as float32 numpy on CPU (a view for fp32, a kept buffer otherwise), torch elsewhere."""
        if rows.device.type != "cpu":
            return rows.float()
        if rows.dtype == torch.float32:
            return rows.detach().numpy()
        if self._buf.shape != rows.shape:
            self._buf = torch.empty(rows.shape, dtype=torch.float32)
        return self._buf.copy_(rows).numpy()

    def _best_ngram(
        self, rows: torch.Tensor, explore: list[int], avoid: Callable[[Sequence[int]], set[int]]
    ) -> list[int]:
        """Each row's argmax; an exploring row whose argmax is in ``avoid(its sequence)`` takes its best
        token outside that set instead."""
        x = self._rows(rows)
        if isinstance(x, torch.Tensor) and explore:
            return self._best_ngram_batched(x, explore, avoid)
        plain = x.argmax(-1).tolist()
        for i in explore:
            banned = avoid(self.seqs[i])
            if plain[i] not in banned:
                continue
            y = x[i].clone() if isinstance(x, torch.Tensor) else x[i].copy()
            y[list(banned)] = float("-inf")
            plain[i] = int(y.argmax())
        return plain

    def advance(
        self,
        last_rows: torch.Tensor,
        draws: Sequence[float] | None,
        threshold: float,
        reading: str = "epsilon",
        avoid: Callable[[Sequence[int]], set[int]] | None = None,
    ) -> list[tuple[int, ...]]:
        """Complete the first w sequences with their predicted next tokens, return them, shift them
        left by one (the others, not sent this step, wait).

        ``last_rows``: ``[w, vocab]`` logits after the last token of each of the first w sequences
        (w = W, unless ``budget=auto`` sent a narrower pool).
        Coverage rule: with ``draws`` (one r ~ U(0,1) per sequence), the
        sequences that :func:`exploring` picks for ``reading`` take their most
        probable token not avoided (the key readings: not excluded; the n-gram
        reading: not in ``avoid(sequence)``); the others (and all of them
        without ``draws``) take the plain argmax.
        """
        w = last_rows.shape[0]
        if w > self.width:
            raise ValueError(f"candidate pool: {w} rows of logits for {self.width} sequences")
        explore = exploring(draws, threshold, reading)
        self._grow(last_rows.shape[-1])
        if reading == "literal_ngram":
            if avoid is None:
                raise ValueError("the literal_ngram reading needs avoid(sequence) (NgramDicts.completions)")
            nxt = self._best_ngram(last_rows, explore, avoid)
        else:
            nxt = self._best(last_rows, explore)
        done = [(*s, t) for s, t in zip(self.seqs[:w], nxt, strict=True)]
        self.seqs[:w] = [list(c[1:]) for c in done]
        return done
