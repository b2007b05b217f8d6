"""Perplexity refinement of a datastore (SPECTRA-RETRIEVAL).

The paper keeps the corpus sequences the target model finds most predictable:
PPL(u) = exp(-(1/t) sum_i log P(u_i | u_<i)) under the target, lowest first
(~100k sequences of UltraChat or The Stack), and indexes only those. Here a
*sequence* is a piece of at most ``max_len`` tokens of a parent store's
documents (documents are cut so that batches are even; a piece shorter than
``min_len`` tokens is dropped). Scoring is batched and resumable: every score
is appended to ``<refined store>.work/scores.tsv`` as soon as its batch is
done, and a rerun scores only what is missing (the file's header ties it to
the parent store's fingerprint and the settings; another header starts over).
``sample`` scores a seeded random subset of the pieces when scoring them all
is too slow (a CPU scores a few thousand tokens a second with a 135M model).
``keep`` is a fraction (``0 < keep < 1``) or a count (``keep >= 1``) of the
scored pieces. The refined store records its parent (path, fingerprint) and
what was kept.
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specbench.errors import ConfigError
from specbench.stores.datastore import Datastore, write_store


def pieces(store: Datastore, max_len: int, min_len: int = 8) -> list[np.ndarray]:
    """The store's documents cut into pieces of at most ``max_len`` tokens (short tails dropped)."""
    out = []
    for doc in store.documents():
        for start in range(0, len(doc), max_len):
            piece = doc[start : start + max_len]
            if len(piece) >= min_len:
                out.append(piece)
    return out


