"""``forward=compiled`` on a GPU: each verification step a CUDA graph (:mod:`specbench.core.graphs`).

Where no CUDA runs, a graph is rehearsed: captured by running the step once with host reads made errors, and
replayed by running it again on the same input buffers and copying the results into the same output tensors,
so callers see what a replayed graph gives them. The checks here run that rehearsal on the CPU and on a
simulated GPU (:mod:`tests.simgpu`): the graphed step gives the direct step's logits; after warm-up no request
captures another graph and every buffer a graph reads or writes keeps its address; outputs poisoned after a
step change nothing a caller kept (and the check fails when a caller keeps a graph's buffer).
"""

from __future__ import annotations

import pytest
import torch

from specbench.core import engine, graphs
from specbench.core.decode import generate
from specbench.core.draft import Draft, Drafter
from specbench.core.engine import WIDTHS, CompiledTarget
from specbench.core.forward import Target
from specbench.core.graphs import SPAN_STEP, span_bucket
from tests.core.test_engine import AUX, PROMPT, TREE, build
from tests.methods.test_simulated_gpus import load_on, save_tiny
from tests.simgpu import simulated_gpus


class Chains(Drafter):
    """Drafts ``k`` copies of the last token as a chain, ``k`` cycling through 1..16 (every width up to 16)."""

    def __init__(self) -> None:
        super().__init__(vocab_size=0)
        self.k = 0

    def propose(self, state) -> Draft:
        self.k = self.k % 16 + 1
        return Draft(tokens=[state.tokens[-1]] * self.k, parents=list(range(-1, self.k - 1)))


def test_a_span_rounds_up_to_its_bucket_within_the_cache():
    assert [span_bucket(s, 10_000) for s in (1, SPAN_STEP, SPAN_STEP + 1, 1000)] == [256, 256, 512, 1024]
    assert span_bucket(1000, 900) == 900  # never past the buffer


@pytest.fixture(scope="module")
def targets():
    model = build()
    return Target(model), CompiledTarget(model, backend="eager"), CompiledTarget(model, backend="eager", graphs=True)


@pytest.mark.parametrize("draft", [TREE, AUX], ids=["tree", "aux"])
def test_a_graphed_step_gives_the_logits_and_features_of_the_direct_one(targets, draft):
    outs = []
    with torch.inference_mode():
        for t in targets:
            cache = t.new_cache(1, limit=300)
            t.prefill(PROMPT, cache)
            outs.append((t.forward_draft(7, draft, cache, features=(1, -1)), dict(t.features)))
    assert targets[2]._graphs, "the step ran without a graph"
    for (_, _, n, w, span), graph in targets[2]._graphs.items():  # no mask copied in: it is made in the graph
        assert all(not t.is_floating_point() and t.numel() <= n * w * w for t in graph.inputs), (span, [
            (t.dtype, tuple(t.shape)) for t in graph.inputs])
    for logits, features in outs[1:]:
        torch.testing.assert_close(logits, outs[0][0], atol=1e-4, rtol=1e-4)
        for layer in (1, -1):
            torch.testing.assert_close(features[layer], outs[0][1][layer], atol=1e-4, rtol=1e-4)


def test_greedy_decoding_with_graphs_is_autoregressive_decoding(targets):
    eager, _, graphed = targets
    expected = generate(eager, Drafter(vocab_size=0), PROMPT, max_new_tokens=40).output_ids
    assert generate(graphed, Drafter(vocab_size=0), PROMPT, max_new_tokens=40).output_ids == expected
    assert generate(graphed, Chains(), PROMPT, max_new_tokens=40).output_ids == expected


def kept_after_poison(target: CompiledTarget) -> tuple[bool, bool]:
    """A step's logits and features, then every graph's outputs poisoned: (logits unchanged, features unchanged)."""
    with torch.inference_mode():
        cache = target.new_cache(1, limit=300)
        target.prefill(PROMPT, cache)
        logits = target.forward_draft(7, TREE, cache, features=(1,))
        kept, first = logits.clone(), target.features[1].clone()
        for graph in target._graphs.values():
            graph.poison()
        return torch.equal(logits, kept), torch.equal(target.features[1], first)


def test_outputs_a_caller_keeps_survive_the_next_replay_and_a_kept_buffer_is_caught(targets, monkeypatch):
    assert kept_after_poison(targets[2]) == (True, True)
    monkeypatch.setattr(graphs, "copy_out", lambda t: t)  # features handed out as the graph's own buffer
    assert kept_after_poison(targets[2]) == (True, False)


@pytest.fixture(scope="module")
def on_gpu(tmp_path_factory):
    saved = save_tiny(tmp_path_factory.mktemp("tiny8"))
    return saved, load_on(saved, 1)


