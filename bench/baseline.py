"""Our autoregressive loop vs transformers' ``model.generate`` (greedy), side by side.

A slow baseline inflates every speedup, so ours must be as fast as
``generate`` on the same prompts, model and dtype. Runs alternate (ours first
on even rounds, ``generate`` first on odd ones) in one process after a warm-up;
the figure reported is the ratio of tokens/s, with outputs checked to be equal.

    python bench/baseline.py                       # SmolLM2, fp32 and bf16
    python bench/baseline.py --dtypes bfloat16 --prompts 3 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from specbench.core.decode import generate
from specbench.core.draft import Drafter
from specbench.core.forward import Target
from specbench.data import get_dataset, select
from specbench.models import DTYPES, load_model
from specbench.provenance import environment_info

CONF = Path(__file__).resolve().parents[1] / "conf"


def hf_generate(loaded, ids: list[int], max_new_tokens: int, **options) -> list[int]:
    """transformers' ``generate``, stopping at the model's EOS tokens (greedy unless ``options`` say
    ``do_sample=True, temperature=...``); the new token ids."""
    eos = loaded.eos_token_ids
    settings = dict(do_sample=False, eos_token_id=eos, pad_token_id=eos[0], top_p=None, top_k=None, temperature=None)
    with torch.inference_mode():
        out = loaded.model.generate(
            torch.tensor([ids], device=loaded.device), max_new_tokens=max_new_tokens, **{**settings, **options}
        )
    return out[0, len(ids) :].tolist()


def compare(loaded, prompts: list[list[int]], max_new_tokens: int, rounds: int) -> tuple[float, float, bool]:
    """tokens/s of our loop and of ``generate`` over alternating rounds; whether outputs were equal."""
    model, eos = loaded.model, loaded.eos_token_ids
    target = Target(model)

    def ours(ids):
        return generate(
            target, Drafter(vocab_size=0), ids, max_new_tokens=max_new_tokens, eos_token_ids=eos
        ).output_ids

    def theirs(ids):
        return hf_generate(loaded, ids, max_new_tokens)

    runners = {"ours": ours, "generate": theirs}
    ours(prompts[0])  # warm-up, not recorded
    theirs(prompts[0])
    tokens = {"ours": 0, "generate": 0}
    seconds = {"ours": 0.0, "generate": 0.0}
    equal = True
    for r in range(rounds):
        for ids in prompts:
            outs = {}
            for who in ("ours", "generate") if r % 2 == 0 else ("generate", "ours"):
                start = time.perf_counter()
                outs[who] = runners[who](ids)
                seconds[who] += time.perf_counter() - start
                tokens[who] += len(outs[who])
            equal &= outs["ours"] == outs["generate"]
    return tokens["ours"] / seconds["ours"], tokens["generate"] / seconds["generate"], equal


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dataset", default="mtbench")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=list(DTYPES))
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--linear", nargs="+", default=["plain", "auto"], choices=["auto", "packed", "plain"],
                    help="CPU linear layers (hardware.linear): each is measured, both loops on the same forward")
    args = ap.parse_args()

    model_cfg = OmegaConf.load(CONF / "model" / f"{args.model}.yaml")
    hardware_cfg = OmegaConf.load(CONF / "hardware" / "cpu.yaml")
    ds_cfg = OmegaConf.load(CONF / "dataset" / f"{args.dataset}.yaml")
    ddef = get_dataset(args.dataset)
    samples = select(ddef.load(ds_cfg), limit=args.prompts, offset=0, shuffle=False, seed=0)
    print(f"machine: {environment_info('cpu')['device_name']}, torch {torch.__version__}")
    print(
        f"model {args.model}, {len(samples)} {args.dataset} prompts x {args.rounds} rounds, {args.max_new_tokens} new tokens max"
    )
    print(f"{'dtype':9} {'linear':7} {'ours tok/s':>11} {'generate tok/s':>15} {'ratio':>7}  outputs equal")
    for dtype in args.dtypes:
        for linear in args.linear:
            hw = OmegaConf.merge(hardware_cfg, {"linear": linear})
            loaded = load_model(OmegaConf.merge(model_cfg, {"dtype": dtype}), hw)
            prompts = [ddef.build_prompt(loaded.tokenizer, s, 0, [], ds_cfg, True) for s in samples]
            ours_tps, gen_tps, equal = compare(loaded, prompts, args.max_new_tokens, args.rounds)
            print(f"{dtype:9} {loaded.linear:7} {ours_tps:11.1f} {gen_tps:15.1f} {ours_tps / gen_tps:7.3f}  {equal}")


if __name__ == "__main__":
    main()
