"""The batched core: rows at their own lengths in one forward, the row cache, and continuous batching.

A batched forward must give each row the logits (and hidden states) it gets alone, whatever the other rows'
lengths and drafts; compaction, slot refills and moves must leave each row's cache as decoding it alone
would; a batch of requests must yield each request's own greedy output, and sampled outputs must keep the
target's distribution.
"""

from __future__ import annotations

import pytest
import torch

from specbench.core.acceptance import SamplingParams
from specbench.core.decode import Request, decode_batch, generate
from specbench.core.draft import Draft, Drafter
from specbench.core.forward import Target
from tests.core.test_tree_forward import build
from tests.lossless import SMALL_VOCAB, assert_sampling_preserves_distribution, small_vocab_target

TREE = Draft(tokens=[3, 4, 5, 6, 7], parents=[-1, 0, -1, 2, 2], sources=["t"] * 5)
CHAIN = Draft.chain([8, 9, 10], "t")
AUX = Draft(tokens=[11, 12], parents=[-1, 0], sources=["t"] * 2, aux_tokens=[13, 14, 15], aux_positions=[1, 2, 1],
            aux_visible=[[False, False, False], [True, False, False], [False, False, False]], aux_logit_rows=[0, 2])
# a prompt per row, of lengths that cross Gemma's window of 4 differently, and each row's draft
PROMPTS = [[5, 17, 33, 2, 71, 9, 40, 12, 61, 3], [44, 8, 19], [70, 1, 2, 3, 4, 5, 6], [90, 91, 92, 93, 94, 95]]
DRAFTS = [TREE, CHAIN, AUX, Draft()]


def alone(target: Target, prompt: list[int], draft: Draft, path: list[int]):
    """A row decoded in a cache of its own: the draft's logits, then the logits after committing ``path``."""
    cache = target.new_cache()
    target.prefill(prompt[:-1], cache)
    first = target.forward_draft(prompt[-1], draft, cache, features=(1, -1))
    features = target.features
    target.compact(cache, cache.lengths[0], path)
    second = target.forward_draft(99 % 96, Draft(tokens=[1], parents=[-1], sources=["t"]), cache)
    return first, features, second


