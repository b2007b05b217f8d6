"""The acceptance model ``budget=auto`` plans with: each guess's chance of being accepted.

A guess's chance is its parent's times its rate: how often a guess of its (source, depth, sibling rank) follows
a right parent, counted over every guess proposed, kept or trimmed, once the output shows whether it followed
(for a sampled target that is the chance it is accepted, too). Sparse keys lean on coarser ones: the rate of
(source, depth, rank) is shrunk toward the rate of (source, depth) on the guesses of other ranks, that toward the
rate of (source) on other depths, that toward 1/4 for a first guess (1/8 for the second, …), each by the weight of
``PRIOR`` guesses: every guess counts once (shrunk toward rates that hold it too, one miss took a fresh key from
0.25 to 0.07). Counts halve every ``WINDOW`` drafts counted (rates follow the text) and start afresh with each
dataset category. A source fed by a pool is counted apart by the width that fed it (``<source>@w<width>``,
``<source>@dry`` with none), starting at what the whole pool brought.
"""

from __future__ import annotations

from collections import Counter

from specbench.budget.drafting import WINDOW
from specbench.core.draft import Draft

MAX_RANK = 4  # sibling ranks counted apart, 0-3 and "4 or more": a first guess is right far more often
PRIOR = 2.0  # guesses' weight of a coarser key's rate in a finer key's: a key never seen starts at its source's
BASE_RATE = 0.25  # a source never seen: a first guess in four follows a right parent (each next sibling half as
# often): enough for a cheap draft to be tried, not for a wide one
SIBLING_DECAY = 2.0  # … each next sibling of a source never seen SIBLING_DECAY times less often than the one before


def positions(draft: Draft) -> list[tuple[int, int]]:
    """(depth, rank among the node's siblings in draft order, capped at MAX_RANK) of every guess."""
    depths, children, out = draft.depths(), Counter(), []
    for i, p in enumerate(draft.parents):
        out.append((depths[i], min(children[p], MAX_RANK)))
        children[p] += 1
    return out


def fed(source: str, feeds: tuple[str, ...], width: int, full: int) -> str:
    """The name ``source``'s guesses are counted under when ``width`` of ``full`` pool columns fed it."""
    if source not in feeds or width >= full:
        return source
    return f"{source}@dry" if width <= 0 else f"{source}@w{width}"


class AcceptanceStats:
    """Guesses whose parent was right (or that had none), and of those the ones that followed, by (source, depth,
    sibling rank) and the coarser keys; halved every WINDOW drafts counted."""

    def __init__(self) -> None:
        self.drafted: Counter = Counter()
        self.accepted: Counter = Counter()
        self.counted = 0
        self._rates: dict[tuple, float] = {}

    def rate(self, source: str, depth: int, rank: int = 0) -> float:
        key = (source, depth, rank)
        if key not in self._rates:
            base, _, pool = source.partition("@")
            r = self.rate(base, depth, rank) if pool else BASE_RATE / SIBLING_DECAY**rank
            keys = ((source,), (source, depth), key)
            for k, finer in zip(keys, (*keys[1:], None), strict=True):  # each guess counted once: a key's rate
                n, a = self.drafted[k], self.accepted[k]  # on the guesses its finer key did not count
                if finer is not None:
                    n, a = n - self.drafted[finer], a - self.accepted[finer]
                r = (a + PRIOR * r) / (n + PRIOR)
            self._rates[key] = r
        return self._rates[key]

    def clear(self) -> None:
        self.drafted.clear()
        self.accepted.clear()
        self._rates.clear()

    def observe_output(self, draft: Draft, output: list[int], final: bool = False, name=lambda s: s,
                       counted: int = 0) -> int:
        """Count the guesses of ``draft`` deeper than ``counted`` that ``output``, the tokens that followed its root,
        reaches (``name``: what a source is counted as), so a level is learned from as soon as the next step shows
        it. Returns the depth counted to: the draft's own once every level is counted, or when ``final`` (the
        output ended: deeper guesses are left out)."""
        where = positions(draft)
        deepest = max((d for d, _ in where), default=0)
        reach = deepest if final else min(deepest, len(output))
        if reach <= counted and where:
            return counted
        matched: list[bool | None] = []
        for i, p in enumerate(draft.parents):
            depth, rank = where[i]
            parent = True if p < 0 else matched[p]
            if parent is None or (parent and depth > len(output)):
                matched.append(None)  # not known: the output stopped before this depth
                continue
            ok = bool(parent) and draft.tokens[i] == output[depth - 1]
            matched.append(ok)
            if not parent or depth <= counted:  # a wrong parent says nothing of how often a guess follows a right one
                continue
            for s in draft.sources_of(i):
                for key in ((name(s),), (name(s), depth), (name(s), depth, rank)):
                    self.drafted[key] += 1
                    self.accepted[key] += ok
        self._rates.clear()
        if reach >= deepest:
            self.counted += 1
            if self.counted % WINDOW == 0:
                for counts in (self.drafted, self.accepted):
                    for key in counts:
                        counts[key] *= 0.5
        return reach


def node_scores(draft: Draft, stats: AcceptanceStats, name=lambda s: s) -> list[float]:
    """Each guess's chance of being accepted: its parent's times its rate (how often such a guess follows a
    right parent); siblings, at most one of which can follow, have their rates scaled down together when they
    add up to more than one."""
    where, families, raw = positions(draft), {}, []
    for i, p in enumerate(draft.parents):
        raw.append(max((stats.rate(name(s), *where[i]) for s in draft.sources_of(i)), default=0.0))
        families.setdefault(p, []).append(i)
    scores = [0.0] * len(raw)
    for p in sorted(families):  # parents come before their children: a parent's score is final first
        total = sum(raw[i] for i in families[p])
        scale = (1.0 if p < 0 else scores[p]) / max(total, 1.0)
        for i in families[p]:
            scores[i] = raw[i] * scale
    return scores
