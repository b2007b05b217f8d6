"""Prompt lookup decoding (LLMA, Yang et al. 2023, "Inference with Reference";
Saxena 2023, "Prompt Lookup Decoding").

When the output copies its input (code editing, summarisation, RAG), the next
tokens often already follow an earlier occurrence of the last few tokens. Each
step takes the last ``n`` committed tokens (``n`` from ``max_ngram`` down to
``min_ngram``), looks for an earlier occurrence of that n-gram in the prompt +
output so far, and proposes the ``num_draft`` tokens that followed it as one
chain of guesses. No occurrence at any ``n`` → no draft (a plain step).

Reading choices:

* **Which occurrence.** ``match: earliest`` (our default) takes the first
  occurrence from the left, as the reference implementation in transformers
  (``PromptLookupCandidateGenerator``) does; ``match: latest`` takes the most
  recent one, which favours the current loop of a repetitive output. LLMA
  breaks ties at random; we do not (a deterministic drafter is easier to test
  and compare).
* **What counts as earlier.** Every occurrence except the trailing n-gram
  itself; an occurrence may overlap it, and its continuation is cut at the end
  of the committed tokens (so it is never empty, but may be shorter than
  ``num_draft``). This matches the reference.
* **Longest n first.** A longer match wins even if its continuation is
  shorter than a shorter match's (the reference does the same).
* **Depth cap.** The draft holds at most ``remaining - 1`` tokens: the target
  adds its own token after the accepted guesses, so a longer draft could not
  add a kept token. We do not cut the draft at EOS (the reference does): the
  decode loop stops at EOS, so a guessed EOS costs nothing extra.
* **Search.** An index of every n-gram (``min_ngram <= n <= max_ngram``):
  its first start and its two latest starts, built from the prompt at
  ``start`` and extended with each committed token at the next ``propose``
  (``state.tokens`` is the authoritative committed sequence; the token of the
  prefill never reaches ``update``). A lookup is then one dict access per
  ``n``. :func:`find_continuation` is the plain scan it must agree with.
"""

from __future__ import annotations

from dataclasses import dataclass

from methods.registry import register_method
from specbench.core.draft import SOURCE_PROMPT, DecodeState, Draft, Drafter

MATCHES = ("earliest", "latest")


@dataclass
class PLDConfig:
    max_ngram: int = 3  # longest n-gram matched (tried first)
    min_ngram: int = 1  # shortest n-gram matched
    num_draft: int = 10  # tokens copied after the match (K)
    match: str = "earliest"  # which occurrence: earliest (as transformers) | latest

    def validate(self) -> None:
        if self.min_ngram < 1:
            raise ValueError(f"pld: min_ngram must be >= 1, got {self.min_ngram}")
        if self.max_ngram < self.min_ngram:
            raise ValueError(f"pld: max_ngram ({self.max_ngram}) must be >= min_ngram ({self.min_ngram})")
        if self.num_draft < 1:
            raise ValueError(f"pld: num_draft must be >= 1, got {self.num_draft}")
        if self.match not in MATCHES:
            raise ValueError(f"pld: match must be one of {', '.join(MATCHES)}, got '{self.match}'")


def find_continuation(
    tokens: list[int], max_ngram: int, min_ngram: int, num_draft: int, match: str = "earliest"
) -> list[int]:
    """The plain scan: tokens following an earlier occurrence of the longest matching trailing n-gram."""
    size = len(tokens)
    for n in range(min(max_ngram, size - 1), min_ngram - 1, -1):
        tail = tokens[size - n :]
        starts = [i for i in range(size - n) if tokens[i : i + n] == tail]
        if starts:
            i = starts[0] if match == "earliest" else starts[-1]
            return tokens[i + n : i + n + num_draft]
    return []


class NgramIndex:
    """Where every n-gram (``min_n <= n <= max_n``) of a growing token list occurs.

    Per n-gram: its first start, its last start and the start before the last
    (plain ints, so the index stays small and light on the garbage collector).
    """

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self.first: dict[tuple[int, ...], int] = {}
        self.last: dict[tuple[int, ...], int] = {}
        self.previous: dict[tuple[int, ...], int] = {}  # the occurrence before the last one

    def extend(self, new_tokens: list[int]) -> None:
        toks, first, last, previous = self.tokens, self.first, self.last, self.previous
        for tok in new_tokens:
            toks.append(tok)
            end = len(toks)
            for n in range(self.min_n, min(self.max_n, end) + 1):
                key = tuple(toks[end - n :])
                seen = last.get(key)
                if seen is None:
                    first[key] = end - n
                else:
                    previous[key] = seen
                last[key] = end - n

    def continuation(self, num_draft: int, latest: bool = False) -> list[int]:
        """Same answer as :func:`find_continuation` on ``self.tokens``."""
        toks = self.tokens
        size = len(toks)
        for n in range(min(self.max_n, size - 1), self.min_n - 1, -1):
            # The trailing n-gram is indexed like every other: its last start is size - n,
            # so an earlier occurrence exists iff it has a previous one.
            key = tuple(toks[size - n :])
            i = self.previous.get(key)
            if i is None:
                continue
            if not latest:
                i = self.first[key]
            return toks[i + n : i + n + num_draft]
        return []


@register_method
class PromptLookup(Drafter):
    name = "pld"
    Config = PLDConfig
    tree_drafts = False  # one chain per step: plain causal attention

    def __init__(self, config: PLDConfig | None = None, **kwargs) -> None:
        super().__init__(config, **kwargs)
        self.index = NgramIndex(self.config.min_ngram, self.config.max_ngram)

    def start(self, prompt_ids: list[int]) -> None:
        self.index = NgramIndex(self.config.min_ngram, self.config.max_ngram)
        self.index.extend(list(prompt_ids))

    def _sync(self, tokens: list[int]) -> None:
        seen = len(self.index.tokens)
        if seen > len(tokens):  # not the sequence we indexed (no start() call): rebuild
            self.start([])
            seen = 0
        if seen < len(tokens):
            self.index.extend(tokens[seen:])

    def propose(self, state: DecodeState) -> Draft | None:
        self._sync(state.tokens)
        depth = min(self.config.num_draft, state.max_depth)
        if depth < 1:
            return None
        guess = self.index.continuation(depth, latest=self.config.match == "latest")
        return Draft.chain(guess, SOURCE_PROMPT) if guess else None