PATHS = [[2, 3], [0, 1], [0], []]  # a path that moves entries forward, a chain's prefix, one guess, none


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_rows_in_one_forward_get_the_logits_and_states_each_gets_alone(kind):
    target = Target(build(kind))
    cache = target.new_cache(len(PROMPTS))
    for slot, prompt in enumerate(PROMPTS):
        target.prefill(prompt[:-1], cache, slot=slot)
    rows = target.forward_rows([p[-1] for p in PROMPTS], DRAFTS, cache, features=(1, -1))
    states = target.row_features
    cache.commit(0, [[0] + [1 + i for i in path] for path in PATHS])
    nxt = target.forward_rows([99 % 96] * 4, [Draft(tokens=[1], parents=[-1], sources=["t"])] * 4, cache)
    for r, (prompt, draft, path) in enumerate(zip(PROMPTS, DRAFTS, PATHS, strict=True)):
        first, features, second = alone(target, prompt, draft, path)
        assert rows[r].shape == first.shape
        torch.testing.assert_close(rows[r], first, atol=1e-5, rtol=1e-5)
        for layer in (1, -1):
            torch.testing.assert_close(states[r][layer], features[layer], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(nxt[r], second, atol=1e-5, rtol=1e-5)
    assert cache.lengths == [len(p) + len(path) for p, path in zip(PROMPTS, PATHS, strict=True)]  # + root - last


def test_the_cache_doubles_when_a_block_would_not_fit_and_keeps_what_it_held():
    target = Target(build("llama"))
    long = [(7 * i) % 96 for i in range(70)]
    cache = target.new_cache(2)
    target.prefill(long, cache, slot=0)
    target.prefill(long[:5], cache, slot=1)
    assert cache.capacity == 70
    rows = target.forward_rows([1, 2], [CHAIN, TREE], cache)  # 70 + 4 entries: the buffer doubles
    assert cache.capacity == 140
    for r, (prompt, draft) in enumerate([(long, CHAIN), (long[:5], TREE)]):
        ref = target.new_cache()
        target.prefill(prompt, ref)
        torch.testing.assert_close(rows[r], target.forward_draft(1 + r, draft, ref), atol=1e-5, rtol=1e-5)
    bounded = target.new_cache(1, limit=72)
    target.prefill(long, bounded)
    target.forward_draft(1, CHAIN, bounded)
    assert bounded.capacity == 74  # past the limit only by what a block needs, never doubled past it


def test_a_moved_row_and_a_refilled_slot_decode_as_they_would_alone():
    target = Target(build("gemma3"))
    cache = target.new_cache(3)
    for slot, prompt in enumerate(PROMPTS[:3]):
        target.prefill(prompt[:-1], cache, slot=slot)
    cache.move(2, 0)  # slot 0's request finished: the last row takes its place
    cache.clear(1)  # slot 1's request finished: the next one is prefilled there
    target.prefill(PROMPTS[3][:-1], cache, slot=1)
    rows = target.forward_rows([PROMPTS[2][-1], PROMPTS[3][-1]], [TREE, AUX], cache)
    for r, (prompt, draft) in enumerate([(PROMPTS[2], TREE), (PROMPTS[3], AUX)]):
        torch.testing.assert_close(rows[r], alone(target, prompt, draft, [])[0], atol=1e-5, rtol=1e-5)


class Script(Drafter):
    """Proposes the autoregressive continuation it was given (right guesses) with a wrong sibling, so every
    step verifies a tree and accepts several tokens."""

    def __init__(self, future: list[int]) -> None:
        super().__init__(vocab_size=96)
        self.future = future

    def propose(self, state):
        done = state.new_tokens
        ahead = self.future[done : done + 3][: max(state.max_depth, 0)]
        if not ahead:
            return None
        wrong = (ahead[0] + 1) % 96
        return Draft(tokens=[wrong, *ahead], parents=[-1, -1, *range(1, len(ahead))], sources=["t"] * (1 + len(ahead)))


@pytest.mark.parametrize("batch_size", [2, 3, 8])
def test_requests_decoded_together_each_get_their_own_greedy_output(batch_size):
    target = Target(build("gemma3"))
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 96, (n,), generator=gen).tolist() for n in (3, 14, 6, 9, 2, 11, 5)]
    lengths = [12, 3, 20, 1, 9, 15, 6]
    expected = [generate(target, Drafter(vocab_size=0), p, max_new_tokens=m).output_ids
                for p, m in zip(prompts, lengths, strict=True)]
    queue = [Request(p, m, Script(e) if i % 2 else Drafter(vocab_size=0), tag=i)
             for i, (p, m, e) in enumerate(zip(prompts, lengths, expected, strict=True))][::-1]
    got = {req.tag: rec for req, rec in decode_batch(target, lambda: queue.pop() if queue else None,
                                                     batch_size=batch_size)}
    assert [got[i].output_ids for i in range(len(prompts))] == expected
    assert sum(got[1].step_accepted) + sum(got[5].step_accepted) > 0  # the scripted rows accepted guesses


def test_a_freed_slot_takes_the_next_request_at_once_and_a_queued_follow_up_runs():
    """Continuous batching: a short request's slot is refilled while a long one decodes, and a request queued
    when another is handed back (a conversation's next turn) is decoded in the same batch."""
    target = Target(build("llama"))
    queue = [Request([1, 2, 3], 2, Drafter(vocab_size=0), tag="short"),
             Request([4, 5, 6, 7], 24, Drafter(vocab_size=0), tag="long"),
             Request([8, 9], 3, Drafter(vocab_size=0), tag="next")][::-1]
    seen = {}
    for req, rec in decode_batch(target, lambda: queue.pop() if queue else None, batch_size=2):
        seen[req.tag] = rec
        if req.tag == "short":  # its answer makes the next turn's prompt
            queue.insert(0, Request(req.prompt_ids + rec.output_ids, 4, Drafter(vocab_size=0), tag="turn 2"))
    assert set(seen) == {"short", "long", "next", "turn 2"}
    assert seen["next"].started_s < seen["long"].finished_s  # refilled before the long one ended
    assert seen["turn 2"].started_s < seen["long"].finished_s
    for tag, rec in seen.items():
        prompt = {"short": [1, 2, 3], "long": [4, 5, 6, 7], "next": [8, 9]}.get(tag, [1, 2, 3] + seen["short"].output_ids)
        assert rec.output_ids == generate(target, Drafter(vocab_size=0), prompt,
                                          max_new_tokens=len(rec.output_ids)).output_ids


