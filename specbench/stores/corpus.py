"""Where a datastore's documents come from, and building a store from them.

``--source`` (``SOURCE=`` for ``make datastore``) takes:

* ``stdlib``: the interpreter's own standard library (``*.py``), a real Python corpus on
  every machine, offline;
* ``dir:DIR``: the files under ``DIR`` matching ``--glob`` (default ``*.py``), one document each;
* ``file:FILE``: a local corpus; ``.txt`` is one document, ``.jsonl``/``.json``/``.parquet`` one
  document per record, its text in ``--field`` (default: ``text``, ``content``, or the turns of
  ``messages``/``conversations``/``data`` joined by newlines);
* ``hub:ID``: a Hugging Face dataset, streamed (``--hub-config``, ``--hub-data-dir``, ``--split``,
  ``--field``, ``--limit``); presets ``ultrachat`` (chat models) and ``the-stack-python`` (code
  models; gated: accept its terms on the hub and authenticate first);
* ``generate:DATASET``: what the target model itself answers (greedy) to a prompt set of this
  project's datasets (``--offset``/``--limit``/``--turns``, ``--max-new-tokens``), REST's
  suggestion for aligning a store with its model. The prompts are recorded (dataset, sample ids,
  text hashes) so that a run over any of them is refused. Resumable: every answer is appended to
  ``<store>.work/generations.jsonl`` as soon as it exists;
* ``chat``: ``generate:mtbench`` over MT-Bench questions 41-80 (``offset=40``), first turns, 256
  new tokens: disjoint from the questions the default runs and the demo evaluate (the first
  few), which the overlap check then enforces.
"""

from __future__ import annotations

import json
import sys
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbench.errors import ConfigError

TEXT_FIELDS = ("text", "content")
TURN_FIELDS = ("messages", "conversations", "data")


@dataclass
class HubPreset:
    hub_id: str
    field: str
    config: str | None = None
    data_dir: str | None = None
    split: str = "train"
    gated: bool = False
    records: int = 100_000  # what a run streams when it builds the store itself (the paper's ~100k sequences)
    bytes_per_record: int = 6_000  # for the estimate before the build


HUB_PRESETS = {
    # 632 MB of text per 100k UltraChat dialogues (the size of a public 100k-dialogue sample of it)
    "ultrachat": HubPreset("stingning/ultrachat", "data", bytes_per_record=6_300),
    "the-stack-python": HubPreset("bigcode/the-stack", "content", data_dir="data/python", gated=True,
                                  bytes_per_record=5_000),
}
CHAT_PRESET = {"dataset": "mtbench", "offset": 40, "limit": 40, "turns": 1, "max_new_tokens": 256}


@dataclass
class Corpus:
    """Texts (or token ids) to index, with a description for the store's meta."""

    texts: Iterable[str] | None
    source: dict
    total: int | None = None
    token_docs: Iterable[list[int]] | None = None  # already tokenized (model outputs)
    extra: dict = field(default_factory=dict)  # meta additions (prompt-set record)
    n_bytes: int | None = None


def default_name(source: str) -> str:
    kind, _, arg = source.partition(":")
    if not arg:
        return kind
    return f"{kind}-{Path(arg.rstrip('/')).stem or 'corpus'}".replace("/", "_")


# ----------------------------------------------------------------------------- files


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def source_files(root: Path, glob: str) -> list[Path]:
    if not root.is_dir():
        raise ConfigError(f"datastore source: {root} is not a directory")
    skip = {"site-packages", "dist-packages", "__pycache__"}
    files = sorted(p for p in root.rglob(glob) if p.is_file() and not skip.intersection(p.parts))
    if not files:
        raise ConfigError(f"datastore source: no files matching '{glob}' under {root}")
    return files


class _ByteCounter:
    """Iterate texts, counting their UTF-8 bytes (the store's meta reports them)."""

    def __init__(self, texts: Iterable[str]) -> None:
        self.texts, self.n_bytes = texts, 0

    def __iter__(self) -> Iterator[str]:
        for text in self.texts:
            self.n_bytes += len(text.encode("utf-8", errors="replace"))
            yield text


def _read_files(files: list[Path]) -> Iterator[str]:
    for p in files:
        try:
            yield p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue


def record_text(record: dict, field_name: str | None) -> str | None:
    """The text of one corpus record: ``field_name``, else a text field, else joined conversation turns."""
    keys = [field_name] if field_name else list(TEXT_FIELDS) + list(TURN_FIELDS)
    for key in keys:
        value = record.get(key)
        if value is None:
            continue
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            parts = [v.get("content") or v.get("value") or "" if isinstance(v, dict) else str(v) for v in value]
            return "\n".join(p for p in parts if p)
    if field_name:
        raise ConfigError(f"datastore source: records have no field '{field_name}' (fields: {', '.join(record)})")
    raise ConfigError(f"datastore source: cannot find the text in records with fields {', '.join(record)}: "
                      "name it with --field")