def padded_batch(seqs: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids right-padded to the longest sequence, and the mask of real tokens: ``[n, width]`` each."""
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for row, s in enumerate(seqs):
        ids[row, : len(s)] = torch.as_tensor(np.asarray(s, dtype=np.int64))
        mask[row, : len(s)] = 1
    return ids, mask


@torch.inference_mode()
def sequence_perplexities(model: torch.nn.Module, seqs: list[Any]) -> list[float]:
    """PPL of each sequence under ``model`` in one batch (the first token is context only).

    Sequences of one length (most pieces: documents are cut at ``max_len``) go without a padding mask, so
    attention takes its unmasked causal kernel; others are right-padded. The loss is taken over contiguous
    rows of logits (a class dimension in the middle costs several times more on a CPU).
    """
    device = model.get_input_embeddings().weight.device
    ids, mask = padded_batch(seqs)
    ragged = bool((mask == 0).any())
    ids, mask = ids.to(device), mask.to(device)
    logits = model(input_ids=ids, attention_mask=mask if ragged else None).logits[:, :-1]
    flat = logits.reshape(-1, logits.shape[-1]).float()
    nll = torch.nn.functional.cross_entropy(flat, ids[:, 1:].reshape(-1), reduction="none").view(len(seqs), -1)
    valid = mask[:, 1:].float()
    mean = (nll * valid).sum(1) / valid.sum(1).clamp(min=1)
    return [math.exp(v) for v in mean.tolist()]


# Tokens a scoring batch holds: a CPU is busy with one or two pieces of 256 tokens (larger batches only
# add memory traffic: bench/README.md), a GPU wants many.
BATCH_TOKENS = {"cpu": 512, "cuda": 16384}


def default_batch_size(model: torch.nn.Module, max_len: int) -> int:
    device = model.get_input_embeddings().weight.device.type
    return max(1, BATCH_TOKENS.get(device, BATCH_TOKENS["cuda"]) // max(max_len, 1))


def score_pieces(model: torch.nn.Module, seqs: list[Any], scores_file: Path, header: dict, *,
                 batch_size: int | None = None, progress: bool = True,
                 on_batch: Callable[[int], None] | None = None) -> dict[int, float]:
    """Perplexity of every piece, appended to ``scores_file`` batch by batch; resumes from it. Batches hold
    pieces of one length where they can (sorted by length); ``batch_size`` defaults to the device's."""
    from tqdm.auto import tqdm

    scores: dict[int, float] = {}
    head = json.dumps(header, sort_keys=True)
    if scores_file.exists():
        lines = scores_file.read_text().splitlines()
        if lines and lines[0] == head:
            for line in lines[1:]:
                parts = line.split("\t")
                if len(parts) == 2:  # a line cut by a kill is ignored
                    try:
                        scores[int(parts[0])] = float(parts[1])
                    except ValueError:
                        continue
        else:
            scores_file.replace(scores_file.with_suffix(".old.tsv"))
    scores_file.parent.mkdir(parents=True, exist_ok=True)
    if not scores_file.exists():
        scores_file.write_text(head + "\n")
    todo = sorted((i for i in range(len(seqs)) if i not in scores), key=lambda i: (len(seqs[i]), i))
    size = batch_size or default_batch_size(model, max((len(s) for s in seqs), default=1))
    bar = tqdm(total=sum(len(s) for s in seqs), initial=sum(len(seqs[i]) for i in scores), desc="perplexity",
               unit="tok", unit_scale=True, disable=not progress, file=sys.stderr)
    with open(scores_file, "a") as out:
        for b in range(0, len(todo), size):
            batch = todo[b : b + size]
            ppl = sequence_perplexities(model, [seqs[i] for i in batch])
            out.write("".join(f"{i}\t{p!r}\n" for i, p in zip(batch, ppl, strict=True)))
            out.flush()
            scores.update(zip(batch, ppl, strict=True))
            bar.update(sum(len(seqs[i]) for i in batch))
            if on_batch is not None:
                on_batch(len(scores))
    bar.close()
    return scores


def kept_indices(scores: dict[int, float], keep: float) -> list[int]:
    """The lowest-perplexity pieces: ``keep`` < 1 is a fraction of them, ``keep`` >= 1 a count."""
    if keep <= 0:
        raise ConfigError(f"refine: keep must be a fraction in (0, 1) or a count >= 1, got {keep}")
    count = int(keep) if keep >= 1 else max(1, round(keep * len(scores)))
    ranked = sorted(scores, key=lambda i: (scores[i], i))
    return sorted(ranked[:count])  # corpus order


SELECTIONS = ("perplexity", "random")


def _refined_extra(parent_path: Path, parent: Datastore, refinement: dict) -> dict:
    extra = {
        "parent": {"path": str(parent_path), "fingerprint": parent.meta["fingerprint"],
                   "tokens": parent.meta["tokens"], "source": parent.meta["source"]},
        "refinement": refinement,
    }
    if parent.meta.get("prompts"):  # model outputs stay tied to their prompts
        extra["prompts"] = parent.meta["prompts"]
    return extra


def refine_store(parent_path: Path, out_path: Path, model: torch.nn.Module, tokenizer: Any = None, *,
                 keep: float = 0.5, sample: int | None = None, max_len: int = 256, min_len: int = 8,
                 batch_size: int | None = None, seed: int = 0, model_name: str = "", progress: bool = True,
                 on_batch: Callable[[int], None] | None = None, select: str = "perplexity") -> Datastore:
    """Score the parent store's pieces under ``model``, keep the lowest-perplexity ones, index them.

    ``select="random"`` is the control at a matched size: as many pieces of the same (sampled)
    subset, drawn at random instead of by perplexity (nothing is scored)."""
    if select not in SELECTIONS:
        raise ConfigError(f"refine: select must be one of {', '.join(SELECTIONS)}, got '{select}'")
    parent = Datastore.load(parent_path, tokenizer)
    seqs = pieces(parent, max_len, min_len)
    if not seqs:
        raise ConfigError(f"refine: the store {parent_path} has no piece of {min_len} tokens or more")
    chosen = list(range(len(seqs)))
    if sample is not None and sample < len(seqs):
        chosen = sorted(random.Random(seed).sample(chosen, sample))
    subset = [seqs[i] for i in chosen]
    header = {"parent": parent.meta["fingerprint"], "model": model_name, "max_len": max_len, "min_len": min_len,
              "sample": sample, "seed": seed}
    if select == "random":
        count = len(kept_indices(dict.fromkeys(range(len(subset)), 0.0), keep))
        kept = sorted(random.Random(seed + 1).sample(range(len(subset)), count))
        return write_store(out_path, [subset[i] for i in kept], tokenizer=parent.meta["tokenizer"],
                           source={"kind": "random-subset", "description": f"{count} of {len(subset)} pieces of "
                                   f"{parent.meta['source'].get('description', parent_path.name)}, drawn at random "
                                   "(the control for refinement at a matched size)"},
                           extra=_refined_extra(parent_path, parent, dict(
                               select="random", scored=0, pieces=len(seqs), kept=count, keep=keep, sample=sample,
                               seed=seed, max_len=max_len, min_len=min_len)),
                           total=count, progress=progress)
    work = out_path.with_name(out_path.name + ".work")
    t0 = time.perf_counter()
    scores = score_pieces(model, subset, work / "scores.tsv", header, batch_size=batch_size, progress=progress,
                          on_batch=on_batch)
    kept = kept_indices(scores, keep)
    kept_ppl = [scores[i] for i in kept]
    extra = _refined_extra(parent_path, parent, {
        "select": "perplexity", "model": model_name, "scored": len(subset), "pieces": len(seqs), "kept": len(kept),
        "kept_fraction": round(len(kept) / len(subset), 6), "keep": keep, "sample": sample, "seed": seed,
        "max_len": max_len, "min_len": min_len, "max_kept_ppl": max(kept_ppl),
        "median_ppl": float(np.median(list(scores.values()))),
        "score_seconds": round(time.perf_counter() - t0, 1)})  # this invocation's (a resumed one: the rest)
    source = {"kind": "refined", "description": f"lowest-perplexity {len(kept)} of {len(subset)} pieces of "
              f"{parent.meta['source'].get('description', parent_path.name)}"}
    return write_store(out_path, [subset[i] for i in kept], tokenizer=parent.meta["tokenizer"], source=source,
                       extra=extra, total=len(kept), progress=progress)
