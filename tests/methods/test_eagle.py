"""EAGLE-2/3 and Medusa: the trees by hand, the heads' published formats, the target's features, training,
and losslessness (greedy on the tiny models and SmolLM2, sampling through a real head)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from methods.eagle import Eagle, EagleConfig
from methods.eagle3 import Eagle3, Eagle3Config
from methods.medusa import Medusa, MedusaConfig
from specbench.core.acceptance import SamplingParams
from specbench.core.decode import generate
from specbench.core.draft import DecodeState, Draft, Drafter
from specbench.core.forward import Target
from specbench.drafting.dynamic_tree import Tree, grow, rerank
from specbench.drafting.eagle_drafter import head_dir, trained_head_dir
from specbench.drafting.eagle_head import EagleHead, HeadConfig, eagle3_layers, save_head
from specbench.drafting.eagle_training import (
    W_CLS,
    answer_starts,
    draft_vocabulary,
    evaluate,
    features_of,
    head_loss,
    offline_conversations,
    train,
    unroll,
)
from specbench.drafting.head_formats import load_head
from specbench.drafting.medusa_head import (
    MC_SIM_7B_63,
    MedusaHeads,
    best_paths,
    load_medusa,
    save_medusa,
    tree_draft,
)
from specbench.drafting.medusa_training import evaluate as medusa_evaluate
from specbench.drafting.medusa_training import train as medusa_train
from specbench.errors import ConfigError
from tests.lossless import (
    HIDDEN,
    SMALL_VOCAB,
    BigramModel,
    assert_greedy_lossless,
    assert_sampling_preserves_distribution,
    autoregressive_output,
    chat,
)

LN = torch.log


# ----------------------------------------------------------------------------- the dynamic tree, by hand


def test_the_tree_expands_the_best_nodes_and_keeps_the_best_overall():
    """Vocabulary of 4, top-2, 3 levels. Root: token 0 at 0.6, 1 at 0.3. Level 2 expands both; the
    children's cumulative scores pick the 2 best of 4 to expand at level 3; the re-rank keeps the 5 best."""
    root = LN(torch.tensor([0.6, 0.3, 0.05, 0.05]))
    children = {  # by parent token path: the draft's distribution after it
        (0,): [0.1, 0.0, 0.8, 0.1], (1,): [0.0, 0.9, 0.05, 0.05],
        (0, 2): [0.55, 0.45, 0.0, 0.0], (1, 1): [0.0, 0.0, 0.3, 0.7], (0, 3): [1, 0, 0, 0], (0, 0): [1, 0, 0, 0],
    }
    calls = []

    def path(tree: Tree, i: int) -> tuple[int, ...]:
        out = []
        while i >= 0:
            out.append(tree.tokens[i])
            i = tree.parents[i]
        return tuple(reversed(out))

    def expand(level, tree):
        calls.append([path(tree, i) for i in level])
        return LN(torch.tensor([children[path(tree, i)] for i in level]) + 1e-12)

    tree = grow(root, expand, depth=3, top_k=2)
    # level 2: (0,2)=.48, (0,0)|(0,3)=.06, (1,1)=.27, (1,2)|(1,3)=.015: the 2 best are (0,2) and (1,1)
    assert calls == [[(0,), (1,)], [(0, 2), (1, 1)]]
    assert len(tree.tokens) == 2 + 4 + 4
    tokens, parents, scores, _ = rerank(tree, 5)
    # the 5 best: (0) .6, (0,2) .48, (1) .3, (1,1) .27, (0,2,0) .264; in levels, best first
    chosen = [tuple(tokens[j] for j in _chain(parents, i)) for i in range(len(tokens))]
    assert chosen == [(0,), (1,), (0, 2), (1, 1), (0, 2, 0)]
    assert scores == pytest.approx([LN(torch.tensor(v)).item() for v in (0.6, 0.3, 0.48, 0.27, 0.264)], abs=1e-5)
    assert all(p < i for i, p in enumerate(parents))


@pytest.mark.parametrize("seed", range(6))
def test_a_narrower_top_k_drafts_every_candidate_whose_need_it_meets(seed):
    """Random draft distributions fixed per token path: the tree grown with top-k w holds every candidate of the
    top-6 tree whose ``need`` is at most w (what budget=auto prices a narrower tree by), and a candidate's need
    is never above the full top-k."""
    gen = torch.Generator().manual_seed(seed)
    cache: dict[tuple[int, ...], torch.Tensor] = {}

    def dist(path):
        if path not in cache:
            cache[path] = torch.log_softmax(3 * torch.randn(12, generator=gen), -1)
        return cache[path]

    def paths(tree):
        out = []
        for i in range(len(tree.tokens)):
            out.append((*out[tree.parents[i]], tree.tokens[i]) if tree.parents[i] >= 0 else (tree.tokens[i],))
        return out

    def expand(level, tree):
        return torch.stack([dist(paths(tree)[i]) for i in level])

    full = grow(dist(()), expand, depth=4, top_k=6)
    assert all(1 <= n <= 6 for n in full.needs) and max(full.needs) > 1
    for w in (1, 2, 3, 5):
        narrow = set(paths(grow(dist(()), expand, depth=4, top_k=w)))
        sure = {p for p, n in zip(paths(full), full.needs, strict=True) if n <= w}
        assert sure <= narrow and len(sure) >= w  # (the root's w best at least)
    tokens, parents, scores, needs = rerank(full, 20)
    by_path = dict(zip(paths(full), full.needs, strict=True))
    kept = [(tokens[i],) if parents[i] < 0 else None for i in range(len(tokens))]
    for i in range(len(tokens)):
        kept[i] = (*kept[parents[i]], tokens[i]) if parents[i] >= 0 else (tokens[i],)
    assert needs == [by_path[p] for p in kept]


def _chain(parents: list[int], i: int) -> list[int]:
    out = []
    while i >= 0:
        out.append(i)
        i = parents[i]
    return list(reversed(out))


def test_rerank_keeps_parents_and_orders_siblings_by_score():
    tree = Tree()
    a = tree.add(5, -1, -0.1)
    tree.add(6, -1, -0.2)
    tree.add(7, a, -0.15)
    tree.add(8, a, -0.12)
    tokens, parents, _, _ = rerank(tree, 3)  # children may outscore an uncle: 6 is left out
    assert tokens == [5, 8, 7] and parents == [-1, 0, 0]
    tokens, parents, _, _ = rerank(tree, 4)  # by level, each level best first
    assert tokens == [5, 6, 8, 7] and parents == [-1, -1, 0, 0]


# ----------------------------------------------------------------------------- heads in their published formats


def tiny_config(kind: str, **kw) -> HeadConfig:
    base = dict(kind=kind, hidden_size=HIDDEN, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
                vocab_size=SMALL_VOCAB, target_layers=6)
    return HeadConfig(**{**base, **kw})


def target_config(vocab=SMALL_VOCAB, hidden=HIDDEN, layers=6):
    return SimpleNamespace(hidden_size=hidden, vocab_size=vocab, num_hidden_layers=layers, intermediate_size=32,
                           num_attention_heads=4, num_key_value_heads=2)


