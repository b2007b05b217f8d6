"""Linear layers prepacked for oneDNN (``hardware.linear``): the same products as ``nn.Linear``, the same
greedy outputs at every block size, chosen on CPUs only, recorded in rows and in the cost curve's key."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from specbench.core.decode import generate
from specbench.core.forward import Target
from specbench.models import load_model
from specbench.models.packed import PackedLinear, pack_linears, packing_available, packs, wants_packed
from tests.conftest import CPU_SDPA, model_cfg

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN")


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_a_packed_linear_computes_what_the_linear_does_at_every_block_size(dtype, tol):
    if not packs(dtype):  # bf16 on a CPU without AVX-512: never packed, and said so
        assert not wants_packed("auto", "cpu", dtype) and not wants_packed("packed", "cpu", dtype)
        return
    torch.manual_seed(0)
    lin = nn.Linear(96, 200).to(dtype)
    packed = PackedLinear(lin)
    for rows in (1, 2, 3, 8, 17, 64):
        x = torch.randn(2, rows, 96, dtype=dtype)
        torch.testing.assert_close(packed(x), lin(x), rtol=tol, atol=tol)
    assert packed.weight is lin.weight  # tied weights stay tied


def test_a_weight_changed_in_place_is_repacked():
    lin = nn.Linear(8, 8)
    packed = PackedLinear(lin)
    x = torch.randn(3, 8)
    with torch.no_grad():
        lin.weight.mul_(2)
    torch.testing.assert_close(packed(x), lin(x), rtol=1e-5, atol=1e-5)


def test_packing_is_for_cpus_and_fp32_unless_asked():
    assert wants_packed("auto", "cpu", torch.float32) and wants_packed("auto", "cpu", torch.bfloat16) == packs(torch.bfloat16)
    assert not wants_packed("auto", "cpu", torch.float16) and wants_packed("packed", "cpu", torch.float16)
    assert not wants_packed("plain", "cpu", torch.float32) and not wants_packed("auto", "cuda", torch.float32)
    with pytest.raises(ValueError, match="hardware.linear"):
        wants_packed("fast", "cpu", torch.float32)


def test_every_linear_of_a_model_is_packed_and_the_load_says_so():
    packed = load_model(model_cfg("tiny-llama"), CPU_SDPA)
    plain = load_model(model_cfg("tiny-llama"), {**CPU_SDPA, "linear": "plain"})
    assert packed.linear == "packed" and plain.linear == "plain"
    n_linear = sum(type(m) is nn.Linear for m in plain.model.modules())
    assert sum(isinstance(m, PackedLinear) for m in packed.model.modules()) == n_linear > 0
    assert not any(type(m) is nn.Linear for m in packed.model.modules())
    assert pack_linears(packed.model) == 0  # nothing left to pack


@pytest.mark.slow
def test_greedy_outputs_are_the_same_with_packed_and_plain_linears_at_every_block_size(smollm2):
    """SmolLM2, fp32: autoregressive decoding and a drafter that proposes blocks of 1 to 8 tokens, packed and
    plain, all give the same tokens."""
    from methods.pld import PLDConfig, PromptLookup
    from specbench.core.draft import Drafter

    plain = load_model(model_cfg("smollm2-135m"), {**CPU_SDPA, "linear": "plain"})
    packed = smollm2
    assert packed.linear == "packed"
    prompt = plain.tokenizer("def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n",
                             add_special_tokens=False)["input_ids"] * 2
    outputs = {}
    for name, lm in (("plain", plain), ("packed", packed)):
        target = Target(lm.model)
        outputs[name, "ar"] = generate(target, Drafter(vocab_size=lm.vocab_size), prompt, max_new_tokens=32).output_ids
        for k in (1, 8):
            drafter = PromptLookup(PLDConfig(num_draft=k), vocab_size=lm.vocab_size)
            outputs[name, k] = generate(target, drafter, prompt, max_new_tokens=32).output_ids
    assert len(set(map(tuple, outputs.values()))) == 1, outputs


def test_the_floor_counts_tied_weights_once_and_divides_by_the_bandwidth():
    from specbench.machine.floor import Floor, weight_bytes

    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight  # tied, as SmolLM2's output layer
    assert weight_bytes(model) == 10 * 4 * 4
    bound = Floor(weight_bytes=2_000_000, bandwidth=1e9, threads=2)
    assert bound.seconds == pytest.approx(2e-3) and "2 MB of weights read at 1.0 GB/s (2 threads) = 2.0 ms" in \
        bound.describe()
