"""Every method decoded on simulated CUDA GPUs (:mod:`tests.simgpu`): one GPU, and the model split over 2 and 4
by ``device_map=auto`` through accelerate's real hooks, greedy and sampling, under ``budget=auto``.

The model is a tiny Llama of 8 layers saved to disk and loaded by :func:`specbench.models.load_model` as a
paper placement loads a 70B one (``hardware.device_map=auto``, ``num_gpus``, each GPU's free memory as its
share); heads are random heads written in their published formats and placed by the drafters themselves;
the draft-model methods run a self-draft of the target's first layers. Each output must equal the plain CPU
run's token for token (the simulated GPUs compute on the CPU), and each decode step's host syncs, counted as a
real GPU counts them (torch's sync debug mode's warnings, :mod:`specbench.gpucheck.syncs`), must stay within its
method's ceiling, greedy and sampling, and reach it.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import Counter

import pytest
import torch

import specbench.core.decode as decode_module
from methods.registry import build_method_config, get_method
from specbench.budget.batch import BatchBudget
from specbench.budget.costs import CostModel
from specbench.budget.planner import AutoBudget
from specbench.core.acceptance import SamplingParams
from specbench.core.decode import Request, decode_batch, generate
from specbench.core.draft import Draft, Drafter, DrafterContext, ScopedMemory
from specbench.core.forward import Target
from specbench.core.reference import References
from specbench.drafting.eagle_drafter import random_head
from specbench.gpucheck.syncs import batch_ceiling, ceilings, count, judge, step_syncs, sync_warnings
from specbench.models import load_model
from specbench.stores.datastore import write_store
from tests.conftest import CPU_SDPA, model_cfg
from tests.methods.test_contract import TARGET_NAME, _head, shipped_methods
from tests.simgpu import simulated_gpus

LAYERS = 8
VOCAB = 128
TOKENS = 16
# A GPU's cost curve at batch 1, flat: budget=auto plans every step and keeps whole trees and pools.
GPU_CURVE = CostModel.flat()
# At batch 4 a block of 16 tokens a row costs a fifth more than one, 128 four times as much: the batched
# planner keeps part of the larger trees and pools and trims the rest.
GPU_BATCH_CURVE = CostModel([1, 128], [0], [[0.02, 0.02]],
                            batches={4: CostModel([1, 16, 128], [0], [[0.02, 0.024, 0.08]])})
NEEDS_STORE = {"rest", "spectra_retrieval", "spectra", "lookahead_rest"}
FEATURE_HEADS = {"eagle": "eagle", "eagle3": "eagle3", "medusa": "medusa", "dflash": "dflash",
                 "dflash-best_first": "dflash", "sam_decoding-eagle": "eagle"}
DRAFT_MODEL = {"sps", "specdec_pp"}
# Methods as the presets run them, plus SAM-Decoding[EAGLE2] (sam_decoding with an EAGLE head below its threshold)
# and DFlash's block read as a best-first tree.
CASES = [*shipped_methods(), "sam_decoding-eagle", "dflash-best_first"]


def _method(case: str) -> str:
    return {"sam_decoding-eagle": "sam_decoding", "dflash-best_first": "dflash"}.get(case, case)


def save_tiny(path):
    """The tiny Llama's weights at ``path`` (so that a CUDA load takes ``from_pretrained``'s ``device_map``
    path): (path, bytes of weights, the model loaded on the CPU)."""
    cfg = model_cfg("tiny-llama", dtype="float32")
    cfg.tiny.num_hidden_layers = LAYERS
    lm = load_model(cfg, CPU_SDPA)
    lm.model.save_pretrained(path)
    lm.tokenizer.save_pretrained(path)
    size = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    return path, size, lm


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny8"))


def free_memory(size: int, gpus: int) -> int:
    """Each GPU's free bytes: a 1/N share of the model with some room, so ``device_map=auto`` uses all N."""
    return int(size / gpus * 1.5) if gpus > 1 else None


def load_on(saved, gpus: int):
    """The tiny model on ``gpus`` simulated GPUs (0: the plain CPU)."""
    path, size, lm = saved
    if gpus == 0:
        return lm
    cfg = model_cfg("tiny-llama", dtype="float32", tiny=None, path=str(path))
    hw = {"device": "cuda", "attn_implementation": "sdpa", "device_map": "auto" if gpus > 1 else None,
          "num_gpus": gpus if gpus > 1 else None}
    with simulated_gpus(gpus, free_memory(size, gpus)):
        return load_model(cfg, hw)


