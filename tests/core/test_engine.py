"""``forward=compiled`` (:mod:`specbench.core.engine`): the static-shape forward against transformers' own.

Most checks run the static-shape path with torch.compile's ``eager`` backend (the shapes, padding, masks
and cache writes are the same; only the code generation is left out, which keeps them quick); the ones
marked ``inductor`` compile for real.
"""

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, Qwen2Config

from specbench.core.decode import Request, decode_batch, generate
from specbench.core.draft import Draft, Drafter
from specbench.core.engine import CompiledTarget, EngineError, make_target
from specbench.core.forward import Target
from specbench.core.shapes import EACH, PIECE, WIDTHS, pieces, width

VOCAB = 96


def build(kind: str = "llama", layers: int = 2, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=512, num_hidden_layers=layers)
    cfg = {"llama": LlamaConfig, "qwen2": Qwen2Config}[kind](**common)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    return model


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request):
    model = build(request.param)
    return Target(model), CompiledTarget(model, backend="eager")


PROMPT = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43]
TREE = Draft(tokens=[5, 6, 7, 8, 9], parents=[-1, 0, 0, 2, -1])
AUX = Draft(tokens=[5, 6], parents=[-1, 0], aux_tokens=[11, 12, 13], aux_positions=[1, 2, 1],
            aux_visible=np.array([[0, 0, 0], [1, 0, 0], [0, 0, 0]], dtype=bool))


def test_widths_are_powers_of_two():
    assert [width(q) for q in (1, 2, 3, 5, 8, 9, 100, 128)] == [1, 2, 4, 8, 8, 16, 128, 128]
    assert [width(q) for q in (129, 256, 257)] == [256, 256, 384]  # a paper-sized block: multiples of 128
    assert WIDTHS[-1] == PIECE


