"""``budget=auto``: each step's block trimmed to what pays on this machine.

Every tree method proposes its preset's draft; the core then keeps the part
that maximises expected tokens per second under the measured cost curve
(:class:`specbench.budget.costs.CostModel`), before the forward. Nothing here touches
the acceptance rule, so outputs are unchanged: a smaller draft is still a draft.

* **Expected tokens.** A guess's chance of being accepted is estimated from running counts by (source, depth,
  rank among its siblings, 0-3 and "4 or more"): a drafter's first guess at a depth is right far more often
  than its fifteenth. Sparse keys lean on coarser ones: the rate of (source, depth, rank) is shrunk toward
  that of (source, depth), that toward the source's, and that toward 1/4 (each by the weight of ``prior``
  guesses), so a key never seen starts at what its source does elsewhere. The counts cover every guess the
  drafter proposed, kept or trimmed: once the output has grown past a guess's depth, the guess counts as
  accepted when its path equals the output that followed its root. For a greedy target that is exactly
  acceptance; when sampling, a deterministic guess is accepted with the probability that the target samples
  it, which is the probability it matches the output: the same rate. So trimming never starves the statistics.
  A guess never scores above its parent (it cannot be accepted without it); a node that several sources
  proposed takes the best of their rates. Summed over the kept guesses this is the expected number accepted
  (siblings' rates are averages over siblings, so they add up to at most one per depth on average).
* **The trim.** Guesses sorted by score (parents first) are kept while the step's expected tokens per second,
  (1 + Σ kept scores) / t(1 + aux + kept), grows: the best prefix of that order is kept, as many nodes as
  maximise it.
* **Auxiliary nodes** (Lookahead's window, SPECTRA's candidate pool) propose
  nothing themselves; they feed the sources in the drafter's ``AUX_FEEDS``,
  so their worth shows only over many steps. It is measured: the tokens per
  (modelled) second of the steps that sent them, a running mean over about 32
  such steps. It is compared with the steady state without them, in which the
  sources they feed run dry: guesses of a step that went without them are
  counted under ``<source>/dry``, whose rate starts at 0 (a fed source brings
  nothing unfed until its own dry steps show otherwise: with ``context_ngrams``
  SPECTRA's dictionaries still learn from the output). When the second pays
  better the step goes without them, and the dry guesses that still pay go.
* **Drafting's own time.** Whether, and how deep, the drafter drafts is decided before each proposal, its own
  measured seconds counted, from a calibration (:mod:`specbench.budget.worth`, :meth:`AutoBudget.cap`).
* **Warm-up.** The aux nodes are sent while their worth is measured, until it
  has spent ``warm`` (16) plain steps' worth of (modelled) time on them: a
  pool that adds a fifth of a step is measured over ~80 steps, long enough for
  Lookahead's window and SPECTRA's dictionaries to fill and pay (a shorter
  warm-up can judge a pool before it pays and leave it out for good: bench/README.md),
  one that adds a whole step over ~16. From the ``MIN_WARM``-th step on the warm-up
  also ends as soon as the measured worth falls short of the dry rate by more than
  1/√(steps so far), so a pool that clearly costs more than it brings goes after ~5 steps.
* **The pool's width.** A drafter whose aux nodes are independent columns
  (SPECTRA's W pool sequences, ``Draft.aux_columns``) may send its first w.
  Whenever the pool on trial is judged not to pay (so at every step that
  would go without it, against that step's dry rate), the widest narrower
  width of W, W/2, … 1 (halved, rounded up) that should pay goes on trial
  instead, for what is left of the warm-up's time and at least ``MIN_WARM``
  steps: one whose block, with the guesses that pay beside it, would beat the
  rate without the pool if it brought the wider pool's tokens above one a
  step scaled by √(w / wider) (fewer columns feed less, but overlap less).
  Only when none should is the pool left out. Narrowing is for the run: a width
  never grows back. Lookahead's window shifts as a whole: its aux nodes go
  all or none. So on a machine where the pool costs more than it brings,
  CORE falls back to what its dictionaries learn without it, and on a flat
  (GPU-like) curve everything is kept.
* **Exploration.** The decision to leave auxiliary nodes out rests on a few
  measured steps, and the text and the context length change; so after
  ``explore_every`` steps without them one step sends them anyway, at the
  width last on trial (its worth joins the running mean), and the wait
  doubles after each such step until a step sends them by choice again (a
  fixed schedule: no randomness enters decoding; over a long run the
  exploration costs less and less).
* **Bounded regret.** What the aux nodes cost beyond what they bring is
  counted: each step that sent them adds its time less the time the step
  without them would have taken for the tokens it brought (at that step's
  rate without them, so a step where they paid counts negative). They are
  not sent (warm-up, trial, exploration or by choice) while that sum would exceed
  ``REGRET_SHARE`` (2%) of the run's modelled time plus ``REGRET_FLOOR``
  plain steps: a pool that never pays costs a run at most that, and one
  that pays earns room to be explored again.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from specbench.budget.costs import CostModel
from specbench.budget.worth import DraftWorth, widths
from specbench.core.draft import Draft

BUDGETS = ("fixed", "auto", "replay")  # replay: a recorded auto run's decisions (specbench.budget.replay)
MAX_RANK = 4  # sibling ranks counted apart: 0, 1, 2, 3, and 4 or more
DRY = "/dry"  # suffix of a source fed by aux nodes, counted apart in the steps that went without them
MIN_WARM = 4  # aux steps before the warm-up may end early
REGRET_SHARE = 0.02  # aux steps that do not pay may lose at most this share of the run's (modelled) time …
REGRET_FLOOR = 1.0  # … plus this many plain steps' worth


def positions(draft: Draft) -> list[tuple[int, int]]:
    """(depth, rank among the node's siblings in draft order, capped at MAX_RANK) of every guess."""
    depths = draft.depths()
    children: Counter = Counter()
    out = []
    for i, p in enumerate(draft.parents):
        out.append((depths[i], min(children[p], MAX_RANK)))
        children[p] += 1
    return out


@dataclass
class AcceptanceStats:
    """Guesses drafted and accepted by (source, depth, sibling rank), for the whole run; the counts
    of the coarser keys (source, depth) and (source,) are kept beside them."""

    base_rate: float = 0.25
    dry_rate: float = 0.0  # the base of a source counted dry: nothing, until its steps without aux show more
    prior: float = 2.0  # the weight, in guesses, of the coarser key's rate
    drafted: Counter = field(default_factory=Counter)
    accepted: Counter = field(default_factory=Counter)

    def rate(self, source: str, depth: int, rank: int = 0) -> float:
        r = self.dry_rate if source.endswith(DRY) else self.base_rate
        for key in ((source,), (source, depth), (source, depth, rank)):
            r = (self.accepted[key] + self.prior * r) / (self.drafted[key] + self.prior)
        return r

    def _count(self, draft: Draft, i: int, where: tuple[int, int], ok: bool, dry: tuple[str, ...] = ()) -> None:
        depth, rank = where
        for s in draft.sources_of(i):
            s = s + DRY if s in dry else s
            for key in ((s,), (s, depth), (s, depth, rank)):
                self.drafted[key] += 1
                self.accepted[key] += ok

    def observe(self, draft: Draft, accepted_nodes: list[int]) -> None:
        """Count the guesses of ``draft`` and which were accepted."""
        accepted = set(accepted_nodes)
        for i, where in enumerate(positions(draft)):
            self._count(draft, i, where, i in accepted)

    def observe_output(self, draft: Draft, output: list[int], final: bool = False, dry: tuple[str, ...] = ()) -> bool:
        """Count the guesses of ``draft`` against ``output``, the tokens that followed its root.
        Returns False (nothing counted) while the output is shorter than the draft's depth, unless
        ``final`` (the generation ended): then guesses deeper than the output are left out. Sources
        in ``dry`` are counted under their ``/dry`` name."""
        where = positions(draft)
        if where and max(d for d, _ in where) > len(output) and not final:
            return False
        matched: list[bool | None] = []
        for i, p in enumerate(draft.parents):
            depth = where[i][0]
            parent_ok = True if p < 0 else matched[p]
            if parent_ok is None or (parent_ok and depth > len(output)):
                matched.append(None)  # not known: the output stopped before this depth
                continue
            ok = bool(parent_ok) and draft.tokens[i] == output[depth - 1]
            matched.append(ok)
            self._count(draft, i, where[i], ok, dry)
        return True


def node_scores(draft: Draft, stats: AcceptanceStats, dry: tuple[str, ...] = ()) -> list[float]:
    """Each guess's estimated acceptance probability, never above its parent's; siblings (distinct
    tokens, at most one of which can follow) share at most their parent's, scaled down together when
    their rates add up to more (rates never observed start at the prior, and ten guesses at 1/4 each
    are not 2.5 tokens). Sources in ``dry`` are read under their ``/dry`` name (what they bring while
    their aux nodes stay home). Parents come before their children in a draft."""
    where = positions(draft)
    families: dict[int, list[int]] = {}
    raw = []
    for i, p in enumerate(draft.parents):
        srcs = [s + DRY if s in dry else s for s in draft.sources_of(i)]
        raw.append(max((stats.rate(s, *where[i]) for s in srcs), default=0.0))
        families.setdefault(p, []).append(i)
    scores = [0.0] * len(raw)
    for p in sorted(families):  # a parent's score is final before its children's
        share = 1.0 if p < 0 else scores[p]
        capped = [min(raw[i], share) for i in families[p]]
        total = sum(capped)
        scale = share / total if total > share else 1.0
        for i, c in zip(families[p], capped, strict=True):
            scores[i] = c * scale
    return scores


def best_prefix(scores: list[float], cost: CostModel, fixed_q: int, context: int) -> tuple[list[int], float]:
    """The nodes to keep (parents first) and the expected tokens per second of the step."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    best_k, best_rate, gain = 0, 1.0 / cost(fixed_q, context), 1.0
    for k, i in enumerate(order, start=1):
        if scores[i] <= 0:
            break
        gain += scores[i]
        rate = gain / cost(fixed_q + k, context)
        if rate > best_rate:
            best_k, best_rate = k, rate
    return sorted(order[:best_k]), best_rate


def subdraft(draft: Draft, keep: list[int], width: int) -> Draft:
    """``draft`` restricted to the guesses ``keep`` (closed under parents) and to the aux nodes of its
    first ``width`` columns (0: none; its :attr:`~Draft.aux_width` or more: all of them)."""
    out = draft.keep(keep)
    if width >= draft.aux_width:
        out.aux_tokens, out.aux_positions = draft.aux_tokens, draft.aux_positions
        out.aux_visible, out.aux_logit_rows = draft.aux_visible, draft.aux_logit_rows
        out.aux_columns = draft.aux_columns
    elif width > 0:  # the nodes of the first `width` columns, their mask and logit rows re-indexed
        cols = draft.aux_columns
        idx = [j for j, c in enumerate(cols) if c < width]
        at = {old: new for new, old in enumerate(idx)}
        out.aux_tokens = [draft.aux_tokens[j] for j in idx]
        out.aux_positions = [draft.aux_positions[j] for j in idx]
        out.aux_visible = draft.aux_visible[np.ix_(idx, idx)]
        out.aux_columns = [cols[j] for j in idx]
        if draft.aux_logit_rows is not None:
            out.aux_logit_rows = [at[j] for j in draft.aux_logit_rows if j in at]
    return out


def aux_count(draft: Draft, width: int) -> int:
    """Aux nodes of ``draft``'s first ``width`` columns."""
    if width <= 0:
        return 0
    if width >= draft.aux_width:
        return draft.n_aux
    return sum(c < width for c in draft.aux_columns)


class AutoBudget:
    """Trims drafts under a cost curve; learns acceptance rates from every step it planned."""

    def __init__(self, cost: CostModel, aux_feeds: tuple[str, ...] = (), explore_every: int = 16,
                 stats: AcceptanceStats | None = None, warm: float = 16.0, price_drafting: bool = True,
                 calibration: tuple | None = None) -> None:
        if explore_every < 0:
            raise ValueError(f"budget: explore_every must be >= 0, got {explore_every}")
        self.cost, self.aux_feeds, self.explore_every = cost, tuple(aux_feeds), explore_every
        self.stats = stats or AcceptanceStats()
        self.steps = 0
        self.skipped_aux = 0  # steps that went without their aux nodes since the last exploration
        self.next_explore = explore_every  # doubles after each exploration, back when aux pays again
        self.kept: list[int] = []  # guesses kept per step (what `auto` chose)
        self.proposed: list[int] = []  # guesses the drafter proposed per step
        self.aux_sent: list[bool] = []
        self.widths: list[int] = []  # aux columns sent per step (0: none)
        self.width: int | None = None  # the pool width on trial (None: the whole pool)
        # whole drafts waiting for their output: with its start, and the sources that ran dry
        self._pending: list[tuple[Draft, int, tuple[str, ...]]] = []
        self.warm = warm  # plain steps' worth of time spent on aux nodes before their worth is judged
        self._warm_spent = 0.0
        self.regret = 0.0  # plain steps' worth of time the aux steps lost against the steps without them
        self.elapsed = 0.0  # the run's modelled time so far, in plain steps
        self._rate_without = 0.0  # this step's rate without aux nodes (0: it has none)
        self._trial(0)
        self._context = self._drafted_depth = 0
        self.worth = DraftWorth(explore_every, price_drafting)  # whether drafting pays, its own time counted
        self.calibration = calibration  # drafting's cost measured before the run (DraftWorth.calibration)
        self.worth.calibrate(calibration, lambda q: cost(q, 0))
        self._capped = False  # this step drafts nothing (worth)

    def _trial(self, min_steps: int) -> None:
        """Measure the aux nodes' worth afresh (a new width on trial) over at least ``min_steps`` steps;
        the warm-up's time is shared by every width tried."""
        self._min_steps = min_steps
        self.aux_steps = 0
        self._aux_tokens = self._aux_seconds = 0.0  # running means over the steps that sent aux nodes

    def spawn(self) -> AutoBudget:
        """A planner for another request decoded beside this one: its own aux state, the same statistics
        and cost curve (a batch's rows learn acceptance together)."""
        return AutoBudget(self.cost, self.aux_feeds, self.explore_every, stats=self.stats, warm=self.warm,
                          price_drafting=self.worth.enabled, calibration=self.calibration)

    def cap(self) -> int | None:
        """Before the step's proposal: the deepest guess worth drafting (0: none; None: the method's own)."""
        self._capped = not self.worth.drafts(self.allowance(), lambda q: self.cost(q, self._context))
        return 0 if self._capped else self.worth.depth(lambda q: self.cost(q, self._context))

    @property
    def width_cap(self) -> int | None:
        """After :meth:`cap`: the widest top-k worth drafting a tree with (None: the method's own)."""
        return None if self._capped else self.worth.width_cap

    def plan(self, draft: Draft, tokens: list[int]) -> Draft:
        """The part of ``draft`` to verify after ``tokens`` (the sequence so far, its root last)."""
        width, keep, scores = self.choose(draft, tokens)  # and what it expects of the step, logged (replay.py)
        drafting = self.worth.predicted_seconds(self._drafted_depth, self.width_cap) if not self._capped else 0.0
        self.last_prediction = (1.0 + sum(scores[i] for i in keep) if scores else 1.0,
                                self.cost(1 + aux_count(draft, width) + len(keep), self._context) + drafting)
        return self.settle(draft, tokens, width, keep)

    def choose(self, draft: Draft, tokens: list[int]) -> tuple[int, list[int], list[float]]:
        """This step's pool width, the guesses to keep and the scores they were chosen by (what the sources
        bring without their aux nodes when none are sent); :meth:`settle` closes the step."""
        self.steps += 1
        self._resolve(tokens)
        self.proposed.append(len(draft))
        self._drafted_depth, context = max(draft.depths(), default=0), len(tokens)
        self._context = context
        if self._capped:  # a plain step: whatever a drafter proposed anyway goes unverified
            self._rate_without = 0.0
            return 0, [], []
        scores = node_scores(draft, self.stats)
        full = draft.aux_width
        width = min(full, self.width or full)
        keep, rate = best_prefix(scores, self.cost, 1 + aux_count(draft, width), context)
        if full:  # steady state without the aux nodes: the sources they feed run dry
            dry = node_scores(draft, self.stats, dry=self.aux_feeds)
            dry_keep, rate_without = best_prefix(dry, self.cost, 1, context)
            measured = self._aux_tokens / self._aux_seconds if self.aux_steps else rate
            room = self._room(draft, width, len(keep), len(dry_keep), context)
            if not room or (rate_without > measured and self._judged(measured / rate_without)):
                narrower = self._narrower(draft, scores, width, rate_without, context, len(dry_keep))
                if narrower:  # a narrower pool should pay: on trial from now on
                    self.width = width = narrower
                    keep, _ = best_prefix(scores, self.cost, 1 + aux_count(draft, width), context)
                    self._trial(MIN_WARM)
                else:
                    self.skipped_aux += 1
                    if self.explore_every and self.skipped_aux >= self.next_explore and room:
                        self.skipped_aux, self.next_explore = 0, 2 * self.next_explore  # explore: send them
                    else:
                        width, keep, scores = 0, dry_keep, dry  # what was learned still drafts
            else:
                self.next_explore = self.explore_every
        self._rate_without = rate_without if full and width else 0.0
        return width, keep, scores

    def settle(self, draft: Draft, tokens: list[int], width: int, keep: list[int]) -> Draft:
        """The step verifies ``draft``'s guesses ``keep`` (parents first) and its first ``width`` aux columns."""
        full = draft.aux_width
        self.last_plan = (list(keep), width)  # what the step verifies, for the record (specbench.budget.replay)
        if len(draft):
            self._pending.append((draft, len(tokens), () if width or not full else self.aux_feeds))
        self.kept.append(len(keep))
        self.aux_sent.append(bool(width))
        self.widths.append(width)
        if width == full and len(keep) == len(draft):
            return draft
        return subdraft(draft, keep, width)

    def _room(self, draft: Draft, width: int, kept: int, dry_kept: int, context: int) -> bool:
        """Whether the regret has room for a step with ``width`` columns and ``kept`` guesses, at most
        its extra time over the step without them (``dry_kept`` guesses), in plain steps."""
        extra = self.cost(1 + aux_count(draft, width) + kept, context) - self.cost(1 + dry_kept, context)
        return self.regret + max(extra / self.cost(1, context), 0.0) <= self.allowance()

    def _narrower(self, draft: Draft, scores: list[float], width: int, rate_without: float, context: int,
                  dry_kept: int) -> int:
        """The widest pool narrower than ``width`` that should still pay and that the regret has room
        for: what ``width`` brought above one token a step, scaled by √(w / width) (a narrower pool
        feeds its sources less, but its columns overlap less), in the time its block takes with the
        guesses that pay beside it, against ``rate_without``. 0: none."""
        gained = self._aux_tokens - 1.0
        for w in widths(draft.aux_width):
            if w < width:
                w_keep, _ = best_prefix(scores, self.cost, 1 + aux_count(draft, w), context)
                seconds = self.cost(1 + aux_count(draft, w) + len(w_keep), context)
                if ((1.0 + gained * (w / width) ** 0.5) / seconds > rate_without
                        and self._room(draft, w, len(w_keep), dry_kept, context)):
                    return w
        return 0

    def allowance(self) -> float:
        """The regret the aux nodes may have spent so far, in plain steps' worth of time."""
        return REGRET_FLOOR + REGRET_SHARE * self.elapsed

    def _judged(self, ratio: float) -> bool:
        """Whether the aux nodes' measured worth, ``ratio`` of the rate without them, is known well
        enough to go without them: once ``warm`` plain steps' worth of time went to them (and this
        width had ``MIN_WARM`` steps, if it is not the first), or sooner (from ``MIN_WARM`` steps) when
        it falls short by more than 1/√(aux steps), a tolerance that narrows with the evidence."""
        k = self.aux_steps
        return (self._warm_spent >= self.warm and k >= self._min_steps) or (k >= MIN_WARM and ratio < 1 - k**-0.5)

    def record(self, draft: Draft, accepted_nodes: list[int], draft_s: float = 0.0) -> None:
        """The step verified ``draft`` (as planned) and accepted ``accepted_nodes``, after ``draft_s`` seconds
        of drafting and planning: the run's time, drafting's worth, and the aux nodes' worth and regret."""
        seconds = self.cost(1 + len(draft) + draft.n_aux, self._context)
        plain = self.cost(1, self._context)
        self.elapsed += seconds / plain
        if not self._capped:
            self.worth.record(1 + len(accepted_nodes), seconds + draft_s, plain, draft, self._drafted_depth, draft_s,
                              accepted_nodes)
        if not draft.n_aux:
            return
        if self._rate_without > 0:  # the time the step without them would have taken for these tokens
            self.regret += (seconds - (1 + len(accepted_nodes)) / self._rate_without) / plain
        self.aux_steps += 1
        w = max(1.0 / 32, 1.0 / self.aux_steps)  # a plain mean at first, then a running one
        self._warm_spent += (seconds - self.cost(1 + len(draft), self._context)) / plain
        self._aux_tokens += w * (1 + len(accepted_nodes) - self._aux_tokens)
        self._aux_seconds += w * (seconds - self._aux_seconds)

    def _resolve(self, tokens: list[int], final: bool = False) -> None:
        waiting = []
        for draft, start, dry in self._pending:
            if not self.stats.observe_output(draft, tokens[start:], final, dry):
                waiting.append((draft, start, dry))
        self._pending = waiting

    def finish(self, tokens: list[int]) -> None:
        """The generation ended with ``tokens``: count what can still be judged, forget the rest."""
        self._resolve(tokens, final=True)
        self._pending = []
