"""A token datastore searched by suffix (REST, SPECTRA-RETRIEVAL).

A store is a directory::

    tokens.bin   the corpus as little-endian token ids (uint16, or uint32 when the
                 vocabulary needs it), documents separated by SEPARATOR
    index.bin    a suffix table over tokens.bin (tokengrams' memory-mapped index)
    meta.json    tokenizer identity, corpus fingerprint, source, counts, build time,
                 prompt-set record (stores built from model outputs), parent store (refined stores)

**Documents never run into each other.** Between two documents the store holds a
separator id, one past the tokenizer's vocabulary. No context contains it (a
context is cut after any id at or above it), so a suffix match lies inside one
document, and a continuation stops at the separator.

**Search.** :meth:`Datastore.search` takes the longest suffix of the context
(``max_suffix`` tokens down to ``min_suffix``) that occurs in the store and
returns the tokens that follow up to ``max_occurrences`` of its occurrences
(each cut to ``max_continuation`` tokens). When the suffix occurs more often,
the occurrences are taken at even strides over its suffix-table range. The
range is sorted by what follows the suffix, so an even stride is a stratified
sample of the continuations: a continuation's share of the sample is its share
of all occurrences (up to rounding), which is what the trie weights need. (REST's
own store takes the first ones in table order instead.)

**Why tokengrams.** It stores u16 or u32 token ids (vocabularies above 65,535
work: Llama 3, Gemma 3), memory-maps the index (a store opens instantly and
shares the page cache) and searches in Rust. pydivsufsort built faster and
half as large, but its pattern search takes bytes only, and a binary search in
Python over its suffix array was ~15x slower per lookup (README: "Datastores").
REST's ``draftretriever`` stores u16 ids, so ids >= 65,536 silently wrap: it
is not used. Where tokengrams has no wheel (Python 3.12 and later), the same
files are built and searched by :mod:`specbench.stores.suffix_table` in numpy.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from specbench.errors import ConfigError

FORMAT = 1
META = "meta.json"
TOKENS = "tokens.bin"
INDEX = "index.bin"
BUILD_HINT = "make datastore MODEL={model} SOURCE={source}"


def _tokengrams():
    """tokengrams when it is installed, else :mod:`specbench.stores.suffix_table` (the same files, in numpy)."""
    try:
        import tokengrams
    except ImportError:  # no wheel for this Python (3.12 and later): the numpy table reads and writes the same
        from specbench.stores import suffix_table as tokengrams
    return tokengrams


# ----------------------------------------------------------------------------- identities


def tokenizer_identity(tokenizer: Any, name: str | None = None) -> dict:
    """Name, vocabulary size and a hash of the vocabulary (token string -> id), for a store's meta."""
    vocab = tokenizer.get_vocab()
    digest = hashlib.sha256(json.dumps(sorted(vocab.items()), ensure_ascii=False).encode()).hexdigest()
    return {
        "name": name or str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__),
        "vocab_size": int(max(len(tokenizer), max(vocab.values(), default=-1) + 1)),
        "vocab_sha256": digest,
    }


