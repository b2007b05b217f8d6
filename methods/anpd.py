"""Adaptive N-gram Parallel Decoding (ANPD; Ou, Chen and Tian, NAACL 2024,
"Lossless Acceleration of Large Language Model via Adaptive N-gram Parallel
Decoding").

An n-gram model of the current conversation drafts the next tokens. At the
start of a generation the table is filled from the prompt: for every order
``n`` from ``min_order`` to ``max_order`` (the paper's multi-level N-gram),
each context of ``n - 1`` tokens maps to the token that followed it. Every
committed token (accepted guesses and the target's own token) is added the
same way, so the table adapts to the output as it grows. A draft is ``K``
tokens predicted one after the other: look up the last ``max_order - 1``
tokens (committed, then the draft so far); if that context was never seen,
back off to shorter contexts down to ``min_order - 1`` tokens; if none was
seen, stop drafting. The draft is one chain, verified by the shared acceptance
rule (greedy as in the paper; sampling is exact too, as a deterministic draft).

Reading choices (the paper's own settings are not in our notes; these are ours):

* **Defaults** ``max_order = 4`` (contexts of 3 tokens), back-off down to
  ``min_order = 2`` (one token of context; a unigram "context" would predict
  the same token everywhere), ``num_draft = 6`` (K): a short chain, since on
  our CPU a forward of 7 tokens already costs ~1.7 single steps in fp32.
* **Which next token.** ``next_token: frequent`` (default) predicts the token
  seen most often after the context, ties going to the most recent one, the
  argmax of the paper's count-based n-gram probability; ``next_token: latest``
  predicts the token that followed the context most recently (closer to
  "adaptive": the newest usage wins).
* **Learning.** The table ingests committed tokens at the start of the next
  ``propose`` from ``state.tokens``, the authoritative committed sequence
  (``update`` sees tokens before EOS/length truncation, and the prefill's
  token never reaches ``update``); the cost is counted in the step's draft
  time all the same.
* **Depth cap.** At most ``remaining - 1`` guesses (the target adds its own
  token after them, so a longer draft cannot add a kept token).
"""

from __future__ import annotations

from dataclasses import dataclass

from methods.registry import register_method
from specbench.core.draft import SOURCE_NGRAM, DecodeState, Draft, Drafter

NEXT_TOKEN_RULES = ("frequent", "latest")


@dataclass
class ANPDConfig:
    max_order: int = 4  # N: the longest n-gram (a context of N - 1 tokens), tried first
    min_order: int = 2  # back off down to this order (>= 2: at least one token of context)
    num_draft: int = 6  # K: tokens drafted per step
    next_token: str = "frequent"  # what a context predicts: frequent (ties → latest) | latest

    def validate(self) -> None:
        if self.min_order < 2:
            raise ValueError(f"anpd: min_order must be >= 2 (one token of context), got {self.min_order}")
        if self.max_order < self.min_order:
            raise ValueError(f"anpd: max_order ({self.max_order}) must be >= min_order ({self.min_order})")
        if self.num_draft < 1:
            raise ValueError(f"anpd: num_draft must be >= 1, got {self.num_draft}")
        if self.next_token not in NEXT_TOKEN_RULES:
            raise ValueError(
                f"anpd: next_token must be one of {', '.join(NEXT_TOKEN_RULES)}, got '{self.next_token}'"
            )


class NgramTable:
    """Contexts of ``min_order - 1`` to ``max_order - 1`` tokens → the predicted next token."""

    def __init__(self, min_order: int, max_order: int, frequent: bool = True) -> None:
        self.min_order, self.max_order, self.frequent = min_order, max_order, frequent
        self.tokens: list[int] = []  # everything added so far
        self.best: dict[tuple[int, ...], int] = {}  # context → predicted next token
        self.counts: dict[tuple[int, ...], dict[int, int]] = {}  # context → next token → count

    def add(self, new_tokens: list[int]) -> None:
        """Append tokens, recording each one as the continuation of its preceding contexts."""
        toks, best, counts = self.tokens, self.best, self.counts
        for tok in new_tokens:
            end = len(toks)
            for n in range(self.min_order, min(self.max_order, end + 1) + 1):
                ctx = tuple(toks[end - n + 1 :])
                if not self.frequent:
                    best[ctx] = tok
                    continue
                seen = counts.get(ctx)
                if seen is None:
                    counts[ctx] = {tok: 1}
                    best[ctx] = tok
                    continue
                c = seen[tok] = seen.get(tok, 0) + 1
                if c >= seen[best[ctx]]:  # ties go to the most recent token
                    best[ctx] = tok
            toks.append(tok)

    def predict(self, context: list[int]) -> tuple[int, int] | None:
        """(next token, order used) from the longest known suffix of ``context``, or None."""
        size = len(context)
        for n in range(min(self.max_order, size + 1), self.min_order - 1, -1):
            tok = self.best.get(tuple(context[size - n + 1 :]))
            if tok is not None:
                return tok, n
        return None

    def draft(self, context: list[int], k: int) -> list[int]:
        """Up to ``k`` tokens predicted one after the other, each extending the context."""
        ctx = list(context[-(self.max_order - 1) :])
        out: list[int] = []
        while len(out) < k:
            hit = self.predict(ctx)
            if hit is None:
                break
            out.append(hit[0])
            ctx.append(hit[0])
            del ctx[0 : len(ctx) - (self.max_order - 1)]
        return out


@register_method
class ANPD(Drafter):
    name = "anpd"
    Config = ANPDConfig
    tree_drafts = False  # one chain per step: plain causal attention

    def __init__(self, config: ANPDConfig | None = None, **kwargs) -> None:
        super().__init__(config, **kwargs)
        self.table = self._new_table()

    def _new_table(self) -> NgramTable:
        c = self.config
        return NgramTable(c.min_order, c.max_order, frequent=c.next_token == "frequent")

    def start(self, prompt_ids: list[int]) -> None:
        self.table = self._new_table()
        self.table.add(list(prompt_ids))

    def _sync(self, tokens: list[int]) -> None:
        seen = len(self.table.tokens)
        if seen > len(tokens):  # not the sequence we learned from (no start() call): rebuild
            self.table = self._new_table()
            seen = 0
        if seen < len(tokens):
            self.table.add(tokens[seen:])

    def propose(self, state: DecodeState) -> Draft | None:
        self._sync(state.tokens)
        depth = min(self.config.num_draft, state.max_depth)
        if depth < 1:
            return None
        guess = self.table.draft(state.tokens, depth)
        return Draft.chain(guess, SOURCE_NGRAM) if guess else None