@pytest.fixture(scope="module")
def models(saved):
    return {n: load_on(saved, n) for n in (0, 1, 2, 4)}


def make_store(path, lm):
    ident = {"name": "tiny", "vocab_size": VOCAB, "vocab_sha256": "t" * 64}
    text = prompt(lm)
    # the random model's own continuation, so that retrieval finds what it is about to say
    said = generate(Target(lm.model), Drafter(vocab_size=0), text, max_new_tokens=2 * TOKENS).output_ids
    docs = [text + said, lm.tokenizer.encode("the cat sat on the mat " * 4)]
    return write_store(path, docs, tokenizer=ident, source={}, progress=False).path


def make_heads(root, config) -> dict:
    """Random EAGLE, EAGLE-3, Medusa and DFlash drafters for the target, in their published layouts (and their folder)."""
    return {"dir": root, **{kind: str(random_head(kind, config, root / kind))
                            for kind in ("eagle", "eagle3", "medusa", "dflash")}}


@pytest.fixture(scope="module")
def store(tmp_path_factory, saved):
    return make_store(tmp_path_factory.mktemp("store") / "s", saved[2])


@pytest.fixture(scope="module")
def heads(tmp_path_factory, saved):
    return make_heads(tmp_path_factory.mktemp("heads"), saved[2].model.config)


def prompt(lm) -> list[int]:
    text = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return"
    return lm.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            return_dict=False)


def maker(case: str, model: torch.nn.Module, sampling: SamplingParams, store, heads, **params):
    name = _method(case)
    if name in NEEDS_STORE:
        params["datastore"] = str(store)
        if "refine" in get_method(name).Config.__dataclass_fields__:
            params["refine"] = False
    if case in FEATURE_HEADS:
        params["head"] = heads[FEATURE_HEADS[case]]
    if case == "sam_decoding-eagle":
        params["auxiliary"] = "eagle"
    if case == "dflash-best_first":
        params["tree"] = "best_first"
    if name in DRAFT_MODEL:
        params["self_first_layers"] = 2
    if name == "specdec_pp":  # a random acceptance head: it only decides where drafts stop
        params["head_path"] = _head(heads["dir"], name, params, model.config.hidden_size, sampling.greedy)
    if name == "lookahead" and not sampling.greedy:
        params["pool_from_prompt"] = True
    config = build_method_config(name, params)
    cls = get_method(name)
    seeds = itertools.count()

    reference = References(Target(model), TOKENS)  # the oracle's (made before its first proposal): no run is longer

    def make():
        context = DrafterContext(sampling=sampling, target_model=model, target_name=TARGET_NAME,
                                 forward_cost=GPU_CURVE, reference=reference)
        return cls(config, vocab_size=VOCAB, seed=next(seeds), context=context)

    return make, cls


class StepTraffic:
    """Wraps a drafter so that each decode step's host traffic (from one proposal to the next) is kept."""

    def __init__(self, drafter, sim) -> None:
        self.sim, self.marks = sim, []
        propose = drafter.propose

        def marked(state):
            self.marks.append(sim.traffic.snapshot())
            return propose(state)

        drafter.propose = marked

    def steps(self):
        ends = [*self.marks[1:], self.sim.traffic.snapshot()]
        return [b - a for a, b in zip(self.marks, ends, strict=True)]


def decode(case, lm, sampling, store, heads, sim=None, tokens=TOKENS, extra_read=False):
    """One generation under budget=auto; on simulated GPUs (``sim``) with each step's traffic kept (the returned
    watch) and its syncs counted from the sync debug mode's warnings (``watch.counts``); ``extra_read``: the
    drafter reads one more GPU value a step (a method that broke its ceiling)."""
    make, cls = maker(case, lm.model, sampling, store, heads)
    drafter = make()
    if extra_read:
        propose = drafter.propose
        drafter.propose = lambda state: (torch.ones((), device="cuda:0").item(), propose(state))[1]
    watch = StepTraffic(drafter, sim) if sim is not None else None
    # budget=static: decisions from stored costs, never the clock, so sampled runs on the CPU and on simulated
    # GPUs (slower hosts) make the same decisions and draw the same tokens
    budget = AutoBudget(GPU_CURVE, aux_feeds=cls.AUX_FEEDS, static=True)
    gen = torch.Generator().manual_seed(7)
    with step_syncs(drafter) if sim is not None else contextlib.nullcontext([]) as counts:
        rec = generate(Target(lm.model), drafter, prompt(lm), max_new_tokens=tokens, sampling=sampling,
                       eos_token_ids=(), generator=gen, planner=budget)
    if watch is not None:
        watch.counts, watch.limits = counts, ceilings(cls, drafter.config, rec)
    return rec, watch