def test_eagle1_reference_layout_loads_and_runs(tmp_path):
    """A random head written as the reference writes EAGLE-1 heads: pytorch_model.bin with ``fc`` (+ bias),
    ``layers.0.*`` without an input norm, the target's embedding in it, a config without ``bias`` or
    ``num_key_value_heads``: loads strictly (the embedding ignored) and computes the same as the saved head."""
    ref = EagleHead(tiny_config("eagle", num_key_value_heads=4))
    state = {k: v.clone() for k, v in ref.state_dict().items()}
    assert "fc.bias" in state and not any("input_layernorm" in k for k in state)
    state["embed_tokens.weight"] = torch.randn(SMALL_VOCAB, HIDDEN)
    torch.save(state, tmp_path / "pytorch_model.bin")
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": HIDDEN, "intermediate_size": 32,
           "num_attention_heads": 4, "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "vocab_size": SMALL_VOCAB}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    head = load_head(tmp_path, target_config())
    assert head.c.kind == "eagle" and head.c.bias and head.feature_layers == (-1,)
    x, e = torch.randn(3, HIDDEN), torch.randn(3, HIDDEN)
    assert torch.equal(head(x, e, torch.arange(3)), ref(x, e, torch.arange(3)))


def test_eagle3_reference_layout_loads_and_maps_its_vocabulary(tmp_path):
    c = tiny_config("eagle3", draft_vocab_size=4)
    ref = EagleHead(c)
    ref.d2t.copy_(torch.tensor([1, 1, 2, 4]))  # draft ids 0..3 → target ids 1, 2, 4, 7
    state = dict(ref.state_dict())
    assert {"fc.weight", "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight", "norm.weight",
            "lm_head.weight", "d2t"} <= set(state) and "fc.bias" not in state
    assert state["midlayer.self_attn.q_proj.weight"].shape == (HIDDEN, 2 * HIDDEN)
    state["t2d"] = torch.zeros(SMALL_VOCAB, dtype=torch.bool)
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "model.safetensors"))
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": HIDDEN, "intermediate_size": 32,
           "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1, "draft_vocab_size": 4,
           "vocab_size": SMALL_VOCAB}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    head = load_head(tmp_path, target_config())
    assert head.c.kind == "eagle3" and head.feature_layers == eagle3_layers(6) == (2, 3, 3)
    assert head.to_target_ids(torch.arange(4)).tolist() == [1, 2, 4, 7]
    feats = {2: torch.randn(2, HIDDEN), 3: torch.randn(2, HIDDEN)}
    assert head.fuse(feats).shape == (2, HIDDEN)


