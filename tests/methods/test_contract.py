"""Every registered method through the lossless checks: a new method cannot skip them.

Each method in ``method_names()`` runs with its default settings (plus what the lists below give the
methods that need a store, a trained head or a model of their own) through

* the greedy check: output equal to autoregressive decoding, token for token, on a tiny Llama;
* the sampling check: the first tokens' joint distribution against the target's exact one (chi-square);
* both again with ``forward=compiled`` (:class:`specbench.core.engine.CompiledTarget`, its static-shape path
  with torch.compile's ``eager`` backend): greedy at batch 1 and, for the methods that batch, at batch 4; the
  sampling check for the methods that verify through the real model;
* the greedy checks once more with each step a graph as on a GPU (rehearsed on the CPU), its outputs poisoned
  after every step.

A method missing from the lists below that cannot run on its defaults fails here, naming itself.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from methods.registry import build_method_config, get_method, method_names
from specbench.budget.costs import CostModel
from specbench.core.acceptance import SamplingParams
from specbench.core.decode import Request, decode_batch
from specbench.core.draft import DrafterContext
from specbench.core.engine import CompiledTarget
from specbench.core.reference import References
from specbench.drafting.acceptance_head import AcceptanceHead, save_head
from specbench.drafting.eagle_drafter import random_head
from specbench.stores.datastore import write_store
from tests.lossless import (
    SMALL_VOCAB,
    BigramModel,
    BigramTarget,
    assert_greedy_lossless,
    assert_sampling_preserves_distribution,
    autoregressive_output,
    counting_proposals,
    small_vocab_target,
)

# Methods that read a retrieval store: they get a small one over the 8-token vocabulary.
NEEDS_STORE = {"rest", "spectra_retrieval", "spectra", "lookahead_rest"}
# Methods that read a trained head: they get a randomly initialised one (the head only decides when a
# draft stops; what verification keeps does not depend on it).
NEEDS_HEAD = {"specdec_pp"}
# Methods that read the target's hidden states through a trained head: they get a random one for the target
# (what verification keeps does not depend on it); in the sampling check, one for the bigram target's states.
NEEDS_FEATURE_HEAD = {"eagle", "eagle3", "medusa", "dflash"}
# Methods that run a draft model: it is the target's first layer (self-draft), so they need a real model.
NEEDS_MODEL = {"sps", "specdec_pp"}
# Methods that never draft: they pass the checks trivially and are run anyway.
NEVER_DRAFTS = {"autoregressive"}
# Settings that make a method draft within the few tokens a sampling trial generates: Lookahead's pool
# otherwise fills only after its window has run for N - 1 steps.
QUICK_START = {"lookahead": {"pool_from_prompt": True}}

# Settings beside a method's defaults that change what it drafts: each runs through the greedy checks (eager,
# compiled, and graphed with its outputs poisoned) and the sampling check as the defaults do.
VARIANTS = {"dflash-best_first": ("dflash", {"tree": "best_first", "top_k": 3, "nodes": 10})}

TARGET_NAME = "small"
GREEDY_PROMPTS = [[1, 2, 3, 1, 2, 3, 1, 2], [5, 6, 7, 5, 6, 7, 5]]


def shipped_methods() -> list[str]:
    """The methods of the ``methods`` package (not drafters other test modules register)."""
    return [n for n in method_names() if get_method(n).__module__.startswith("methods.")]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    ident = {"name": "small", "vocab_size": SMALL_VOCAB, "vocab_sha256": "s" * 64}
    docs = [[1, 2, 3, 1, 2, 3, 4, 1, 2, 3], [2, 3, 4, 5, 6], [3, 1, 2, 0, 7, 1], [5, 6, 7, 5, 6, 7, 5, 6]]
    docs.append([t for a in range(SMALL_VOCAB) for b in range(SMALL_VOCAB) for t in (a, b)])  # every bigram
    return write_store(tmp_path_factory.mktemp("contract") / "s", docs, tokenizer=ident, source={},
                       progress=False).path


@pytest.fixture(scope="module")
def target():
    return small_vocab_target()


@pytest.fixture(scope="module")
def compiled(target, tmp_path_factory):
    """The same tiny Llama with ``forward=compiled`` (the static shapes, compiled with the eager backend), its
    one-token steps through packages compiled ahead of time, as a CPU run has them (built once, tens of seconds)."""
    return CompiledTarget(target.model, backend="eager", ahead=tmp_path_factory.mktemp("packages"))


class Poisoned(CompiledTarget):
    """``forward=compiled`` as a GPU runs it, each step a graph (rehearsed here), every graph's outputs filled
    with NaN after each step, as the next replay would overwrite them: a method that kept a graph's buffer
    decodes differently."""

    def _forward(self, *args, **kwargs):
        out = super()._forward(*args, **kwargs)
        for graph in self._graphs.values():
            graph.poison()
        return out


@pytest.fixture(scope="module")
def graphed(target):
    return Poisoned(target.model, backend="eager", graphs=True)


def _head(tmp_path, name: str, params: dict, hidden: int, greedy: bool) -> str:
    config = build_method_config(name, params)
    torch.manual_seed(0)
    path = tmp_path / f"{name}-{'greedy' if greedy else 'sampled'}.pt"
    save_head(path, AcceptanceHead(hidden, 2), {"target": TARGET_NAME, "draft": config.identity(),
                                                 "temperature": 0.0 if greedy else 1.0})
    return str(path)


def _maker(name, store, target, tmp_path, sampling: SamplingParams, model=None, settings: dict | None = None):
    """``model``: what the drafter reads as the target's model (default: ``target``'s own); ``settings``: beside
    the defaults (a variant's)."""
    model = model if model is not None else target.model
    params: dict = dict(QUICK_START.get(name, {})) if not sampling.greedy else {}
    params.update(settings or {})
    if name in NEEDS_STORE:
        params["datastore"] = str(store)
        if "refine" in {f for f in get_method(name).Config.__dataclass_fields__}:
            params["refine"] = False
    if name in NEEDS_MODEL:
        params["self_first_layers"] = 1
    if name in NEEDS_FEATURE_HEAD:
        params["head"] = str(random_head(get_method(name).KIND, model.config, tmp_path / f"{name}-head"))
    if name in NEEDS_HEAD:
        params["head_path"] = _head(tmp_path, name, params, target.model.config.hidden_size, sampling.greedy)
    config = build_method_config(name, params)
    cls = get_method(name)
    seeds = itertools.count()

    # the oracle drafts the greedy output of the target it is verified against (the bigram target when sampling)
    reference = References(target if sampling.greedy or name in NEEDS_MODEL else BigramTarget(), 64)

    loaded: list = []  # a head method's drafter, never decoded with: each one made is its twin

    def make():
        if name in NEEDS_FEATURE_HEAD and loaded:  # the head loaded once, each request its own twin (as a batch
            twin = loaded[0].spawn()  # makes them), with a seed of its own: a drafter that samples its guesses
            twin.seed = next(seeds)  # (dflash's chain) draws them independently in each trial
            return twin
        context = DrafterContext(sampling=sampling, target_model=model, target_name=TARGET_NAME,
                                 forward_cost=CostModel.flat(), reference=reference,
                                 graphs=bool(getattr(target, "graphed", False)))
        drafter = cls(config, vocab_size=SMALL_VOCAB, seed=next(seeds), context=context)
        if name not in NEEDS_FEATURE_HEAD:
            return drafter
        loaded.append(drafter)
        return drafter.spawn()

    return make


def test_the_lists_name_registered_methods():
    for group in (NEEDS_STORE, NEEDS_HEAD, NEEDS_FEATURE_HEAD, NEEDS_MODEL, NEVER_DRAFTS, set(QUICK_START)):
        assert group <= set(shipped_methods())


@pytest.mark.parametrize("forward", ["eager", "compiled"])
@pytest.mark.parametrize("name", shipped_methods())
def test_greedy_output_is_autoregressive(name, forward, store, target, compiled, graphed, tmp_path):
    on = target if forward == "eager" else compiled
    proposed: list[int] = []
    make = counting_proposals(_maker(name, store, on, tmp_path, SamplingParams()), proposed)
    records = assert_greedy_lossless(on, make, GREEDY_PROMPTS, 24)
    if name not in NEVER_DRAFTS:
        assert sum(proposed) > 0, f"{name} proposed nothing: the check saw no draft"
    if forward == "compiled":  # again with each step a graph, poisoned after it: outputs and steps unchanged
        poisoned = assert_greedy_lossless(graphed, _maker(name, store, graphed, tmp_path, SamplingParams()),
                                          GREEDY_PROMPTS, 24)
        assert [r.step_tokens for r in poisoned] == [r.step_tokens for r in records]  # a spoiled draft shows here


@pytest.mark.parametrize("name", shipped_methods())
def test_sampling_keeps_the_target_distribution(name, store, target, tmp_path):
    params = SamplingParams(temperature=1.0)
    proposed: list[int] = []
    # a bigram target (no model: fast) unless the method runs the target's own layers
    on = target if name in NEEDS_MODEL else BigramTarget()
    model = BigramModel() if name in NEEDS_FEATURE_HEAD else None  # heads read the bigram target's features
    make = counting_proposals(_maker(name, store, target, tmp_path, params, model), proposed)
    assert_sampling_preserves_distribution(make, params, target=on, trials=600 if name in NEEDS_MODEL else 1500,
                                           extra=2)
    if name not in NEVER_DRAFTS:
        assert sum(proposed) > 0, f"{name} proposed nothing: the check saw no draft"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_variant_keeps_greedy_output_and_the_target_distribution(variant, store, target, compiled, graphed,
                                                                     tmp_path):
    name, settings = VARIANTS[variant]
    steps = []
    for on in (target, compiled, graphed):
        proposed: list[int] = []
        make = counting_proposals(_maker(name, store, on, tmp_path, SamplingParams(), settings=settings), proposed)
        steps.append([r.step_tokens for r in assert_greedy_lossless(on, make, GREEDY_PROMPTS, 24)])
        assert sum(proposed) > 0, f"{variant} proposed nothing: the check saw no draft"
    assert steps[2] == steps[1]  # each step a graph, poisoned after it: a spoiled draft shows here
    params, proposed = SamplingParams(temperature=1.0), []
    make = counting_proposals(_maker(name, store, target, tmp_path / "sampled", params, BigramModel(), settings),
                              proposed)
    assert_sampling_preserves_distribution(make, params, target=BigramTarget(), trials=1500, extra=2)
    assert sum(proposed) > 0, f"{variant} proposed nothing: the check saw no draft"


BATCH_PROMPTS = [*GREEDY_PROMPTS, [2, 3, 4, 2, 3], [7, 1, 7, 1, 7, 1, 6], [4, 4, 5, 4, 4]]


@pytest.mark.parametrize("forward", ["compiled", "graphed"])
@pytest.mark.parametrize("name", [n for n in shipped_methods() if get_method(n).batchable])
def test_a_compiled_batch_of_4_gives_each_request_its_autoregressive_output(name, forward, store, compiled, graphed,
                                                                            tmp_path):
    compiled = graphed if forward == "graphed" else compiled
    first = _maker(name, store, compiled, tmp_path, SamplingParams())()  # a batch's drafters: its spawns
    queue = [Request(prompt_ids=p, max_new_tokens=16, drafter=first.spawn(), tag=i) for i, p in enumerate(BATCH_PROMPTS)]
    queue.reverse()
    done = {req.tag: rec.output_ids for req, rec in decode_batch(compiled, lambda: queue.pop() if queue else None,
                                                                   batch_size=4)}
    for i, prompt in enumerate(BATCH_PROMPTS):
        assert done[i] == autoregressive_output(compiled, prompt, 16), f"request {i} diverged"


@pytest.mark.parametrize("name", ["sps", "pld"])
def test_sampling_keeps_the_target_distribution_compiled(name, store, compiled, tmp_path):
    params = SamplingParams(temperature=1.0)
    make = _maker(name, store, compiled, tmp_path, params)
    assert_sampling_preserves_distribution(make, params, target=compiled, trials=600, extra=2)


@pytest.fixture(scope="module")
def inductor(target, tmp_path_factory):
    """The same tiny Llama with ``forward=compiled`` as a run has it: compiled with Inductor, its one-token steps
    ahead of time."""
    return CompiledTarget(target.model, ahead=tmp_path_factory.mktemp("inductor-packages"))


@pytest.mark.slow
@pytest.mark.parametrize("name", shipped_methods())
def test_greedy_output_is_autoregressive_under_inductor(name, store, inductor, tmp_path):
    make = _maker(name, store, inductor, tmp_path, SamplingParams())
    assert_greedy_lossless(inductor, make, GREEDY_PROMPTS, 24)