def prompt_hash(text: str) -> str:
    """The hash a store records for each prompt it was generated from (whitespace-trimmed text)."""
    return hashlib.sha256(text.strip().encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- the store


class Datastore:
    """A built store, opened read-only (memory-mapped)."""

    def __init__(self, path: Path, meta: dict) -> None:
        self.path = Path(path)
        self.meta = meta
        self.separator = int(meta["separator"])
        self.dtype = np.dtype(meta["dtype"])
        self.tokens = np.memmap(self.path / TOKENS, dtype=self.dtype, mode="r") if meta["tokens"] else None
        self.index = (
            _tokengrams().MemmapIndex(str(self.path / TOKENS), str(self.path / INDEX), vocab=self.separator + 1)
            if meta["tokens"]
            else None
        )

    def __len__(self) -> int:
        return int(self.meta["tokens"])

    def provenance(self) -> dict[str, Any]:
        """What a result row says of the store it read: its name, fingerprint, size and kind (a refined
        store: how many pieces it kept of how many scored)."""
        refinement = self.meta.get("refinement") or {}
        kind = str(self.meta.get("source", {}).get("kind", ""))
        if refinement:
            kind += f" ({refinement.get('kept')} of {refinement.get('scored') or refinement.get('pieces')} pieces)"
        return {"datastore": self.path.name, "datastore_fingerprint": str(self.meta.get("fingerprint", ""))[:16],
                "datastore_tokens": int(self.meta.get("tokens", 0)), "datastore_kind": kind}

    @classmethod
    def load(cls, path: str | os.PathLike, tokenizer: Any = None, *, hint: str | None = None) -> Datastore:
        """Open the store at ``path``; with ``tokenizer``, check it was built for that tokenizer.

        Raises a one-line :class:`ConfigError` (naming ``hint``, the build command) when the
        store is missing, incomplete or built for another tokenizer.
        """
        path = Path(path).expanduser()
        meta = read_meta(path, hint)
        for name in (TOKENS, INDEX):
            if not (path / name).exists():
                raise ConfigError(f"datastore {path} is incomplete ({name} missing): rebuild it"
                                  + (f" with `{hint}`" if hint else ""))
        if tokenizer is not None:
            check_tokenizer(meta, tokenizer_identity(tokenizer), path, hint)
        return cls(path, meta)

    def documents(self) -> Iterable[np.ndarray]:
        """The stored documents, in order (views into the memory-mapped tokens)."""
        if self.tokens is None:
            return
        ends = np.flatnonzero(self.tokens == self.separator)
        start = 0
        for end in ends:
            yield self.tokens[start:end]
            start = int(end) + 1
        if start < len(self.tokens):
            yield self.tokens[start:]

    def match(self, context: Sequence[int], *, max_suffix: int = 16, min_suffix: int = 2) -> tuple[int, list[int]]:
        """``(n, positions)``: the longest suffix of ``context`` (``max_suffix`` down to ``min_suffix``
        tokens) that occurs in the store, and where its occurrences start (suffix-table order);
        ``(0, [])`` when none does."""
        if self.index is None:
            return 0, []
        tail = [int(t) for t in context[-max_suffix:]] if max_suffix > 0 else []
        for i in range(len(tail) - 1, -1, -1):  # never query across a separator (or an id past the vocab)
            if tail[i] >= self.separator or tail[i] < 0:
                tail = tail[i + 1 :]
                break
        for n in range(len(tail), min_suffix - 1, -1):
            positions = self.index.positions(tail[len(tail) - n :])
            if positions:
                return n, positions
        return 0, []

    def continuations(self, n: int, positions: Sequence[int], *, max_occurrences: int,
                      max_continuation: int = 10) -> list[tuple[int, ...]]:
        """What follows the matched ``n`` tokens at up to ``max_occurrences`` of ``positions`` (an even
        stride over them when there are more), each cut at ``max_continuation`` tokens or a separator."""
        if not positions or max_occurrences <= 0 or max_continuation <= 0:
            return []
        if len(positions) > max_occurrences:
            picks = (np.arange(max_occurrences) * len(positions)) // max_occurrences
            positions = [positions[int(i)] for i in picks]
        toks, sep = self.tokens, self.separator
        starts = np.asarray(positions, dtype=np.int64) + n
        idx = starts[:, None] + np.arange(max_continuation)
        inside = idx < len(toks)
        block = np.where(inside, toks[np.minimum(idx, len(toks) - 1)], sep)
        # length of each continuation: up to its first separator (or the end of the corpus)
        is_sep = block == sep
        lengths = np.where(is_sep.any(axis=1), is_sep.argmax(axis=1), max_continuation)
        rows = block.tolist()
        return [tuple(row[:k]) for row, k in zip(rows, lengths.tolist(), strict=True) if k]

    def search(self, context: Sequence[int], *, max_suffix: int = 16, min_suffix: int = 2,
               max_occurrences: int, max_continuation: int = 10) -> list[tuple[int, ...]]:
        """Continuations of the longest suffix of ``context`` found in the store (see the module doc);
        ``[]`` when no suffix of at least ``min_suffix`` tokens occurs."""
        n, positions = self.match(context, max_suffix=max_suffix, min_suffix=min_suffix)
        return self.continuations(n, positions, max_occurrences=max_occurrences,
                                  max_continuation=max_continuation)


def read_meta(path: Path, hint: str | None = None) -> dict:
    file = Path(path) / META
    if not file.exists():
        fix = f"build one with `{hint}`" if hint else "build one with `specbench datastore build`"
        raise ConfigError(f"no datastore at {path}: {fix}")
    try:
        meta = json.loads(file.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"datastore {path}: unreadable {META} ({err}); rebuild it") from None
    if meta.get("format") != FORMAT:
        raise ConfigError(f"datastore {path} has format {meta.get('format')}, this version reads {FORMAT}: rebuild it")
    return meta


def check_tokenizer(meta: dict, ident: dict, path: Path, hint: str | None = None) -> None:
    have = meta["tokenizer"]
    if have["vocab_sha256"] != ident["vocab_sha256"] or int(have["vocab_size"]) != int(ident["vocab_size"]):
        raise ConfigError(
            f"datastore {path} was built for tokenizer {have['name']} (vocab {have['vocab_size']}), not for "
            f"{ident['name']} (vocab {ident['vocab_size']}): build one for this model"
            + (f" with `{hint}`" if hint else "")
        )


# ----------------------------------------------------------------------------- writing


@contextlib.contextmanager
def _quiet_stdout():
    """tokengrams prints to the process's stdout while sorting; keep our own output clean."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def write_store(
    path: str | os.PathLike,
    documents: Iterable[Sequence[int]],
    *,
    tokenizer: dict,
    source: dict,
    n_bytes: int | Callable[[], int] | None = None,
    extra: dict | None = None,
    total: int | None = None,
    progress: bool = True,
) -> Datastore:
    """Write token ``documents`` as a store at ``path`` (replacing any store there, atomically).

    ``tokenizer`` is :func:`tokenizer_identity`'s dict; ``source`` describes where the
    documents came from; ``n_bytes`` is the size of the source text (or a function returning it once the
    documents are read); ``extra`` is merged
    into meta (prompt-set record, parent store). Prints tokens, bytes and seconds at the end.
    """
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    separator = int(tokenizer["vocab_size"])
    dtype = np.dtype("<u2") if separator < 2**16 else np.dtype("<u4")
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp"))
    tmp.chmod(0o755)
    try:
        digest, n_tokens, n_docs = hashlib.sha256(), 0, 0
        sep_bytes = np.asarray([separator], dtype=dtype).tobytes()
        bar = tqdm(documents, total=total, desc=f"datastore {path.name}", unit="doc", disable=not progress,
                   file=sys.stderr)
        with open(tmp / TOKENS, "wb") as out:
            for doc in bar:
                arr = np.asarray(doc, dtype=np.int64)
                if arr.size == 0:
                    continue
                if arr.min() < 0 or arr.max() >= separator:
                    raise ConfigError(f"datastore: token id {int(arr.max())} is outside the vocabulary ({separator})")
                body = arr.astype(dtype).tobytes()
                block = sep_bytes + body if n_docs else body  # a separator before every document but the first
                out.write(block)
                digest.update(block)
                n_tokens += int(arr.size) + (1 if n_docs else 0)
                n_docs += 1
                bar.set_postfix(tokens=n_tokens, refresh=False)
        bar.close()
        if n_tokens:
            if progress:
                print(f"datastore {path.name}: indexing {n_tokens:,} tokens ...", file=sys.stderr, flush=True)
            with _quiet_stdout():
                _tokengrams().MemmapIndex.build(str(tmp / TOKENS), str(tmp / INDEX), vocab=separator + 1,
                                               verbose=False)
        else:
            (tmp / INDEX).write_bytes(b"")
        seconds = time.perf_counter() - t0
        if callable(n_bytes):
            n_bytes = n_bytes()
        meta = {
            "format": FORMAT,
            "tokenizer": tokenizer,
            "separator": separator,
            "dtype": dtype.str,
            "tokens": n_tokens,
            "documents": n_docs,
            "bytes": int(n_bytes) if n_bytes is not None else None,
            "fingerprint": digest.hexdigest(),
            "source": source,
            "build_seconds": round(seconds, 3),
            "index_bytes": (tmp / INDEX).stat().st_size,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **(extra or {}),
        }
        (tmp / META).write_text(json.dumps(meta, indent=1))
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if progress:
        size = f", {n_bytes:,} bytes of text" if n_bytes is not None else ""
        print(f"datastore {path}: {n_docs:,} documents, {n_tokens:,} tokens{size}, built in {seconds:.1f} s",
              file=sys.stderr)
    return Datastore(path, meta)
