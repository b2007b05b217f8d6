"""GSM8K (Cobbe et al. 2021): grade-school maths word problems, zero-shot.

The SPECTRA paper's math set (max 1024 new tokens). Chat models get the
question alone as the user message; without a chat template the prompt is
``Question: <question>\\nAnswer:``. Rows: ``question``, ``answer`` (worked
solution ending ``#### <number>``), as in ``openai/gsm8k`` (config ``main``,
split ``test``, 1,319 rows) and the original ``test.jsonl``. Sample ids are row
indices. With ``check_answers`` the final number of the output is compared with
the reference's (``accuracy`` 1/0).
"""

from __future__ import annotations

from typing import Any

from specbench.paths import setting

from .base import DatasetDef, Sample
from .quality import gsm8k_correct


class GSM8K(DatasetDef):
    name = "gsm8k"
    default_max_new_tokens = 1024
    hub_id = "openai/gsm8k"
    hub_config = "main"
    split = "test"
    path_example = "gsm8k_test.jsonl"

    def to_sample(self, record: dict, index: int, cfg: Any) -> Sample:
        question = record.get("question") or record.get("problem")
        if question is None:
            raise ValueError(f"GSM8K row without 'question': keys {sorted(record)}")
        return Sample(
            sample_id=str(record.get("id", index)), turns=[str(question)], reference=record.get("answer")
        )

    def raw_text(self, sample: Sample, turn: int, previous_answers: list[str], cfg: Any) -> str:
        return f"Question: {sample.turns[0]}\nAnswer:"

    def score(self, sample: Sample, output_text: str, turn: int, cfg: Any) -> dict[str, float]:
        if not setting(cfg, "check_answers", False) or not sample.reference:
            return {}
        return {"accuracy": float(gsm8k_correct(output_text, sample.reference))}