def _file_texts(path: Path, field_name: str | None, limit: int | None) -> Iterator[str]:
    if path.suffix == ".txt":
        yield path.read_text(encoding="utf-8", errors="replace")
        return
    from specbench.data.readers import read_records

    for i, rec in enumerate(read_records(path)):
        if limit is not None and i >= limit:
            return
        text = record_text(rec, field_name)
        if text:
            yield text


# ----------------------------------------------------------------------------- hub


def _hub_missing(hub_id: str, gated: bool) -> str | None:
    """"unreachable" (no hub), "token" (a gated set and no token) or None (it can be streamed)."""
    from specbench import hub

    if not hub.reachable():
        return "unreachable"
    if gated:
        from huggingface_hub import get_token

        if not get_token():
            return "token"
    return None


def check_hub(hub_id: str, gated: bool) -> None:
    """One line, before any download: the hub must be reachable (or the set cached) and, for a
    gated set, a token present."""
    from specbench.data.readers import hub_cached

    if hub_cached(hub_id):
        return
    missing = _hub_missing(hub_id, gated)
    if missing == "unreachable":
        raise ConfigError(f"datastore source hub:{hub_id} needs the Hugging Face hub, which is unreachable: "
                          "build offline with SOURCE=stdlib, SOURCE=dir:DIR or SOURCE=file:FILE instead")
    if missing == "token":
        raise ConfigError(f"{hub_id} is gated: accept its terms at https://huggingface.co/datasets/{hub_id}, "
                          "then authenticate with `hf auth login` (or set HF_TOKEN) and rerun")


def hub_problem(name: str) -> str | None:
    """Why the hub preset ``name`` cannot be streamed here (None when it can): no hub, or gated without a token."""
    preset = HUB_PRESETS[name]
    missing = _hub_missing(preset.hub_id, preset.gated)
    if missing == "unreachable":
        return "the Hugging Face hub is unreachable"
    if missing == "token":
        return f"{preset.hub_id} is gated and no hub token is set"
    return None


def _hub_texts(preset: HubPreset, field_name: str | None, limit: int | None) -> Iterator[str]:
    try:
        import datasets
    except ImportError:
        raise ConfigError("hub sources need the datasets package: pip install 'specbench[hub]'") from None
    kwargs = {"split": preset.split, "streaming": True}
    if preset.data_dir:
        kwargs["data_dir"] = preset.data_dir
    try:
        rows = datasets.load_dataset(preset.hub_id, preset.config, **kwargs)
        for i, rec in enumerate(rows):
            if limit is not None and i >= limit:
                return
            text = record_text(rec, field_name or preset.field)
            if text:
                yield text
    except ConfigError:
        raise
    except Exception as err:  # gated, missing, network: one line
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        if "gated" in msg.lower() or "401" in msg or "403" in msg:
            raise ConfigError(f"{preset.hub_id} is gated: accept its terms on the hub, then `hf auth login` "
                              "(or set HF_TOKEN) and rerun") from None
        raise ConfigError(f"datastore source hub:{preset.hub_id}: {msg}") from None


# ----------------------------------------------------------------------------- model outputs


def generation_prompts(dataset: str, offset: int, limit: int | None, turns: int,
                       dataset_cfg: dict | None = None) -> tuple[Any, list, dict]:
    """The samples a ``generate:`` source answers and the record a store keeps of them."""
    from specbench import data
    from specbench.stores.datastore import prompt_hash

    ddef = data.get_dataset(dataset)
    dcfg = {"name": dataset, **(dataset_cfg or {})}
    data.check_available(dcfg)
    samples = data.select(ddef.load(dcfg), limit=limit, offset=offset)
    if not samples:
        raise ConfigError(f"datastore source generate:{dataset}: no samples at offset={offset}, limit={limit}")
    record = {
        "dataset": ddef.name,
        "offset": offset,
        "limit": limit,
        "turns": turns,
        "sample_ids": [s.sample_id for s in samples],
        # every turn of every sample used: a run on any of them is an overlap
        "hashes": sorted({prompt_hash(t) for s in samples for t in s.turns}),
    }
    return ddef, samples, record


