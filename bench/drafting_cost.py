"""Per-token and per-step cost of the pure drafting structures, without a model.

* the suffix automaton (SAM-Decoding): ``extend`` per token of a growing text
  (the dynamic automaton), ``build`` per corpus token and ``advance`` per
  token of a stream matched against it (the static automaton);
* the counted suffix trie (SuffixDecoding): ``extend`` per token and one
  ``speculate`` per step;
* Token Recycling's candidate matrix: one ``update`` from a logits block and
  one template ``fill`` per step.

Token streams are drawn from a Zipf-like distribution with repeated spans, so
matches occur as they do in text. Run:

    python bench/drafting_cost.py                 # 50k-token text, 49,152-token vocabulary
    python bench/drafting_cost.py --tokens 2000   # a quick check
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specbench.drafting.automaton import SuffixAutomaton  # noqa: E402
from specbench.drafting.recycling import PAPER_TREE, CandidateMatrix, TreeTemplate  # noqa: E402
from specbench.drafting.suffix_trie import SuffixTrie  # noqa: E402


def stream(n: int, vocab: int, seed: int = 0) -> list[int]:
    """Zipf-distributed tokens where every fifth chunk repeats an earlier span."""
    rng = np.random.default_rng(seed)
    out: list[int] = []
    while len(out) < n:
        if len(out) > 50 and rng.random() < 0.2:
            start = int(rng.integers(0, len(out) - 20))
            out += out[start : start + int(rng.integers(5, 20))]
        else:
            out += (np.minimum(rng.zipf(1.3, 16), vocab) - 1).tolist()
    return out[:n]


def per_token_us(fn, tokens: list[int], chunk: int = 256) -> float:
    start = time.perf_counter()
    for i in range(0, len(tokens), chunk):
        fn(tokens[i : i + chunk])
    return (time.perf_counter() - start) / len(tokens) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=50_000)
    ap.add_argument("--vocab", type=int, default=49_152)
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()
    text = stream(args.tokens, args.vocab)
    other = stream(args.tokens // 4, args.vocab, seed=1)

    sam = SuffixAutomaton()
    print(f"suffix automaton extend (dynamic): {per_token_us(sam.extend, text):.2f} us/token, "
          f"{sam.n_states} states for {len(text)} tokens")
    t0 = time.perf_counter()
    static = SuffixAutomaton().build([text])
    print(f"suffix automaton build (static):   {(time.perf_counter() - t0) / len(text) * 1e6:.2f} us/token")
    t0 = time.perf_counter()
    for tok in other:
        static.advance(tok)
    print(f"suffix automaton advance (static): {(time.perf_counter() - t0) / len(other) * 1e6:.2f} us/token")

    trie = SuffixTrie(max_depth=24)
    seq = trie.new_sequence()
    print(f"suffix trie extend (depth 24):     {per_token_us(lambda c: trie.extend(seq, c), text):.2f} us/token, "
          f"{trie.n_nodes} nodes")
    times = []
    for i in range(args.steps):
        end = len(text) // 2 + i * 37
        t0 = time.perf_counter()
        trie.speculate(text[end - 24 : end], max_tokens=32, max_spec_factor=1.0, min_token_prob=0.1)
        times.append(time.perf_counter() - t0)
    print(f"suffix trie speculate:             {statistics.median(times) * 1e3:.3f} ms/step (median)")

    matrix = CandidateMatrix(args.vocab, 8)
    template = TreeTemplate(PAPER_TREE)
    logits = torch.randn(81, args.vocab)
    upd, fill = [], []
    for i in range(args.steps):
        t0 = time.perf_counter()
        matrix.update(text[i * 81 : (i + 1) * 81], logits)
        upd.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        template.fill(matrix, text[i], 100)
        fill.append(time.perf_counter() - t0)
    print(f"token recycling update (81 rows):  {statistics.median(upd) * 1e3:.3f} ms/step (median)")
    print(f"token recycling fill (80 nodes):   {statistics.median(fill) * 1e3:.3f} ms/step (median)")


if __name__ == "__main__":
    main()
