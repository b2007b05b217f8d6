"""EAGLE heads' format questions, each answered or refused in one line, and the speculators layout (vLLM's)
read into the same head: a random head written in both layouts computes and drafts the same."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from methods.eagle import Eagle, EagleConfig
from methods.eagle3 import Eagle3, Eagle3Config
from specbench.core.decode import generate
from specbench.core.forward import Target
from specbench.drafting.eagle_head import EagleHead, HeadConfig, save_head
from specbench.drafting.head_formats import load_head
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
    assert make().feature_layers == (0, 1, 1)  # ascending, as vLLM and EAGLE concatenate them
    assert_greedy_lossless(Target(tiny_llama.model), make, [[5, 6, 7, 8]], 12)


# ----------------------------------------------------------------------------- the speculators layout


def write_speculators(head: EagleHead, directory, *, embed: torch.Tensor | None = None) -> None:
    """A head as the speculators library saves it: its config (the draft layer's Llama config nested) and its
    own key names (EAGLE-1/2: ``fusion_fc``, ``transformer``; EAGLE-3: ``layers.0``, ``t2d``)."""
    c = head.c
    directory.mkdir(parents=True)
    layer = {"model_type": "llama", "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
             "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
             "num_hidden_layers": 1, "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
             "max_position_embeddings": c.max_position_embeddings, "vocab_size": c.vocab_size}
    cfg = {"speculators_model_type": c.kind, "architectures": ["EagleSpeculator" if c.kind == "eagle" else
                                                               "Eagle3Speculator"],
           "transformer_layer_config": layer, "speculators_version": "0.1.0",
           "speculators_config": {"algorithm": c.kind, "default_proposal_method": "greedy"}}
    state = {}
    for key, value in head.state_dict().items():
        if c.kind == "eagle":
            key = key.replace("fc.", "fusion_fc.", 1) if key.startswith("fc.") else key.replace("layers.0.",
                                                                                                  "transformer.", 1)
        else:
            key = key.replace("midlayer.", "layers.0.", 1)
        state[key] = value.detach().clone().contiguous()
    if c.kind == "eagle":
        cfg.update(fusion_bias=c.bias, layernorms=False)
    else:
        cfg.update(draft_vocab_size=head.lm_head.out_features, norm_before_residual=c.norm_before_residual,
                   target_hidden_size=c.target_hidden_size, norm_before_fc=c.norm_before_fc,
                   norm_output=c.norm_output, fc_norm=False)
        if c.sliding_window:  # as speculators writes a Llama layer with a window
            layer.update(sliding_window=c.sliding_window, use_sliding_window=True, layer_types=["sliding_attention"])
        if c.aux_layers:
            cfg["eagle_aux_hidden_state_layer_ids"] = list(c.aux_layers)
        t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
        t2d[head.to_target_ids(torch.arange(head.lm_head.out_features))] = True
        state["t2d"] = t2d
    if embed is not None:
        state["embed_tokens.weight"] = embed
    (directory / "config.json").write_text(json.dumps(cfg))
    save_file(state, str(directory / "model.safetensors"))


def _both_layouts(head: EagleHead, tmp_path, tc):
    save_head(head, tmp_path / "eagle")
    write_speculators(head, tmp_path / "speculators", embed=torch.randn(head.c.vocab_size, head.c.hidden_size))
    return load_head(tmp_path / "eagle", tc), load_head(tmp_path / "speculators", tc)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_a_speculators_head_computes_what_the_same_head_in_eagles_layout_does(kind, tmp_path):
    extra = {"draft_vocab_size": 4, "aux_layers": (1, 3, 4), "norm_before_residual": True} if kind == "eagle3" \
        else {"bias": False, "num_key_value_heads": 4}
    head = _random(EagleHead(tiny_config(kind, **extra)))
    if kind == "eagle3":
        head.d2t.copy_(torch.tensor([1, 1, 2, 4]))
    ours, theirs = _both_layouts(head, tmp_path, target_config())
    assert theirs.c.kind == kind and theirs.feature_layers == ours.feature_layers == head.feature_layers
    assert theirs.c.bias == ours.c.bias and theirs.c.norm_before_residual == ours.c.norm_before_residual
    x, e, pos = torch.randn(5, HIDDEN), torch.randn(5, HIDDEN), torch.arange(5)
    lm = torch.nn.Linear(HIDDEN, SMALL_VOCAB, bias=False)
    with torch.no_grad():
        want = ours(x, e, pos)
        assert torch.equal(theirs(x, e, pos), want) and torch.equal(want, head(x, e, pos))
        assert torch.equal(theirs.logits(want, lm), ours.logits(want, lm))
        if kind == "eagle3":
            feats = {i: torch.randn(5, HIDDEN) for i in head.feature_layers}
            assert torch.equal(theirs.fuse(feats), ours.fuse(feats))
            assert theirs.to_target_ids(torch.arange(4)).tolist() == [1, 2, 4, 7]


def test_norm_before_residual_changes_what_the_layer_adds_back():
    head = _random(EagleHead(tiny_config("eagle3")))
    other = EagleHead(tiny_config("eagle3", norm_before_residual=True))
    other.load_state_dict(head.state_dict())
    x, e = torch.randn(3, HIDDEN) * 5, torch.randn(3, HIDDEN)
    with torch.no_grad():
        assert not torch.allclose(head(x, e, torch.arange(3)), other(x, e, torch.arange(3)))


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_a_speculators_head_drafts_the_same_trees(kind, tiny_llama, tmp_path):
    c = HeadConfig.for_target(kind, tiny_llama.model.config, draft_vocab_size=32 if kind == "eagle3" else 0)
    if kind == "eagle3":
        c.aux_layers, c.norm_before_residual = (1, 0, 1), True
    else:
        c.bias = False  # speculators' EAGLE-1/2 default (fusion_bias: false)
    head = _random(EagleHead(c), seed=1)
    if kind == "eagle3":
        head.d2t.copy_(torch.arange(32) * 3 - torch.arange(32))  # target ids 0, 3, 6, …
    tc = tiny_llama.model.config
    save_head(head, tmp_path / "eagle")
    write_speculators(head, tmp_path / "speculators")
    cls, config_cls = (Eagle, EagleConfig) if kind == "eagle" else (Eagle3, Eagle3Config)
    target = Target(tiny_llama.model)
    trees = []
    for layout in ("eagle", "speculators"):
        assert load_head(tmp_path / layout, tc).c.kind == kind
        drafter = eagle_drafter(tiny_llama, tmp_path / layout, cls, config_cls, depth=3, top_k=3, total_tokens=8)()
        seen, propose = [], drafter.propose

        def record(state, propose=propose, seen=seen):
            draft = propose(state)
            seen.append(None if draft is None else (draft.tokens, draft.parents))
            return draft

        drafter.propose = record
        rec = generate(target, drafter, [5, 6, 7, 8, 9], max_new_tokens=10)
        trees.append((seen, rec.output_ids))
    assert trees[0] == trees[1] and any(t is not None for t in trees[0][0])


def test_speculators_heads_we_do_not_read_are_refused(tmp_path):
    head = _random(EagleHead(tiny_config("eagle3", draft_vocab_size=4)))
    write_speculators(head, tmp_path / "h")
    path = tmp_path / "h" / "config.json"
    cfg = json.loads(path.read_text())
    for change, message in [({"speculators_model_type": "mlp_speculator"}, "speculators_model_type 'mlp_speculator'"),
                            ({"fc_norm": True}, "fc_norm"),
                            ({"transformer_layer_config": {**cfg["transformer_layer_config"], "model_type": "qwen3"}},
                             "draft layer is 'qwen3'"),
                            ({"transformer_layer_config": {**cfg["transformer_layer_config"], "num_hidden_layers": 2}},
                             "2 draft layers")]:
        path.write_text(json.dumps({**cfg, **change}))
        with pytest.raises(ConfigError, match=message):
            load_head(tmp_path / "h", target_config())
    path.write_text(json.dumps(cfg))
    _drop_d2t(tmp_path / "h")
    with pytest.raises(ConfigError, match="without d2t"):
        load_head(tmp_path / "h", target_config())


def test_aux_layer_ids_are_fused_in_ascending_order_whatever_order_the_config_lists(tmp_path):
    """vLLM and EAGLE concatenate the auxiliary states in ascending layer order: a config listing [5, 1, 4] reads
    its fc's columns as layers 1, 4, 5, in both layouts."""
    head = _random(EagleHead(tiny_config("eagle3", aux_layers=(1, 4, 5))))
    write_speculators(head, tmp_path / "s")
    for directory in (tmp_path / "s",):
        path = directory / "config.json"
        cfg = json.loads(path.read_text())
        cfg["eagle_aux_hidden_state_layer_ids"] = [5, 1, 4]
        path.write_text(json.dumps(cfg))
        assert load_head(directory, target_config()).feature_layers == (1, 4, 5)
    save_head(head, tmp_path / "e")
    cfg = json.loads((tmp_path / "e" / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = [5, 4, 1]
    (tmp_path / "e" / "config.json").write_text(json.dumps(cfg))
    assert load_head(tmp_path / "e", target_config()).feature_layers == (1, 4, 5)


def test_a_speculators_head_for_another_verifier_is_refused_in_one_line(tmp_path):
    head = _random(EagleHead(tiny_config("eagle3", draft_vocab_size=4)))
    write_speculators(head, tmp_path / "h")
    path = tmp_path / "h" / "config.json"
    cfg = json.loads(path.read_text())
    cfg["speculators_config"]["verifier"] = {"name_or_path": "meta-llama/Llama-3.1-8B-Instruct"}
    path.write_text(json.dumps(cfg))
    tc = target_config()
    tc._name_or_path = "Qwen/Qwen3-8B"
    with pytest.raises(ConfigError, match="trained for meta-llama/Llama-3.1-8B-Instruct.*not for the target Qwen") as err:
        load_head(tmp_path / "h", tc)
    assert "\n" not in str(err.value)
    tc._name_or_path = "meta-llama/Llama-3.1-8B-Instruct"
    assert load_head(tmp_path / "h", tc).c.kind == "eagle3"  # its own verifier: read
    tc._name_or_path = "/models/local-copy"  # a local path names no hub model: nothing to compare
    assert load_head(tmp_path / "h", tc).c.kind == "eagle3"


def test_a_scaled_rope_is_written_with_a_float_factor(tmp_path):
    """The reference loader reads rope_scaling.factor as a float: an integer factor is written as one."""
    c = tiny_config("eagle3")
    c.rope_scaling = {"rope_type": "linear", "factor": 2}
    save_head(EagleHead(c), tmp_path / "h")
    written = json.loads((tmp_path / "h" / "config.json").read_text())["rope_scaling"]
    assert written == {"type": "linear", "factor": 2.0} and isinstance(written["factor"], float)


# ----------------------------------------------------------------------------- vLLM's forward, written out


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = positions.float()[:, None] * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    return x * cos + torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1) * sin


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def vllm_forward(w: dict, cfg: dict, states: torch.Tensor, ids: list[int], embed: torch.Tensor,
                 positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's llama_eagle3 over one sequence of rows, recomputed whole (no cache), causal within the sliding
    window: the first layer's normed embedding beside the normed state, the residual (normed with
    norm_before_residual), attention, the MLP; the raw output and the final norm's."""
    layer, eps = cfg["transformer_layer_config"], cfg["transformer_layer_config"]["rms_norm_eps"]
    heads, kv = layer["num_attention_heads"], layer["num_key_value_heads"]
    hd, window, n = layer["hidden_size"] // heads, layer.get("sliding_window") or 10**9, states.shape[0]
    hn = _rms(states, w["layers.0.hidden_norm.weight"], eps)
    residual = hn if cfg.get("norm_before_residual") else states
    x = torch.cat([_rms(embed[torch.tensor(ids)], w["layers.0.input_layernorm.weight"], eps), hn], -1)
    q = (x @ w["layers.0.self_attn.q_proj.weight"].T).view(n, heads, hd).transpose(0, 1)
    k = (x @ w["layers.0.self_attn.k_proj.weight"].T).view(n, kv, hd).transpose(0, 1)
    v = (x @ w["layers.0.self_attn.v_proj.weight"].T).view(n, kv, hd).transpose(0, 1)
    q, k = _rope(q, positions, layer["rope_theta"]), _rope(k, positions, layer["rope_theta"])
    k, v = k.repeat_interleave(heads // kv, 0), v.repeat_interleave(heads // kv, 0)
    seen = torch.ones(n, n, dtype=torch.bool).tril() & (positions[:, None] - positions[None, :] < window)
    att = (q @ k.transpose(1, 2) / hd**0.5).masked_fill(~seen, float("-inf")).softmax(-1) @ v
    hidden = residual + att.transpose(0, 1).reshape(n, -1) @ w["layers.0.self_attn.o_proj.weight"].T
    mlp_in = _rms(hidden, w["layers.0.post_attention_layernorm.weight"], eps)
    out = hidden + (torch.nn.functional.silu(mlp_in @ w["layers.0.mlp.gate_proj.weight"].T)
                    * (mlp_in @ w["layers.0.mlp.up_proj.weight"].T)) @ w["layers.0.mlp.down_proj.weight"].T
    return out, _rms(out, w["norm.weight"], eps)


def vllm_tree(w: dict, cfg: dict, feats: dict, tokens: list[int], embed: torch.Tensor, *, depth: int, top_k: int,
              total: int) -> tuple[list[int], list[int]]:
    """The EAGLE-2 tree (:func:`~specbench.drafting.dynamic_tree.grow`, :func:`rerank`) over an EAGLE-3
    speculators head's log-probabilities as vLLM computes them (:func:`vllm_forward`): ``fc`` over the
    (input-normed) target states at the prompt's positions, each node a row after the prompt and its
    ancestors, at position (prompt length + its depth − 1), fed its parent's output (normed with norm_output);
    logits from the final norm over the draft vocabulary, mapped by d2t."""
    from specbench.drafting.dynamic_tree import grow, rerank

    eps = cfg["transformer_layer_config"]["rms_norm_eps"]
    aux = torch.cat([feats[i] for i in sorted(cfg["eagle_aux_hidden_state_layer_ids"])], -1)
    if cfg.get("norm_before_fc"):
        aux = _rms(aux, w["input_norm.weight"], eps)
    prefix, ids = aux @ w["fc.weight"].T, list(tokens[1:])  # row t: position t, reading token t + 1
    n = prefix.shape[0]
    draft_ids = torch.arange(w["lm_head.weight"].shape[0])

    def logprobs(post: torch.Tensor) -> torch.Tensor:
        lp = torch.full((post.shape[0], embed.shape[0]), float("-inf"))
        return lp.index_copy_(1, draft_ids + w["d2t"].long(), torch.log_softmax(post @ w["lm_head.weight"].T, -1))

    def fed(out: torch.Tensor, post: torch.Tensor) -> torch.Tensor:
        return post if cfg.get("norm_output") else out

    root_out, root_post = (x[-1] for x in vllm_forward(w, cfg, prefix, ids, embed, torch.arange(n)))
    outs: dict[int, tuple] = {}

    def expand(level: list[int], tree) -> torch.Tensor:
        rows = []
        for i in level:
            chain, p = [i], tree.parents[i]
            while p >= 0:
                chain.append(p)
                p = tree.parents[p]
            chain.reverse()  # ancestors first, the node last
            states = [fed(*(outs[tree.parents[j]] if tree.parents[j] >= 0 else (root_out, root_post)))
                      for j in chain]
            out, post = vllm_forward(w, cfg, torch.cat([prefix, torch.stack(states)]),
                                     ids + [tree.tokens[j] for j in chain], embed,
                                     torch.cat([torch.arange(n), torch.tensor([n + tree.depths[j] - 1 for j in chain])]))
            outs[i] = (out[-1], post[-1])
            rows.append(post[-1])
        return logprobs(torch.stack(rows))

    tree = grow(logprobs(root_post[None])[0], expand, depth=depth, top_k=top_k)
    toks, parents, _, _ = rerank(tree, total - 1)
    return toks, parents


def test_a_head_with_every_current_speculators_default_drafts_what_vllm_s_forward_drafts(tiny_llama, tmp_path):
    """norm_before_fc, norm_output, norm_before_residual, a sliding window shorter than the prompt and an
    embedding of the head's own, as current speculators training writes them: the drafter's tree (3 levels,
    top-k 3) is the one vLLM's forward, written out plainly and recomputed per node (:func:`vllm_tree`), gives;
    with the options off, or with the target's embedding, it is not."""
    from safetensors.torch import load_file

    model = tiny_llama.model
    c = HeadConfig.for_target("eagle3", model.config)
    c.aux_layers, c.norm_before_residual, c.norm_before_fc, c.norm_output = (1, 0, 1), True, True, True
    c.sliding_window, c.own_embedding = 3, True
    head = _random(EagleHead(c), seed=2)
    write_speculators(head, tmp_path / "h")
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    weights = {k: v.float() for k, v in load_file(str(tmp_path / "h" / "model.safetensors")).items()}
    assert {"input_norm.weight", "embed_tokens.weight"} <= set(weights) and cfg["norm_output"]
    loaded = load_head(tmp_path / "h", model.config)
    assert (loaded.c.norm_before_fc, loaded.c.norm_output, loaded.c.sliding_window, loaded.c.own_embedding) == \
        (True, True, 3, True) and loaded.feature_layers == (0, 1, 1)
    prompt = [5, 6, 7, 8, 9, 10, 11, 12]
    drafter = eagle_drafter(tiny_llama, tmp_path / "h", Eagle3, Eagle3Config, depth=3, top_k=3, total_tokens=9)()
    first = []
    propose = drafter.propose
    drafter.propose = lambda state: first.append(propose(state)) or first[-1]
    root = generate(Target(model), drafter, prompt, max_new_tokens=8).output_ids[0]
    with torch.no_grad():
        out = model(torch.tensor([prompt]), output_hidden_states=True)
        feats = {i: out.hidden_states[i][0] for i in (0, 1)}
        own = weights["embed_tokens.weight"]
        want = vllm_tree(weights, cfg, feats, prompt + [root], own, depth=3, top_k=3, total=9)
        assert (first[0].tokens, first[0].parents) == want and not first[0].is_chain()
        plain = {**cfg, "norm_before_fc": False, "norm_output": False,
                 "transformer_layer_config": {**cfg["transformer_layer_config"], "sliding_window": None}}
        assert vllm_tree(weights, plain, feats, prompt + [root], own, depth=3, top_k=3, total=9) != want
        assert vllm_tree(weights, cfg, feats, prompt + [root], model.get_input_embeddings().weight, depth=3,
                         top_k=3, total=9) != want


def test_norm_before_residual_is_on_when_a_speculators_config_leaves_it_out(tmp_path):
    """vLLM's speculators config reads an absent norm_before_residual as true (and absent norm_before_fc and
    norm_output as false); a head in EAGLE's own layout leaves it off."""
    head = _random(EagleHead(tiny_config("eagle3")))
    write_speculators(head, tmp_path / "h")
    path = tmp_path / "h" / "config.json"
    cfg = json.loads(path.read_text())
    for key in ("norm_before_residual", "norm_before_fc", "norm_output"):
        del cfg[key]
    path.write_text(json.dumps(cfg))
    c = load_head(tmp_path / "h", target_config()).c
    assert (c.norm_before_residual, c.norm_before_fc, c.norm_output) == (True, False, False)
    save_head(head, tmp_path / "e")
    assert load_head(tmp_path / "e", target_config()).c.norm_before_residual is False
