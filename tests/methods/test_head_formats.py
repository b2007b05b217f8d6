"""EAGLE heads' format questions, each answered or refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from methods.eagle3 import Eagle3, Eagle3Config
from specbench.core.forward import Target
from specbench.drafting.eagle_head import EagleHead, HeadConfig, load_head, save_head
from specbench.errors import ConfigError
from tests.lossless import HIDDEN, SMALL_VOCAB
from tests.methods.test_eagle import eagle_drafter, target_config, tiny_config


def _random(head: EagleHead, seed: int = 0) -> EagleHead:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
    return head


def _drop_d2t(directory):
    state = load_file(str(directory / "model.safetensors"))
    del state["d2t"]
    save_file(state, str(directory / "model.safetensors"))


# ----------------------------------------------------------------------------- (a) d2t


def test_a_reduced_draft_vocabulary_without_d2t_is_refused(tmp_path):
    head = EagleHead(tiny_config("eagle3", draft_vocab_size=4))
    save_head(head, tmp_path / "small")
    _drop_d2t(tmp_path / "small")
    with pytest.raises(ConfigError, match=r"draft vocabulary \(4 of the target's 8\).*without d2t"):
        load_head(tmp_path / "small", target_config())
    save_head(EagleHead(tiny_config("eagle3")), tmp_path / "full")  # the target's vocabulary: ids are its ids
    _drop_d2t(tmp_path / "full")
    full = load_head(tmp_path / "full", target_config())
    assert full.to_target_ids(torch.arange(SMALL_VOCAB)).tolist() == list(range(SMALL_VOCAB))


# ----------------------------------------------------------------------------- (b) target_hidden_size


def test_target_hidden_size_sizes_fc_and_a_head_of_another_width_is_refused(tmp_path):
    """``target_hidden_size`` is the width of the target's states ``fc`` reads (3 × it in); a head whose own
    layer is narrower than them (it would embed tokens with a table of its own) is refused, naming it."""
    save_head(EagleHead(tiny_config("eagle3")), tmp_path / "h")
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    assert cfg["target_hidden_size"] == HIDDEN
    head = load_head(tmp_path / "h", target_config())
    assert head.fc.in_features == 3 * HIDDEN and head.c.target_hidden_size == HIDDEN
    narrow = EagleHead(tiny_config("eagle3", hidden_size=HIDDEN // 2, target_hidden_size=HIDDEN))
    assert narrow.fc.in_features == 3 * HIDDEN and narrow.fc.out_features == HIDDEN // 2
    save_head(narrow, tmp_path / "narrow")
    with pytest.raises(ConfigError, match=r"its layer is 8 wide over the target's 16-wide states \(target_hidden_size\)"):
        load_head(tmp_path / "narrow", target_config())
    save_head(EagleHead(tiny_config("eagle3", target_hidden_size=2 * HIDDEN)), tmp_path / "other")
    with pytest.raises(ConfigError, match="for another model"):
        load_head(tmp_path / "other", target_config())


# ----------------------------------------------------------------------------- (c) the layers EAGLE-3 fuses


def test_the_layers_a_config_names_are_the_ones_fused(tmp_path):
    """``eagle_aux_hidden_state_layer_ids`` (vLLM's numbering: layer i's input) replaces (2, L/2, L-3); SpecForge's
    ``eagle_config`` ids, layer outputs when the first is 1, are read as SGLang reads them; ids the target has no
    layer input for are refused."""
    save_head(EagleHead(tiny_config("eagle3", aux_layers=(1, 4, 5))), tmp_path / "h")
    head = load_head(tmp_path / "h", target_config())
    assert head.feature_layers == (1, 4, 5)
    feats = {i: torch.randn(2, HIDDEN) for i in (1, 4, 5)}  # only these: the default layers are not asked for
    assert head.fuse(feats).shape == (2, HIDDEN)
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    del cfg["eagle_aux_hidden_state_layer_ids"]
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 2, 4]}
    (tmp_path / "h" / "config.json").write_text(json.dumps(cfg))
    assert load_head(tmp_path / "h", target_config()).feature_layers == (2, 3, 5)
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [2, 3, 5]}
    (tmp_path / "h" / "config.json").write_text(json.dumps(cfg))
    assert load_head(tmp_path / "h", target_config()).feature_layers == (2, 3, 5)
    del cfg["eagle_config"]
    (tmp_path / "h" / "config.json").write_text(json.dumps(cfg))
    assert load_head(tmp_path / "h", target_config()).feature_layers == (2, 3, 3)  # none named: (2, L/2, L-3)
    cfg["eagle_aux_hidden_state_layer_ids"] = [2, 3, 6]
    (tmp_path / "h" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"eagle_aux_hidden_state_layer_ids \[2, 3, 6\].*6 layers"):
        load_head(tmp_path / "h", target_config())


def test_the_drafter_reads_the_layers_its_head_names(tiny_llama, tmp_path):
    """The verification forward hands the drafter the named layers' states, and decoding stays the target's."""
    from tests.lossless import assert_greedy_lossless

    c = HeadConfig.for_target("eagle3", tiny_llama.model.config)
    c.aux_layers = (1, 0, 1)
    torch.manual_seed(0)
    save_head(EagleHead(c), tmp_path / "h")
    make = eagle_drafter(tiny_llama, tmp_path / "h", Eagle3, Eagle3Config, depth=3, top_k=3, total_tokens=8)
    assert make().feature_layers == (1, 0, 1)
    assert_greedy_lossless(Target(tiny_llama.model), make, [[5, 6, 7, 8]], 12)


# ----------------------------------------------------------------------------- norm placement


def test_norm_before_residual_changes_what_the_layer_adds_back():
    head = _random(EagleHead(tiny_config("eagle3")))
    other = EagleHead(tiny_config("eagle3", norm_before_residual=True))
    other.load_state_dict(head.state_dict())
    x, e = torch.randn(3, HIDDEN) * 5, torch.randn(3, HIDDEN)
    with torch.no_grad():
        assert not torch.allclose(head(x, e, torch.arange(3)), other(x, e, torch.arange(3)))
