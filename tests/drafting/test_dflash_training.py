"""Training a DFlash drafter (:mod:`specbench.drafting.dflash_training`): the blocks of one sequence share a forward
under a mask that shows each what decoding would, and a drafter trained on a tiny target drafts what it agrees
with, verified losslessly by ``method=dflash``."""

from __future__ import annotations

import pytest
import torch

from specbench.drafting import dflash_training as training
from specbench.drafting.dflash import DFlashNet
from specbench.drafting.dflash_files import load_dflash, save_dflash, shape_for
from specbench.drafting.dflash_training import accepted, anchors_of, block_mask, block_states, train
from specbench.drafting.eagle_training import features_of


def test_each_block_sees_the_context_before_its_anchor_and_itself():
    mask = block_mask(torch.tensor([1, 3]), context=4, block=2)
    assert mask.int().tolist() == [
        [1, 0, 0, 0, 1, 1, 0, 0],
        [1, 0, 0, 0, 1, 1, 0, 0],
        [1, 1, 1, 0, 0, 0, 1, 1],
        [1, 1, 1, 0, 0, 0, 1, 1],
    ]


def test_anchors_are_answer_positions_with_a_next_token():
    gen = torch.Generator().manual_seed(0)
    assert anchors_of(10, 4, 100, gen).tolist() == [4, 5, 6, 7, 8]
    assert anchors_of(10, 0, 100, gen).tolist() == list(range(1, 9))  # the first block sees some context
    drawn = anchors_of(200, 10, 16, gen)
    assert drawn.numel() == 16 and len(set(drawn.tolist())) == 16 and drawn.min() >= 10 and drawn.max() <= 198
    assert drawn.tolist() == sorted(drawn.tolist())
    assert anchors_of(5, 4, 8, gen).numel() == 0


def test_accepted_counts_the_leading_agreeing_guesses():
    right = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
    judged = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    assert accepted(right & judged, judged).tolist() == [2, 0, 2]


def test_blocks_in_one_forward_equal_decodings_drafts(tiny_llama, monkeypatch):
    """Every anchor's block drafted in the shared forward equals the block drafted as decoding does: the
    context before the anchor, then the block alone; with every key visible (the mask left out) it does not."""
    model, embed = tiny_llama.model, tiny_llama.model.get_input_embeddings()
    torch.manual_seed(0)
    net = DFlashNet(shape_for(model.config, layers=2, block=4)).eval()
    ids = torch.randint(0, 120, (20,))
    features = torch.randn(20, len(net.s.taps) * net.s.hidden)
    anchors = torch.tensor([2, 7, 8, 15, 18])
    with torch.no_grad():
        shared = block_states(net, embed, features, ids, anchors)
        for i, a in enumerate(anchors.tolist()):
            tokens = torch.tensor([int(ids[a])] + [net.s.mask_token] * 3)
            alone, _ = net(features[:a], embed(tokens), torch.arange(a + 4))
            torch.testing.assert_close(shared[i], alone, atol=1e-5, rtol=1e-4)
        monkeypatch.setattr(training, "block_mask", lambda a, t, b: torch.ones(a.numel() * b, t + a.numel() * b,
                                                                                dtype=torch.bool))
        unmasked = block_states(net, embed, features, ids, anchors)
    assert not torch.allclose(unmasked, shared, atol=1e-3)


def _own_text(model, n: int, length: int) -> list[list[int]]:
    """The target's own greedy continuations of short random prompts (what decoding will verify against)."""
    gen = torch.Generator().manual_seed(1)
    out = []
    with torch.no_grad():
        for _ in range(n):
            ids = torch.randint(5, 120, (1, 4), generator=gen)
            for _ in range(length - 4):
                ids = torch.cat([ids, model(input_ids=ids).logits[:, -1:].argmax(-1)], 1)
            out.append(ids[0].tolist())
    return out


