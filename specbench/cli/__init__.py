"""The ``specbench`` command: one command line with verbs, each a module of this package.

    specbench report summary --results results/sweep     # the tables, the summary, the site
    specbench datastore build --source stdlib --out stores/stdlib
    specbench train-head model=smollm2-135m --kind eagle3
    specbench costs                                       # the verification cost curve of this machine
    specbench gpu-check --stages forward                  # the GPU paths, on a CUDA GPU
    specbench peers build                                 # llama.cpp's server, from its sources

``specbench <verb> --help`` says more. Where nothing is installed (a lent GPU machine), ``python -m specbench
<verb>`` is the same command. Decoding runs are ``python run.py …`` (Hydra's command line).
"""

from __future__ import annotations

import difflib
import importlib
import sys
from collections.abc import Sequence

# verb: (module under specbench.cli, what it does)
VERBS = {
    "report": ("report", "the paper's tables and figures, a sweep's summary and its site, from results/"),
    "datastore": ("datastore", "build, refine and inspect the retrieval datastores (REST, SPECTRA-RETRIEVAL)"),
    "train-head": ("eagle_head", "train an EAGLE, EAGLE-3 or Medusa head or a DFlash drafter for a target"),
    "train-acceptance-head": ("acceptance_head", "train SpecDec++'s acceptance head for a target and draft"),
    "costs": ("costs", "measure (or read the cached) verification cost curve t(q, context) of this machine"),
    "gpu-check": ("gpu_check", "the GPU paths checked on this machine's CUDA GPU, offline, on random weights"),
    "gpu-bundle": ("gpu_bundle", "the wheels a GPU machine without network lacks, for ./gpu_check.sh there"),
    "peers": ("peers", "build (or locate) llama.cpp's server, the peer engine, from the sources PyPI ships"),
}


def usage() -> str:
    width = max(map(len, VERBS))
    lines = [f"  {verb:{width}}  {what}" for verb, (_, what) in VERBS.items()]
    return ("usage: specbench <verb> [arguments]   (specbench <verb> --help for its own)\n\nverbs:\n"
            + "\n".join(lines) + "\n\nDecoding runs: python run.py model=<model> method=<method> dataset=<dataset>")


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return
    verb, rest = args[0], args[1:]
    if verb not in VERBS:
        close = difflib.get_close_matches(verb, VERBS, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        print(f"error: specbench has no verb '{verb}': {hint}the verbs: {', '.join(VERBS)} (specbench --help)",
              file=sys.stderr)
        raise SystemExit(2)
    module = importlib.import_module(f"specbench.cli.{VERBS[verb][0]}")
    entry = getattr(module, "run", None) or module.main  # run: main with its errors in one line
    entry(rest)
