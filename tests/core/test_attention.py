"""Grouped-query tree steps with the group folded into the query: the same logits as K/V repeated per head,
without repeating them, and only where it applies."""

import copy

import pytest
import torch

import specbench.core.attention as attention
from specbench.core.attention import NAME, fold_gqa
from specbench.core.draft import Draft
from specbench.core.forward import Target
from tests.core.test_tree_forward import PREFIX, build

TREE = Draft(tokens=[3, 4, 5, 6, 7], parents=[-1, 0, -1, 2, 0], sources=["t"] * 5, aux_tokens=[9, 10],
             aux_positions=[1, 2], aux_visible=[[False, False], [True, False]])


def run(model, before_tree=lambda: None):
    """Prefill, then the tree step (``before_tree`` runs between the two); the logits of both and the cache."""
    target = Target(model)
    cache = target.new_cache()
    first = target.prefill(PREFIX, cache)
    before_tree()
    return first, target.forward_draft(PREFIX[-1], TREE, cache), cache


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_folded_tree_steps_equal_repeated_kv(kind, monkeypatch):
    repeated = build(kind)
    folded = copy.deepcopy(repeated)
    assert fold_gqa(folded) and folded.config._attn_implementation == NAME
    ref_first, ref_tree, ref_cache = run(repeated)
    calls = []
    real = attention.folded_sdpa
    monkeypatch.setattr(attention, "folded_sdpa", lambda *a, **k: calls.append(a[1].shape[2]) or real(*a, **k))
    attention._register()  # the spy under the registered name

    def no_repeat(*args):
        raise AssertionError("K/V repeated in a folded tree step")

    # the prefill has no custom mask and goes to transformers' sdpa; the tree step must not repeat K/V
    refuse = lambda: monkeypatch.setattr("transformers.integrations.sdpa_attention.repeat_kv", no_repeat)  # noqa: E731
    first, tree, cache = run(folded, refuse)
    monkeypatch.undo()
    attention._register()  # the real function back under the name
    assert torch.allclose(first, ref_first, atol=1e-5) and torch.allclose(tree, ref_tree, atol=1e-5)
    assert 1 + len(TREE.tokens) + len(TREE.aux_tokens) in calls  # the tree step went through the fold
    for a, b in zip(cache.layers, ref_cache.layers, strict=True):
        assert torch.allclose(a.keys, b.keys, atol=1e-5) and torch.allclose(a.values, b.values, atol=1e-5)


def test_models_without_groups_are_left_alone():
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM, LlamaConfig

    mha = AutoModelForCausalLM.from_config(LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=4), attn_implementation="sdpa")
    assert not fold_gqa(mha) and mha.config._attn_implementation == "sdpa"
    eager = build("llama", attn="eager")
    assert not fold_gqa(eager) and eager.config._attn_implementation == "eager"


def test_load_model_folds_unless_told_to_repeat():
    from specbench.errors import ModelLoadError
    from specbench.models import load_model
    from tests.conftest import model_cfg

    cfg = model_cfg("tiny-llama", dtype="float32")  # 4 query heads, 2 K/V heads
    assert load_model(cfg, {"device": "cpu"}).model.config._attn_implementation == NAME
    assert load_model(cfg, {"device": "cpu", "gqa": "repeat"}).model.config._attn_implementation == "sdpa"
    with pytest.raises(ModelLoadError, match="hardware.gqa 'fast' is not one of fold, repeat"):
        load_model(cfg, {"device": "cpu", "gqa": "fast"})
