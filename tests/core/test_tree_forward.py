"""The verification forward and cache compaction on tiny random models (fp32).

Llama (GQA) and Gemma 3 (sliding-window layers with a window of 4, so that
prompts cross it) are built from configs; every tree is checked against
running each branch on its own.
"""

import copy

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig

from specbench.core.acceptance import SamplingParams
from specbench.core.decode import generate
from specbench.core.draft import Draft, Drafter
from specbench.core.forward import Target

VOCAB = 96


def build(kind: str, attn: str = "sdpa") -> torch.nn.Module:
    torch.manual_seed(0)
    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
    )
    if kind == "llama":
        cfg = LlamaConfig(num_hidden_layers=2, **common)
    else:
        cfg = Gemma3TextConfig(
            num_hidden_layers=3,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            **common,
        )
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32)
    with torch.no_grad():  # sharper distributions than the tiny init, so greedy paths vary
        model.get_output_embeddings().weight.mul_(8.0)
    return model.eval()


MODELS = [("llama", "sdpa"), ("llama", "eager"), ("gemma3", "sdpa"), ("gemma3", "eager")]


@pytest.fixture(scope="module", params=MODELS, ids=lambda p: f"{p[0]}-{p[1]}")
def target(request):
    return Target(build(*request.param))


def plain_logits(model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens])).logits[0]


PREFIX = [5, 17, 33, 2, 71, 9, 40, 12, 61, 3]  # longer than Gemma's window


def test_tree_logits_equal_each_branch_alone(target):
    draft = Draft.from_sequences([[7, 8, 9], [7, 10], [11, 12, 13, 14]], ["a", "b", "c"])
    past, root = PREFIX[:-1], PREFIX[-1]
    cache = target.new_cache()
    with torch.no_grad():
        target.prefill(past, cache)
        logits = target.forward_draft(root, draft, cache)
    for i in range(len(draft.tokens)):
        branch, node = [], i
        while node >= 0:
            branch.insert(0, draft.tokens[node])
            node = draft.parents[node]
        ref = plain_logits(target.model, PREFIX + branch)[-1]
        torch.testing.assert_close(logits[1 + i], ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[0], plain_logits(target.model, PREFIX)[-1], atol=1e-4, rtol=1e-4)


