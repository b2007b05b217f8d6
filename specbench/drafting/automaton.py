"""A suffix automaton over token ids, with a running longest-suffix match (SAM-Decoding's index).

A suffix automaton of a sequence ``s`` has one state per class of substrings
sharing their end positions; it accepts exactly the substrings of ``s`` and is
built online in amortised O(1) per token (Blumer et al. 1985). Each state keeps
``first_end``, the end index of the substring's first occurrence, so the text
that followed that occurrence is ``s[first_end + 1:]``.

:class:`SuffixAutomaton` is used two ways:

* **dynamic** (the text so far): :meth:`extend` first advances the match with
  the new token against the automaton built so far, then adds the token. The
  match is therefore the longest suffix of the text that also ends *earlier*
  (at its first occurrence), whose continuation is known.
* **static** (a corpus): built once with :meth:`extend` over documents joined by
  a separator that no context contains; a generation then only
  :meth:`advance`\\ s its own match state token by token (the corpus is not
  extended) and reads continuations up to the next separator.

Either way advancing a match is amortised O(1) per token: follow suffix links
until the token has a transition (each link strictly shortens the match).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

SEPARATOR = -1  # between corpus documents; never a token of a context


class SuffixAutomaton:
    """Suffix automaton of a growing token sequence, and a match state that follows a stream."""

    __slots__ = ("next", "link", "length", "first_end", "tokens", "last", "state", "match_len")

    def __init__(self) -> None:
        self.next: list[dict[int, int]] = [{}]  # per state: token -> state
        self.link: list[int] = [-1]  # suffix link
        self.length: list[int] = [0]  # longest substring of the state
        self.first_end: list[int] = [-1]  # end index of its first occurrence
        self.tokens: list[int] = []
        self.last = 0  # the state of the whole sequence
        self.state = 0  # the running match: the state of its longest suffix found, and that length
        self.match_len = 0

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def n_states(self) -> int:
        return len(self.link)

    def reset_match(self) -> None:
        self.state = self.match_len = 0

    def advance(self, token: int) -> int:
        """Extend the running match by ``token``; return the new match length."""
        nxt, link, length = self.next, self.link, self.length
        p, n = self.state, self.match_len
        while p and token not in nxt[p]:
            p = link[p]
            n = length[p]
        q = nxt[p].get(token)
        if q is None:  # p is the root here
            self.state = self.match_len = 0
        else:
            self.state, self.match_len = q, n + 1
        return self.match_len

    def _add(self, token: int) -> None:
        nxt, link, length, first_end = self.next, self.link, self.length, self.first_end
        end = len(self.tokens)
        self.tokens.append(token)
        cur = len(link)
        nxt.append({})
        link.append(0)
        length.append(length[self.last] + 1)
        first_end.append(end)
        p = self.last
        while p != -1 and token not in nxt[p]:
            nxt[p][token] = cur
            p = link[p]
        if p != -1:
            q = nxt[p][token]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:  # split q: the clone keeps q's transitions and first occurrence
                clone = len(link)
                nxt.append(dict(nxt[q]))
                link.append(link[q])
                length.append(length[p] + 1)
                first_end.append(first_end[q])
                while p != -1 and nxt[p].get(token) == q:
                    nxt[p][token] = clone
                    p = link[p]
                link[q] = link[cur] = clone
        self.last = cur

    def extend(self, tokens: Iterable[int]) -> None:
        """Append tokens; the running match follows them against the text before each one."""
        # Adding a token may split the match's state (its shorter strings, the match among them, move to
        # a clone with the same first occurrence); the next advance still reads the right transitions,
        # since the clone differs from the original only after the newest token, which has no successor yet.
        for tok in tokens:
            tok = int(tok)
            self.advance(tok)
            self._add(tok)

    def build(self, documents: Iterable[Sequence[int]]) -> SuffixAutomaton:
        """Add documents separated by :data:`SEPARATOR` (a static corpus); the match starts empty."""
        first = True
        for doc in documents:
            if not first:
                self._add(SEPARATOR)
            first = False
            for tok in doc:
                self._add(int(tok))
        self.reset_match()
        return self

    def continuation(self, n: int) -> list[int]:
        """Up to ``n`` tokens after the match's first occurrence (stopping at a separator)."""
        if not self.match_len or n < 1:
            return []
        start = self.first_end[self.state] + 1
        out = self.tokens[start : start + n]
        if SEPARATOR in out:
            out = out[: out.index(SEPARATOR)]
        return out
