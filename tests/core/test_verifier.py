"""The acceptance rule on hand-built logits (no model)."""

import numpy as np
import pytest
import torch

from specbench.core.acceptance import SamplingParams, accept, target_probs
from specbench.core.draft import Draft

V = 8
GREEDY = SamplingParams()


def onehot_logits(rows: list[int]) -> torch.Tensor:
    """Logits whose argmax in row r is rows[r]."""
    logits = torch.zeros(len(rows), V)
    for r, tok in enumerate(rows):
        logits[r, tok] = 5.0
    return logits


def test_greedy_match_then_target_token():
    draft = Draft.chain([3, 4, 5], "prompt")
    # root→3 ✓, after 3 → 4 ✓, after 4 → 6 ✗ (guess was 5)
    path, tokens = accept(draft, onehot_logits([3, 4, 6, 0]), GREEDY)
    assert path == [0, 1]
    assert tokens == [3, 4, 6]


def test_greedy_early_miss_yields_one_token():
    draft = Draft.chain([3, 4, 5], "prompt")
    path, tokens = accept(draft, onehot_logits([2, 4, 5, 0]), GREEDY)
    assert path == []
    assert tokens == [2]


def test_greedy_full_match_plus_bonus():
    draft = Draft.chain([3, 4, 5], "prompt")
    path, tokens = accept(draft, onehot_logits([3, 4, 5, 7]), GREEDY)
    assert path == [0, 1, 2]
    assert tokens == [3, 4, 5, 7]


def test_greedy_multi_branch_tree_picks_matching_branch():
    # Two branches from the root: [1, 2] and [3, 4, 5]; sequences merge shared prefixes.
    draft = Draft.from_sequences([[1, 2], [3, 4, 5], [3, 4, 6]], ["fwd_dict", "bwd_dict", "pool"])
    assert draft.tokens == [1, 2, 3, 4, 5, 6]
    assert draft.parents == [-1, 0, -1, 2, 3, 3]
    # nodes 3 and 4 are on both the bwd_dict and the pool sequence: both sources are kept
    both = ("bwd_dict", "pool")
    assert draft.sources == ["fwd_dict", "fwd_dict", both, both, "bwd_dict", "pool"]
    assert draft.sources_of(2) == both and draft.sources_of(0) == ("fwd_dict",)
    # rows: root, after 1, after 2, after 3, after 4, after 5, after 6
    logits = onehot_logits([3, 0, 0, 4, 6, 0, 2])
    path, tokens = accept(draft, logits, GREEDY)
    assert path == [2, 3, 5]
    assert tokens == [3, 4, 6, 2]


def test_auxiliary_nodes_never_accepted():
    draft = Draft(
        tokens=[3],
        parents=[-1],
        sources=["pool"],
        aux_tokens=[4, 5],
        aux_positions=[1, 2],
        aux_visible=np.array([[1, 0], [1, 1]], dtype=bool),
    )
    # Only the guess rows are passed to accept(); the aux token 4 at row 1 would match nothing.
    path, tokens = accept(draft, onehot_logits([4, 0]), GREEDY)
    assert path == []
    assert tokens == [4]


def test_children_and_depths():
    draft = Draft(tokens=[1, 2, 3, 4], parents=[-1, 0, 0, -1])
    assert draft.children() == [[0, 3], [1, 2], [], [], []]
    assert draft.depths() == [1, 2, 2, 1]
    with pytest.raises(ValueError):
        Draft(tokens=[1, 2], parents=[1, -1]).depths()


def test_top_k_and_top_p_shape_the_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    p = target_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    # top_p = 0.8: 0.5 + 0.3 reaches 0.8, so the last two go.
    p = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.8))
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    p = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.81))
    assert p[0, 2] > 0 and p[0, 3] == 0
    p = target_probs(logits, SamplingParams(temperature=0.5))
    expected = torch.tensor([0.5, 0.3, 0.15, 0.05]) ** 2
    assert torch.allclose(p[0], expected / expected.sum(), atol=1e-6)
    assert target_probs(logits[:, [2, 0, 1]], SamplingParams()).tolist() == [[0.0, 1.0, 0.0]]  # greedy: one-hot


@pytest.mark.parametrize("bad", [dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1)])
def test_bad_sampling_params(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)