def test_the_head_cache_appends_and_crops_like_concatenation():
    """Appends into doubling buffers and crops by length give what concatenating and slicing give, past
    several doublings; under autograd it concatenates, and gradients flow through it."""
    from specbench.drafting.head_parts import HeadCache

    g = torch.Generator().manual_seed(0)
    cache, ref_k, ref_v = HeadCache(), torch.zeros(2, 0, 4), torch.zeros(2, 0, 4)
    for step in range(40):
        n = int(torch.randint(1, 12, (1,), generator=g))
        k, v = torch.randn(2, n, 4, generator=g), torch.randn(2, n, 4, generator=g)
        keys, values = cache.append(k, v)
        ref_k, ref_v = torch.cat([ref_k, k], 1), torch.cat([ref_v, v], 1)
        assert torch.equal(keys, ref_k) and torch.equal(values, ref_v) and len(cache) == ref_k.shape[1]
        if step % 3 == 2:  # a verified step: the tree's entries go
            keep = len(cache) - int(torch.randint(0, min(len(cache), 10) + 1, (1,), generator=g))
            cache.crop(keep)
            ref_k, ref_v = ref_k[:, :keep], ref_v[:, :keep]
    assert ref_k.shape[1] > 64  # the buffer grew past its first size
    w = torch.randn(2, 3, 4, requires_grad=True)
    trained = HeadCache()
    trained.append(w, w)
    keys, _ = trained.append(w * 2, w)
    keys.sum().backward()
    assert torch.equal(w.grad, torch.full_like(w, 3.0))


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_head_attention_runs_4d_on_the_stored_kv_heads_and_equals_repeating_them(kv_heads, monkeypatch):
    """The head's attention hands SDPA 4-D tensors and K/V as stored (no copy per query head), tree mask and
    causal alike, and gives what repeating K/V to every query head gives."""
    import torch.nn.functional as F

    from specbench.drafting.eagle_head import Attention

    attn = Attention(tiny_config("eagle", num_key_value_heads=kv_heads), HIDDEN)
    real, seen = F.scaled_dot_product_attention, []

    def spy(q, k, v, *args, **kwargs):
        seen.append((q.dim(), k.shape[-3]))
        return real(q, k, v, *args, **kwargs)

    def reference(x, positions, keys, values, visible):
        n, heads, d = x.shape[0], 4, HIDDEN // 4
        q = attn.rotary(attn.q_proj(x).view(n, heads, d).transpose(0, 1), positions)
        k, v = keys.repeat_interleave(heads // kv_heads, 0), values.repeat_interleave(heads // kv_heads, 0)
        scores = (q @ k.transpose(1, 2)) / d ** 0.5
        scores = scores.masked_fill(~visible, float("-inf")) if visible is not None else scores.masked_fill(
            torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        return attn.o_proj((scores.softmax(-1) @ v).transpose(0, 1).reshape(n, -1))

    from specbench.drafting.head_parts import HeadCache

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    with torch.no_grad():
        x, cache = torch.randn(5, HIDDEN), HeadCache()
        out = attn(x, torch.arange(5), cache, None)  # causal over a fresh sequence (the training path)
        assert torch.allclose(out, reference(x, torch.arange(5), cache.keys[:, :5], cache.values[:, :5], None),
                              atol=1e-5)
        tree = torch.randn(3, HIDDEN)
        visible = torch.ones(3, 8, dtype=torch.bool)
        visible[1, 5], visible[2, 6] = False, False  # siblings do not see each other
        out = attn(tree, torch.tensor([5, 6, 6]), cache, visible)
        assert torch.allclose(out, reference(tree, torch.tensor([5, 6, 6]), cache.keys[:, :8], cache.values[:, :8],
                                             visible), atol=1e-5)
    assert seen == [(4, kv_heads), (4, kv_heads)]


def test_head_errors_name_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match="make train-eagle-head MODEL=smollm2-135m"):
        head_dir("auto", "smollm2-135m", "eagle")
    with pytest.raises(ConfigError, match="KIND=eagle3"):
        head_dir("auto", "smollm2-135m", "eagle3")
    with pytest.raises(ConfigError, match="unreachable"):
        head_dir("yuhuili/EAGLE-Vicuna-7B-v1.3", "vicuna-7b", "eagle")  # the tests' hub is offline
    for missing in ("no-such-dir", "/no/such-dir", "/nonexistent", "./heads/eagle", "~/gone/head"):
        with pytest.raises(ConfigError, match="neither a directory that exists nor a hub repository"):
            head_dir(missing, "m", "eagle", fetch=False)  # before any load: a run's preflight
    save_head(EagleHead(tiny_config("eagle")), tmp_path / "h")
    with pytest.raises(ConfigError, match="for another model"):
        load_head(tmp_path / "h", target_config(hidden=32))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        head_dir(str(tmp_path / "empty"), "m", "eagle")


def test_auto_reads_the_head_published_for_the_model_else_the_one_trained_here(tmp_path, monkeypatch):
    """``head: auto`` goes to the hub repository the model preset names (here not cached and the hub offline,
    so the error names it and the alternatives); with none named, and with ``trained``, the cache's head."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match=r"hf download yuhuili/EAGLE-Vicuna-7B-v1\.3.*method.head=trained"):
        head_dir("auto", "vicuna-7b", "eagle", published="yuhuili/EAGLE-Vicuna-7B-v1.3")
    save_head(EagleHead(tiny_config("eagle")), trained_head_dir("vicuna-7b", "eagle"))
    assert head_dir("trained", "vicuna-7b", "eagle", published="yuhuili/EAGLE-Vicuna-7B-v1.3") \
        == trained_head_dir("vicuna-7b", "eagle")
    assert head_dir("auto", "vicuna-7b", "eagle", published=None) == trained_head_dir("vicuna-7b", "eagle")
    with pytest.raises(ConfigError, match="unreachable"):  # auto still prefers the published head
        head_dir("auto", "vicuna-7b", "eagle", published="yuhuili/EAGLE-Vicuna-7B-v1.3")


def test_rows_name_the_head_and_a_retrained_head_changes_its_fingerprint(tmp_path, monkeypatch):
    from specbench.drafting.eagle_drafter import head_provenance

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    path = save_head(EagleHead(tiny_config("eagle")), trained_head_dir("m", "eagle"))
    (path / "training.json").write_text('{"epochs": 1}')
    first = head_provenance("auto", path)
    assert first["head_source"] == "trained here" and first["head"] == "auto"
    (path / "training.json").write_text('{"epochs": 2}')
    assert head_provenance("auto", path)["head_fingerprint"] != first["head_fingerprint"]
    other = save_head(EagleHead(tiny_config("eagle")), tmp_path / "snapshot")
    assert head_provenance("auto", other, "yuhuili/EAGLE-Vicuna-7B-v1.3")["head_source"] == \
        "yuhuili/EAGLE-Vicuna-7B-v1.3"
    assert head_provenance(str(other), other)["head_source"] == "snapshot"


def test_paper_models_name_their_published_heads():
    """The presets of the paper's and Spec-Bench's models name the official heads, each the right kind,
    and a preset's ``heads`` is checked before any run."""
    from omegaconf import OmegaConf

    from specbench.drafting.eagle_drafter import published_head
    from specbench.errors import ModelLoadError
    from specbench.models.config import model_config_check
    from specbench.paths import CONF_DIR

    want = {"vicuna-7b": ("eagle", "medusa"), "vicuna-13b": ("eagle", "eagle3", "medusa"),
            "llama2-7b": ("eagle",), "llama2-13b": ("eagle",), "llama2-70b": ("eagle",),
            "llama3.1-8b": ("eagle", "eagle3")}
    for model, kinds in want.items():
        cfg = OmegaConf.load(CONF_DIR / "model" / f"{model}.yaml")
        model_config_check(cfg)
        for kind in kinds:
            repo = published_head(cfg, kind)
            prefix = {"eagle": "yuhuili/EAGLE-", "eagle3": "yuhuili/EAGLE3-", "medusa": "FasterDecoding/medusa-"}[kind]
            assert repo.startswith(prefix), (model, kind, repo)
    assert published_head(OmegaConf.load(CONF_DIR / "model" / "smollm2-135m.yaml"), "eagle") is None
    bad = OmegaConf.load(CONF_DIR / "model" / "vicuna-7b.yaml")
    bad.heads = {"eagle2": "yuhuili/EAGLE-Vicuna-7B-v1.3"}
    with pytest.raises(ModelLoadError, match="heads must map eagle, eagle3, medusa"):
        model_config_check(bad)


@pytest.mark.parametrize("scaling", [None, {"type": "linear", "factor": 2.0}, {"type": "dynamic", "factor": 2.0},
                                     {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64}])
def test_head_positions_rotate_as_transformers_llama_does(scaling, tmp_path):
    """A head's RoPE, with the scalings hub configs carry (the reference's linear and dynamic, Llama 3.1's),
    equals transformers' Llama rotary embedding past the trained length; it survives save and load."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    from specbench.drafting.head_parts import Rotary

    c = tiny_config("eagle", rope_theta=500000.0, rope_scaling=scaling, max_position_embeddings=128)
    save_head(EagleHead(c), tmp_path)
    written = json.loads((tmp_path / "config.json").read_text()).get("rope_scaling")
    if scaling and "type" in scaling:  # as the reference's loader reads it: exactly {"type", "factor"}
        assert written == scaling
    loaded = load_head(tmp_path, target_config())
    assert loaded.c.rope_scaling == c.rope_scaling and loaded.c.rope_theta == 500000.0
    x, pos = torch.randn(4, 300, HIDDEN // 4), torch.arange(300)
    kw = {"rope_scaling": dict(scaling)} if scaling else {}
    reference = LlamaRotaryEmbedding(LlamaConfig(hidden_size=HIDDEN, num_attention_heads=4, rope_theta=500000.0,
                                                 max_position_embeddings=128, **kw))
    cos, sin = reference(x[None], pos[None])
    want, _ = apply_rotary_pos_emb(x[None], x[None], cos, sin)
    torch.testing.assert_close(Rotary(loaded.c)(x, pos), want[0], atol=1e-5, rtol=1e-5)
    if scaling:  # and the scaling matters: plain RoPE differs
        assert not torch.allclose(Rotary(tiny_config("eagle", rope_theta=500000.0))(x, pos), want[0], atol=1e-3)


# ----------------------------------------------------------------------------- the target's features


def test_the_core_hands_drafters_the_accepted_rows_features(tiny_llama):
    """The features a drafter receives (prompt, then root + accepted guesses each step) equal the target's
    own hidden states at those positions in one plain forward over the output."""
    target = Target(tiny_llama.model)
    got: list[torch.Tensor] = []

    class Echo(Drafter):
        feature_layers = (-1, 2)

        def prefilled(self, features):
            got.append(features[-1])
            assert features[2].shape == features[-1].shape

        def propose(self, state: DecodeState):
            from specbench.core.draft import Draft

            return Draft.chain([7, 8], "x") if state.step % 2 else Draft.from_sequences([[3], [4, 5]], ["x", "x"])

        def update(self, result):
            assert set(result.features) == {-1, 2} and len(result.features[-1]) == 1 + result.n_accepted
            got.append(result.features[-1])

    prompt = [5, 6, 7, 8, 9]
    rec = generate(target, Echo(vocab_size=128), prompt, max_new_tokens=12)
    seq = prompt + rec.output_ids
    with torch.no_grad():
        ref = tiny_llama.model(input_ids=torch.tensor([seq]), output_hidden_states=True).hidden_states[-1][0]
    mine = torch.cat(got)
    n = mine.shape[0]
    assert n >= len(prompt) + 1 and torch.allclose(mine, ref[:n], atol=1e-4)


# ----------------------------------------------------------------------------- drafting, lossless


@pytest.fixture(scope="module")
def tiny_head_dir(tmp_path_factory, tiny_llama):
    """A head for the tiny Llama, trained for a few seconds on its own features (guesses it sometimes gets right)."""
    model = tiny_llama.model
    d = tmp_path_factory.mktemp("eagle_tiny")
    head = EagleHead(HeadConfig.for_target("eagle", model.config))
    g = torch.Generator().manual_seed(0)
    target = Target(model)
    starts = [torch.randint(3, 128, (4,), generator=g).tolist() for _ in range(16)]
    seqs = [p + autoregressive_output(target, p, 40) for p in starts]  # the target's own continuations
    data = features_of(model, seqs, (-1,), progress=False)
    train(head, model.get_output_embeddings().weight.detach().float(), model.get_input_embeddings(), data[2:],
          data[:2], epochs=8, lr=2e-3, progress=False)
    return save_head(head, d / "head")


def eagle_drafter(lm, head: str, cls=Eagle, config_cls=EagleConfig, **kw):
    from specbench.core.draft import DrafterContext

    ctx = DrafterContext(target_model=lm.model, target_name=lm.name)
    return lambda: cls(config_cls(head=str(head), **kw), vocab_size=lm.vocab_size, context=ctx)


PROMPTS = [[5, 6, 7, 8] * 4, [3, 3, 3, 3, 9], list(range(20, 44))]


def test_training_lowers_the_heldout_loss_in_seconds(tiny_llama):
    model = tiny_llama.model
    g = torch.Generator().manual_seed(1)
    seqs = [([5, 6, 7, 8] * 8)[i:] + torch.randint(0, 128, (4,), generator=g).tolist() for i in range(10)]
    data = features_of(model, seqs, (-1,), progress=False)
    torch.manual_seed(0)
    head = EagleHead(HeadConfig.for_target("eagle", model.config))
    lm, emb = model.get_output_embeddings().weight.detach().float(), model.get_input_embeddings()
    before, _ = evaluate(head, lm, emb, data[:2])
    state = train(head, lm, emb, data[2:], data[:2], epochs=3, lr=2e-3, progress=False)
    after, alphas = evaluate(head, lm, emb, data[:2])
    assert after < 0.8 * before and state["history"][-1]["epoch"] == 3
    assert len(alphas) == 1 and 0 <= alphas[0] <= 1


def test_training_an_eagle3_head_lowers_its_loss(tiny_llama):
    """On the target's own continuations (as EAGLE-3 trains), a 32-token draft vocabulary of their most frequent
    tokens covers the target's next tokens."""
    model = tiny_llama.model
    target = Target(model)
    seqs = [p + autoregressive_output(target, p, 24) for p in ([5, 6, 7, 8], [9, 10], [30, 31, 32], [3] * 4,
                                                                 [40, 41], [50, 60, 70], [11, 12, 13], [90, 91])]
    c = HeadConfig.for_target("eagle3", model.config)
    d2t = draft_vocabulary(seqs, 32)
    c.draft_vocab_size = d2t.numel()
    torch.manual_seed(0)
    head = EagleHead(c)
    head.d2t.copy_(d2t)
    used = head.to_target_ids(torch.arange(32)).tolist()
    common = max(set(sum(seqs, [])), key=sum(seqs, []).count)
    assert used == sorted(set(used)) and len(used) == 32 and common in used  # ascending, distinct, the frequent
    data = features_of(model, seqs, (*c.feature_layers(), -1), progress=False)
    lm, emb = model.get_output_embeddings().weight.detach().float(), model.get_input_embeddings()
    before, _ = evaluate(head, lm, emb, data[:2])
    assert before > 0
    state = train(head, lm, emb, data[2:], data[:2], epochs=15, lr=3e-3, progress=False, steps=3)
    # soft cross-entropy against a random model's flat next-token distributions: its floor, their entropy, is
    # ~3.4 nats, so the gain is small in absolute terms
    assert evaluate(head, lm, emb, data[:2])[0] < before - 0.1
    assert len(state["history"][-1]["alpha_by_step"]) == 3  # α of each unrolled step, held out


def test_eagles_loss_counts_the_answer_alone_as_the_reference_masks_the_prompt(tiny_llama):
    """EAGLE-1's loss at answer start k: SmoothL1 and 0.1 × the soft cross-entropy, each a mean over the rows
    from k on (the reference's loss mask), α judged on those rows; the prompt's rows change nothing."""
    import torch.nn.functional as F

    model = tiny_llama.model
    ids = torch.tensor([5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16])
    (_, feats), = features_of(model, [ids.tolist()], (-1,), progress=False)
    torch.manual_seed(0)
    head = EagleHead(HeadConfig.for_target("eagle", model.config))
    lm, emb = model.get_output_embeddings().weight.detach().float(), model.get_input_embeddings()
    with torch.no_grad():
        pred = next(unroll(head, head.fuse(feats)[:-1], lambda a, b: emb(ids[a:b]).float(), 1))
        logits, target = F.linear(pred, lm), F.linear(feats[-1], lm)[1:]
        for k in (0, 4, 9):
            loss, right, judged = head_loss(head, lm, emb, ids, feats, start=k)
            cls = -(target[k:].softmax(-1) * logits[k:].log_softmax(-1)).sum(-1).mean()
            want = F.smooth_l1_loss(pred[k:], feats[-1][1:][k:]) + W_CLS * cls
            assert float(loss) == pytest.approx(float(want), rel=1e-5) and judged == [len(ids) - 1 - k]
        assert float(head_loss(head, lm, emb, ids, feats, start=4)[0]) != pytest.approx(
            float(head_loss(head, lm, emb, ids, feats)[0]), rel=1e-3)


def test_eagle3s_cross_entropy_divides_by_every_position_as_the_reference(tiny_llama):
    """EAGLE-3's soft cross-entropy sums over the answer's positions whose target token is in the draft
    vocabulary and divides by the sequence's length n at every step (the reference's mean over all of its
    positions), neither by the counted ones nor by the step's n − 1 − s rows."""
    model = tiny_llama.model
    ids = torch.tensor([5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16])
    c = HeadConfig.for_target("eagle3", model.config)
    (_, feats), = features_of(model, [ids.tolist()], (*c.feature_layers(), -1), progress=False)
    lm, emb = model.get_output_embeddings().weight.detach().float(), model.get_input_embeddings()
    target = torch.nn.functional.linear(feats[-1], lm)[1:]
    truth = target.argmax(-1).tolist()
    # a draft vocabulary of 8 holding the target's tokens at rows 3-5 and none of those at rows 8-10
    filler = [t for t in range(128) if t not in truth][: 8 - len(set(truth[3:6]))]
    d2t = draft_vocabulary([truth[3:6] + filler], 8)
    c.draft_vocab_size = d2t.numel()
    torch.manual_seed(0)
    head = EagleHead(c)
    head.d2t.copy_(d2t)
    with torch.no_grad():
        pred = next(unroll(head, head.fuse(feats)[:-1], lambda a, b: emb(ids[a:b]).float(), 1))
        logits = head.logits(pred, None)
        used = head.to_target_ids(torch.arange(8))
        ce = -(target[:, used].softmax(-1) * logits.log_softmax(-1)).sum(-1)
        counted = torch.isin(target.argmax(-1), used) & (torch.arange(len(ids) - 1) >= 3)
        assert 0 < int(counted.sum()) < len(ids) - 1 - 3  # some answer positions fall outside the vocabulary
        loss = float(head_loss(head, lm, emb, ids, feats, start=3)[0])
        second = list(unroll(head, head.fuse(feats)[:-1], lambda a, b: emb(ids[a:b]).float(), 2))[1]
        ce2 = -(target[1:][:, used].softmax(-1) * head.logits(second, None).log_softmax(-1)).sum(-1)
        counted2 = torch.isin(target[1:].argmax(-1), used) & (torch.arange(len(ids) - 2) + 1 >= 3)
        two = float(head_loss(head, lm, emb, ids, feats, start=3, steps=2)[0])
    assert loss == pytest.approx(float((ce * counted).sum() / len(ids)), rel=1e-5)
    assert loss < float(ce[counted].mean())  # the mean over counted positions would be larger
    assert two == pytest.approx(loss + 0.8 * float((ce2 * counted2).sum() / len(ids)), rel=1e-5)


def test_answer_starts_are_where_the_template_hands_over_to_the_answer(smollm2):
    """The question through the chat template with the assistant's header is the encoded pair's prefix; the
    answer starts right after it."""
    from specbench.drafting.eagle_training import encode

    tok = smollm2.tokenizer
    pairs = [("What is two plus two?", "Four, since two and two make four."), ("Name a colour.", "Blue.")]
    seqs = encode(tok, pairs, 512)
    for (question, answer), ids, start in zip(pairs, seqs, answer_starts(tok, pairs, seqs), strict=True):
        assert 0 < start < len(ids)
        assert tok.decode(ids[start:]).strip().startswith(answer.split()[0])
        assert answer.split()[0] not in tok.decode(ids[:start]) and question in tok.decode(ids[:start])
    assert answer_starts(tok, pairs, [s[:5] for s in seqs]) == [5, 5]  # cut short: the sequence's end


def test_the_training_time_test_sees_what_a_draft_chain_sees(tiny_llama):
    """EAGLE-3's unrolled step s at position t (training) computes what drafting computes for the depth-(s+1)
    node of the chain that follows the true tokens after t: same inputs, positions and visible entries."""
    from specbench.drafting.eagle_training import unroll
    from specbench.drafting.head_parts import HeadCache

    model = tiny_llama.model
    torch.manual_seed(0)
    head = EagleHead(HeadConfig.for_target("eagle3", model.config)).eval()
    ids = torch.tensor([5, 6, 7, 8, 9, 10, 11, 12, 13, 14])
    feats = features_of(model, [ids.tolist()], (*head.feature_layers, -1), progress=False)[0][1]
    emb = model.get_input_embeddings()
    with torch.no_grad():
        x = head.fuse(feats)[:-1]
        steps = list(unroll(head, x, lambda a, b: emb(ids[a:b]).float(), 4))
        for t in (2, 5):  # the committed prefix ends at t; the chain then takes the true tokens
            cache = HeadCache()
            out = head(x[: t + 1], emb(ids[1 : t + 2]).float(), torch.arange(t + 1), cache, None)[-1:]
            slots = []
            for s in range(1, 4):
                vis = torch.zeros(1, len(cache) + 1, dtype=torch.bool)
                vis[0, : t + 1] = True
                vis[0, slots] = True
                vis[0, -1] = True
                slots.append(len(cache))
                out = head(out, emb(ids[t + s + 1 : t + s + 2]).float(), torch.tensor([t + s]), cache, vis)
                torch.testing.assert_close(out[0], steps[s][t], atol=1e-5, rtol=1e-4)
        # and the steps differ from one another: the chain's own entries matter
        assert not torch.allclose(steps[1][2], steps[2][2])


def test_eagle_is_greedy_lossless_on_the_tiny_llama(tiny_llama, tiny_head_dir):
    target = Target(tiny_llama.model)
    recs = assert_greedy_lossless(target, eagle_drafter(tiny_llama, tiny_head_dir, depth=4, top_k=3, total_tokens=10),
                                  PROMPTS, 40)
    assert sum(sum(r.step_accepted) for r in recs) > 0  # some guesses accepted: the tree paths were exercised


def test_eagle3_is_greedy_lossless_on_the_tiny_gemma(tiny_gemma3, tmp_path):
    """Sliding-window layers, a random EAGLE-3 head with a reduced vocabulary."""
    c = HeadConfig.for_target("eagle3", tiny_gemma3.model.config)
    c.draft_vocab_size = 32
    torch.manual_seed(0)
    head = EagleHead(c)
    head.d2t.copy_(torch.arange(32) * 2 - torch.arange(32))  # the even target ids
    save_head(head, tmp_path / "h3")
    assert_greedy_lossless(Target(tiny_gemma3.model),
                           eagle_drafter(tiny_gemma3, tmp_path / "h3", Eagle3, Eagle3Config, depth=3, top_k=4),
                           PROMPTS[:2], 24)


@pytest.mark.parametrize("kind", ["eagle", pytest.param("eagle3", marks=pytest.mark.slow),
                                  pytest.param("medusa", marks=pytest.mark.slow)])
@pytest.mark.slow  # a real model: make test-slow (make test keeps the smaller checks)
def test_each_head_method_is_greedy_lossless_on_smollm2(kind, smollm2, tmp_path):
    """SmolLM2 in fp32 (its layers prepacked): an untrained head of each kind, in its published layout,
    drafts trees that verification cuts back to the target's own output."""
    from specbench.drafting.eagle_drafter import random_head

    head = random_head(kind, smollm2.model.config, tmp_path / kind)
    cls, config_cls = {"eagle": (Eagle, EagleConfig), "eagle3": (Eagle3, Eagle3Config),
                       "medusa": (Medusa, MedusaConfig)}[kind]
    kw = {"nodes": 12} if kind == "medusa" else {"depth": 3, "top_k": 4, "total_tokens": 12}
    prompt = chat(smollm2, "Write a Python function that returns the sum of a list.")
    recs = assert_greedy_lossless(Target(smollm2.model), eagle_drafter(smollm2, head, cls, config_cls, **kw),
                                  [prompt], 24, eos=smollm2.eos_token_ids)
    assert sum(sum(r.step_drafted) for r in recs) > 0


def test_drafting_in_bfloat16_under_an_fp32_target_is_lossless(tiny_llama, tiny_head_dir, tiny_medusa_dir, smollm2,
                                                               tmp_path):
    """draft_dtype=bfloat16: the head and the LM head it reads run in bf16 (a copy, prepacked as the target's is),
    verification in the target's fp32, so the output is the target's and guesses are still accepted."""
    from specbench.models.packed import PackedLinear, packs

    target = Target(tiny_llama.model)
    make = eagle_drafter(tiny_llama, tiny_head_dir, depth=4, top_k=3, total_tokens=10, draft_dtype="bfloat16")
    recs = assert_greedy_lossless(target, make, PROMPTS, 40)
    assert sum(sum(r.step_accepted) for r in recs) > 0
    d = make()
    assert d.lm_head.weight.dtype == torch.bfloat16 and next(d.head.parameters()).dtype == torch.bfloat16
    assert tiny_llama.model.get_output_embeddings().weight.dtype == torch.float32  # the target's is untouched
    make = eagle_drafter(tiny_llama, tiny_medusa_dir, Medusa, MedusaConfig, nodes=12, draft_dtype="bfloat16")
    assert sum(sum(r.step_drafted) for r in assert_greedy_lossless(target, make, PROMPTS, 40)) > 0
    torch.manual_seed(0)
    save_head(EagleHead(HeadConfig.for_target("eagle", smollm2.model.config)), tmp_path / "h")
    d = eagle_drafter(smollm2, tmp_path / "h", draft_dtype="bfloat16")()
    # prepacked as the target's is, where this CPU packs bf16 at all (AVX-512 or AVX-NE-CONVERT)
    assert isinstance(d.lm_head, PackedLinear) == (isinstance(smollm2.model.get_output_embeddings(), PackedLinear)
                                                   and packs(torch.bfloat16))
    with pytest.raises(ValueError, match="draft_dtype must be null or one of"):
        EagleConfig(draft_dtype="int4").validate()


@pytest.mark.slow  # the contract test checks every head method's sampling too, without the depth requirement
def test_sampling_through_a_real_head_keeps_the_distribution(tmp_path):
    torch.manual_seed(0)
    save_head(EagleHead(tiny_config("eagle")), tmp_path / "h")
    model = BigramModel()
    from specbench.core.draft import DrafterContext

    ctx = DrafterContext(target_model=model, target_name="bigram")
    make = lambda: Eagle(EagleConfig(head=str(tmp_path / "h"), depth=3, top_k=3, total_tokens=10),  # noqa: E731
                         vocab_size=SMALL_VOCAB, context=ctx)
    assert_sampling_preserves_distribution(make, SamplingParams(temperature=1.0), trials=1500, extra=3, min_depth=2)


def test_the_trained_head_dir_is_per_model_and_kind(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    assert trained_head_dir("smollm2-135m", "eagle3") == tmp_path / "eagle_heads" / "smollm2-135m__eagle3"


def test_offline_conversations_exist_and_are_not_evaluation_sets():
    pairs = offline_conversations()
    assert len(pairs) > 300 and all(len(a) > 200 for _, a in pairs)
    assert any(q.startswith("Explain the Python language topic") for q, _ in pairs)


# ----------------------------------------------------------------------------- Medusa


def test_medusa_tree_from_accuracies_by_hand():
    """Two heads, ranks 0-2. Products: (0) .6, (1) .2, (2) .1; (0,0) .6·.5 = .3, (0,1) .12, (1,0) .1, …"""
    acc = [[0.6, 0.2, 0.1], [0.5, 0.2, 0.1]]
    assert best_paths(acc, 4) == [(0,), (0, 0), (1,), (0, 1)]
    paths = best_paths(acc, 9)
    assert len(paths) == 9 and all(p[:-1] in paths for p in paths if len(p) > 1)
    tokens, parents = tree_draft(paths[:4], [[10, 11, 12], [20, 21, 22]])
    assert tokens == [10, 11, 20, 21] and parents == [-1, -1, 0, 0]
    assert tree_draft(MC_SIM_7B_63, [list(range(10))])[0] == list(range(10))  # depth 1 only: the ten ranks


def test_medusa_reference_layout_loads(tmp_path):
    """Written as Medusa's authors publish: medusa_lm_head.pt with "{i}.0.linear.*" and "{i}.1.weight", a
    config that names 2 heads where the weights hold 3: the weights decide."""
    ref = MedusaHeads(HIDDEN, SMALL_VOCAB, 3)
    for p in ref.parameters():
        torch.nn.init.normal_(p)
    state = {k.removeprefix("heads."): v for k, v in ref.state_dict().items()}
    assert {"0.0.linear.weight", "0.0.linear.bias", "0.1.weight", "2.1.weight"} <= set(state)
    torch.save(state, tmp_path / "medusa_lm_head.pt")
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1,
                                                      "base_model_name_or_path": "lmsys/vicuna-7b-v1.3"}))
    heads, _ = load_medusa(tmp_path, target_config())
    x = torch.randn(2, HIDDEN)
    assert len(heads) == 3 and torch.equal(heads.logits(x), ref.logits(x))
    with pytest.raises(ConfigError, match="for another model"):
        load_medusa(tmp_path, target_config(hidden=32))
    with pytest.raises(ConfigError, match="predict 8 tokens"):
        load_medusa(tmp_path, target_config(vocab=16))
    other = target_config()
    other._name_or_path = "meta-llama/Llama-2-7b-chat-hf"  # same shapes, another model
    with pytest.raises(ConfigError, match="trained for lmsys/vicuna-7b-v1.3, not for the target"):
        load_medusa(tmp_path, other)
    other._name_or_path = "LMSYS/Vicuna-7b-v1.3"  # the same model, or a local copy of any: accepted
    load_medusa(tmp_path, other)
    other._name_or_path = str(tmp_path)
    load_medusa(tmp_path, other)


