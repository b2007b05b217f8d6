"""DFlash's drafter network (:mod:`specbench.drafting.dflash`) against a plain reference written here: every
block position, head and key one at a time, the rotary embedding as the rotation of each pair of coordinates.
The reference is shown to differ when the block is causal instead of bidirectional or when the context is not
injected as keys and values, so the match below holds the network to both."""

from __future__ import annotations

import math
import re

import pytest
import torch

from specbench.drafting.dflash import DFlashNet, DFlashShape, tapped_layers


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * x / torch.sqrt((x * x).mean() + eps)


def rotate(x: torch.Tensor, position: int, theta: float) -> torch.Tensor:
    """``x`` [dim] turned by the angles of ``position``: coordinate i paired with i + dim / 2."""
    half = x.shape[0] // 2
    out = x.clone()
    for i in range(half):
        angle = position * theta ** (-2 * i / x.shape[0])
        c, s = math.cos(angle), math.sin(angle)
        out[i], out[i + half] = x[i] * c - x[i + half] * s, x[i + half] * c + x[i] * s
    return out


def reference(net: DFlashNet, features: torch.Tensor, block: torch.Tensor, positions: list[int],
              causal: bool = False, inject: bool = True) -> torch.Tensor:
    """The block's final states, one position, head and key at a time (every context position at once)."""
    s = net.s
    t, b = features.shape[0], block.shape[0]
    context = [rms(net.fc.weight @ f, net.hidden_norm.weight, s.eps) for f in features]
    x = [row.clone() for row in block]
    for layer in net.layers:
        a = layer.self_attn
        h = [rms(row, layer.input_layernorm.weight, s.eps) for row in x]
        sources = (context if inject else []) + h
        where = (positions[:t] if inject else []) + positions[t:]

        def head(weight: torch.Tensor, vec: torch.Tensor, j: int) -> torch.Tensor:
            return (weight @ vec)[j * s.head_dim : (j + 1) * s.head_dim]

        keys = [[rotate(rms(head(a.k_proj.weight, src, j), a.k_norm.weight, s.eps), p, s.rope_theta)
                 for src, p in zip(sources, where, strict=True)] for j in range(s.kv_heads)]
        values = [[head(a.v_proj.weight, src, j) for src in sources] for j in range(s.kv_heads)]
        new = []
        for i in range(b):
            heads = []
            for j in range(s.heads):
                kv = j // (s.heads // s.kv_heads)
                q = rotate(rms(head(a.q_proj.weight, h[i], j), a.q_norm.weight, s.eps), positions[t + i], s.rope_theta)
                seen = len(sources) - b + i + 1 if causal else len(sources)
                scores = torch.stack([q @ keys[kv][m] for m in range(seen)]) / math.sqrt(s.head_dim)
                weights = torch.softmax(scores, 0)
                heads.append(sum(w * values[kv][m] for m, w in enumerate(weights)))
            row = x[i] + a.o_proj.weight @ torch.cat(heads)
            g = rms(row, layer.post_attention_layernorm.weight, s.eps)
            mlp = layer.mlp
            row = row + mlp.down_proj.weight @ (torch.nn.functional.silu(mlp.gate_proj.weight @ g) * (mlp.up_proj.weight @ g))
            new.append(row)
        x = new
    return torch.stack([rms(row, net.norm.weight, s.eps) for row in x])


def random_net(block: int, layers: int, seed: int = 0) -> DFlashNet:
    torch.manual_seed(seed)
    shape = DFlashShape(hidden=32, heads=4, kv_heads=2, head_dim=8, intermediate=48, layers=layers,
                        taps=tuple(range(layers)) if layers > 1 else (2,), block=block, rope_theta=10_000.0)
    net = DFlashNet(shape).double()
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0, 0.3)
    return net


@pytest.mark.parametrize(("block", "layers"), [(4, 1), (4, 3), (16, 1), (16, 2)])
def test_a_block_in_one_forward_equals_the_reference(block, layers):
    net = random_net(block, layers)
    t = 6
    features = torch.randn(t, len(net.s.taps) * 32, dtype=torch.float64)
    embeds = torch.randn(block, 32, dtype=torch.float64)
    positions = list(range(3, 3 + t + block))
    out, context = net(features, embeds, torch.tensor(positions))
    want = reference(net, features, embeds, positions)
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-5)  # the rotary angles in fp32, as transformers has them
    assert context.length == t and len(context.keys) == layers
    # the reference bites: a causal block or a context left out of the keys gives another answer
    for wrong in (dict(causal=True), dict(inject=False)):
        assert (reference(net, features, embeds, positions, **wrong) - want).abs().max() > 1e-3, wrong


def test_the_context_cached_over_steps_equals_the_context_given_at_once():
    """A step adds the newly verified positions to each layer's cached keys and values and drops the block's:
    two steps give what one step over the whole context gives."""
    net = random_net(8, 2)
    features = torch.randn(9, 64, dtype=torch.float64)
    embeds = torch.randn(8, 32, dtype=torch.float64)
    whole, _ = net(features, embeds, torch.arange(9 + 8))
    _, first = net(features[:5], torch.randn(8, 32, dtype=torch.float64), torch.arange(5 + 8))  # an earlier block
    assert first.length == 5
    later, context = net(features[5:], embeds, torch.cat([torch.arange(5, 9), torch.arange(9, 17)]), first)
    torch.testing.assert_close(later, whole, atol=1e-10, rtol=1e-10)
    assert context.length == 9