def _periodic(n: int, length: int) -> list[list[int]]:
    """Cyclic shifts of one random 7-token pattern: text whose next tokens a small drafter can learn to guess."""
    pattern = torch.randint(5, 120, (7,), generator=torch.Generator().manual_seed(1)).tolist()
    return [(pattern * (length // 7 + 2))[i % 7 : i % 7 + length] for i in range(n)]


def _fit(model, sequences: list[list[int]], heldout: int, epochs: int, lr: float):
    shape = shape_for(model.config, layers=1, block=4)
    layers = (shape.taps[0] + 1, -1)
    data = [(ids, feats, 2) for ids, feats in features_of(model, sequences, layers, progress=False)]
    torch.manual_seed(0)
    net = DFlashNet(shape)
    lm_weight = model.get_output_embeddings().weight.detach().float()
    state = train(net, lm_weight, model.get_input_embeddings(), data[heldout:], data[:heldout] or data[:1],
                  layers[:1], epochs=epochs, lr=lr, anchors=16, progress=False)
    return net, state


def test_training_raises_the_heldout_agreement(tiny_llama):
    """On text with a pattern, held out from training: the drafter's guesses come to agree with the target's."""
    _, state = _fit(tiny_llama.model, _periodic(14, 40), heldout=4, epochs=12, lr=1e-2)
    first, best = state["history"][0], min(state["history"], key=lambda h: h["heldout_loss"])
    assert best["heldout_loss"] < first["heldout_loss"]  # (a random target's near-uniform labels: a small step)
    assert best["accepted"] > first["accepted"] + 1.0  # of at most 3 guesses a block
    assert len(best["agree_by_position"]) == 3 and min(best["agree_by_position"]) > 0.5


def test_a_trained_drafter_drafts_for_method_dflash_losslessly(tiny_llama, tmp_path):
    """Trained on the target's own greedy text, then decoding a prompt of it: the drafter's guesses are accepted
    (more tokens a step than an untrained drafter's), and the output is the target's, token for token."""
    from methods.registry import build_method_config, get_method
    from specbench.core.decode import generate
    from specbench.core.draft import DrafterContext
    from specbench.core.forward import Target
    from specbench.drafting.dflash_files import random_dflash

    model = tiny_llama.model
    texts = _own_text(model, 6, 40)
    net, _ = _fit(model, texts, heldout=0, epochs=30, lr=3e-3)
    folder = save_dflash(net, tmp_path / "trained", model.config.vocab_size)
    prompt = texts[0][:12]
    assert load_dflash(folder, model.config.vocab_size, model.config.num_hidden_layers).s.block == 4
    target = Target(model)
    auto = generate(target, get_method("autoregressive")(None, vocab_size=model.config.vocab_size), prompt,
                    max_new_tokens=24)
    taus = {}
    for name, head in (("trained", folder), ("random", random_dflash(model.config, tmp_path / "r", block=4))):
        context = DrafterContext(target_model=model, target_name="tiny-llama")
        drafter = get_method("dflash")(build_method_config("dflash", {"head": str(head)}),
                                       vocab_size=model.config.vocab_size, context=context)
        rec = generate(target, drafter, prompt, max_new_tokens=24)
        assert rec.output_ids == auto.output_ids
        taus[name] = len(rec.output_ids) / len(rec.step_tokens)
    assert taus["trained"] > taus["random"] + 0.3


@pytest.mark.slow  # ~20 s (two runs of the command, each composing its config and reading the training text)
def test_the_training_command_writes_a_drafter_where_method_dflash_finds_it(tmp_path, monkeypatch, capsys):
    """``specbench train-head --kind dflash`` (``make train-dflash``) on the tiny Llama: a drafter in
    speculators' layout where ``head: trained`` finds it, training.json with the held-out history; run again, it
    resumes from its checkpoint."""
    import json

    from specbench.cli.eagle_head import main
    from specbench.drafting.eagle_drafter import trained_head_dir

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    args = ["model=tiny-llama", "--kind", "dflash", "--conversations", "6", "--max-len", "48", "--epochs", "2",
            "--block", "4", "--anchors", "8"]
    out = main(args)
    assert out == trained_head_dir("tiny-llama", "dflash")
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "dflash" and config["block_size"] == 4
    meta = json.loads((out / "training.json").read_text())
    assert meta["conversations"] == 6 and [h["epoch"] for h in meta["history"]] == [0, 1, 2]
    assert {"accepted", "agree_by_position"} <= set(meta["history"][-1])
    net = load_dflash(out, 128, 2)
    assert net.s.block == 4 and net.s.mask_token == 127
    main(args)
    assert "resuming after epoch 2" in capsys.readouterr().out