@pytest.fixture(scope="module")
def tiny_medusa_dir(tmp_path_factory, tiny_llama):
    model = tiny_llama.model
    g = torch.Generator().manual_seed(0)
    target = Target(model)
    seqs = [p + autoregressive_output(target, p, 40) for p in
            (torch.randint(3, 128, (4,), generator=g).tolist() for _ in range(16))]
    data = features_of(model, seqs, (-1,), progress=False)
    c = model.config
    torch.manual_seed(0)
    heads = MedusaHeads(c.hidden_size, c.vocab_size, 3, tied=True)
    w = model.get_output_embeddings().weight.detach().float()
    before, acc0 = medusa_evaluate(heads, lambda x: torch.nn.functional.linear(x, w), w, data[:3])
    state = medusa_train(heads, lambda x: torch.nn.functional.linear(x, w), w, data[3:], data[:3], epochs=6,
                         lr=3e-3, positions=32, progress=False)
    best = min(state["history"], key=lambda h: h["heldout_loss"])
    assert best["heldout_loss"] < before and len(best["accuracy"]) == 3 and len(best["accuracy"][0]) == 10
    return save_medusa(heads, tmp_path_factory.mktemp("medusa") / "m", {"accuracy": best["accuracy"]})


def test_medusa_training_lowers_the_heldout_loss(tiny_medusa_dir):
    cfg = json.loads((tiny_medusa_dir / "config.json").read_text())
    assert cfg["tied"] and cfg["medusa_num_heads"] == 3 and len(cfg["accuracy"]) == 3


