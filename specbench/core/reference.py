"""The true continuation of a prompt, what the oracle drafts: its greedy autoregressive output."""

from __future__ import annotations

from collections.abc import Callable

from specbench.core.decode import generate
from specbench.core.draft import Drafter
from specbench.core.forward import Target


class References:
    """prompt → its greedy autoregressive output, generated once and kept: what the oracle drafts
    (``DrafterContext.reference``). ``max_new_tokens``: a number, or a function of the prompt."""

    def __init__(self, target: Target, max_new_tokens: int | Callable[[list[int]], int],
                 eos_token_ids: list[int] | tuple[int, ...] = ()) -> None:
        self.target, self.max_new, self.eos = target, max_new_tokens, tuple(eos_token_ids)
        self.known: dict[tuple[int, ...], list[int]] = {}

    def add(self, prompt_ids: list[int], output_ids: list[int]) -> None:
        """A greedy autoregressive output generated elsewhere (the baseline's, in a job)."""
        self.known[tuple(prompt_ids)] = list(output_ids)

    def __call__(self, prompt_ids: list[int]) -> list[int]:
        key = tuple(prompt_ids)
        if key not in self.known:
            n = self.max_new(list(prompt_ids)) if callable(self.max_new) else self.max_new
            self.known[key] = generate(self.target, Drafter(vocab_size=0), list(prompt_ids), max_new_tokens=n,
                                       eos_token_ids=self.eos).output_ids
        return self.known[key]
