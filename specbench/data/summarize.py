"""Summarisation sets: CNN/DailyMail and XSum, scored with ROUGE-1/2/L (SPECTRA Table 7).

Prompt (``prompt_style: lookahead``, the default): the one of the Lookahead
decoding evaluation scripts that SPECTRA's Table 7 reuses — the article as the
context of an "intelligent chatbot", a short list of output rules, then
"Briefly summarize the given context." Chat models get it as one user message
through their chat template. Raw mode (``chat=False``) renders it in Llama-2
``[INST] <<SYS>>`` markup ending in ``Summary:``, as those scripts sent it
(without their trailing space, which tokenizes badly). ``prompt_style: plain``
is a bare "Briefly summarize the following article." over the article.

Long inputs: prompts over ``max_input_tokens`` (default 2048, the scripts'
limit; 0 disables) are skipped (``overlong: skip``, the scripts' behaviour;
``build_prompt`` raises :class:`SampleSkipped`) or, with ``overlong: truncate``,
the article is cut (token-wise, from the end) until the whole prompt fits.

Splits: ``validation``, as in those scripts (``test`` is a setting away).
CNN/DM: hub ``abisee/cnn_dailymail`` config ``3.0.0`` (``article``,
``highlights``, ``id``). XSum: hub ``EdinburghNLP/xsum`` (``document``,
``summary``, ``id``); a revision that still holds the old loading script is
retried on ``refs/convert/parquet``. Local files in either schema.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from specbench.paths import setting

from .base import DatasetDef, Sample, SampleSkipped
from .quality import rouge

_CONTEXT = "You are an intelligent chatbot. Answer the questions only using the following context:"
_RULES = (
    "Here are some rules you always follow:\n\n"
    "- Generate human readable output, avoid creating output with gibberish text.\n"
    "- Generate only the requested output, don't include any other language before or after the "
    "requested output.\n"
    "- Never say thank you, that you are happy to help, that you are an AI agent, etc. Just answer directly.\n"
    "- Generate professional language typically used in business documents in North America.\n"
    "- Never generate offensive or foul language.\n"
)
_ASK = "Briefly summarize the given context."


def summary_prompt(document: str, style: str, chat: bool) -> str:
    if style == "lookahead":
        if chat:
            return f"{_CONTEXT}\n\n{document}\n\n{_RULES}\n{_ASK}"
        return f"[INST] <<SYS>>\n{_CONTEXT}\n\n{document}\n\n{_RULES}\n<</SYS>>\n\n{_ASK} [/INST]\nSummary:"
    if style == "plain":
        if chat:
            return f"Briefly summarize the following article.\n\n{document}"
        return f"Article: {document}\n\nBriefly summarize the article above.\nSummary:"
    raise ValueError(f"summarisation prompt_style must be lookahead or plain, not '{style}'")


class _Summaries(DatasetDef):
    default_max_new_tokens = 1024
    split = "validation"
    max_input_tokens = 2048
    _document_keys = ("article", "document", "text")
    _summary_keys = ("highlights", "summary", "reference")

    def to_sample(self, record: dict, index: int, cfg: Any) -> Sample:
        document = next((record[k] for k in self._document_keys if record.get(k)), None)
        if document is None:
            raise ValueError(f"{self.name} row without an article: keys {sorted(record)}")
        reference = next((record[k] for k in self._summary_keys if record.get(k)), None)
        style = setting(cfg, "prompt_style", "lookahead")
        return Sample(
            sample_id=str(record.get("id", index)),
            turns=[summary_prompt(document, style, chat=True)],
            reference=reference,
            meta={"document": document},
        )

    def user_text(self, sample: Sample, turn: int, cfg: Any) -> str:
        return summary_prompt(sample.meta["document"], setting(cfg, "prompt_style", "lookahead"), chat=True)

    def raw_text(self, sample: Sample, turn: int, previous_answers: list[str], cfg: Any) -> str:
        return summary_prompt(sample.meta["document"], setting(cfg, "prompt_style", "lookahead"), chat=False)

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
        def encode_with(document: str) -> list[int]:
            shorter = dataclasses.replace(sample, meta={**sample.meta, "document": document})
            return self.encode(tokenizer, shorter, turn, previous_answers, cfg, chat)

        doc_ids = tokenizer(sample.meta["document"], add_special_tokens=False)["input_ids"]
        budget = min(len(doc_ids), limit - len(encode_with("")))
        for _ in range(8):
            if budget <= 0:
                break
            ids = encode_with(tokenizer.decode(doc_ids[:budget], skip_special_tokens=True))
            if len(ids) <= limit:
                sample.meta["input_truncated_to"] = budget
                return ids
            budget -= len(ids) - limit
        raise SampleSkipped(f"{self.name} sample {sample.sample_id}: the prompt cannot fit {limit} tokens")

    def score(self, sample: Sample, output_text: str, turn: int, cfg: Any) -> dict[str, float]:
        if not sample.reference:
            return {}
        return rouge(output_text, sample.reference, bool(setting(cfg, "rouge_stemmer", True)))


class CNNDailyMail(_Summaries):
    name = "cnn_dailymail"
    hub_id = "abisee/cnn_dailymail"
    hub_config = "3.0.0"
    path_example = "cnn_dailymail_validation.parquet"


class XSum(_Summaries):
    name = "xsum"
    hub_id = "EdinburghNLP/xsum"
    path_example = "xsum_validation.parquet"