def test_a_block_wider_than_128_tokens_runs_too(pair):
    """The paper's budgets verify about 120 guesses plus a pool: a block past 128 rows runs at 256."""
    wide = Draft(tokens=[t % VOCAB for t in range(140)], parents=[-1] + list(range(139)))  # a chain of 140 guesses
    caches = [t.new_cache(1, limit=200) for t in pair]
    with torch.inference_mode():
        for t, c in zip(pair, caches, strict=True):
            t.prefill(PROMPT, c)
        got = [t.forward_draft(7, wide, c) for t, c in zip(pair, caches, strict=True)]
    torch.testing.assert_close(got[1], got[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("draft", [Draft(tokens=[], parents=[]), Draft(tokens=[4, 5, 6], parents=[-1, 0, 1]), TREE,
                                   AUX], ids=["one", "chain", "tree", "aux"])
def test_a_step_gives_the_eager_logits(pair, draft):
    eager, compiled = pair
    caches = [t.new_cache(1, limit=64) for t in pair]
    with torch.inference_mode():
        first = [t.prefill(PROMPT, c, features=(1, -1)) for t, c in zip(pair, caches, strict=True)]
        torch.testing.assert_close(first[1], first[0], atol=1e-4, rtol=1e-4)
        steps = [t.forward_draft(7, draft, c, features=(1, -1)) for t, c in zip(pair, caches, strict=True)]
    torch.testing.assert_close(steps[1], steps[0], atol=1e-4, rtol=1e-4)
    for layer in (1, -1):  # the hidden states a head reads, row for row
        torch.testing.assert_close(compiled.features[layer], eager.features[layer], atol=1e-4, rtol=1e-4)
    assert caches[1].lengths == caches[0].lengths


def test_prefill_features_match(pair):
    eager, compiled = pair
    states = []
    for t in pair:
        with torch.inference_mode():
            t.prefill(PROMPT, t.new_cache(1, limit=64), features=(0, 1, -1))
        states.append(t.features)
    for layer in (0, 1, -1):
        assert states[1][layer].shape == states[0][layer].shape == (len(PROMPT), 64)
        torch.testing.assert_close(states[1][layer], states[0][layer], atol=1e-4, rtol=1e-4)


def test_a_long_prompt_is_prefilled_in_pieces(pair):
    eager, compiled = pair
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, VOCAB, PIECE * 2 + 17)]
    with torch.inference_mode():
        got = [t.prefill(prompt, t.new_cache(1, limit=400), features=(1,)) for t in pair]
        states = [t.features[1] for t in pair]
    torch.testing.assert_close(got[1], got[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(states[1], states[0], atol=1e-4, rtol=1e-4)


def test_a_prompt_runs_in_the_pieces_of_fewest_rows(pair):
    """On a CPU a prompt is cut where padding it would cost more rows than another piece (EACH): 70 tokens run
    as 64 + 6 (72 rows, not 128); no way of cutting it, into pieces of any sizes, runs fewer rows. A GPU's
    prefill (each = PIECE) pads the rest into one piece, as before. Logits and features stay the eager ones."""
    assert pieces(70, 16) == (64, 6) and pieces(78, 16) == (64, 14) and pieces(53, 16) == (53,)
    assert pieces(300, 16) == (128, 128, 44) and pieces(70, PIECE) == (70,) and pieces(300, PIECE) == (128, 128, 44)
    least = [0] * (PIECE + 1)  # the fewest rows (a piece counting EACH more) over every way of cutting n
    for n in range(1, PIECE + 1):
        least[n] = min(EACH + width(k) + least[n - k] for k in range(1, n + 1))
        assert sum(pieces(n, EACH)) == n and sum(EACH + width(k) for k in pieces(n, EACH)) == least[n]
    eager, compiled = pair
    prompt = [int(t) for t in np.random.default_rng(1).integers(0, VOCAB, 70)]
    with torch.inference_mode():
        got = [t.prefill(prompt, t.new_cache(1, limit=128), features=(1,)) for t in pair]
        states = [t.features[1] for t in pair]
    torch.testing.assert_close(got[1], got[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(states[1], states[0], atol=1e-4, rtol=1e-4)


def test_rows_at_their_own_lengths_match(pair):
    eager, compiled = pair
    prompts = [PROMPT, PROMPT[:5], PROMPT[3:12]]
    drafts = [TREE, Draft(tokens=[], parents=[]), AUX]
    out = []
    for t in pair:
        cache = t.new_cache(3, limit=64)
        with torch.inference_mode():
            first = t.prefill_rows(prompts, cache, 0, features=(1,))
            rows = t.forward_rows([4, 5, 6], drafts, cache, features=(1,))
        out.append((first, rows, [f[1] for f in t.row_features]))
    torch.testing.assert_close(out[1][0], out[0][0], atol=1e-4, rtol=1e-4)
    for a, b in zip(out[1][1], out[0][1], strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    for a, b in zip(out[1][2], out[0][2], strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_greedy_decoding_matches_eager_decoding(pair):
    eager, compiled = pair
    ours = generate(compiled, Drafter(vocab_size=0), PROMPT, max_new_tokens=40)
    theirs = generate(eager, Drafter(vocab_size=0), PROMPT, max_new_tokens=40)
    assert ours.output_ids == theirs.output_ids


def test_the_cache_keeps_its_address_and_padding_never_shows():
    model = build()
    compiled = CompiledTarget(model, backend="eager")
    cache = compiled.new_cache(2, limit=48)
    addresses = {d: s.data_ptr() for d, s in cache.stores.items()}
    with torch.inference_mode():
        compiled.prefill_rows([PROMPT, PROMPT[:4]], cache, 0)
        for _ in range(10):  # widths 1 to 8 over lengths near the limit: the buffer is never regrown
            logits = compiled.forward_rows([1, 2], [TREE, Draft(tokens=[4], parents=[-1])], cache)
            assert all(torch.isfinite(x).all() for x in logits)
            Target.compact(cache, cache.lengths[0], [0], slot=0)
            Target.compact(cache, cache.lengths[1], [], slot=1)
    assert {d: s.data_ptr() for d, s in cache.stores.items()} == addresses
    # what the padded rows wrote past a block is hidden: poisoning it changes nothing
    with torch.inference_mode():
        before = compiled.forward_draft(3, TREE, cache)
        for store in cache.stores.values():
            store[..., cache.lengths[0] + 1 + len(TREE.tokens):, :] = float("nan")
        after = compiled.forward_draft(3, TREE, cache)
    torch.testing.assert_close(after, before)


def test_the_layers_cache_rows_are_made_once_per_buffer_and_an_ended_buffer_is_let_go():
    """A step hands the compiled layers each layer's rows of the cache buffer: made once per (buffer, rows), the
    same objects every step; a new buffer drops the views of the last one (they would hold its memory), and the
    output stays eager decoding's."""
    model = build()
    compiled, eager = CompiledTarget(model, backend="eager"), Target(model)
    first = compiled.new_cache(1, limit=64)
    with torch.inference_mode():
        compiled.prefill(PROMPT, first)
        seen = []
        for _ in range(3):
            compiled.forward_draft(1, TREE, first)
            Target.compact(first, first.lengths[0], [0])
            seen.append(next(iter(compiled._views.values())))
        assert len(compiled._views) == 1 and seen[0] is seen[1] is seen[2]
        assert seen[0][0].data_ptr() == first.stores[compiled.device].data_ptr()
        old = first.stores[compiled.device].data_ptr()
        del first
        ours = generate(compiled, Drafter(vocab_size=0), PROMPT, max_new_tokens=12)
    assert all(key[0] != old for key in compiled._views)
    assert ours.output_ids == generate(eager, Drafter(vocab_size=0), PROMPT, max_new_tokens=12).output_ids


def test_models_it_cannot_run_are_refused_in_one_line():
    torch.manual_seed(0)
    gemma = AutoModelForCausalLM.from_config(Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, num_hidden_layers=2, sliding_window=4))
    with pytest.raises(EngineError, match="forward=eager"):
        CompiledTarget(gemma)
    with pytest.raises(EngineError, match="eager, compiled"):
        make_target(build(), "fast")
    assert type(make_target(build(), "eager")) is Target


def test_a_batch_decodes_as_one_request_does(pair):
    eager, compiled = pair
    prompts = [PROMPT, PROMPT[:6], PROMPT[2:9], PROMPT[::-1]]
    alone = [generate(compiled, Drafter(vocab_size=0), p, max_new_tokens=12).output_ids for p in prompts]
    queue = iter([Request(prompt_ids=p, max_new_tokens=12, drafter=Drafter(vocab_size=0), tag=i)
                  for i, p in enumerate(prompts)])
    done = {req.tag: rec.output_ids for req, rec in decode_batch(compiled, lambda: next(queue, None), batch_size=4)}
    assert [done[i] for i in range(len(prompts))] == alone


class Chains(Drafter):
    """Chains of 0, 1, … 9 guesses in turn (blocks of every width up to 16), whatever the target says."""

    name = "chains"

    def __init__(self) -> None:
        self.turn = 0

    def propose(self, state):
        self.turn += 1
        k = self.turn % 10
        return Draft(tokens=[(7 * self.turn + i) % VOCAB for i in range(k)], parents=list(range(-1, k - 1))) if k else None


def test_after_warm_up_no_request_compiles_again():
    """Once :meth:`CompiledTarget.warm` has run, requests of other prompt lengths and limits (other spans, other
    cache capacities) at every width up to 16 run on the graphs already compiled: a recompilation raises."""
    model = build()
    compiled = CompiledTarget(model)
    compiled.warm(1)
    shapes, spent = set(compiled.compiled), compiled.compile_s
    with torch._dynamo.config.patch(error_on_recompile=True):
        for prompt, new in ((PROMPT, 30), (PROMPT * 12, 50), (PROMPT[:2], 9)):
            ours = generate(compiled, Chains(), prompt, max_new_tokens=new).output_ids
            assert ours == generate(Target(model), Drafter(vocab_size=0), prompt, max_new_tokens=new).output_ids
    assert compiled.compiled == shapes and compiled.compile_s == spent


def test_inductor_decodes_as_eager_and_a_second_decode_compiles_nothing():
    """The real compiler: greedy output equal to transformers' forward; once every width the decode visits has
    been compiled, decoding again recompiles nothing (torch raises on a recompilation)."""
    model = build()
    compiled = CompiledTarget(model)
    ours = generate(compiled, Drafter(vocab_size=0), PROMPT, max_new_tokens=10).output_ids
    assert ours == generate(Target(model), Drafter(vocab_size=0), PROMPT, max_new_tokens=10).output_ids
    shapes, spent = set(compiled.compiled), compiled.compile_s
    assert shapes and spent > 0
    with torch._dynamo.config.patch(error_on_recompile=True):
        again = generate(compiled, Drafter(vocab_size=0), PROMPT, max_new_tokens=10).output_ids
    assert again == ours and compiled.compiled == shapes and compiled.compile_s == spent