# make test: greedy and sampling on 2 GPUs (the model split, the hardest placement; one GPU is checked by the
# ceiling tests below and by gpu-check on a simulated GPU); make test-slow adds both on 1 and 4.
SLOW = pytest.mark.slow
PLACEMENTS = [(0.0, 2), (1.0, 2), pytest.param(0.0, 1, marks=SLOW), pytest.param(0.0, 4, marks=SLOW),
              pytest.param(1.0, 1, marks=SLOW), pytest.param(1.0, 4, marks=SLOW)]
_CPU_RUNS: dict = {}
_TRAFFIC: dict = {}  # on 2 GPUs, greedy and sampled: (record, its steps watched) per (case, temperature)


@pytest.mark.parametrize(("temperature", "gpus"), PLACEMENTS)
@pytest.mark.parametrize("case", CASES)
def test_every_method_on_simulated_gpus_equals_the_cpu_run(case, temperature, gpus, models, store, heads, saved):
    sampling = SamplingParams(temperature=temperature)
    if (case, temperature) not in _CPU_RUNS:
        _CPU_RUNS[case, temperature] = decode(case, models[0], sampling, store, heads)[0]
    expected = _CPU_RUNS[case, temperature]
    lm = models[gpus]
    placed = {str(p.device) for p in lm.model.parameters()}
    assert placed == {f"cuda:{i}" for i in range(gpus)}, placed
    with simulated_gpus(gpus, free_memory(saved[1], gpus)) as sim:
        rec, watch = decode(case, lm, sampling, store, heads, sim)
    assert rec.output_ids == expected.output_ids
    assert rec.step_tokens == expected.step_tokens
    if gpus == 2:
        _TRAFFIC[case, temperature] = rec, watch  # the host-traffic tests below read this run's steps


def step_traffic(case, lm, gpus, saved, store, heads, temperature=0.0, **kw):
    with simulated_gpus(gpus, free_memory(saved[1], gpus)) as sim:
        return decode(case, lm, SamplingParams(temperature=temperature), store, heads, sim, **kw)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("case", CASES)
def test_host_syncs_per_step_stay_within_the_methods_ceiling_and_reach_it(case, temperature, models, store, heads,
                                                                          saved):
    """On 2 GPUs, greedy and at T = 1: each decode step's syncs, counted from the sync debug mode's warnings as
    gpu-check counts them on a real GPU, equal the simulator's own count, lie within [1, the step's ceiling]
    (:func:`specbench.gpucheck.syncs.ceilings`), and some step reaches its ceiling (so it is what the method needs,
    not slack); no pageable upload on the hot path."""
    rec, watch = _TRAFFIC.get((case, temperature)) or step_traffic(case, models[2], 2, saved, store, heads,
                                                                   temperature)
    steps = watch.steps()
    assert watch.counts == [t.syncs for t in steps]
    ok, detail = judge(watch.counts, watch.limits)
    assert ok, f"{detail}: {dict(max(steps, key=lambda t: t.syncs).sync_sites)}"
    assert any(c == lim for c, lim in zip(watch.counts, watch.limits, strict=True)), (watch.counts, watch.limits)
    pageable = sum((t.pageable_sites for t in steps), Counter())
    assert not pageable, f"pageable uploads on the hot path: {dict(pageable)}"
    assert sum(rec.step_drafted) > 0 or case == "autoregressive" or temperature  # sampled: a store may not match


@pytest.mark.parametrize("case", CASES)
def test_one_more_read_a_step_breaks_every_methods_ceiling(case, models, store, heads, saved):
    """A drafter that reads one more GPU value each step (an ``.item()``) fails its ceiling, greedy and at T = 1."""
    for temperature in (0.0, 1.0):
        _, watch = step_traffic(case, models[1], 1, saved, store, heads, temperature, tokens=8, extra_read=True)
        ok, detail = judge(watch.counts, watch.limits)
        assert not ok and "over" in detail, (temperature, detail)