def test_auxiliary_nodes_see_prefix_and_their_visibility_row(target):
    # Aux 0 at offset 1, aux 1 at offset 2 seeing aux 0: together a chain [root, 20, 21].
    # Aux 2 at offset 1 sees nothing but itself: [root, 22]. A guess [7] rides along.
    draft = Draft(
        tokens=[7],
        parents=[-1],
        sources=["g"],
        aux_tokens=[20, 21, 22],
        aux_positions=[1, 2, 1],
        aux_visible=np.array([[0, 0, 0], [1, 0, 0], [0, 0, 0]], dtype=bool),
    )
    past, root = PREFIX[:-1], PREFIX[-1]
    cache = target.new_cache()
    with torch.no_grad():
        target.prefill(past, cache)
        logits = target.forward_draft(root, draft, cache)
    torch.testing.assert_close(logits[2], plain_logits(target.model, PREFIX + [20])[-1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(
        logits[3], plain_logits(target.model, PREFIX + [20, 21])[-1], atol=1e-4, rtol=1e-4
    )
    torch.testing.assert_close(logits[4], plain_logits(target.model, PREFIX + [22])[-1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[1], plain_logits(target.model, PREFIX + [7])[-1], atol=1e-4, rtol=1e-4)


def test_compaction_matches_fresh_forward(target):
    draft = Draft(
        tokens=[7, 8, 10, 11],
        parents=[-1, 0, -1, 2],
        sources=["a"] * 4,
        aux_tokens=[30, 31],
        aux_positions=[1, 2],
        aux_visible=np.array([[0, 0], [1, 0]], dtype=bool),
    )
    past, root = PREFIX[:-1], PREFIX[-1]
    cache = target.new_cache()
    with torch.no_grad():
        target.prefill(past, cache)
        target.forward_draft(root, draft, cache)
        Target.compact(cache, len(past), [2, 3])  # keep the second branch: 10, 11
        assert cache.get_seq_length() == len(PREFIX) + 2
        nxt = target.forward_draft(55, Draft(), cache)[0]
    ref = plain_logits(target.model, PREFIX + [10, 11, 55])[-1]
    torch.testing.assert_close(nxt, ref, atol=1e-4, rtol=1e-4)


class Autoregressive(Drafter):
    pass


class NoisyOracle(Drafter):
    """Drafts trees mixing the true continuation with random tokens, plus aux nodes."""

    def __init__(self, truth: list[int], prompt_len: int, seed: int = 0):
        super().__init__(vocab_size=VOCAB, seed=seed)
        self.truth, self.prompt_len = truth, prompt_len
        self.rng = np.random.default_rng(seed)

    def propose(self, state):
        pos = state.new_tokens
        right = self.truth[pos : pos + int(self.rng.integers(0, 6))]
        if right and self.rng.random() < 0.5:  # corrupt one token
            right[int(self.rng.integers(len(right)))] = int(self.rng.integers(VOCAB))
        wrong = list(self.rng.integers(0, VOCAB, size=3))
        seqs = [s for s in (wrong, right) if s]
        if not seqs:
            return None
        draft = Draft.from_sequences(seqs, ["wrong", "right"][-len(seqs) :])
        m = int(self.rng.integers(0, 4))
        draft.aux_tokens = list(self.rng.integers(0, VOCAB, size=m))
        draft.aux_positions = list(range(1, m + 1))
        draft.aux_visible = np.tril(np.ones((m, m), dtype=bool), -1)
        return draft


PROMPTS = [[1, 4, 9, 16, 25, 36], [3, 3, 3], list(range(2, 30))]


@pytest.mark.parametrize("prompt", PROMPTS, ids=["p6", "p3", "p28"])
def test_autoregressive_equals_model_generate(target, prompt):
    rec = generate(target, Autoregressive(vocab_size=VOCAB), prompt, max_new_tokens=40)
    with torch.no_grad():
        ref = target.model.generate(
            torch.tensor([prompt]), max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0
        )[0, len(prompt) :].tolist()
    assert rec.output_ids == ref
    assert rec.steps == rec.new_tokens == 40
    assert rec.finish_reason == "length"


@pytest.mark.parametrize("prompt", PROMPTS, ids=["p6", "p3", "p28"])
def test_trees_with_aux_nodes_are_lossless(target, prompt):
    truth = generate(target, Autoregressive(vocab_size=VOCAB), prompt, max_new_tokens=60).output_ids
    rec = generate(target, NoisyOracle(truth, len(prompt)), prompt, max_new_tokens=60)
    assert rec.output_ids == truth
    assert rec.steps < rec.new_tokens  # the oracle did get tokens accepted
    # every accepted guess counts once by depth; a node both sources proposed counts for each of them
    assert sum(rec.accepted_by_position.values()) == rec.new_tokens - rec.steps
    assert sum(rec.accepted_by_source.values()) >= rec.new_tokens - rec.steps


def test_eos_and_truncation_inside_an_accepted_run(target):
    prompt = PROMPTS[0]
    truth = generate(target, Autoregressive(vocab_size=VOCAB), prompt, max_new_tokens=30).output_ids

    class Exact(Drafter):
        def propose(self, state):
            pos = state.new_tokens
            return Draft.chain(truth[pos : pos + 8], "right")

    # max_new_tokens falls inside an accepted run: cut exactly there
    rec = generate(target, Exact(vocab_size=VOCAB), prompt, max_new_tokens=13)
    assert rec.output_ids == truth[:13] and rec.finish_reason == "length"
    assert sum(rec.step_tokens) == 13
    # EOS = a token that appears mid-output: stop right after its first occurrence
    eos = truth[10]
    first = truth.index(eos)
    rec = generate(target, Exact(vocab_size=VOCAB), prompt, max_new_tokens=30, eos_token_ids=[eos])
    assert rec.output_ids == truth[: first + 1] and rec.finish_reason == "eos"


def test_sampling_is_seeded():
    target = Target(build("llama"))
    params = SamplingParams(temperature=1.0, top_p=0.9)
    runs = [
        generate(
            target,
            Autoregressive(vocab_size=VOCAB),
            PROMPTS[0],
            max_new_tokens=20,
            sampling=params,
            generator=torch.Generator().manual_seed(s),
        ).output_ids
        for s in (1, 1, 2)
    ]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_aux_logit_rows_select_which_aux_logits_are_computed(target):
    aux = dict(
        aux_tokens=[20, 21, 22],
        aux_positions=[1, 2, 3],
        aux_visible=np.tril(np.ones((3, 3), dtype=bool), -1),
    )
    full = Draft(tokens=[7], parents=[-1], sources=["g"], **aux)
    some = Draft(tokens=[7], parents=[-1], sources=["g"], aux_logit_rows=[2, 0], **aux)
    past, root = PREFIX[:-1], PREFIX[-1]
    out = []
    for draft in (full, some):
        cache = target.new_cache()
        with torch.no_grad():
            target.prefill(past, cache)
            out.append(target.forward_draft(root, draft, cache))
    assert out[1].shape[0] == 2 + 2
    torch.testing.assert_close(out[1][:2], out[0][:2], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1][2], out[0][2 + 2], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1][3], out[0][2 + 0], atol=1e-5, rtol=1e-5)


def test_aux_only_draft_is_not_replaced_by_an_empty_one():
    """A draft of auxiliary nodes alone still reaches the model, and its logits the drafter."""
    target = Target(build("llama"))
    seen = []

    class WindowOnly(Drafter):
        def propose(self, state):
            return Draft(
                aux_tokens=[5, 6], aux_positions=[1, 2], aux_visible=np.array([[0, 0], [1, 0]], dtype=bool)
            )

        def update(self, result):
            seen.append(None if result.aux_logits is None else tuple(result.aux_logits.shape))

    rec = generate(target, WindowOnly(vocab_size=VOCAB), PROMPTS[0], max_new_tokens=4)
    assert seen == [(2, VOCAB)] * 3 and rec.new_tokens == 4


def test_a_model_that_takes_its_cache_as_past_key_values_decodes_as_one_that_takes_cache():
    """transformers before 5.24 names the forward's KV cache ``past_key_values`` and drops an unknown ``cache``
    without a word (each step then attends over its own tokens alone): the target passes the name the installed
    model takes, so a tree method's output is the same either way."""
    from transformers.models.llama.modeling_llama import LlamaModel

    from methods.registry import get_method
    from specbench.core.forward import cache_kwarg

    class OlderLlamaModel(LlamaModel):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, **kwargs):
            kwargs.pop("cache", None)  # unknown to such a version: ignored
            return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                   cache=past_key_values, **kwargs)

    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    outputs = []
    for older in (False, True):
        model = build("llama")
        if older:
            model.model.__class__ = OlderLlamaModel
        target = Target(model)
        assert target.cache_kwarg == ("past_key_values" if older else "cache") == cache_kwarg(model.model)
        outputs.append([generate(target, d, prompt, max_new_tokens=12).output_ids
                        for d in (Drafter(vocab_size=VOCAB), get_method("spectra_core")(vocab_size=VOCAB))])
    assert outputs[0] == outputs[1] and outputs[0][0] == outputs[0][1]


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_features_are_the_models_hidden_states_caught_on_the_layers_asked_for_alone(kind):
    """A drafter's features equal ``output_hidden_states``' (every index, -1 the final norm's output), from a
    tree forward too; only the layers asked for are hooked, and transformers' hooks on every layer never are."""
    model = build(kind).eval()
    n = model.config.num_hidden_layers
    prompt = [3, 9, 4, 17, 5, 11]
    with torch.no_grad():  # on a copy: asking for hidden states hooks every layer of the model asked
        ref = copy.deepcopy(model).base_model(input_ids=torch.tensor([prompt]), output_hidden_states=True).hidden_states
    target = Target(model)
    cache = target.new_cache()
    every = tuple(range(n + 1)) + (-1,)
    target.prefill(prompt[:-1], cache, features=every)
    draft = Draft(tokens=[prompt[-1] + 1, 7], parents=[-1, -1], sources=["t", "t"])
    target.forward_draft(prompt[-1], draft, cache, features=every)  # a tree: root, then two siblings
    for layer in every:
        torch.testing.assert_close(target.features[layer][0], ref[layer][0, -1], atol=1e-5, rtol=1e-5)
    layers = model.base_model.layers
    assert [len(layer._forward_pre_hooks) for layer in layers] == [1] * n  # 0 … n-1, each hooked once
    assert not any(getattr(m, "_output_capturing_hooks_installed", False) for m in (model, model.base_model))
    other = Target(model)  # another Target over the same model shares the hooks
    other.forward_draft(prompt[-1], draft, other.new_cache(), features=(1,))
    assert [len(layer._forward_pre_hooks) for layer in layers] == [1] * n and set(other.features) == {1}