class RandomTree(Drafter):
    """Two random branches of up to two guesses each over the 8-token vocabulary (deterministic guesses)."""

    def __init__(self, seed: int) -> None:
        super().__init__(vocab_size=SMALL_VOCAB)
        self.gen = torch.Generator().manual_seed(seed)

    def propose(self, state):
        depth = min(2, state.max_depth)
        if depth < 1:
            return None
        a, b, c, d = torch.randint(0, SMALL_VOCAB, (4,), generator=self.gen).tolist()
        if depth == 1:
            return Draft(tokens=[a, b], parents=[-1, -1], sources=["t"] * 2)
        return Draft(tokens=[a, c, b, d], parents=[-1, 0, -1, 2], sources=["t"] * 4)


def test_sampling_at_batch_4_keeps_the_target_distribution():
    """The real forward, mask and cache at batch 4 (rows at different steps and lengths, slots refilled, trees
    verified), chi-square against the exact joint of the first three tokens."""
    seeds = iter(range(10**6))
    assert_sampling_preserves_distribution(lambda: RandomTree(next(seeds)), SamplingParams(temperature=1.0),
                                           target=small_vocab_target(), trials=1500, batch_size=4, extra=2,
                                           min_depth=2)


def test_a_batch_size_below_one_is_refused():
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        next(decode_batch(Target(build("llama")), lambda: None, batch_size=0))


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_prompts_prefilled_together_get_what_each_gets_alone(kind):
    target = Target(build(kind))
    cache = target.new_cache(4)
    target.prefill(PROMPTS[0][:4], cache, slot=0)  # a row prefilled alone, decoded beside those prefilled together
    logits = target.prefill_rows(PROMPTS[1:4], cache, 1, features=(1, -1))
    assert logits.shape[0] == 3
    states = target.row_features
    for r, prompt in enumerate(PROMPTS[1:4]):
        ref = target.new_cache()
        torch.testing.assert_close(logits[r], target.prefill(prompt, ref, features=(1, -1)), atol=1e-5, rtol=1e-5)
        for layer in (1, -1):
            torch.testing.assert_close(states[r][layer], target.features[layer], atol=1e-5, rtol=1e-5)
    assert cache.lengths == [4, *(len(p) for p in PROMPTS[1:4])]
    nxt = target.forward_rows([7, 7, 7], [TREE, Draft(), CHAIN], cache)
    for r, (prompt, draft) in enumerate([(PROMPTS[0][:4], TREE), (PROMPTS[1], Draft()), (PROMPTS[2], CHAIN)]):
        ref = target.new_cache()
        target.prefill(prompt, ref)
        torch.testing.assert_close(nxt[r], target.forward_draft(7, draft, ref), atol=1e-5, rtol=1e-5)


def test_admitted_requests_share_a_prefill_in_runs_of_consecutive_slots(monkeypatch):
    from specbench.core import decode

    def req(n):
        return Request(list(range(n)), 4, Drafter(vocab_size=0))

    a, b, c, d = req(3), req(5), req(4), req(2)
    assert [[s for s, _ in g] for g in decode._runs([(3, d), (0, a), (1, b), (4, c)])] == [[0, 1], [3, 4]]
    monkeypatch.setattr(decode, "PREFILL_MASK", 2 * 5 * 5)  # two prompts of 5 fit, three do not
    assert [[s for s, _ in g] for g in decode._runs([(0, a), (1, b), (2, c)])] == [[0, 1], [2]]
