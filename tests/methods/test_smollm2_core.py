"""The core on the real embedded model (SmolLM2-135M, fp32): autoregressive equals ``generate``."""

import pytest
import torch

from specbench.core.decode import generate
from specbench.core.draft import Draft, Drafter
from specbench.core.forward import Target

MESSAGES = [
    "What is the capital of France? Answer in one sentence.",
    "Rewrite this function to use a list comprehension:\n\ndef squares(xs):\n    out = []\n    for x in xs:\n"
    "        out.append(x * x)\n    return out",
    "List three prime numbers.",
]


def chat_ids(tok, text):
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return tok(rendered, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("message", MESSAGES, ids=["fact", "code-edit", "list"])
def test_autoregressive_equals_generate_on_smollm2(smollm2, message):
    ids = chat_ids(smollm2.tokenizer, message)
    target = Target(smollm2.model)
    rec = generate(
        target,
        Drafter(vocab_size=smollm2.vocab_size),
        ids,
        max_new_tokens=40,
        eos_token_ids=smollm2.eos_token_ids,
    )
    with torch.inference_mode():
        ref = smollm2.model.generate(
            torch.tensor([ids]),
            max_new_tokens=40,
            do_sample=False,
            eos_token_id=smollm2.eos_token_ids,
            pad_token_id=smollm2.eos_token_ids[0],
            top_p=None,
            top_k=None,
            temperature=None,
        )[0, len(ids) :].tolist()
    assert rec.output_ids == ref
    assert rec.steps == rec.new_tokens


def test_tree_draft_on_smollm2_is_lossless(smollm2):
    """A tree mixing the true continuation with wrong branches, on the real model."""
    ids = chat_ids(smollm2.tokenizer, MESSAGES[1])
    target = Target(smollm2.model)
    truth = generate(target, Drafter(vocab_size=0), ids, max_new_tokens=48).output_ids

    class Mixed(Drafter):
        def propose(self, state):
            pos = state.new_tokens
            right = truth[pos : pos + 4]
            wrong = [(t + 7) % 49152 for t in right]
            return (
                Draft.from_sequences([wrong, right[:2] + wrong[2:], right], ["w", "half", "right"])
                if right
                else None
            )

    rec = generate(target, Mixed(vocab_size=0), ids, max_new_tokens=48)
    assert rec.output_ids == truth
    assert rec.steps <= len(truth) // 3
    assert rec.accepted_by_source["right"] > 0
