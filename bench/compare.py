"""Every method against autoregressive decoding, side by side in one process.

For each dtype and dataset, every prompt is decoded by the autoregressive
baseline and by each method preset (``conf/method/<preset>.yaml``), in an order
that rotates from prompt to prompt, after one un-recorded warm-up per method.
Reported per method: τ, speedup (Σ baseline time / Σ method time on the same
prompts), the speedup modelled by the cost curve that ``auto`` plans with
(model: each decode step costs t(root + guesses + aux nodes, context); shown
when a preset runs ``budget=auto``), Mac-TP, Mic-TP, tokens per decode
forward (q/fwd: the root, the guesses and the auxiliary nodes), the share of steps that sent auxiliary nodes
and how many they sent on average (aux: ``budget=auto`` chooses the pool's
width and may leave it out), drafting overhead per step (time outside the
model forward: propose + update), and how many greedy outputs equal the
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
autoregressive ones, the model column then compares budgets under bf16 costs on the same texts).
``<preset>:norefine`` reads the unrefined store; ``<preset>:random`` reads the refined store's
control, as many pieces drawn at random from the same subset (``python -m specbench.datastore
refine --select random``), so that refinement is compared at a matched store size. The lookup time per
step and each store's size and build time are printed too.

    python bench/compare.py --data gsm8k=/path/gsm8k_test.jsonl
    python bench/compare.py --dtypes bfloat16 --datasets mtbench --prompts 2 --max-new-tokens 64
    python bench/compare.py --dtypes float32 --plan-dtype bfloat16 --methods spectra_core-cpu spectra_core-cpu:fixed
    python bench/compare.py --methods pld spectra_core-cpu rest-cpu spectra_retrieval-cpu \
        spectra_retrieval-cpu:norefine spectra-cpu --datasets humaneval mtbench
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from baseline import hf_generate  # bench/ is on sys.path when a script here runs
from omegaconf import OmegaConf
from prompts import dataset_prompts  # bench/ is on sys.path when a script here runs

from specbench.budget import AutoBudget
from specbench.config import CONF_DIR, ConfigError, load_preset
from specbench.costs import CostModel, load_or_measure
from specbench.datastore import RANDOM_SUFFIX, Datastore
from specbench.decode import generate
from specbench.metrics import mac_tp, mic_tp
from specbench.models import load_model
from specbench.provenance import environment_info
from specbench.registry import build_method_config, get_method
from specbench.verify import Target

DEFAULT_METHODS = ["pld", "anpd", "lookahead-cpu", "lookahead", "spectra_core-cpu", "spectra_core"]
DEFAULT_STORES = {"humaneval": "stdlib", "mbpp": "stdlib", "classeval": "stdlib", "mtbench": "chat", "gsm8k": "chat"}


def preset(name: str, run_cfg=None, store: str | None = None):
    """A preset's method, config and budget; ``<preset>:norefine`` reads the unrefined store,
    ``<preset>:random`` the refined store's matched-size random control, ``<preset>:auto`` /
    ``<preset>:fixed`` set the budget (default: the preset's). Retrieval presets get ``store`` and are
    checked against ``run_cfg`` as a run checks them (preflight)."""
    base, _, variant = name.partition(":")
    method, cfg, preset_budget = load_preset(base)
    if variant not in ("", "norefine", "random", "auto", "fixed"):
        raise SystemExit(f"{name}: the variants are <preset>:norefine, :random, :auto and :fixed")
    budget = variant if variant in ("auto", "fixed") else preset_budget or "fixed"
    if cfg.get("datastore") and store:  # presets without a store (sam_decoding) keep none
        cfg["datastore"] = store
    if variant in ("norefine", "random"):
        cfg["refine"] = False
    if variant == "random":
        cfg["datastore"] = cfg["datastore"] + RANDOM_SUFFIX
    config = build_method_config(method, cfg, budget)
    if run_cfg is not None:
        get_method(method).preflight(config, run_cfg)
    return method, config, budget


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
        self.modelled_s = 0.0  # decode time under the planning cost curve: Σ t(1 + guesses + aux, context)

    def add(self, rec, seconds: float, same: bool, cost: CostModel | None = None) -> None:
        if cost is not None:
            context = rec.prompt_len + rec.step_tokens[0]
            for q, a, k in zip(rec.step_drafted[1:], rec.step_aux[1:], rec.step_tokens[1:], strict=True):
                self.modelled_s += cost(1 + q + a, context)
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
        self.step_tokens += rec.step_tokens
        self.step_times += rec.step_times


def bench(loaded, prompts, presets: list[str], max_new: int, run_cfg=None, store=None, cost=None) -> dict[str, Tally]:
    target = Target(loaded.model)
    eos = loaded.eos_token_ids
    drafters = {"autoregressive": get_method("autoregressive")(None, vocab_size=loaded.vocab_size)}
    budgets = {}  # <preset>:auto: trimmed under the measured cost curve, statistics kept across prompts
    for name in presets:
        method, cfg, budget = preset(name, run_cfg, store)
        drafters[name] = get_method(method)(
            cfg, vocab_size=loaded.vocab_size, seed=0, tokenizer=loaded.tokenizer
        )
        if budget == "auto":
            budgets[name] = AutoBudget(cost, aux_feeds=get_method(method).AUX_FEEDS)
        if getattr(cfg, "_store_path", None):
            print(f"  {name} reads {store_facts(cfg._store_path)}")

    def once(name, ids, n):
        if name == "hf_pld":
            start = time.perf_counter()
            out = hf_generate(loaded, ids, n, prompt_lookup_num_tokens=10)
            return out, None, time.perf_counter() - start
        start = time.perf_counter()
        rec = generate(target, drafters[name], ids, max_new_tokens=n, eos_token_ids=eos, budget=budgets.get(name))
        return rec.output_ids, rec, time.perf_counter() - start

    names = list(drafters) + ["hf_pld"]
    for name in names:  # warm-up, not recorded
        once(name, prompts[0], 16)
    for drafter in drafters.values():  # as a run does: the warm-up teaches run-long memory nothing
        drafter.reset()
    for name, b in budgets.items():
        budgets[name] = AutoBudget(cost, aux_feeds=b.aux_feeds)
    tallies = {name: Tally() for name in names}
    for i, ids in enumerate(prompts):
        order = names[i % len(names) :] + names[: i % len(names)]
        outs = {}
        for name in order:
            if name in drafters:
                drafters[name].begin_sample()
            outs[name] = once(name, ids, max_new)
        ref = outs["autoregressive"][0]
        for name, (out, rec, seconds) in outs.items():
            if rec is None:  # hf_pld: only tokens and time
                t = tallies[name]
                t.n += 1
                t.match += out == ref
                t.tokens += len(out)
                t.seconds += seconds
            else:
                tallies[name].add(rec, seconds, out == ref, cost)
    return tallies


def report(dtype: str, dataset: str, tallies: dict[str, Tally]) -> None:
    base = tallies["autoregressive"]
    for name, t in tallies.items():
        tau = f"{t.tokens / t.steps:5.2f}" if t.steps else "    -"
        mac = f"{mac_tp(t.step_tokens, t.step_times):7.1f}" if t.step_times else "      -"
        mic = (
            f"{mic_tp(t.step_tokens, t.step_times):7.1f}" if t.step_times else f"{t.tokens / t.seconds:7.1f}"
        )
        decode_steps = t.steps - t.n
        overhead = f"{1000 * t.draft_s / decode_steps:6.2f}" if decode_steps > 0 and t.steps else "     -"
        lookup = f"{1000 * t.lookup_s / decode_steps:6.2f}" if decode_steps > 0 and t.lookup_s else "     -"
        width = f"{t.forward_tokens / decode_steps:5.1f}" if decode_steps > 0 and t.steps else "    -"
        aux = (f"{100 * t.aux_steps / decode_steps:3.0f}%:{t.aux_nodes / t.aux_steps:<4.0f}"
               if t.aux_steps else "       -")  # steps that sent aux nodes : nodes they sent
        speedup = (base.seconds / base.tokens) / (t.seconds / t.tokens)  # per-token time ratio
        modelled = (f"{(base.modelled_s / (base.tokens - base.n)) / (t.modelled_s / (t.tokens - t.n)):5.2f}x"
                    if t.modelled_s and base.modelled_s else "     -")  # decode steps only, as planned
        print(
            f"{dtype:9} {dataset:10} {name:30} {tau} {speedup:6.2f}x {modelled} {mac} {mic} {width} {aux} {overhead}"
            f" {lookup}  {t.match}/{t.n}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    ap.add_argument("--datasets", nargs="+", default=["mtbench", "gsm8k", "humaneval"])
    ap.add_argument("--data", action="append", default=[], help="NAME=PATH: a local copy of a dataset")
    ap.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, help="method presets from conf/method/")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--stores", nargs="*", default=[], help="DATASET=STORE: the store retrieval presets read")
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
    print(
        f"machine: {environment_info('cpu')['device_name']}; model {args.model}; "
        f"{args.prompts} prompts per dataset, up to {args.max_new_tokens} new tokens, greedy"
    )
    print("speedup = autoregressive time per token / method time per token, same prompts, same process")
    print(
        f"{'dtype':9} {'dataset':10} {'method':30} {'τ':>5} {'speedup':>7} {'model':>6} {'Mac-TP':>7} {'Mic-TP':>7} "
        f"{'q/fwd':>5} {'aux':>8} {'ms/stp':>6} {'lookup':>6}  same as AR"
    )
    for dtype in args.dtypes:
        loaded = load_model(OmegaConf.merge(model_cfg, {"dtype": dtype}), hardware_cfg)
        cost = None
        if any(preset(m)[2] == "auto" for m in args.methods):
            plan = args.plan_dtype or dtype
            attn = hardware_cfg.get("attn_implementation", "sdpa")
            if args.flat_cost:
                cost = CostModel.flat()
            elif plan == dtype:
                cost = load_or_measure(loaded, args.model, dtype, attn)
            else:  # another dtype's curve: measured (or read from the cache) with the model in that dtype
                cost = load_or_measure(load_model(OmegaConf.merge(model_cfg, {"dtype": plan}), hardware_cfg),
                                       args.model, plan, attn)
            print(f"cost curve ({plan}{', flat: GPU-like' if args.flat_cost else ''}):\n{cost.table()}")
        for name in args.datasets:
            found = dataset_prompts(name, loaded.tokenizer, model_cfg, limit=args.prompts, path=paths.get(name))
            if found is None:
                continue
            ds_cfg, prompts = found
            run_cfg = OmegaConf.create(
                {"model": model_cfg, "dataset": ds_cfg, "limit": args.prompts, "offset": 0, "seed": 0}
            )
            try:
                tallies = bench(loaded, prompts, args.methods, args.max_new_tokens, run_cfg, stores.get(name), cost)
            except ConfigError as err:  # a store that is missing or overlaps these prompts
                print(f"(skipping {name}: {err})")
                continue
            report(dtype, name, tallies)


if __name__ == "__main__":
    main()
