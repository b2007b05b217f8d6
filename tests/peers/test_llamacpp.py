"""Against the built llama-server (``make peers``, then ``make test-peers``): SmolLM2's weights as we load them,
written as an F32 GGUF, served; one generation each, autoregressive and speculative, their counts, the same
tokens as our own autoregressive decoding, and the process gone afterwards."""

from __future__ import annotations

import pytest

from specbench.core.decode import generate
from specbench.core.draft import Drafter
from specbench.core.forward import Target
from specbench.peers import llamacpp
from specbench.peers.llamacpp import LlamaServer

pytestmark = pytest.mark.peers

CODE = ("Rename the function `add` to `plus` in this code and return the whole code:\n"
        "def add(a, b):\n    return a + b\n\n\nprint(add(1, 2))\nprint(add(3, 4))\n")
TOKENS = 48


@pytest.fixture(scope="module")
def prompt(smollm2):
    return smollm2.tokenizer.apply_chat_template([{"role": "user", "content": CODE}], add_generation_prompt=True,
                                                 return_dict=False)


@pytest.fixture(scope="module")
def gguf(smollm2):
    llamacpp.require_server()  # fails (does not skip) without a build: make peers
    return llamacpp.gguf_for(smollm2.model, smollm2.tokenizer, "smollm2-135m", "float32")


@pytest.fixture(scope="module")
def ours(smollm2, prompt):
    rec = generate(Target(smollm2.model), Drafter(vocab_size=0), prompt, max_new_tokens=TOKENS,
                   eos_token_ids=smollm2.eos_token_ids)
    return rec.output_ids


def test_the_engines_autoregressive_output_is_ours_on_the_same_f32_weights(gguf, prompt, ours):
    with LlamaServer(gguf, "none", context=1024) as server:
        done = server.complete(prompt, TOKENS)
        proc = server.proc
    assert done.tokens == ours[:len(done.tokens)] and len(done.tokens) >= len(ours) - 1  # its EOS may go unreturned
    assert done.drafted == done.accepted == 0 and done.steps == len(done.tokens)
    assert 0 < done.prompt_s and 0 < done.decode_s < done.client_s
    assert proc.poll() is not None  # stopped with the block


def test_prompt_lookup_in_the_engine_keeps_its_output_and_counts_its_guesses(gguf, prompt, ours):
    with LlamaServer(gguf, "ngram-simple", context=1024) as server:
        done = server.complete(prompt, TOKENS)
    assert done.tokens == ours[:len(done.tokens)]
    assert 0 <= done.accepted <= done.drafted and done.drafted > 0  # the code is copied: it drafts
    assert done.steps == len(done.tokens) - done.accepted
