"""Draft-model methods on one machine: self-draft sps at fixed K, SpecDec++, and transformers' assisted generation.

On the same prompts, in one process, after one un-recorded warm-up each, with
the run order rotating from prompt to prompt:

* ``autoregressive`` (the baseline every speedup divides);
* ``sps K=k`` for each ``--ks``: self-draft speculative sampling with a fixed
  length (the layers of the ``sps`` preset, or the first ``--self-first-layers``);
* ``specdec_pp``: the same draft with the trained acceptance head (skipped,
  with the training command, when no head exists for the pair);
* transformers' assisted generation with the same draft (a model object that
  shares the target's embedding, first layers, norm and LM head: no weights
  copied, the same layers kept): ``hf const K=k`` (``num_assistant_tokens_schedule="constant"`` at the
  best fixed K of our sps), ``hf heuristic`` (starts at 20, +2 after a full
  match, −1 otherwise; reset before each prompt), and ``hf confidence``
  (``assistant_confidence_threshold=0.4``, at most 20 tokens: the draft stops
  when its top probability falls below the threshold; transformers adapts the
  threshold only when scikit-learn is installed, which the table says).

Reported: τ (tokens per target forward), the share of drafted tokens accepted,
speedup (autoregressive time per token / method time per token), the share of
time spent drafting (propose + update, measured after a device sync), and how
many greedy outputs equal the baseline's. transformers' runs give only tokens,
time and equality. ``--temperature T`` samples instead (every method and
transformers' peers at T, each prompt's random stream seeded alike); SpecDec++
then reads the head trained on sampled labels, greedy runs the one trained on
greedy labels (``--temperature 0``).

    python bench/draft_models.py                          # SmolLM2, bf16, 3 MT-Bench prompts
    python bench/draft_models.py --temperature 1 --prompts 6
    python bench/draft_models.py --dtypes float32 --prompts 2 --max-new-tokens 32 --ks 1 3
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import time

import torch
from baseline import hf_generate  # bench/ is on sys.path when a script here runs
from omegaconf import OmegaConf

from methods.registry import build_method_config, get_method
from specbench.core.acceptance import SamplingParams
from specbench.core.decode import generate
from specbench.core.draft import DrafterContext
from specbench.core.forward import Target
from specbench.data import get_dataset, select
from specbench.drafting.acceptance_head import train_command
from specbench.errors import ConfigError
from specbench.models import load_model
from specbench.paths import CONF_DIR
from specbench.provenance import environment_info


def layer_skipping_assistant(model: torch.nn.Module, kept: list[int]) -> torch.nn.Module:
    """A model object running only the target's ``kept`` layers, sharing every weight (for ``generate``).

    The config keeps the target's layer count, so that the assistant's cache has a slot for every
    original layer index (a kept layer writes to its own index); the forward runs the kept layers only.
    """
    config = copy.deepcopy(model.config)
    with torch.device("meta"):
        assistant = type(model)(config)
    assistant.model.embed_tokens = model.model.embed_tokens
    assistant.model.layers = torch.nn.ModuleList(model.model.layers[i] for i in kept)
    assistant.model.norm = model.model.norm
    assistant.model.rotary_emb = model.model.rotary_emb
    assistant.lm_head = model.lm_head
    assistant.generation_config = copy.deepcopy(model.generation_config)
    return assistant.eval()


class Tally:
    def __init__(self) -> None:
        self.n = self.match = self.tokens = self.steps = self.drafted = self.accepted = 0
        self.seconds = self.draft_s = self.step_s = 0.0

    def add(self, out, rec, seconds: float, same: bool) -> None:
        self.n += 1
        self.match += same
        self.tokens += len(out)
        self.seconds += seconds
        if rec is not None:
            self.steps += rec.steps
            self.drafted += sum(rec.drafted_by_source.values())
            self.accepted += sum(rec.accepted_by_source.values())
            self.draft_s += sum(rec.step_draft_s)
            self.step_s += sum(rec.step_times)


def bench(loaded, prompts, ks: list[int], layers: dict, max_new: int, params: SamplingParams) -> dict[str, Tally]:
    target = Target(loaded.model)
    eos = loaded.eos_token_ids
    context = DrafterContext(sampling=params, target_model=loaded.model, target_name=loaded.name,
                             device=loaded.device, dtype=target.dtype)
    sampled = {} if params.greedy else dict(do_sample=True, temperature=params.temperature)

    def drafter(method: str, **params):
        cfg = build_method_config(method, params)
        return get_method(method)(cfg, vocab_size=loaded.vocab_size, tokenizer=loaded.tokenizer, context=context)

    ours = {"autoregressive": drafter("autoregressive")}
    for k in ks:
        ours[f"sps K={k}"] = drafter("sps", **layers, k=k)
    try:
        ours["specdec_pp"] = drafter("specdec_pp", **layers)
    except ConfigError:
        settings = build_method_config("specdec_pp", layers)
        print(f"(specdec_pp skipped: no head for {loaded.name} at this temperature; train one with "
              f"`{train_command(loaded.name, settings, params.greedy)}`)")
    assistant = layer_skipping_assistant(loaded.model, ours["sps K=" + str(ks[0])].lm.layers)
    hf = {}  # name -> assistant generation settings (filled once the best fixed K is known)

    def once(name, ids, n, seed=0):
        start = time.perf_counter()
        if name in ours:
            rec = generate(target, ours[name], ids, max_new_tokens=n, eos_token_ids=eos, sampling=params,
                           generator=torch.Generator().manual_seed(seed))
            return rec.output_ids, rec, time.perf_counter() - start
        for key, value in hf[name].items():  # each prompt starts from the same settings
            setattr(assistant.generation_config, key, value)
        torch.manual_seed(seed)
        out = hf_generate(loaded, ids, n, assistant_model=assistant, **sampled)
        return out, None, time.perf_counter() - start

    def run(names) -> dict[str, Tally]:
        for name in names:  # warm-up, not recorded
            once(name, prompts[0], 16)
        tallies = {name: Tally() for name in names}
        for i, ids in enumerate(prompts):
            order = names[i % len(names):] + names[: i % len(names)]
            outs = {name: once(name, ids, max_new, seed=i) for name in order}
            ref = outs.get("autoregressive", (None,))[0] if params.greedy else None  # sampled: no reference
            for name, (out, rec, seconds) in outs.items():
                tallies[name].add(out, rec, seconds, ref is None or out == ref)
        return tallies

    tallies = run(list(ours))
    best = max(ks, key=lambda k: tallies[f"sps K={k}"].tokens / tallies[f"sps K={k}"].seconds)
    hf[f"hf const K={best}"] = dict(num_assistant_tokens=best, num_assistant_tokens_schedule="constant",
                                    assistant_confidence_threshold=0.0)
    hf["hf heuristic"] = dict(num_assistant_tokens=20, num_assistant_tokens_schedule="heuristic",
                              assistant_confidence_threshold=0.0)
    hf["hf confidence"] = dict(num_assistant_tokens=20, num_assistant_tokens_schedule="constant",
                               assistant_confidence_threshold=0.4)
    peers = run(["autoregressive", *hf])
    base = peers.pop("autoregressive")
    for t in peers.values():  # the peers' own baseline, scaled into the first run's baseline time
        t.seconds *= tallies["autoregressive"].seconds / base.seconds
    tallies.update(peers)
    return tallies


def report(dtype: str, tallies: dict[str, Tally], greedy: bool) -> None:
    base = tallies["autoregressive"]
    for name, t in tallies.items():
        tau = f"{t.tokens / t.steps:5.2f}" if t.steps else "    -"
        acc = f"{t.accepted / t.drafted:5.2f}" if t.drafted else "    -"
        share = f"{t.draft_s / t.step_s:5.2f}" if t.step_s else "    -"
        speedup = (base.seconds / base.tokens) / (t.seconds / t.tokens)
        same = f"{t.match}/{t.n}" if greedy else "-"
        print(f"{dtype:9} {name:17} {tau} {acc} {speedup:6.2f}x {share}  {same}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dataset", default="mtbench")
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16"])
    ap.add_argument("--ks", nargs="+", type=int, default=[1, 2, 3, 5])
    ap.add_argument("--self-first-layers", type=int, default=None, help="default: the sps preset's")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); > 0: sampling at T")
    args = ap.parse_args()
    params = SamplingParams(temperature=args.temperature)

    preset = OmegaConf.load(CONF_DIR / "method" / "sps.yaml")
    layers = {"self_first_layers": preset.self_first_layers, "self_skip_layers": preset.self_skip_layers}
    if args.self_first_layers:
        layers = {"self_first_layers": args.self_first_layers, "self_skip_layers": None}
    layers = OmegaConf.to_container(OmegaConf.create(layers))
    which = build_method_config("sps", layers).identity()
    hardware_cfg = OmegaConf.load(CONF_DIR / "hardware" / "cpu.yaml")
    model_cfg = OmegaConf.load(CONF_DIR / "model" / f"{args.model}.yaml")
    ds_cfg = OmegaConf.load(CONF_DIR / "dataset" / f"{args.dataset}.yaml")
    ddef = get_dataset(args.dataset)
    ddef.check_available(ds_cfg)
    samples = select(ddef.load(ds_cfg), limit=args.prompts, offset=0, shuffle=False, seed=0)
    sklearn = importlib.util.find_spec("sklearn") is not None
    print(f"machine: {environment_info('cpu')['device_name']}; model {args.model}; self-draft {which};"
          f" {len(samples)} {args.dataset} prompts, up to {args.max_new_tokens} new tokens, "
          + ("greedy" if params.greedy else f"sampling at T = {params.temperature}"))
    print("speedup = autoregressive time per token / method time per token, same prompts, same process; "
          f"hf confidence threshold {'adapted (scikit-learn present)' if sklearn else 'fixed at 0.4 (no scikit-learn)'}")
    print(f"{'dtype':9} {'method':17} {'τ':>5} {'acc':>5} {'speedup':>7} {'draft':>5}  same as AR")
    for dtype in args.dtypes:
        loaded = load_model(OmegaConf.merge(model_cfg, {"dtype": dtype}), hardware_cfg)
        chat = bool(model_cfg.get("chat", True))
        prompts = [ddef.build_prompt(loaded.tokenizer, s, 0, [], ds_cfg, chat) for s in samples]
        report(dtype, bench(loaded, prompts, args.ks, layers, args.max_new_tokens, params), params.greedy)


if __name__ == "__main__":
    main()