def test_medusa_is_greedy_lossless_on_the_tiny_llama(tiny_llama, tiny_medusa_dir):
    make = eagle_drafter(tiny_llama, tiny_medusa_dir, Medusa, MedusaConfig, nodes=12)
    recs = assert_greedy_lossless(Target(tiny_llama.model), make, PROMPTS, 40)
    assert sum(sum(r.step_drafted) for r in recs) > 0
    drafter = make()
    assert len(drafter.paths) == 12 and drafter.paths[0] == (0,)


def test_an_eagle_tree_is_one_graph_a_step_when_the_targets_steps_are(tiny_llama, tiny_head_dir, monkeypatch):
    """With ``DrafterContext.graphs`` (rehearsed here) a step's tree after the head catches up is one graph's
    replay: the same drafts and steps as grown directly; requests after the first take the first one's cache
    buffers again and capture nothing new for the same shapes; a graph whose inputs are never refreshed drafts
    otherwise (the target runs eagerly here, so only the tree's graphs go stale)."""
    from specbench.core.draft import DrafterContext
    from specbench.core.graphs import StepGraph

    target = Target(tiny_llama.model)

    def decode(graphs: bool, prompts=PROMPTS):
        ctx = DrafterContext(target_model=tiny_llama.model, target_name=tiny_llama.name, graphs=graphs)
        first = Eagle(EagleConfig(head=str(tiny_head_dir), depth=4, top_k=3, total_tokens=10),
                      vocab_size=tiny_llama.vocab_size, context=ctx)
        drafts: list = []
        monkeypatch.setattr(Eagle, "propose", lambda self, state: drafts.append(
            Eagle.propose_rows([self], [state])[0]) or drafts[-1])  # on the class: a request's drafter ends with it
        recs = [generate(target, first.spawn(), p, max_new_tokens=24) for p in prompts]
        monkeypatch.undo()
        return first, recs, [(d.tokens, d.parents, d.needs) if d else None for d in drafts]

    plain, expected, drafted = decode(False)
    first, recs, graphed = decode(True)
    assert plain.trees is None and first.trees.graphs and graphed == drafted
    assert [r.step_tokens for r in recs] == [r.step_tokens for r in expected]
    assert [r.output_ids for r in recs] == [autoregressive_output(target, p, 24) for p in PROMPTS]
    assert len({key[0] for key in first.trees.graphs}) == 1  # one buffer, taken again by each request
    call = StepGraph.__call__
    with monkeypatch.context() as stale:
        stale.setattr(StepGraph, "__call__", lambda self, *values: call(self, *self.inputs))  # inputs never copied
        ctx = DrafterContext(target_model=tiny_llama.model, target_name=tiny_llama.name, graphs=True)
        drafter = Eagle(EagleConfig(head=str(tiny_head_dir), depth=4, top_k=3, total_tokens=10),
                        vocab_size=tiny_llama.vocab_size, context=ctx)
        assert [generate(target, drafter, p, max_new_tokens=24).step_tokens for p in PROMPTS] != [
            r.step_tokens for r in expected]


