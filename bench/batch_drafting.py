"""A head drafter's batch drafted at once against its rows drafted one by one, side by side in one process.

At batch size B the loop hands every row's drafting to ``propose_rows`` when the rows share a drafter class
that has it: the rows' trees grow in lockstep, one head forward per tree level for all rows and one read of
the level's top-k per level. One by one, each row runs its own forwards and reads. Both decode the same
prompts with the same head (``budget=fixed``: the preset's whole tree every step), alternating which goes
first each round; the table gives, per row and decode step, the drafting milliseconds (the loop's ``draft_s``),
the host reads of top-k and the wall milliseconds of the whole run, and whether every output equals
autoregressive decoding's.

    python bench/batch_drafting.py --method eagle3-cpu --batch-size 4 --rounds 3
    python bench/batch_drafting.py --method eagle3-cpu,head=<dir> --batch-size 4
"""

from __future__ import annotations

import statistics
import time

from prompts import one_preset  # bench/ is on sys.path when a script here runs

import specbench.drafting.dynamic_tree as dynamic_tree
from specbench.core.decode import Request, decode_batch, generate
from specbench.core.forward import Target
from specbench.drafting.eagle_drafter import HeadDrafter
from specbench.provenance import environment_info


def main() -> None:
    args, _, loaded, prompts, method, drafter, plain = one_preset(
        __doc__.splitlines()[0], "eagle3-cpu", extra=[("--batch-size", int, 4), ("--rounds", int, 3)])
    if not isinstance(drafter, HeadDrafter):
        raise SystemExit(f"{args.method}: not a head drafter (eagle-cpu, eagle3-cpu, …)")
    target, eos = Target(loaded.model), loaded.eos_token_ids
    expected = [generate(target, plain, p, max_new_tokens=args.max_new_tokens, eos_token_ids=eos).output_ids
                for p in prompts]
    one_by_one = type("OneByOne", (type(drafter),), {
        "propose_rows": None, "propose": lambda self, state: HeadDrafter.propose_rows([self], [state])[0]})
    reads = [0]
    top = dynamic_tree._top

    def counted(*a, **k):
        reads[0] += 1
        return top(*a, **k)

    dynamic_tree._top = counted

    def run(batched: bool) -> tuple[float, float, float, bool]:
        queue = []
        for p in prompts:
            d = drafter.spawn()
            if not batched:
                d.__class__ = one_by_one
            d.begin_sample()
            queue.append(Request(p, args.max_new_tokens, d))
        queue = queue[::-1]
        reads[0] = 0
        draft_s, steps, outs = 0.0, 0, []
        start = time.perf_counter()
        for req, rec in decode_batch(target, lambda: queue.pop() if queue else None, batch_size=args.batch_size,
                                     eos_token_ids=eos):
            draft_s += sum(rec.step_draft_s[1:])
            outs.append((req.prompt_ids, rec.output_ids))
            steps += len(rec.step_times) - 1
        seconds = time.perf_counter() - start
        same = all(out == expected[prompts.index(p)] for p, out in outs)
        return 1000 * draft_s / steps, reads[0] / steps, 1000 * seconds / steps, same

    run(True)  # warm-up
    got: dict[str, list[tuple]] = {"batched": [], "one by one": []}
    for r in range(args.rounds):
        for name in (["batched", "one by one"] if r % 2 == 0 else ["one by one", "batched"]):
            got[name].append(run(name == "batched"))
    print(f"machine: {environment_info('cpu')['device_name']}; {args.model} {args.dtype}; {args.method}, "
          f"{len(prompts)} {args.dataset} prompts at batch size {args.batch_size}, {args.max_new_tokens} new tokens, "
          f"{args.rounds} rounds (medians)")
    print("| drafting | draft ms per row-step | top-k reads per row-step | wall ms per row-step | outputs equal |")
    print("|---|---|---|---|---|")
    for name, values in got.items():
        cols = [statistics.median(v[i] for v in values) for i in range(3)]
        print(f"| {name} | {cols[0]:.1f} | {cols[1]:.1f} | {cols[2]:.1f} | {all(v[3] for v in values)} |")


if __name__ == "__main__":
    main()