def generate_outputs(model_cfg: Any, ddef: Any, samples: list, *, turns: int, max_new_tokens: int,
                     work: Path, dataset_cfg: dict | None = None, progress: bool = True) -> list[list[int]]:
    """Greedy answers of the target model (autoregressive drafter), resumable through ``work``."""
    import torch
    from tqdm.auto import tqdm

    from specbench import data
    from specbench.core.decode import generate
    from specbench.core.draft import Drafter
    from specbench.core.forward import Target
    from specbench.models import load_model

    work.mkdir(parents=True, exist_ok=True)
    log = work / "generations.jsonl"
    done: dict[tuple[str, int], dict] = {}
    if log.exists():
        for line in log.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:  # a line cut by a kill
                continue
            done[(rec["sample_id"], rec["turn"])] = rec
    todo = [(s, t) for s in samples for t in range(min(turns, len(s.turns)))]
    bar = tqdm(total=len(todo), initial=sum(1 for s, t in todo if (s.sample_id, t) in done),
               desc=f"generating for the store ({ddef.name})", unit="answer", disable=not progress, file=sys.stderr)
    if any((s.sample_id, t) not in done for s, t in todo):
        torch.manual_seed(0)
        lm = load_model(model_cfg, {"device": "cpu", "attn_implementation": "sdpa"}
                        if not torch.cuda.is_available() else None)
        target = Target(lm.model)
        dcfg = {"name": ddef.name, **(dataset_cfg or {})}
        chat = bool(model_cfg.get("chat", True))
        with open(log, "a") as out:
            if log.stat().st_size and not log.read_bytes().endswith(b"\n"):
                out.write("\n")  # end a line a kill cut short (it is skipped when read)
            for sample in samples:
                answers: list[str] = []
                for turn in range(min(turns, len(sample.turns))):
                    key = (sample.sample_id, turn)
                    if key in done:
                        answers.append(lm.tokenizer.decode(done[key]["output_ids"], skip_special_tokens=True))
                        continue
                    try:
                        ids = ddef.build_prompt(lm.tokenizer, sample, turn, answers, dcfg, chat)
                    except data.SampleSkipped:
                        break
                    rec = generate(target, Drafter(vocab_size=lm.vocab_size), ids,
                                   max_new_tokens=min(max_new_tokens, lm.context_length - len(ids)),
                                   eos_token_ids=lm.eos_token_ids)
                    row = {"sample_id": sample.sample_id, "turn": turn, "output_ids": rec.output_ids}
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    done[key] = row
                    answers.append(lm.tokenizer.decode(rec.output_ids, skip_special_tokens=True))
                    bar.update(1)
    bar.close()
    # each answer as generated, EOS included (a store entry ends at its document's end)
    return [done[(s.sample_id, t)]["output_ids"] for s, t in todo if (s.sample_id, t) in done]


# ----------------------------------------------------------------------------- entry


def open_corpus(source: str, *, field_name: str | None = None, glob: str = "*.py", limit: int | None = None,
                hub_config: str | None = None, hub_data_dir: str | None = None, split: str | None = None) -> Corpus:
    """Texts of a ``--source`` that needs no model (all but ``generate:``/``chat``); checks come first."""
    kind, _, arg = source.partition(":")
    if kind == "stdlib" and not arg:
        root = stdlib_dir()
        files = source_files(root, "*.py")[:limit]
        return Corpus(_read_files(files), {"kind": "stdlib", "description":
                                           f"Python {sys.version.split()[0]} standard library (*.py)",
                                           "files": len(files)}, total=len(files))
    if kind == "dir" and arg:
        files = source_files(Path(arg).expanduser(), glob)[:limit]
        return Corpus(_read_files(files), {"kind": "dir", "description": f"{Path(arg).name}/**/{glob}",
                                           "files": len(files)}, total=len(files))
    if kind == "file" and arg:
        path = Path(arg).expanduser()
        if not path.is_file():
            raise ConfigError(f"datastore source: no file {path}")
        return Corpus(_file_texts(path, field_name, limit), {"kind": "file", "description": path.name})
    if kind in HUB_PRESETS and not arg or kind == "hub" and arg:
        preset = HUB_PRESETS[kind] if kind in HUB_PRESETS else HubPreset(arg, field_name or "text")
        if hub_config:
            preset.config = hub_config
        if hub_data_dir:
            preset.data_dir = hub_data_dir
        if split:
            preset.split = split
        check_hub(preset.hub_id, preset.gated)
        return Corpus(_hub_texts(preset, field_name, limit), {
            "kind": "hub", "description": f"{preset.hub_id}" + (f" ({preset.data_dir})" if preset.data_dir else ""),
            "hub_id": preset.hub_id, "split": preset.split, "limit": limit}, total=limit)
    raise ConfigError(f"unknown datastore source '{source}': use stdlib, chat, dir:DIR, file:FILE, hub:ID, "
                      f"{', '.join(HUB_PRESETS)} or generate:DATASET")


def tokenized(texts: Iterable[str], tokenizer: Any, batch: int = 64) -> Iterator[list[int]]:
    """Token ids of each text (no special tokens), tokenized in batches."""
    chunk: list[str] = []
    for text in texts:
        chunk.append(text)
        if len(chunk) == batch:
            yield from tokenizer(chunk, add_special_tokens=False, verbose=False)["input_ids"]
            chunk = []
    if chunk:
        yield from tokenizer(chunk, add_special_tokens=False, verbose=False)["input_ids"]