def test_a_counter_that_counts_nothing_fails_the_floor():
    assert judge([1, 2, 1], [2, 2, 2])[0]
    assert not judge([0, 0, 0], [2, 2, 2])[0] and "under" in judge([0, 0, 0], [2, 2, 2])[1]
    assert not judge([1, 3], [2, 2])[0] and not judge([], [])[0]


@pytest.mark.parametrize("gpus", [2, 4])
def test_each_gpu_receives_a_steps_mask_and_rotary_once_not_once_per_layer(gpus, models, store, heads, saved):
    """accelerate's hooks copy every layer's inputs to its GPU; the mask, cos/sin and positions are the same for
    every layer, so each GPU gets them once a step (specbench.models.shards): per step, at most the hidden
    states and those four cross each GPU boundary, plus one read back. Copied per layer, a tree step over 2 GPUs
    (4 layers each) made 19 copies."""
    per_boundary = 5  # hidden states, mask, cos, sin, positions
    for case in ("autoregressive", "spectra_core"):
        _, watch = step_traffic(case, models[gpus], gpus, saved, store, heads)
        worst = max(t.peer_copies for t in watch.steps())
        assert 0 < worst <= per_boundary * (gpus - 1) + 1, (case, worst)


def batch_requests(lm, make, lengths=(14, 6, 11, 3, 16), planner=None):
    """Requests of mixed prompt and answer lengths, each with a drafter spawned from the method's first (and a
    planner spawned from ``planner``'s, if given)."""
    base = prompt(lm)
    first = make()
    cuts = [len(base), len(base) - 7, len(base) - 3, len(base) - 11, len(base) - 5]
    return [Request(base[:cut], n, first if i == 0 else first.spawn(), tag=i,
                    planner=None if planner is None else planner if i == 0 else planner.spawn())
            for i, (cut, n) in enumerate(zip(cuts, lengths, strict=True))]


_AR_BATCH: dict = {}


# batch sizes with the number of simulated GPUs the model is split over (0: the plain CPU); 5 requests, so
# slots are refilled at 2 and 4, and a batch of 8 is never full. make test: 4 on 2 GPUs; make test-slow adds
# 2 and 8 on the CPU.
BATCHES = [pytest.param(2, 0, marks=pytest.mark.slow), (4, 2), pytest.param(8, 0, marks=pytest.mark.slow)]


@pytest.mark.parametrize(("batch_size", "gpus"), BATCHES)
@pytest.mark.parametrize("case", CASES)
def test_every_method_decoded_in_a_batch_gives_each_request_its_autoregressive_output(case, batch_size, gpus,
                                                                                      models, store, heads, saved,
                                                                                      monkeypatch):
    """Greedy, fp32: requests decoded together (rows at their own lengths, finished slots refilled) yield
    token for token what each yields alone with plain decoding; on the simulated GPUs under budget=auto (each
    step's block planned for all rows), each batched step within its sync ceiling
    (:func:`specbench.gpucheck.syncs.batch_ceiling`)."""
    sampling = SamplingParams()
    if not _AR_BATCH:
        for req in batch_requests(models[0], lambda: Drafter(vocab_size=0)):
            _AR_BATCH[req.tag] = generate(Target(models[0].model), Drafter(vocab_size=0), req.prompt_ids,
                                          max_new_tokens=req.max_new_tokens).output_ids
    lm = models[gpus]
    syncs = []  # on simulated GPUs: each batched step's syncs and its ceiling
    with simulated_gpus(gpus, free_memory(saved[1], gpus)) if gpus else contextlib.nullcontext(), \
            sync_warnings() as caught:
        make, cls = maker(case, lm.model, sampling, store, heads)
        budget = BatchBudget(GPU_BATCH_CURVE, aux_feeds=cls.AUX_FEEDS) if gpus else None
        queue = batch_requests(lm, make, planner=budget.planner() if budget else None)[::-1]
        step, propose, proposed = decode_module._Loop.step, decode_module._Loop.propose, []

        def proposing(loop, rows):  # what each row proposed, before the batch's plan cut it
            propose(loop, rows)
            proposed[:] = [len(row.draft.tokens) for row in rows]

        def counted(loop):
            before = len(caught)
            step(loop)
            if len(loop.rows) > 1:
                syncs.append((count(caught[before:]), batch_ceiling(cls, config, proposed)))

        config = queue[-1].drafter.config
        monkeypatch.setattr(decode_module._Loop, "step", counted)
        monkeypatch.setattr(decode_module._Loop, "propose", proposing)
        got = {req.tag: rec for req, rec in decode_batch(Target(lm.model), lambda: queue.pop() if queue else None,
                                                         batch_size=batch_size, plan_rows=budget)}
    assert {tag: rec.output_ids for tag, rec in got.items()} == _AR_BATCH
    assert not gpus or (syncs and all(1 <= n <= most for n, most in syncs)), syncs
    assert budget is None or any(b == batch_size for b, _ in budget.blocks)
    assert len({rec.slot for rec in got.values()}) == min(batch_size, len(got))


