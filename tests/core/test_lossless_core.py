"""The shared lossless checks applied to the core itself, with drafts that are often wrong."""

import numpy as np
import pytest

from specbench.core.acceptance import SamplingParams
from specbench.core.draft import Draft, Drafter
from tests.lossless import SMALL_VOCAB, assert_sampling_preserves_distribution, small_vocab_target


class RandomTree(Drafter):
    """Random two-branch trees with random auxiliary nodes: right only by chance."""

    def __init__(self, rng):
        super().__init__(vocab_size=SMALL_VOCAB)
        self.rng = rng

    def propose(self, state):
        seqs = [list(self.rng.integers(0, SMALL_VOCAB, size=3)) for _ in range(2)]
        draft = Draft.from_sequences(seqs, ["a", "b"])
        draft.aux_tokens = list(self.rng.integers(0, SMALL_VOCAB, size=2))
        draft.aux_positions = [1, 2]
        draft.aux_visible = np.array([[0, 0], [1, 0]], dtype=bool)
        return draft


@pytest.mark.parametrize(
    "params", [SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, top_p=0.9)]
)
def test_random_trees_keep_the_target_distribution(params):
    rng = np.random.default_rng(0)
    assert_sampling_preserves_distribution(lambda: RandomTree(rng), params)


@pytest.mark.slow
def test_random_trees_keep_the_distribution_of_a_real_transformer():
    rng = np.random.default_rng(1)
    assert_sampling_preserves_distribution(
        lambda: RandomTree(rng), SamplingParams(temperature=1.0), target=small_vocab_target(), trials=1500
    )


class SharedNode(Drafter):
    """Proposes, every step, two sequences that share their first token: [t, x] by "a", [t, y] by "b",
    where t is the bigram target's greedy next token (so the shared node is accepted) and x, y are wrong."""

    def __init__(self, target):
        super().__init__(vocab_size=SMALL_VOCAB)
        self.table = target.table

    def propose(self, state):
        t = int(self.table[state.tokens[-1]].argmax())
        after = int(self.table[t].argmax())
        x, y = [v for v in range(SMALL_VOCAB) if v != after][:2]
        draft = Draft.from_sequences([[t, x], [t, y]], ["a", "b"])
        draft.lookup_s = 0.25
        return draft


def test_a_node_two_sources_proposed_counts_for_both():
    from specbench.core.decode import generate
    from tests.lossless import BigramTarget

    target = BigramTarget()
    rec = generate(target, SharedNode(target), [1, 2, 3], max_new_tokens=9)
    steps = rec.steps - 1  # decode steps; each accepts the shared node and then the target's token
    assert rec.step_tokens[1:] == [2] * steps
    # per step: the shared node (a and b) + x (a) + y (b) drafted; the shared node accepted
    assert rec.drafted_by_source == {"a": 2 * steps, "b": 2 * steps}
    assert rec.accepted_by_source == {"a": steps, "b": steps}
    assert rec.accepted_by_position == {1: steps}
    assert rec.step_lookup_s == [0.0] + [0.25] * steps


class Recorder(RandomTree):
    """RandomTree that keeps every VerifyResult it is given."""

    def __init__(self, rng):
        super().__init__(rng)
        self.results = []

    def update(self, result):
        self.results.append(result)


def test_update_gets_the_logits_of_the_root_and_every_guess():
    from specbench.core.decode import generate
    from tests.lossless import BigramTarget

    target = BigramTarget()
    drafter = Recorder(np.random.default_rng(2))
    generate(target, drafter, [1, 2, 3], max_new_tokens=12)
    assert drafter.results
    for res in drafter.results:
        n = len(res.draft.tokens)
        assert res.logits.shape == (1 + n, SMALL_VOCAB)
        # the bigram target's row after a node is its token's row; the root's is the root token's
        root = res.root_logits
        assert np.allclose(res.logits[0].numpy(), root.numpy())
        for i, tok in enumerate(res.draft.tokens):
            assert np.allclose(res.logits[1 + i].numpy(), target.table[tok].numpy())
        assert res.aux_logits.shape[0] == res.draft.n_aux  # aux rows stay apart
