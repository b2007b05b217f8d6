"""SPECTRA-CORE's internal speculation as an engine that methods compose.

``spectra_core`` is this engine alone; ``spectra`` adds retrieval guesses after
its guesses. The engine owns the two n-gram dictionaries and the candidate
pool (:mod:`specbench.drafting.ngram_dicts`) and does the three things a step needs:

* :meth:`SpectraCoreEngine.guesses`: the backward guess first (source
  ``bwd_dict``), then S_fwd[last token], most recent first (``fwd_dict``; a
  continuation equal to the backward guess is skipped), at most ``max_guesses``;
* :meth:`SpectraCoreEngine.attach_pool`: the pool as auxiliary nodes of a draft,
  with the output layer asked for each sequence's last token only, each node
  tagged with its sequence (``aux_columns``: ``budget=auto`` may send the first w);
* :meth:`SpectraCoreEngine.update`: every pool sequence gets its next token by
  the coverage rule (``coverage_reading``, see :mod:`specbench.drafting.ngram_dicts`;
  r ~ U(0,1) from the engine's own ``random.Random(seed)``, reseeded at every
  :meth:`start`), then both dictionaries learn the completed sequences and the
  pool shifts left. The rule reads S_fwd as it was before this step's updates.

Settings are one dataclass, :class:`CoreSettings`, that each method's config
extends, so ``+ablation=...`` presets apply to every method built on it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

import torch

from specbench.core.draft import SOURCE_BWD, SOURCE_FWD, Draft, check_memory
from specbench.drafting.ngram_dicts import READINGS, CandidatePool, NgramDicts


@dataclass
class CoreSettings:
    """SPECTRA-CORE's hyperparameters (paper defaults: N=5, W=15, G=15, τ=0.1)."""

    _method: ClassVar[str] = "spectra_core"  # named in validation errors

    ngram_size: int = 5  # N: pool sequences and dictionary n-grams
    pool_size: int = 15  # W: candidate-pool sequences
    max_guesses: int = 15  # G: guesses per step (also the cap of each S_fwd list)
    coverage_threshold: float = 0.1  # τ of the coverage rule
    coverage_reading: str = "literal_ngram"  # epsilon | literal_key | literal_ngram
    coverage: bool = True  # False: pool tokens are the plain argmax
    use_forward_dict: bool = True
    use_backward_dict: bool = True
    sub_ngrams: bool = True
    # also learn n-grams of the prompt and committed output; "auto": when the run's budget is auto
    # (what is left to draft from where the pool does not pay), resolved by :meth:`under_budget`
    context_ngrams: bool | str = "auto"
    memory: str = "turn"  # how long the dictionaries live: turn (the paper) | sample | run

    def validate(self) -> None:
        m = self._method
        if self.ngram_size < 2:
            raise ValueError(f"{m}: ngram_size must be >= 2, got {self.ngram_size}")
        if self.pool_size < 1:
            raise ValueError(f"{m}: pool_size must be >= 1, got {self.pool_size}")
        if self.max_guesses < 1:
            raise ValueError(f"{m}: max_guesses must be >= 1, got {self.max_guesses}")
        if not 0.0 <= self.coverage_threshold <= 1.0:
            raise ValueError(f"{m}: coverage_threshold must be in [0, 1], got {self.coverage_threshold}")
        check_memory(m, self.memory)
        if self.context_ngrams not in (True, False, "auto"):
            raise ValueError(f"{m}: context_ngrams must be true, false or auto, got {self.context_ngrams!r}")
        if self.coverage_reading not in READINGS:
            raise ValueError(
                f"{m}: coverage_reading must be one of {', '.join(READINGS)}, got {self.coverage_reading!r}"
            )


    def under_budget(self, budget: str) -> None:
        """The run's budget is known: ``context_ngrams: auto`` learns the context under ``budget=auto``."""
        if self.context_ngrams == "auto":
            self.context_ngrams = budget == "auto"


