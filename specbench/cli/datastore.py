"""``specbench datastore build|refine|info``: build, refine and inspect retrieval datastores."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from specbench.errors import ConfigError, one_line_errors
from specbench.models import load_model, load_tokenizer, model_preset
from specbench.paths import setting
from specbench.stores import corpus
from specbench.stores.datastore import Datastore, read_meta, tokenizer_identity, write_store
from specbench.stores.naming import RANDOM_SUFFIX, build_command, resolve_store
from specbench.stores.ondemand import store_lock
from specbench.stores.refine import refine_store


def _model_cfg(name: str, dtype: str | None = None, path: str | None = None) -> Any:
    cfg = model_preset(name)
    if dtype:
        cfg.dtype = dtype
    if path:
        cfg.path = path
    return cfg


def build_from_args(args: Any) -> Datastore:
    """``build``: a store for ``--model`` from ``--source`` (see :mod:`specbench.stores.corpus`)."""
    model_cfg = _model_cfg(args.model, args.dtype, args.model_path)
    source = args.source
    name = args.name or corpus.default_name(source)
    out = Path(args.out).expanduser() if args.out else resolve_store(name, model_cfg)
    kind, _, arg = source.partition(":")
    if kind in ("generate", "chat"):
        if kind == "chat" and not arg:
            opts = dict(corpus.CHAT_PRESET)
        elif kind == "generate" and arg:
            opts = {"dataset": arg, "offset": args.offset or 0, "limit": args.limit, "turns": args.turns or 1,
                    "max_new_tokens": args.max_new_tokens or 256}
        else:
            raise ConfigError(f"unknown datastore source '{source}': use chat or generate:DATASET")
        for key in ("offset", "limit", "turns", "max_new_tokens"):
            if kind == "chat" and getattr(args, key) is not None:
                opts[key] = getattr(args, key)
        dataset_cfg = {"path": args.dataset_path} if args.dataset_path else {}
        ddef, samples, record = corpus.generation_prompts(opts["dataset"], int(opts["offset"]), opts["limit"],
                                                          int(opts["turns"]), dataset_cfg)
        tokenizer = load_tokenizer(model_cfg)
        outputs = corpus.generate_outputs(model_cfg, ddef, samples, turns=int(opts["turns"]),
                                          max_new_tokens=int(opts["max_new_tokens"]),
                                          work=out.with_name(out.name + ".work"), dataset_cfg=dataset_cfg,
                                          progress=not args.quiet)
        texts_bytes = sum(len(tokenizer.decode(o, skip_special_tokens=True).encode()) for o in outputs)
        desc = (f"{args.model} greedy answers to {ddef.name} samples {opts['offset']}.."
                f"{int(opts['offset']) + len(samples) - 1} ({opts['turns']} turn(s), <= {opts['max_new_tokens']} tokens)")
        return write_store(out, outputs, tokenizer=tokenizer_identity(tokenizer, _tokenizer_name(model_cfg)),
                           source={"kind": "generate", "description": desc, "model": args.model, **opts},
                           n_bytes=texts_bytes, extra={"prompts": record}, total=len(outputs),
                           progress=not args.quiet)
    corp = corpus.open_corpus(source, field_name=args.field, glob=args.glob, limit=args.limit,
                              hub_config=args.hub_config, hub_data_dir=args.hub_data_dir, split=args.split)
    tokenizer = load_tokenizer(model_cfg)
    counter = corpus._ByteCounter(corp.texts)
    return write_store(out, corpus.tokenized(counter, tokenizer),
                       tokenizer=tokenizer_identity(tokenizer, _tokenizer_name(model_cfg)), source=corp.source,
                       n_bytes=lambda: counter.n_bytes, total=corp.total, progress=not args.quiet)


def _tokenizer_name(model_cfg: Any) -> str:
    return str(setting(model_cfg, "hub_id") or setting(model_cfg, "name"))


def refine_from_args(args: Any) -> Datastore:
    """``refine``: score a store's pieces under the model and index the lowest-perplexity ones."""
    model_cfg = _model_cfg(args.model, args.dtype, args.model_path)
    parent = resolve_store(args.store, model_cfg)
    read_meta(parent, build_command(args.store, model_cfg))
    out = Path(args.out).expanduser() if args.out else resolve_store(args.store, model_cfg, refined=True)
    if args.select == "random" and not args.out:
        out = parent.with_name(parent.name + RANDOM_SUFFIX)
    keep = float(args.keep)
    if keep <= 0:
        raise ConfigError(f"--keep must be a fraction in (0, 1) or a count >= 1, got {args.keep}")
    if args.select == "random":  # nothing is scored: no model
        model, tokenizer = None, load_tokenizer(model_cfg)
    else:
        device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
        lm = load_model(model_cfg, {"device": device, "attn_implementation": "sdpa"})
        model, tokenizer = lm.model, lm.tokenizer
    return refine_store(parent, out, model, tokenizer, keep=keep, sample=args.sample, max_len=args.max_len,
                        batch_size=args.batch_size, seed=args.seed, model_name=args.model, progress=not args.quiet,
                        select=args.select)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="specbench datastore",
                                     description="Build, refine and inspect token datastores for retrieval drafting.")
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--model", default="smollm2-135m", help="a model config name (conf/model/<name>.yaml)")
    common.add_argument("--dtype", default=None, help="model dtype for generation/scoring (default: the config's)")
    common.add_argument("--model-path", default=None, help="a local copy of the model (model.path)")
    common.add_argument("--quiet", action="store_true", help="no progress bars")
    b = sub.add_parser("build", parents=[common], help="build a store from a source")
    b.add_argument("--source", default="stdlib",
                   help="stdlib | chat | dir:DIR | file:FILE | hub:ID | ultrachat | the-stack-python | generate:DATASET")
    b.add_argument("--name", default=None, help="store name under the cache (default: from the source)")
    b.add_argument("--out", default=None, help="a directory instead of the named store under the cache")
    b.add_argument("--field", default=None, help="record field holding the text (file:/hub: sources)")
    b.add_argument("--glob", default="*.py", help="files to read under dir:DIR (default *.py)")
    b.add_argument("--limit", type=int, default=None, help="at most this many files/records/prompts")
    b.add_argument("--offset", type=int, default=None, help="first prompt (generate:/chat)")
    b.add_argument("--turns", type=int, default=None, help="turns answered per prompt (generate:/chat)")
    b.add_argument("--max-new-tokens", type=int, default=None, help="tokens per answer (generate:/chat)")
    b.add_argument("--dataset-path", default=None, help="a local copy of the prompt dataset (generate:)")
    b.add_argument("--hub-config", default=None)
    b.add_argument("--hub-data-dir", default=None)
    b.add_argument("--split", default=None)
    r = sub.add_parser("refine", parents=[common], help="keep a store's lowest-perplexity pieces (SPECTRA-RETRIEVAL)")
    r.add_argument("--store", default="stdlib", help="the parent store (a name or a path)")
    r.add_argument("--out", default=None, help="default: <store>-refined beside the parent")
    r.add_argument("--keep", default="0.5", help="a fraction (0 < keep < 1) or a count (>= 1) of scored pieces")
    r.add_argument("--sample", type=int, default=None, help="score only this many pieces, drawn at random (seeded)")
    r.add_argument("--max-len", type=int, default=256, help="tokens per piece")
    r.add_argument("--batch-size", type=int, default=None, help="pieces per forward (default: 512 tokens' worth "
                   "on a CPU, 16k on a GPU)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--device", default="auto", help="cpu | cuda | auto (the GPU when torch sees one)")
    r.add_argument("--select", default="perplexity", choices=["perplexity", "random"],
                   help="perplexity: the lowest-perplexity pieces (SPECTRA); random: as many pieces drawn at random, "
                        "the control at a matched size (default out: <store>-random)")
    i = sub.add_parser("info", parents=[common], help="print a store's meta")
    i.add_argument("--store", default="stdlib")
    args = parser.parse_args(argv)
    with one_line_errors():
        if args.command in ("build", "refine"):
            # a run that needs the same store waits, then reads it (and a second build waits for the first)
            with store_lock(resolve_store(args.store if args.command == "refine" else
                                          args.name or corpus.default_name(args.source), _model_cfg(args.model))):
                (build_from_args if args.command == "build" else refine_from_args)(args)
        else:
            model_cfg = _model_cfg(args.model)
            path = resolve_store(args.store, model_cfg)
            print(json.dumps({"path": str(path), **read_meta(path, build_command(args.store, model_cfg))}, indent=1))


if __name__ == "__main__":
    main()