def test_medusa_heads_run_as_a_graph_when_the_targets_steps_do(tiny_llama, tiny_medusa_dir, monkeypatch):
    """With the target's steps as graphs (``DrafterContext.graphs``, rehearsed here) the heads' pass is a graph of
    its own per rows × depth × width: the same steps as the heads run directly; a graph whose input is never
    refreshed drafts otherwise (the target runs eagerly here, so only the heads' graphs go stale)."""
    from specbench.core.draft import DrafterContext
    from specbench.core.graphs import StepGraph

    target = Target(tiny_llama.model)

    def decode(graphs: bool):
        ctx = DrafterContext(target_model=tiny_llama.model, target_name=tiny_llama.name, graphs=graphs)
        drafter = Medusa(MedusaConfig(head=str(tiny_medusa_dir), nodes=12), vocab_size=tiny_llama.vocab_size,
                         context=ctx)
        return drafter, [generate(target, drafter, p, max_new_tokens=24) for p in PROMPTS]

    plain, expected = decode(False)
    drafter, recs = decode(True)
    assert plain.graphs is None and drafter.graphs and all(key[0] == 1 for key in drafter.graphs)
    assert [r.step_tokens for r in recs] == [r.step_tokens for r in expected]
    assert [r.output_ids for r in recs] == [autoregressive_output(target, p, 24) for p in PROMPTS]
    call = StepGraph.__call__
    monkeypatch.setattr(StepGraph, "__call__", lambda self, *values: call(self, *self.inputs))  # stale inputs
    _, stale = decode(True)
    assert [r.step_tokens for r in stale] != [r.step_tokens for r in expected]