class SpectraCoreEngine:
    """Dictionaries + candidate pool + coverage rule, with no model and no cache."""

    def __init__(self, settings: CoreSettings, seed: int = 0) -> None:
        settings.validate()
        self.settings = s = settings
        self.seed = seed
        self.dicts = NgramDicts(s.ngram_size, s.max_guesses, s.sub_ngrams)
        self.pool = CandidatePool(s.pool_size, s.ngram_size)
        self.rng = random.Random(seed)
        self._learned = 0  # context tokens already inserted as window ends (context_ngrams)
        self._keys_seen = 0  # the keys of dicts.keys_added the pool already avoids

    def forget(self) -> None:
        """Empty the dictionaries (what the engine learns)."""
        self.dicts.clear()

    def start(self, prompt_ids: list[int], keep: bool = False) -> None:
        """A new generation: a pool drawn from the prompt, the RNG reseeded, and empty dictionaries
        unless ``keep`` (then the coverage rule's key readings still avoid every key kept)."""
        if not keep:
            self.forget()
        self.rng = random.Random(self.seed)
        self.pool.reset(prompt_ids, self.rng)
        self.pool.exclude(list(self.dicts.fwd))
        self._keys_seen = len(self.dicts.keys_added)
        self._learned = 0
        if self.settings.context_ngrams is True:
            self.learn_context(prompt_ids)

    def learn_context(self, tokens: list[int]) -> None:
        """With ``context_ngrams``: insert every full window of N tokens not inserted yet (an
        unresolved ``auto``, a config built without a budget, is a fixed budget's: nothing)."""
        if self.settings.context_ngrams is not True:
            return
        n = self.settings.ngram_size
        for end in range(max(self._learned, n - 1), len(tokens)):
            self.dicts.add(tokens[end - n + 1 : end + 1])
        self._learned = len(tokens)
        self._sync_keys()

    def guesses(self, tokens: list[int]) -> tuple[list[list[int]], list[str]]:
        """The step's guess sequences and their sources, in priority order, at most G."""
        s = self.settings
        seqs: list[list[int]] = []
        sources: list[str] = []
        bwd: list[int] = []
        if s.use_backward_dict:
            bwd = self.dicts.backward_guess(tokens, s.ngram_size)
            if bwd:
                seqs.append(bwd)
                sources.append(SOURCE_BWD)
        if s.use_forward_dict:
            for cont in self.dicts.forward_guesses(tokens[-1]):
                if len(seqs) >= s.max_guesses:
                    break
                if list(cont) != bwd:
                    seqs.append(list(cont))
                    sources.append(SOURCE_FWD)
        return seqs, sources

    def attach_pool(self, draft: Draft) -> Draft:
        """Send the pool as ``draft``'s auxiliary nodes (its last W logit rows come back to :meth:`update`)."""
        draft.aux_tokens = self.pool.aux_tokens()
        draft.aux_positions = self.pool.positions
        draft.aux_visible = self.pool.visible
        draft.aux_logit_rows = self.pool.logit_rows
        draft.aux_columns = self.pool.columns
        return draft

    def update(self, aux_logits: torch.Tensor | None) -> None:
        """Predict the pool's next tokens (coverage rule), learn the completed sequences, shift.
        ``aux_logits``: one row per sequence sent, the first w of W (``budget=auto`` may send fewer)."""
        if aux_logits is None:
            return
        s = self.settings
        draws = [self.rng.random() for _ in range(aux_logits.shape[0])] if s.coverage else None
        done = self.pool.advance(
            aux_logits,
            draws,
            s.coverage_threshold,
            s.coverage_reading,
            self.dicts.completions,
        )
        for seq in done:
            self.dicts.add(seq)
        self._sync_keys()

    def _sync_keys(self) -> None:
        """The key readings avoid the keys of S_fwd: pass on the ones added since last time (by this engine
        or, under ``memory: run`` at batch size > 1, by another request's sharing the dictionaries)."""
        added = self.dicts.keys_added
        self.pool.exclude(added[self._keys_seen :])
        self._keys_seen = len(added)
