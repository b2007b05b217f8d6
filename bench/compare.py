"""Every method against autoregressive decoding, side by side in one process.

For each dtype and dataset, every prompt is decoded by the autoregressive
baseline and by each method preset (``conf/method/<preset>.yaml``), in an order
that rotates from prompt to prompt, after one un-recorded warm-up per method.
Reported per method: τ (tokens per decode step: the mean acceptance length), speedup (the method's tokens per second over the
baseline's on the same prompts and repeats, ± its standard deviation over
repeats, [its 95% paired bootstrap interval over prompts]), the plain time
ratio (Σ baseline time / Σ method time: the same figure when the outputs have
equal lengths, inflated or deflated by length when sampling makes them
differ), the speedup modelled by the cost curve that ``auto`` plans with
(model: each decode step costs t(root + guesses + aux nodes, context) plus its
drafting's measured seconds, the two parts ``auto`` prices; shown
when a preset runs ``budget=auto``), Mac-TP, Mic-TP, tokens per decode
forward (q/fwd: the root, the guesses and the auxiliary nodes), the share of steps that sent auxiliary nodes
and how many they sent on average (aux: ``budget=auto`` chooses the pool's
width and may leave it out), drafting overhead per step (time outside the
model forward: propose + update; for EAGLE and Medusa the head's forwards), its share of the
decode steps' time (draft%), and how many greedy outputs equal the
baseline's. transformers' own prompt lookup (``generate(prompt_lookup_num_tokens=10)``)
runs on the same prompts as ``hf_pld``, next to our ``pld``.

Paper presets (``lookahead``, ``spectra_core``, ``spectra``, ``rest``) carry the
GPU budget; ``-cpu`` presets a budget for a CPU (see DESIGN: on this CPU a
120-token block costs several single-token steps).

Retrieval presets (``rest``, ``spectra_retrieval``, ``spectra``, ``lookahead_rest``)
read the store named per dataset by ``--stores`` (default: the standard-library
store for code prompts, the model-generated ``chat`` store, built from MT-Bench
questions 41-80, for MT-Bench questions 1-40 and GSM8K); each is checked as a
run would check it (it must exist; its prompts must not overlap the evaluated
ones). ``<preset>:auto`` runs the preset with ``budget=auto`` (its drafts trimmed under this
machine's measured cost curve, printed first; ``--flat-cost`` plans with a GPU-like flat curve
instead, ``--plan-dtype bfloat16`` with bf16's curve: in an fp32 run, whose outputs all equal the
autoregressive ones, the model column then compares budgets under bf16 costs on the same texts);
``<preset>:static`` plans from the warm-up's drafting table, frozen (``budget=static``).
``<preset>:norefine`` reads the unrefined store; ``<preset>:random`` reads the refined store's
control, as many pieces drawn at random from the same subset (``specbench datastore
refine --select random``), so that refinement is compared at a matched store size. The lookup time per
step and each store's size and build time are printed too. ``autoregressive:fixed`` is a second
autoregressive run measured as a method: the null control, what the speed line reads for a method that
costs nothing on these prompts and repeats. ``--split``: where each ``auto`` preset's decode time went beyond
autoregressive decoding's steps at the same positions (greedy: step i of each decodes after the same tokens
until a guess is accepted), as shares of its time: the steps the planner let draft (its choices, probes and
first drafts) and the plain ones, with a plain step's drafting and planning in ms against the loop's own, then
budget=auto's promise where nothing pays (τ ≤ 1.02, outputs equal): O = D + P, what drafting (D) and the plain
steps' planning (P) cost beyond autoregressive decoding, at most A, the allowance the planner grants itself over one
pass, with a point speedup of at least 0.97 (``kept``, else ``broken``); a row that pays says ``pays`` and is held
to the interval line; ``autoregressive:fixed`` is calibration, never a pass/fail row.
``--forward eager compiled``: every row of ours runs in each forward mode (``forward=compiled``: static shapes,
compiled with Inductor, compiled before the warm-up and said apart), a compiled row named ``<row>@compiled`` with
its speedup over ``autoregressive@compiled``; with ``--engines``, each mode's autoregressive rate is set against
``llama.cpp:ar``'s.

    python bench/compare.py --data gsm8k=/path/gsm8k_test.jsonl
    python bench/compare.py --temperature 1 --repeats 3 --prompts 5 --methods pld spectra_core-cpu
    python bench/compare.py --dtypes bfloat16 --datasets mtbench --prompts 2 --max-new-tokens 64
    python bench/compare.py --dtypes float32 --plan-dtype bfloat16 --methods spectra_core-cpu spectra_core-cpu:fixed
    python bench/compare.py --dtypes float32 --split --methods autoregressive:fixed eagle-cpu:auto
    python bench/compare.py --methods pld spectra_core-cpu rest-cpu spectra_retrieval-cpu \
        spectra_retrieval-cpu:norefine spectra-cpu --datasets humaneval mtbench
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from baseline import hf_generate  # bench/ is on sys.path when a script here runs
from omegaconf import OmegaConf
from prompts import dataset_prompts, preset  # bench/ is on sys.path when a script here runs

from methods.registry import get_method
from specbench.budget.costs import CostModel
from specbench.budget.planner import ALLOWANCE_FLOOR, ALLOWANCE_SHARE, AutoBudget
from specbench.core.acceptance import SamplingParams
from specbench.core.decode import generate
from specbench.core.draft import DrafterContext
from specbench.core.engine import FORWARD_MODES, make_target
from specbench.core.forward import Target
from specbench.core.reference import References
from specbench.errors import ConfigError
from specbench.machine.costs import load_or_measure
from specbench.models import load_model
from specbench.paths import CONF_DIR, compiled_packages
from specbench.provenance import environment_info
from specbench.results.metrics import mac_tp, mic_tp
from specbench.results.stats import bootstrap_interval, share_interval, speedup_ratio
from specbench.results.table import format_interval
from specbench.stores.datastore import Datastore

ENGINES = ("llama.cpp",)  # --engines: peer engines run beside ours (specbench.peers)
ENGINE_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
LINE = 0.97  # the speed line budget=auto is held to: at least this speedup, with an interval reaching 1.00
PAYS = 1.02  # τ above this: drafting pays, and the row is held to the interval line; at or below, to O ≤ A


def margin(sp: dict[str, float]) -> float:
    """The added cost, as a share of the row's time, that keeps it on the line: ``on`` when ≥ 0. Scaling every
    time of the row by 1 + c scales its speedup and each bootstrap resample (the same prompts drawn) by 1 / (1 + c),
    so the row stays on the line exactly while c ≤ min(speedup / LINE, interval's top) − 1."""
    return min(sp["speedup"] / LINE, sp["hi"]) - 1.0


def on_the_line(sp: dict[str, float]) -> str:
    """``on`` when the speedup is at least :data:`LINE` and its interval's top reaches 1.00, read exactly (a top
    of 0.996 prints as 1.00 and is off), with the :func:`margin` (what drafting could still cost, or how far off
    the row is); ``-`` without an interval."""
    if not sp["hi"] == sp["hi"]:  # NaN: one prompt, no interval
        return "-"
    return f"{'on' if margin(sp) >= 0 else 'off'} {100 * margin(sp):+.1f}%"


DEFAULT_METHODS = ["pld", "anpd", "lookahead-cpu", "lookahead", "spectra_core-cpu", "spectra_core"]
DEFAULT_STORES = {"humaneval": "stdlib", "mbpp": "stdlib", "classeval": "stdlib", "mtbench": "chat", "gsm8k": "chat",
                  "spec_bench": "chat"}


def store_facts(path) -> str:
    meta = Datastore.load(path).meta
    scored = meta.get("refinement", {}).get("score_seconds")
    return (
        f"{Path(path).name}: {meta['tokens'] / 1e6:.2f}M tokens, {meta.get('documents', '?')} documents, "
        f"index {meta.get('index_bytes', 0) / 1e6:.0f} MB, indexed in {meta.get('build_seconds', 0):.0f} s"
        + (f", pieces scored in {scored:.0f} s" if scored is not None else "")
    )


class Tally:
    def __init__(self) -> None:
        self.tokens = self.steps = self.n = self.match = 0
        self.seconds = self.draft_s = self.lookup_s = 0.0
        self.aux_steps = self.aux_nodes = 0  # decode steps that sent aux nodes, and how many they sent
        self.forward_tokens = 0  # tokens sent per decode forward: root + guesses + auxiliary nodes
        self.step_tokens: list[int] = []
        self.step_times: list[float] = []
        self.modelled_s = 0.0  # decode time as auto plans it: Σ t(1 + guesses + aux, context) + drafting's seconds
        self.runs: list[tuple[int, int, int, float]] = []  # (prompt, repeat, tokens, seconds) of each generation
        self.drafted = self.accepted = 0  # a peer engine's guesses drafted and accepted (its own counts)
        self.same_as_ours = 0  # a peer engine's autoregressive outputs equal to ours
        # (prompt, repeat): each decode step's seconds, drafting seconds and whether the planner let it draft
        self.gens: dict[tuple[int, int], tuple[list[float], list[float], list[bool]]] = {}
        self.planned = False  # a planner (budget=auto, static) decided its steps

    def add(self, rec, seconds: float, same: bool, cost: CostModel | None = None, prompt: int = 0,
            repeat: int = 0, whys: list[str] | None = None) -> None:
        self.runs.append((prompt, repeat, rec.new_tokens, seconds))
        self.planned = self.planned or whys is not None
        drafting = [why != "plain" for why in whys] if whys else [q > 0 for q in rec.step_drafted[1:]]
        self.gens[(prompt, repeat)] = (rec.step_times[1:], rec.step_draft_s[1:], drafting)
        if cost is not None:
            context = rec.prompt_len + rec.step_tokens[0]
            for q, a, k, d in zip(rec.step_drafted[1:], rec.step_aux[1:], rec.step_tokens[1:], rec.step_draft_s[1:],
                                  strict=True):
                self.modelled_s += cost(1 + q + a, context) + d  # drafting priced as measured, as auto prices it
                context += k
        self.n += 1
        self.match += same
        self.tokens += rec.new_tokens
        self.steps += rec.steps
        self.seconds += seconds
        self.draft_s += sum(rec.step_draft_s)
        self.lookup_s += sum(rec.step_lookup_s)
        self.forward_tokens += sum(1 + d + a for d, a in zip(rec.step_drafted[1:], rec.step_aux[1:], strict=True))
        self.aux_steps += sum(a > 0 for a in rec.step_aux[1:])
        self.aux_nodes += sum(rec.step_aux[1:])
        self.step_tokens += rec.step_tokens[1:]  # decode steps: Mac-TP and Mic-TP leave the prefill out
        self.step_times += rec.step_times[1:]

    def add_engine(self, done, same: bool, prompt: int, repeat: int) -> None:
        """A peer engine's generation (:class:`specbench.peers.llamacpp.Completion`): its server-timed seconds,
        its steps from the guesses it accepted."""
        self.runs.append((prompt, repeat, len(done.tokens), done.seconds))
        self.n += 1
        self.match += same
        self.tokens += len(done.tokens)
        self.seconds += done.seconds
        self.steps += done.steps
        self.drafted += done.drafted
        self.accepted += done.accepted

    def add_tokens(self, out: list[int], seconds: float, same: bool, prompt: int, repeat: int) -> None:
        """A generation known only by its tokens and time (transformers' generate)."""
        self.runs.append((prompt, repeat, len(out), seconds))
        self.n += 1
        self.match += same
        self.tokens += len(out)
        self.seconds += seconds


def speedups(t: Tally, base: Tally) -> dict[str, float]:
    """The method's token rate over the baseline's on the same prompts and repeats (metrics.speedup_ratio),
    its 95% paired bootstrap interval over prompts, its spread over repeats, and the plain time ratio
    (Σ baseline seconds / Σ method seconds: right only when both outputs have the same length)."""
    def frame(tally: Tally) -> pd.DataFrame:
        return pd.DataFrame(tally.runs, columns=["prompt", "repeat", "tokens", "seconds"])

    paired = frame(t).merge(frame(base), on=["prompt", "repeat"], suffixes=("_m", "_b"))
    cols = ["tokens_m", "seconds_m", "tokens_b", "seconds_b"]
    per_prompt = paired.groupby("prompt")[cols].sum()
    per_repeat = paired.groupby("repeat")[cols].sum()
    lo, hi = bootstrap_interval(dict(zip(("m_tokens", "m_seconds", "b_tokens", "b_seconds"),
                                         (per_prompt[c] for c in cols), strict=True)), speedup_ratio)
    ratios = speedup_ratio(*(per_repeat[c] for c in cols))
    return {
        "speedup": float(speedup_ratio(*(paired[c].sum() for c in cols))),
        "lo": lo,
        "hi": hi,
        "std": float(np.std(ratios, ddof=1)) if len(ratios) > 1 else float("nan"),
        "time_ratio": float(paired["seconds_b"].sum() / paired["seconds_m"].sum()),
    }


def share_of_limit(t: Tally, base: Tally, oracle: Tally, oracle_base: Tally) -> str:
    """The row's speedup (over ``base``) ÷ the oracle's (over ``oracle_base``), [95% paired bootstrap interval
    over prompts]."""
    def per_prompt(tally: Tally, over: Tally) -> pd.DataFrame:
        runs, b = (pd.DataFrame(x.runs, columns=["prompt", "repeat", "tokens", "seconds"]) for x in (tally, over))
        return runs.merge(b, on=["prompt", "repeat"], suffixes=("_m", "_b")).groupby("prompt").sum()

    names = {"m_tokens": "tokens_m", "m_seconds": "seconds_m", "b_tokens": "tokens_b", "b_seconds": "seconds_b"}
    mine, best = per_prompt(t, base), per_prompt(oracle, oracle_base)
    common = mine.index.intersection(best.index)
    lo, hi = share_interval(*({k: p.loc[common, c] for k, c in names.items()} for p in (mine, best)))
    point = speedups(t, base)["speedup"] / speedups(oracle, oracle_base)["speedup"]
    return format_interval(point, lo, hi, spec=".0%")


def bench(loaded, prompts, presets: list[str], max_new: int, run_cfg=None, store=None, cost=None,
          sampling: SamplingParams | None = None, repeats: int = 1, hf_pld: bool = True,
          engines: dict | None = None, forwards: tuple[str, ...] = ("eager",)) -> dict[str, Tally]:
    """``engines``: peer servers by row name (``llama.cpp:ar``, ``llama.cpp:<spec type>``), sent the same prompts
    in the same rotation (greedy). ``forwards``: the forward modes every row runs in (a row of a mode other than
    eager is named ``<row>@<mode>``, its speedup over ``autoregressive@<mode>``)."""
    engines = engines or {}
    target = Target(loaded.model)
    targets = {mode: target if mode == "eager" else make_target(loaded.model, mode, ahead=compiled_packages())
               for mode in forwards}
    costs = {"eager": cost}  # each mode plans on its own curve (a flat one is every mode's)
    for mode, t in targets.items():
        if hasattr(t, "warm"):
            print(f"  forward={mode}: compiled every width in {t.warm():.1f} s (not timed as decoding)")
        if mode != "eager" and cost is not None:
            costs[mode] = cost if cost.device_name == "flat" else load_or_measure(
                dataclasses.replace(loaded, forward=mode), loaded.name, loaded.dtype, "sdpa", check=True, target=t)
            print(f"cost curve (forward={mode}):\n{costs[mode].table()}")
    eos = loaded.eos_token_ids
    sampling = sampling or SamplingParams()
    drafters = {}
    budgets = {}  # <preset>:auto: trimmed under the measured cost curve, statistics kept across prompts
    whys: dict[str, list[str] | None] = {}  # each preset's last generation: the planner's reason for each step
    references = References(target, max_new, eos)  # the oracle's: each prompt's greedy output, made untimed
    rows = [(name, mode) for mode in forwards for name in ["autoregressive", *presets]]
    first_ar = "autoregressive" if forwards[0] == "eager" else f"autoregressive@{forwards[0]}"

    def cost_of(row: str):  # the curve a row plans and is modelled on: its mode's
        return costs.get(row.partition("@")[2] or "eager")

    on = {}  # each row's target
    for name, mode in rows:
        row = name if mode == "eager" else f"{name}@{mode}"
        on[row] = targets[mode]
        if name == "autoregressive":
            drafters[row] = get_method("autoregressive")(None, vocab_size=loaded.vocab_size)
            continue
        method, cfg, budget = preset(name, run_cfg, store)
        context = DrafterContext(sampling=sampling, device=loaded.device, target_model=loaded.model,
                                 target_name=loaded.name,  # drafters that read the target (EAGLE, Medusa)
                                 forward_cost=costs.get(mode), reference=references)
        drafters[row] = get_method(method)(
            cfg, vocab_size=loaded.vocab_size, seed=0, tokenizer=loaded.tokenizer, context=context
        )
        if budget in ("auto", "static"):  # the warm-up's planner measures what drafting costs, as a run's does
            budgets[row] = AutoBudget(costs.get(mode), aux_feeds=get_method(method).AUX_FEEDS, static=budget == "static",
                                       calibrating=True, catches_up=drafters[row].catches_up)
        if getattr(cfg, "_store_path", None) and mode == forwards[0]:
            print(f"  {name} reads {store_facts(cfg._store_path)}")

    def once(name, ids, n, seed):
        generator = torch.Generator().manual_seed(seed)  # the same draws for every method on one prompt
        if name in engines:
            done = engines[name].complete(ids, n)
            return done.tokens, done, done.seconds
        if name == "hf_pld":
            start = time.perf_counter()
            out = hf_generate(loaded, ids, n, prompt_lookup_num_tokens=10)
            return out, None, time.perf_counter() - start
        if drafters[name].needs_reference:
            references(ids)  # before the clock starts
        seen = len(budgets[name].why) if name in budgets else 0
        start = time.perf_counter()
        rec = generate(on[name], drafters[name], ids, max_new_tokens=n, eos_token_ids=eos, planner=budgets.get(name),
                       sampling=sampling, generator=generator)
        seconds = time.perf_counter() - start
        whys[name] = budgets[name].why[seen:] if name in budgets else None  # the planner's reason for each step
        return rec.output_ids, rec, seconds

    # transformers' prompt lookup decodes greedily only
    names = list(drafters) + (["hf_pld"] if sampling.greedy and hf_pld else []) + list(engines)
    for name in names:  # warm-up, not recorded
        once(name, prompts[0], 16, 0)
    tallies = {name: Tally() for name in names}
    tables = {}  # the drafting tables the warm-up measured
    for rep in range(repeats):  # each repeat replicates the run: drafters and budgets start empty
        for drafter in drafters.values():  # as a run does: the warm-up teaches run-long memory nothing
            drafter.reset()
        for server in engines.values():  # and so do an engine's (ngram-mod and ngram-cache keep what they saw)
            server.stop()
            server.start()
        for name, b in budgets.items():  # the warm-up's drafting table is kept, as a run keeps it
            tables.setdefault(name, b.drafting)
            budgets[name] = AutoBudget(cost_of(name), aux_feeds=b.aux_feeds, drafting=tables[name].copy(frozen=b.static),
                                       static=b.static, catches_up=b.catches_up)
        for i, ids in enumerate(prompts):
            shift = (i + rep) % len(names)
            order = names[shift:] + names[:shift]
            outs = {}
            for name in order:
                if name in drafters:
                    drafters[name].begin_sample()
                outs[name] = once(name, ids, max_new, 1_000_003 * rep + i)
            ref = outs[first_ar][0]  # the first mode's autoregressive output
            if sampling.greedy and len(ref) == max_new:
                references.add(ids, ref)
            for name, (out, rec, seconds) in outs.items():
                own = outs[engine_baseline(name)][0]  # an engine's or a mode's own autoregressive output
                same = sampling.greedy and out == own
                if name == engine_baseline(name) and name in engines:  # the two engines' greedy outputs
                    tallies[name].same_as_ours += sampling.greedy and out == ref
                if name in engines:
                    tallies[name].add_engine(rec, same, i, rep)
                elif rec is None:  # hf_pld: only tokens and time
                    tallies[name].add_tokens(out, seconds, same, i, rep)
                else:
                    tallies[name].add(rec, seconds, same, cost_of(name), i, rep, whys[name])
    return tallies


def engine_baseline(name: str) -> str:
    """The row a row's speedup is over: a peer engine's own autoregressive run, else ours in the row's mode."""
    engine = name.partition(":")[0]
    mode = name.partition("@")[2]
    return f"{engine}:ar" if engine in ENGINES else f"autoregressive@{mode}" if mode else "autoregressive"


def time_split(t: Tally, base: Tally) -> str:
    """Where ``t``'s decode steps' seconds went beyond ``base``'s steps at the same positions (greedy, equal
    outputs: step i of each decodes after the same tokens until a guess is accepted), as shares of ``base``'s
    decode time: the steps the planner let draft, the plain ones; a plain step's drafting seconds (the
    drafter's check and the planner's bookkeeping, its record() included) against ``base``'s (the loop's own).
    Then what the planner spent against what it allows itself: O = D + P, D the drafting steps' excess, P the
    plain steps' drafting and planning beyond the loop's own, A the allowance over one pass (:func:`spent`); and
    the steps ``base`` took past ``t``'s last (what accepted guesses saved, which D does not subtract)."""
    over, steps, stopped, own, total, saved = _split(t, base)
    o, a = spent(t, base)
    return (f"drafting {100 * over[True] / total:+.2f}% ({steps[True]} steps), plain {100 * over[False] / total:+.2f}%"
            f" ({steps[False]} steps, drafting and planning {1e3 * np.mean(stopped or [0]):.3f} ms a step against "
            f"the loop's {1e3 * np.mean(own or [0]):.3f}); O = D + P {100 * o:+.2f}% against A {100 * a:.2f}%; "
            f"saved {100 * saved[0] / total:.2f}% ({saved[1]} steps fewer)")


def _split(t: Tally, base: Tally) -> tuple:
    """Excess seconds and steps of ``t`` over ``base``, by whether the planner let the step draft; the plain
    steps' drafting seconds, ``base``'s, ``base``'s decode time, and ``base``'s seconds and steps past ``t``'s."""
    over, steps, stopped = {True: 0.0, False: 0.0}, {True: 0, False: 0}, []
    total = sum(sum(times) for times, _, _ in base.gens.values())
    own = [d for _, draft_s, _ in base.gens.values() for d in draft_s]
    saved = [0.0, 0]
    for key, (times, draft_s, drafting) in t.gens.items():
        plain_s = base.gens[key][0] if key in base.gens else []
        for s, d, drafted, b in zip(times, draft_s, drafting, plain_s, strict=False):
            over[drafted] += s - b
            steps[drafted] += 1
            if not drafted:
                stopped.append(d)
        saved[0] += sum(plain_s[len(times):])
        saved[1] += max(0, len(plain_s) - len(times))
    return over, steps, stopped, own, total, saved


def spent(t: Tally, base: Tally) -> tuple[float, float]:
    """O and A as shares of ``base``'s decode time: O = D + P, D the excess of the steps the planner let draft
    over ``base``'s at the same positions, P = (a plain step's drafting and planning − the loop's own) × the plain
    steps; A = ALLOWANCE_SHARE + ALLOWANCE_FLOOR ÷ the plain steps of one pass (each repeat is a pass: its
    planner starts afresh)."""
    over, steps, stopped, own, total, _ = _split(t, base)
    p = (np.mean(stopped) - np.mean(own or [0])) * steps[False] if stopped else 0.0
    passes = len({rep for _, rep in base.gens}) or 1
    pass_steps = sum(len(times) for times, _, _ in base.gens.values()) / passes
    return (over[True] + p) / total, ALLOWANCE_SHARE + ALLOWANCE_FLOOR / max(pass_steps, 1)


def promise(t: Tally, base: Tally, sp: dict[str, float], greedy: bool) -> str:
    """budget=auto's promise where nothing pays (greedy, outputs equal, τ ≤ 1.02): O ≤ A and a point speedup
    of at least :data:`LINE` (``kept`` / ``broken``); where drafting pays the interval line holds instead
    (``pays``); ``-`` unplanned or sampled."""
    if not (t.planned and greedy and t.steps):
        return "-"
    if t.match < t.n:
        return "outputs differ"
    if t.tokens / t.steps > PAYS:
        return "pays"
    o, a = spent(t, base)
    return "kept" if o <= a and sp["speedup"] >= LINE else "broken"


def report(dtype: str, dataset: str, tallies: dict[str, Tally], greedy: bool = True, split: bool = False) -> None:
    for name, t in tallies.items():
        base = tallies[engine_baseline(name)]
        tau = f"{t.tokens / t.steps:5.2f}" if t.steps else "    -"
        mac = f"{mac_tp(t.step_tokens, t.step_times):7.1f}" if t.step_times else "      -"
        mic = (
            f"{mic_tp(t.step_tokens, t.step_times):7.1f}" if t.step_times else f"{t.tokens / t.seconds:7.1f}"
        )
        decode_steps = t.steps - t.n
        overhead = f"{1000 * t.draft_s / decode_steps:6.2f}" if decode_steps > 0 and t.steps else "     -"
        lookup = f"{1000 * t.lookup_s / decode_steps:6.2f}" if decode_steps > 0 and t.lookup_s else "     -"
        share = f"{100 * t.draft_s / sum(t.step_times):5.1f}%" if t.step_times and t.draft_s else "     -"
        width = f"{t.forward_tokens / decode_steps:5.1f}" if decode_steps > 0 and t.step_tokens else "    -"
        aux = (f"{100 * t.aux_steps / decode_steps:3.0f}%:{t.aux_nodes / t.aux_steps:<4.0f}"
               if t.aux_steps else "       -")  # steps that sent aux nodes : nodes they sent
        sp = speedups(t, base)
        speedup = format_interval(sp["speedup"], sp["lo"], sp["hi"], sp["std"], suffix="x")
        modelled = (f"{(base.modelled_s / (base.tokens - base.n)) / (t.modelled_s / (t.tokens - t.n)):5.2f}x"
                    if t.modelled_s and base.modelled_s else "     -")  # decode steps only, as planned
        same = f"{t.match}/{t.n}" if greedy else "-"
        line = on_the_line(sp) if name != engine_baseline(name) else "-"
        mode = name.partition("@")[2]
        oracle = tallies.get(f"oracle@{mode}" if mode else "oracle")  # the limit in the row's own mode
        limit = (share_of_limit(t, base, oracle, tallies[f"autoregressive@{mode}" if mode else "autoregressive"])
                 if oracle is not None and name != engine_baseline(name) else "-")
        print(
            f"{dtype:9} {dataset:10} {name:30} {tau} {speedup:30} {limit:17} {t.tokens / t.seconds:7.1f}"
            f" {sp['time_ratio']:5.2f}x {modelled} {mac} {mic} {width} {aux} {overhead} {share} {lookup}"
            f"  {same:10} {line}"
        )
        if split and greedy and t.planned:
            print(f"{'':21} {name:30} beyond autoregressive decoding's steps: {time_split(t, base)}: "
                  f"{promise(t, base, sp, greedy)}")
    for engine in ENGINES:
        ar = tallies.get(f"{engine}:ar")
        for row in [r for r in tallies if r.partition("@")[0] == "autoregressive"]:
            ours = tallies[row]
            if ar is not None and ar.seconds and ours.seconds:
                print(f"{dtype:9} {dataset:10} {engine}:ar against our {row}: "
                      f"{(ar.tokens / ar.seconds) / (ours.tokens / ours.seconds):.2f}x the tokens/s; ours "
                      f"{(ours.tokens / ours.seconds) / (ar.tokens / ar.seconds):.2f}x theirs, "
                      + (f"outputs equal to ours {ar.same_as_ours}/{ar.n}" if greedy else ""))


def peer_servers(args, loaded, dtype: str) -> list:
    """(row name, server) for every peer engine and type asked for: llama.cpp on a GGUF of the loaded weights."""
    if not args.engines:
        return []
    if args.temperature:
        raise SystemExit("--engines runs the peers greedily: use --temperature 0")
    from specbench.peers import llamacpp

    gguf = llamacpp.gguf_for(loaded.model, loaded.tokenizer, args.model, dtype)
    context = min(loaded.context_length, 8192)
    rows = [(f"llama.cpp:{'ar' if kind == 'none' else kind}", llamacpp.LlamaServer(gguf, kind, context=context))
            for kind in ("none", *[k for k in args.engine_types if k not in ("none", "draft-simple")])]
    if args.engine_draft:
        from specbench.models import load_draft

        draft = load_draft(args.engine_draft, dtype, OmegaConf.load(CONF_DIR / "hardware" / "cpu.yaml"))
        md = llamacpp.gguf_for(draft.model, draft.tokenizer, args.engine_draft, dtype)
        rows.append(("llama.cpp:draft-simple", llamacpp.LlamaServer(gguf, "draft-simple", context=context,
                                                                    extra=("-md", str(md)))))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    ap.add_argument("--datasets", nargs="+", default=["mtbench", "gsm8k", "humaneval"])
    ap.add_argument("--data", action="append", default=[], help="NAME=PATH: a local copy of a dataset")
    ap.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, help="method presets from conf/method/")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy; > 0 samples (seeded per prompt "
                    "and repeat, the same draws for every method)")
    ap.add_argument("--repeats", type=int, default=1, help="measure every prompt this many times (each repeat "
                    "replicates the run); speedups then show ±their spread over repeats")
    ap.add_argument("--forward", nargs="+", default=["eager"], choices=FORWARD_MODES,
                    help="the forward modes every row runs in, side by side (compiled: rows <row>@compiled, "
                         "over autoregressive@compiled)")
    ap.add_argument("--no-hf-pld", action="store_true", help="leave out transformers' prompt lookup")
    ap.add_argument("--engines", nargs="*", default=[], choices=ENGINES,
                    help="peer engines run beside ours on the same weights (a GGUF of the loaded dtype) and prompts, "
                    "greedy: rows <engine>:ar (its own autoregressive run, its rows' baseline) and <engine>:<type> "
                    "(make peers builds llama.cpp's server)")
    ap.add_argument("--engine-types", nargs="+", default=list(ENGINE_TYPES),
                    help="llama.cpp's speculative types (--spec-type) run as rows")
    ap.add_argument("--engine-draft", help="a model preset of the same tokenizer: adds llama.cpp:draft-simple, "
                    "drafting with its GGUF")
    ap.add_argument("--stores", nargs="*", default=[], help="DATASET=STORE: the store retrieval presets read")
    ap.add_argument("--split", action="store_true",
                    help="(greedy) after each row, where its decode time went beyond autoregressive decoding's steps "
                    "at the same positions: the steps the planner let draft, the plain ones")
    ap.add_argument("--remeasure", action="store_true",
                    help="measure the cost curve anew (and cache it): a curve measured while the machine ran at "
                    "another speed (other load, another clock) skews the plan and the model column")
    ap.add_argument("--flat-cost", action="store_true",
                    help="<preset>:auto plans with a flat (GPU-like) cost curve instead of this machine's")
    ap.add_argument("--plan-dtype", help="<preset>:auto plans with this dtype's cost curve (measured with the "
                    "model in that dtype): an fp32 run, whose outputs equal autoregressive decoding's, shows what "
                    "auto chooses under bf16 costs on the same texts (see the model column)")
    args = ap.parse_args()
    stores = {**DEFAULT_STORES, **dict(item.split("=", 1) for item in args.stores)}

    paths = dict(item.split("=", 1) for item in args.data)
    hardware_cfg = OmegaConf.load(CONF_DIR / "hardware" / "cpu.yaml")
    model_cfg = OmegaConf.load(CONF_DIR / "model" / f"{args.model}.yaml")
    sampling = SamplingParams(temperature=args.temperature)
    print(
        f"machine: {environment_info('cpu')['device_name']}; model {args.model}; "
        f"{args.prompts} prompts per dataset, up to {args.max_new_tokens} new tokens, "
        + (f"temperature {args.temperature:g}" if args.temperature else "greedy")
        + (f", {args.repeats} repeats" if args.repeats > 1 else "")
    )
    print("speedup = method tokens/s ÷ autoregressive tokens/s on the same prompts and repeats, same process; "
          "±: std over repeats; [lo, hi]: 95% paired bootstrap interval over prompts; "
          "tok/s: Σ tokens ÷ Σ seconds, prefill included (a peer engine's: its server's own seconds); "
          "limit: the speedup ÷ the oracle's (--methods oracle: the true continuation drafted, as many tokens a "
          "step as pay most on the cost curve), [interval]; "
          "time: Σ autoregressive s / Σ method s (the same figure only when outputs have equal lengths); "
          f"line: on when the speedup is ≥ {LINE} and its interval's top ≥ 1.00, read unrounded, with the margin: "
          "the added cost, as a share of the row's time, it could take and stay on (off: below 0)")
    print(
        f"{'dtype':9} {'dataset':10} {'method':30} {'τ':>5} {'speedup':30} {'limit':17} {'tok/s':>7} {'time':>6} "
        f"{'model':>6} {'Mac-TP':>7} "
        f"{'Mic-TP':>7} {'q/fwd':>5} {'aux':>8} {'ms/stp':>6} {'draft%':>6} {'lookup':>6}  same as AR line"
    )
    for dtype in args.dtypes:
        loaded = load_model(OmegaConf.merge(model_cfg, {"dtype": dtype}), hardware_cfg)
        cost = None
        if any(preset(m)[2] in ("auto", "static") or get_method(preset(m)[0]).needs_reference for m in args.methods):
            plan = args.plan_dtype or dtype
            attn = hardware_cfg.get("attn_implementation", "sdpa")
            if args.flat_cost:
                cost = CostModel.flat()
            elif plan == dtype:
                cost = load_or_measure(loaded, args.model, dtype, attn, remeasure=args.remeasure, check=True)
            else:  # another dtype's curve: measured (or read from the cache) with the model in that dtype
                cost = load_or_measure(load_model(OmegaConf.merge(model_cfg, {"dtype": plan}), hardware_cfg),
                                       args.model, plan, attn, remeasure=args.remeasure, check=True)
            print(f"cost curve ({plan}{', flat: GPU-like' if args.flat_cost else ''}):\n{cost.table()}")
        for name in args.datasets:
            found = dataset_prompts(name, loaded.tokenizer, model_cfg, limit=args.prompts,
                                    path=paths.get(name.partition(":")[0]))
            if found is None:
                continue
            ds_cfg, prompts = found
            run_cfg = OmegaConf.create(
                {"model": model_cfg, "dataset": ds_cfg, "limit": args.prompts, "offset": 0, "seed": 0,
                 "temperature": args.temperature}
            )
            with contextlib.ExitStack() as stack:
                engines = {row: stack.enter_context(server) for row, server in peer_servers(args, loaded, dtype)}
                try:
                    tallies = bench(loaded, prompts, args.methods, args.max_new_tokens, run_cfg, stores.get(name),
                                    cost, sampling, args.repeats, not args.no_hf_pld, engines,
                                    tuple(args.forward))
                except ConfigError as err:  # a store that is missing or overlaps these prompts
                    print(f"(skipping {name}: {err})")
                    continue
            report(dtype, name, tallies, sampling.greedy, args.split)


if __name__ == "__main__":
    main()