def test_a_stopped_medusa_step_costs_the_heads_nothing_and_the_next_draft_reads_the_last_state(tiny_llama,
                                                                                                tiny_medusa_dir):
    """While ``budget=auto`` holds the heads at depth 0, a step keeps its states as they came (nothing brought to
    the heads' device or dtype); the first draft after the pause reads the last of them, as a drafter that never
    paused does: the same outputs, and drafts again once allowed."""
    from specbench.core.draft import VerifyResult

    class StopThenDraft:  # depth 0 for the first 5 decode steps, then the method's own draft
        width_cap, steps = None, 0

        def cap(self):
            self.steps += 1
            return 0 if self.steps <= 5 else None

        def plan(self, draft, tokens):
            return draft

        def record(self, draft, path, draft_s=0.0):
            pass

        def finish(self, tokens):
            pass

    make = eagle_drafter(tiny_llama, tiny_medusa_dir, Medusa, MedusaConfig, nodes=12)
    target, paused, always = Target(tiny_llama.model), make(), make()
    rec = generate(target, paused, PROMPTS[2], max_new_tokens=24, planner=StopThenDraft())
    assert rec.output_ids == generate(target, always, PROMPTS[2], max_new_tokens=24).output_ids
    assert rec.step_drafted[1:6] == [0] * 5 and sum(rec.step_drafted[6:]) > 0
    states = {-1: torch.zeros(2, tiny_llama.model.config.hidden_size, dtype=torch.float64)}  # not the heads' dtype
    paused.update(VerifyResult([0], [7, 8], Draft.chain([7], "medusa"), features=states))
    assert paused.features is states  # kept as it came: no copy while stopped


def test_medusa_sampling_keeps_the_distribution(tmp_path):
    torch.manual_seed(0)
    save_medusa(MedusaHeads(HIDDEN, SMALL_VOCAB, 2), tmp_path / "m", {"accuracy": [[0.5, 0.3, 0.1], [0.4, 0.2]]})
    from specbench.core.draft import DrafterContext

    ctx = DrafterContext(target_model=BigramModel(), target_name="bigram")
    make = lambda: Medusa(MedusaConfig(head=str(tmp_path / "m"), nodes=6), vocab_size=SMALL_VOCAB,  # noqa: E731
                          context=ctx)
    assert_sampling_preserves_distribution(make, SamplingParams(temperature=1.0), trials=1500, extra=3, min_depth=2)


# ----------------------------------------------------------------------------- SAM-Decoding with EAGLE-2