def test_the_target_layers_read_are_spread_as_the_published_drafters_read_them():
    assert tapped_layers(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-8B's five-layer drafter
    assert tapped_layers(30, 5) == [1, 8, 14, 20, 27]  # SmolLM2's thirty layers (Python's rounding: 7.5 -> 8)
    assert tapped_layers(30, 1) == [15]
    with pytest.raises(ValueError, match="at least one layer"):
        tapped_layers(30, 0)


def zlab_layout(net: DFlashNet, folder, vocab: int) -> None:
    """``net`` as z-lab publishes its drafters: the Qwen3 config at the top level, ``dflash_config`` inside."""
    import json

    from safetensors.torch import save_file

    s = net.s
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": s.hidden,
        "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim,
        "intermediate_size": s.intermediate, "num_hidden_layers": s.layers, "rms_norm_eps": s.eps,
        "rope_theta": s.rope_theta, "vocab_size": vocab, "block_size": s.block, "num_target_layers": 12,
        "dflash_config": {"mask_token_id": s.mask_token, "target_layer_ids": list(s.taps)}}))
    save_file({k: v.float().contiguous() for k, v in net.state_dict().items()}, str(folder / "model.safetensors"))


def test_both_published_layouts_load_to_the_same_drafter_and_ours_is_speculators(tmp_path):
    import json

    from specbench.drafting.dflash_files import load_dflash, save_dflash

    net = random_net(8, 2).float()
    save_dflash(net, tmp_path / "ours", vocab=100)
    zlab_layout(net, tmp_path / "zlab", vocab=100)
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["speculators_model_type"] == "dflash"
    features, embeds = torch.randn(5, 64), torch.randn(8, 32)
    want, _ = net(features, embeds, torch.arange(13))
    for layout in ("ours", "zlab"):
        loaded = load_dflash(tmp_path / layout, vocab=100, target_layers=12)
        assert loaded.s == net.s
        torch.testing.assert_close(loaded(features, embeds, torch.arange(13))[0], want)


@pytest.mark.parametrize(("change", "says"), [
    ({"draft_vocab_size": 64}, "a draft vocabulary of its own is not supported"),
    ({"mask_token_id": 100}, "mask_token_id 100 is outside the target's vocabulary of 100 tokens"),
    ({"aux_hidden_state_layer_ids": [0, 12]}, "reads target layers [0, 12], the target has 12"),
    ({"projector_type": "domino"}, "projector_type 'domino' is not supported"),
    ({"sample_from_anchor": True}, "sample_from_anchor"),
    ({"transformer_layer_config": {"layer_types": ["sliding_attention", "full_attention"]}}, "sliding windows"),
    ({"mask_token_id": None}, "names no mask_token_id"),
])
def test_what_the_harness_does_not_run_is_refused_in_one_line(tmp_path, change, says):
    import json

    from specbench.drafting.dflash_files import DFlashFileError, load_dflash, save_dflash

    folder = save_dflash(random_net(8, 2).float(), tmp_path / "d", vocab=100)
    config = json.loads((folder / "config.json").read_text())
    for key, value in change.items():
        if isinstance(value, dict):
            config[key].update(value)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(DFlashFileError, match=re.escape(says)) as err:
        load_dflash(folder, vocab=100, target_layers=12)
    assert "\n" not in str(err.value)


def test_a_run_without_a_drafter_or_with_a_wrong_one_stops_before_loading(tmp_path, monkeypatch):
    """No drafter trained (``head: auto``), or a folder holding none: one line naming the fix, before anything
    loads; once one is trained where ``make train-dflash`` puts it, the same run plans."""
    from specbench.drafting.dflash_files import random_dflash
    from specbench.drafting.eagle_drafter import trained_head_dir
    from specbench.errors import ConfigError
    from specbench.run.job import plan
    from tests.run.test_config import make_cfg

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    cfg = make_cfg("experiment=smoke", "method=dflash")
    with pytest.raises(ConfigError, match=re.escape(f"train one with `make train-dflash MODEL={cfg.model.name}`")):
        plan(cfg)
    from transformers import LlamaConfig

    shape = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                        num_hidden_layers=2, vocab_size=128)
    random_dflash(shape, trained_head_dir(cfg.model.name, "dflash"))
    plan(cfg)
    plan(make_cfg("experiment=smoke", "method=dflash", "method.head=trained"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no config.json"):
        plan(make_cfg("experiment=smoke", "method=dflash", f"method.head={tmp_path / 'empty'}"))


def test_a_missing_head_path_stops_a_run_before_any_model_loads(monkeypatch):
    """``method.head=/nonexistent`` (a path, not an owner/name repository): refused by the plan, in one line,
    before the model loads or the cost curve is timed, for an EAGLE head and for a DFlash drafter alike."""
    from specbench.errors import ConfigError
    from specbench.run import job
    from tests.run.test_config import make_cfg

    monkeypatch.setattr(job, "load_model", lambda *a, **k: pytest.fail("the model loaded"), raising=False)
    for method in ("eagle-cpu", "dflash-cpu"):
        with pytest.raises(ConfigError, match="neither a directory that exists nor a hub repository") as err:
            job.plan(make_cfg("experiment=smoke", f"method={method}", "method.head=/nonexistent"))
        assert "\n" not in str(err.value)
