"""A batch drafted at once against its rows drafted one by one, side by side in one process.

At batch size B the loop hands every row's drafting to ``propose_rows`` when the rows share a drafter class
that has it: a head's trees grow in lockstep (one head forward per tree level for all rows, one read of the
level's top-k), a draft model's chains too (the tokens committed since each row last drafted in one forward,
then one draft forward and one read per drafted position for all rows). One by one, each row runs its own
forwards and reads. Both decode the same prompts (``budget=fixed``: the preset's whole draft every step),
alternating which goes first each round; the table gives, per row and decode step, the drafting milliseconds
(the loop's ``draft_s``), the host reads while drafting (values read from tensors: on a GPU each waits for the
device) and the wall milliseconds of the whole run, and whether every output equals autoregressive decoding's.

    python bench/batch_drafting.py --method eagle3-cpu --batch-size 4 --rounds 3
    python bench/batch_drafting.py --method sps --batch-size 4
    python bench/batch_drafting.py --method eagle3-cpu,head=<dir> --batch-size 4
"""

from __future__ import annotations

import contextlib
import statistics
import time

import torch
from prompts import one_preset  # bench/ is on sys.path when a script here runs

import specbench.core.decode as decode
from specbench.core.decode import Request, decode_batch, generate
from specbench.core.forward import Target
from specbench.provenance import environment_info

READS = ("tolist", "item", "__int__", "__float__", "__bool__")


@contextlib.contextmanager
def reads_while_drafting(reads: list[int]):
    """Count the tensor values read on the host while the loop proposes (every row's drafting)."""
    saved = {name: getattr(torch.Tensor, name) for name in READS}
    propose, active = decode._Loop.propose, [False]

    def counting(name):
        def read(self, *a, **k):
            reads[0] += active[0]
            return saved[name](self, *a, **k)
        return read

    def proposing(loop, rows):
        active[0] = True
        try:
            return propose(loop, rows)
        finally:
            active[0] = False

    for name in READS:
        setattr(torch.Tensor, name, counting(name))
    decode._Loop.propose = proposing
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)
        decode._Loop.propose = propose


def main() -> None:
    args, _, loaded, prompts, method, drafter, plain = one_preset(
        __doc__.splitlines()[0], "eagle3-cpu", extra=[("--batch-size", int, 4), ("--rounds", int, 3)])
    kind = type(drafter)
    if getattr(kind, "propose_rows", None) is None:
        raise SystemExit(f"{args.method}: drafts each row alone (head and draft-model methods draft a batch at once)")
    target, eos = Target(loaded.model), loaded.eos_token_ids
    expected = [generate(target, plain, p, max_new_tokens=args.max_new_tokens, eos_token_ids=eos).output_ids
                for p in prompts]
    one_by_one = type("OneByOne", (kind,), {
        "propose_rows": None, "propose": lambda self, state: kind.propose_rows([self], [state])[0]})
    reads = [0]

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
        with reads_while_drafting(reads):
            finished = list(decode_batch(target, lambda: queue.pop() if queue else None, batch_size=args.batch_size,
                                         eos_token_ids=eos))
        for req, rec in finished:
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
    print("| drafting | draft ms per row-step | reads per row-step | wall ms per row-step | outputs equal |")
    print("|---|---|---|---|---|")
    for name, values in got.items():
        cols = [statistics.median(v[i] for v in values) for i in range(3)]
        print(f"| {name} | {cols[0]:.1f} | {cols[1]:.1f} | {cols[2]:.1f} | {all(v[3] for v in values)} |")


if __name__ == "__main__":
    main()