def test_on_a_gpu_warm_up_captures_every_graph_and_no_address_moves(on_gpu):
    """On a simulated GPU: warm-up captures every width at every span bucket up to the limit; requests after
    it capture nothing, take the same cache buffer again, keep every graph's buffers where they were, do no
    host read inside a step (the rehearsal raises on one) and no pageable upload, and decode as autoregressive
    decoding does."""
    saved, lm = on_gpu
    prompt = lm.tokenizer.encode("def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return")
    with simulated_gpus(1) as sim:
        target = CompiledTarget(lm.model)
        assert target.graphed
        seconds = target.warm(1, limit=300)  # a cache of 428 entries: spans 256 and 428
        assert seconds > 0 and len(target._graphs) == 2 * len(WIDTHS)
        before = {key: graph.addresses() for key, graph in target._graphs.items()}
        ar = generate(target, Drafter(vocab_size=0), prompt, max_new_tokens=24).output_ids
        mark = sim.traffic.snapshot()
        chains = generate(target, Chains(), prompt, max_new_tokens=24)
        traffic = sim.traffic - mark
        after = {key: graph.addresses() for key, graph in target._graphs.items()}
    assert chains.output_ids == ar
    assert after == before and 0 not in sum(before.values(), [])
    assert not traffic.pageable_sites, dict(traffic.pageable_sites)
    steps = len(chains.step_tokens)
    # one host read a step, the verified tokens (the prefill's first token included): none in the forward
    assert traffic.syncs == steps and all("acceptance.py" in site for site in traffic.sync_sites), (
        traffic.syncs, steps, dict(traffic.sync_sites))


@pytest.mark.parametrize("kind", ["eagle3", "medusa", "sps", "dflash"])
def test_on_a_gpu_a_head_step_reads_the_host_twice_with_its_heads_a_graph(on_gpu, tmp_path, kind):
    """On a simulated GPU with graphs: an EAGLE-3 step is the head's catch-up, the tree's graph and the
    verification's; a Medusa step the heads' graph and the verification's; a self-draft's its catch-up and
    chain as graphs of the kept layers, then the verification's; a DFlash step its block's graph and the
    verification's (each graph rehearsed with host reads made
    errors). Two host reads a drafting step (the draft's, the verified tokens'), no pageable upload; the output
    is autoregressive decoding's."""
    from methods.dflash import DFlash, DFlashConfig
    from methods.eagle3 import Eagle3, Eagle3Config
    from methods.medusa import Medusa, MedusaConfig
    from methods.sps import SpeculativeSampling, SpSConfig
    from specbench.core.draft import DrafterContext
    from specbench.drafting.eagle_drafter import random_head

    saved, lm = on_gpu
    prompt = lm.tokenizer.encode("def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return")
    head = "" if kind == "sps" else str(random_head(kind, lm.model.config, tmp_path / "head"))
    cls, config = {"eagle3": (Eagle3, Eagle3Config(head=head, depth=3, top_k=2, total_tokens=6)),
                   "medusa": (Medusa, MedusaConfig(head=head, nodes=8)),
                   "sps": (SpeculativeSampling, SpSConfig(self_skip_layers=[1], k=3)),
                   "dflash": (DFlash, DFlashConfig(head=head, block=4))}[kind]
    with simulated_gpus(1) as sim:
        target = CompiledTarget(lm.model)
        ar = generate(target, Drafter(vocab_size=0), prompt, max_new_tokens=16).output_ids
        context = DrafterContext(target_model=lm.model, target_name="tiny", graphs=target.graphed)
        drafter = cls(config, vocab_size=lm.vocab_size, context=context)
        generate(target, drafter, prompt, max_new_tokens=4)  # captures
        mark = sim.traffic.snapshot()
        rec = generate(target, drafter, prompt, max_new_tokens=16)
        traffic = sim.traffic - mark
    graphed = {"eagle3": lambda: drafter.trees.graphs, "medusa": lambda: drafter.graphs,
               "sps": lambda: drafter.lm.graphed.engine._graphs, "dflash": lambda: drafter.graphs.graphs}[kind]()
    assert graphed and rec.output_ids == ar
    assert not traffic.pageable_sites, dict(traffic.pageable_sites)
    drafted = sum(1 for d in rec.step_drafted[1:] if d)
    assert drafted and traffic.syncs == len(rec.step_tokens) + drafted, (traffic.syncs, dict(traffic.sync_sites))


def test_a_gpu_with_graphs_is_not_refused_but_a_split_model_is():
    assert engine.supported(build()) is None
    from specbench.run.config import _check_forward
    from tests.conftest import model_cfg

    cfg = model_cfg("tiny-llama")
    from omegaconf import OmegaConf

    run = OmegaConf.create({"forward": "compiled", "model": cfg,
                            "hardware": {"device": "cuda", "device_map": "auto", "num_gpus": 2}})
    with pytest.raises(engine.ConfigError, match="one device"):
        _check_forward(run)
    run.hardware.device_map, run.hardware.num_gpus = None, None
    _check_forward(run)