SCOPED = [c for c in CASES if issubclass(get_method(_method(c)), ScopedMemory)]


@pytest.mark.parametrize("case", SCOPED)
def test_drafters_spawned_for_a_batch_share_what_memory_run_keeps_and_nothing_else(case, models, store, heads):
    """``memory: run`` is one memory over the run at batch size > 1 too: a spawned drafter holds the very objects
    its method's RUN_STATE names (cleared in place, so still shared after a reset); under ``memory: sample``
    each request's are its own. SAM-Decoding[EAGLE2]'s twins share the head's weights, not its cache."""
    cls = get_method(_method(case))
    assert cls.RUN_STATE, f"{case}: name what memory: run keeps (RUN_STATE)"

    def held(drafter):
        out = []
        for path in cls.RUN_STATE:
            obj = drafter
            for name in path.split("."):
                obj = getattr(obj, name)
            out.append(obj)
        return out

    for memory, shared in (("run", True), ("sample", False)):
        first = maker(case, models[0].model, SamplingParams(), store, heads, memory=memory)[0]()
        twin = first.spawn()
        first.reset()
        assert [a is b for a, b in zip(held(first), held(twin), strict=True)] == [shared] * len(cls.RUN_STATE)
    if case == "sam_decoding-eagle":
        assert twin.eagle.head is first.eagle.head and twin.eagle.cache is not first.eagle.cache


@pytest.mark.parametrize("case", ["spectra_core", "token_recycling", "sps", "eagle", "medusa"])
def test_sampled_requests_in_a_batch_on_two_gpus_draw_what_each_draws_alone_on_the_cpu(case, models, store, heads,
                                                                                       saved):
    """T = 1: each request keeps its own sampling stream, so a batch of 4 on 2 simulated GPUs draws the tokens
    each request draws alone at batch size 1 (whose rule the statistical tests check). Memory is kept per
    sample here: under ``memory: run`` the batch's requests teach each other, so their drafts (and the draws
    they take) differ from those made alone."""
    own = {"memory": "sample"} if case in SCOPED else {}
    sampling = SamplingParams(temperature=1.0)
    make, _ = maker(case, models[0].model, sampling, store, heads, **own)
    alone = {}
    for req in batch_requests(models[0], make):  # drafters of the same seeds as the batch's
        alone[req.tag] = generate(Target(models[0].model), req.drafter, req.prompt_ids,
                                  max_new_tokens=req.max_new_tokens, sampling=sampling,
                                  generator=torch.Generator().manual_seed(req.tag)).output_ids
    with simulated_gpus(2, free_memory(saved[1], 2)):
        make, _ = maker(case, models[2].model, sampling, store, heads, **own)
        queue = batch_requests(models[2], make)[::-1]
        for req in queue:
            req.generator = torch.Generator().manual_seed(req.tag)
        got = {req.tag: rec.output_ids for req, rec in decode_batch(
            Target(models[2].model), lambda: queue.pop() if queue else None, batch_size=4, sampling=sampling)}
    assert got == alone


class Sees:
    """A planner that lets a step draft when ``drafts(step)`` says so, records each proposal and verifies none
    of it: every step commits one token, so runs that skip different steps stay step for step aligned."""

    def __init__(self, drafts) -> None:
        self.drafts, self.step, self.seen = drafts, 0, {}

    def cap(self):
        self.step += 1
        return None if self.drafts(self.step) else 0

    def plan(self, draft, seq):
        self.seen[self.step] = (list(draft.tokens), list(draft.parents))
        return Draft()

    def record(self, draft, path, draft_s=0.0):
        pass

    def finish(self, seq):
        pass