def test_sam_decoding_with_eagle_below_its_threshold_is_lossless(tiny_llama, tiny_head_dir):
    """Repetitive prompts give long matches (SAM's chains) and the rest EAGLE's trees; the head's cache is fed
    every step whichever drafted, so its trees stay right after a stretch of matches."""
    from methods.sam_decoding import SAMDecoding, SAMDecodingConfig

    cfg = dict(auxiliary="eagle", head=str(tiny_head_dir), eagle_depth=3, eagle_top_k=3, eagle_total_tokens=8)
    make = eagle_drafter(tiny_llama, tiny_head_dir, SAMDecoding, SAMDecodingConfig, **{k: v for k, v in cfg.items()
                                                                                        if k != "head"})
    recs = assert_greedy_lossless(Target(tiny_llama.model), make, PROMPTS, 40)
    sources = set().union(*(r.drafted_by_source for r in recs))
    assert "head" in sources and make().feature_layers == (-1,)


# ----------------------------------------------------------------------------- the training command, end to end


@pytest.mark.slow  # ~14 s: keeps `make test` under its 10 minutes on a clean clone
def test_train_command_then_a_run_reads_the_head(tmp_path, monkeypatch, capsys):
    """``specbench train-head`` on the tiny Llama: features once for every head reading the same
    layer, a head in the cache where ``head: auto`` finds it, training.json with the held-out history; run
    again, it resumes from its checkpoint; ``run.py method=eagle`` and ``method=medusa`` then decode with them."""
    from specbench.cli.eagle_head import main
    from specbench.results.rows import load_results
    from specbench.run.runner import run
    from tests.run.test_config import make_cfg

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    args = ["model=tiny-llama", "--conversations", "6", "--max-len", "48", "--epochs", "2", "--lr", "2e-3"]
    out = main(args)
    assert out == trained_head_dir("tiny-llama", "eagle") and (out / "model.safetensors").is_file()
    meta = json.loads((out / "training.json").read_text())
    assert meta["conversations"] == 6 and [h["epoch"] for h in meta["history"]] == [0, 1, 2]
    features = list((tmp_path / "cache" / "eagle_heads" / "tiny-llama.features").glob("*.pt"))
    assert len(features) == 1
    main(args)
    assert "resuming after epoch 2" in capsys.readouterr().out
    medusa = main(["model=tiny-llama", "--kind", "medusa", "--medusa-heads", "2", "--conversations", "6",
                   "--max-len", "48", "--epochs", "1", "--positions", "8"])
    assert len(json.loads((medusa / "config.json").read_text())["accuracy"]) == 2
    assert list((tmp_path / "cache" / "eagle_heads" / "tiny-llama.features").glob("*.pt")) == features  # reused
    base = ("experiment=smoke", f"results_dir={tmp_path / 'r'}", "progress=false", "limit=1", "max_new_tokens=12")
    for method in ("eagle-cpu", "medusa-cpu"):
        run(make_cfg(*base, f"method={method}"))
    df = load_results(tmp_path / "r")
    assert set(df.method) >= {"eagle", "medusa"} and (df.tau >= 1).all()
    heads = df[df.method != "autoregressive"]
    assert (heads.head_source == "trained here").all() and heads.head_fingerprint.str.len().eq(16).all()


def test_eagle3_s_defaults_are_its_preset_s():
    """A config built in Python drafts what `method=eagle3` drafts: the evaluation scripts' 6 levels."""
    from methods.eagle3 import Eagle3Config
    from specbench.run.config import load_preset

    _, preset, _ = load_preset("eagle3")
    config = Eagle3Config()
    assert (config.depth, config.top_k, config.total_tokens) == (preset["depth"], preset["top_k"],
                                                                 preset["total_tokens"])


def test_eagle3s_draft_vocabulary_counts_the_training_answers_alone():
    """The reference's d2t: the most frequent tokens of the training conversations' answers; a token frequent in
    the prompts (before each answer's start) and nowhere else is left out."""
    from specbench.drafting.eagle_training import answers_vocabulary

    feats = {-1: torch.zeros(1, 1)}
    train_set = [(torch.tensor([7, 7, 7, 7, 1, 2, 3]), feats, 4), (torch.tensor([7, 7, 7, 2, 3, 4]), feats, 3)]
    d2t = answers_vocabulary(train_set, 3)
    used = (torch.arange(3) + d2t).tolist()
    assert used == [2, 3, 4] or used == [1, 2, 3]  # the answers' most frequent three; never the prompts' 7
    assert 7 not in (torch.arange(d2t.numel()) + d2t).tolist()


def test_a_batch_of_head_drafts_grows_in_lockstep_and_each_row_drafts_what_it_drafts_alone(tiny_llama, tmp_path,
                                                                                              monkeypatch):
    """At batch size 4 the loop asks the head drafter for every row's draft at once (one head forward per tree
    level for all rows): each row's drafts are the ones it proposes when the rows draft one by one, and every
    output is the target's greedy one."""
    from collections import defaultdict

    from specbench.core.decode import Request, decode_batch
    from specbench.drafting.eagle_drafter import HeadDrafter

    c = HeadConfig.for_target("eagle3", tiny_llama.model.config)
    torch.manual_seed(3)
    save_head(EagleHead(c), tmp_path / "h")
    make = eagle_drafter(tiny_llama, tmp_path / "h", Eagle3, Eagle3Config, depth=3, top_k=3, total_tokens=8)
    target = Target(tiny_llama.model)
    prompts = [[5, 6, 7, 8] * 2, [3, 3, 3, 9], list(range(20, 30)), [40, 41], [7, 7, 8]]
    expected = [generate(target, Drafter(vocab_size=0), p, max_new_tokens=12).output_ids for p in prompts]

    class OneByOne(Eagle3):
        propose_rows = None  # the loop asks each row alone

        def propose(self, state):
            return HeadDrafter.propose_rows([self], [state])[0]

    original = HeadDrafter.propose_rows

    def run(kind):
        drafts, calls = defaultdict(list), []

        def recorded(drafters, states):
            out = original(drafters, states)
            calls.append(len(drafters))
            for d, draft in zip(drafters, out, strict=True):
                drafts[d.tag].append(None if draft is None else (draft.tokens, draft.parents))
            return out

        monkeypatch.setattr(HeadDrafter, "propose_rows", staticmethod(recorded))
        queue = []
        for i, p in enumerate(prompts):
            d = make() if kind is Eagle3 else OneByOne(make().config, vocab_size=tiny_llama.vocab_size,
                                                       context=make().context)
            d.tag = i
            queue.append(Request(p, 12, d, tag=i))
        queue = queue[::-1]
        got = {req.tag: rec.output_ids for req, rec in decode_batch(target, lambda: queue.pop() if queue else None,
                                                                    batch_size=4)}
        return got, drafts, calls

    batched, batched_drafts, batched_calls = run(Eagle3)
    alone, alone_drafts, alone_calls = run(OneByOne)
    assert [batched[i] for i in range(len(prompts))] == expected == [alone[i] for i in range(len(prompts))]
    assert max(batched_calls) == 4 and set(alone_calls) == {1}
    assert dict(batched_drafts) == dict(alone_drafts) and any(v for v in batched_drafts.values())