@pytest.mark.parametrize("case", ["eagle", "eagle3", "sam_decoding-eagle"])
def test_a_head_that_skips_steps_catches_up_and_drafts_what_it_would_have(case, models, store, heads):
    """budget=auto may tell a drafter that nothing is worth drafting (depth cap 0): an EAGLE head then skips its
    step entirely (it does not even fuse the step's target states) and later catches up on every committed
    position at once; the tree it drafts then is the one a head that never skipped drafts at the same point."""
    lm = models[0]
    make, _ = maker(case, lm.model, SamplingParams(), store, heads)
    every, some = Sees(lambda step: True), Sees(lambda step: step % 3 == 0)
    fused = {}
    for planner in (every, some):
        drafter = make()
        head = getattr(drafter, "eagle", None) or drafter
        fuse = head.head.fuse
        head.head.fuse = lambda states, fuse=fuse, planner=planner: (fused.setdefault(planner, []).append(1),
                                                                     fuse(states))[1]
        generate(Target(lm.model), drafter, prompt(lm), max_new_tokens=TOKENS, planner=planner)
    assert len(fused[some]) <= len([step for step in some.seen if step % 3 == 0]) < len(fused[every])
    assert set(some.seen) == set(every.seen) and len(some.seen) == TOKENS - 1
    drafted = [step for step in some.seen if step % 3 == 0]
    assert all(some.seen[step][0] == [] for step in some.seen if step % 3)  # capped: nothing proposed
    assert any(every.seen[step][0] for step in drafted)
    assert {step: some.seen[step] for step in drafted} == {step: every.seen[step] for step in drafted}


@pytest.mark.parametrize(("case", "temperature"), [("eagle", 0.0), ("eagle3", 0.0), ("medusa", 0.0), ("medusa", 1.0),
                                                    ("sam_decoding-eagle", 0.0), ("sps", 0.0), ("sps", 1.0),
                                                    ("specdec_pp", 0.0)])
def test_a_batch_drafts_and_accepts_with_the_reads_of_one_row_for_every_row(case, temperature, models, store, heads,
                                                                           saved, monkeypatch):
    """A batch of 4 on 2 simulated GPUs: each batched step costs at most one read of the verified tokens (every
    row's argmax, or every row's sampling walk, at once) and the drafter's reads for one row (EAGLE: one, its
    tree grown on the device; Medusa: one; a draft model: one per drafted position, SpecDec++ two) for all rows, counted from
    the sync debug mode's warnings; drafted row by row it needs that per row."""

    lm = models[2]
    sampling = SamplingParams(temperature=temperature)

    def per_step(one_by_one: bool) -> list[int]:
        counts: list[int] = []
        step = decode_module._Loop.step
        with simulated_gpus(2, free_memory(saved[1], 2)), sync_warnings() as caught:
            make, cls = maker(case, lm.model, sampling, store, heads)

            def counted(loop):
                before, rows = len(caught), len(loop.rows)
                step(loop)
                if rows > 1:  # a batch's steps (the drain's last row decodes at batch size 1)
                    longest = max(len(row.draft.tokens) for row in loop.rows)
                    counts.append((count(caught[before:]), 1 + cls.host_reads(config, longest)))

            monkeypatch.setattr(decode_module._Loop, "step", counted)
            if one_by_one:  # each row drafts and accepts alone, as before the batch did both at once
                monkeypatch.setattr(decode_module, "accept_rows", lambda drafts, logits, params, gens: [
                    decode_module.accept(*args) for args in zip(drafts, logits, [params] * len(drafts), gens,
                                                                strict=True)])
            queue = batch_requests(lm, make)
            config = queue[0].drafter.config
            if one_by_one:
                alone = cls.propose_rows
                for req in queue:
                    req.drafter.__class__ = type("OneByOne", (cls,), {
                        "propose_rows": None, "propose": lambda self, s, alone=alone: alone([self], [s])[0]})
            for i, req in enumerate(queue):
                req.generator = torch.Generator().manual_seed(i)
            queue = queue[::-1]
            for _ in decode_batch(Target(lm.model), lambda: queue.pop() if queue else None, batch_size=4,
                                  sampling=sampling):
                pass
            monkeypatch.setattr(decode_module._Loop, "step", step)
        return counts

    batched, alone = per_step(False), per_step(True)
    assert batched and all(1 <= n <= most for n, most in batched)  # most: 1 + one row's reads for its longest
    assert any(n > most for n, most in alone)  # the same steps, read row by row
    assert sum(n for n, _ in alone) > sum(n for n, _ in batched)
