"""One job: a checked :class:`~specbench.run.job.Job` → parquet rows and a summary table.

Order of work, so that bad input fails before anything slow: :func:`plan` checks
the config (settings, the method's files, the dataset, the selection) → open the
results → load the model → build and check every first-turn prompt → warm up
(not recorded) → for each repeat and sample, run the method and the
autoregressive baseline, the one first on even samples and the other on odd ones
(neither always runs on a warmer machine), appending a row per sample × turn ×
repeat as soon as it exists (a re-run skips what is recorded). Each repeat
replicates the run: drafters and the ``budget=auto`` statistics start empty,
sampling draws afresh.
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys
import time
import uuid
import zlib
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig
from tqdm.auto import tqdm

from methods.registry import get_method
from specbench import data as datasets_
from specbench.core.decode import generate
from specbench.core.draft import DrafterContext
from specbench.core.engine import announce, make_target
from specbench.core.reference import References
from specbench.errors import ConfigError
from specbench.models import load_draft, load_model
from specbench.paths import compiled_packages
from specbench.provenance import environment_info
from specbench.results.metrics import BASELINE, summarize
from specbench.results.rows import ResultWriter, load_results, make_row
from specbench.results.summary import format_summary, summary_frame
from specbench.results.table import stores_read
from specbench.run import batched
from specbench.run.engines import PeerRows
from specbench.run.job import Job, in_multirun, plan


def run(cfg: DictConfig) -> Any:
    """Check ``cfg``, run the job, return the summary DataFrame of everything in its results.

    ``summary.attrs`` says where the results are (``results``) and how many
    generations this call added (``new_generations``; 0 when all were recorded).
    """
    return execute(plan(cfg))


def execute(job: Job) -> Any:
    """Run a planned job (see :func:`run`)."""
    # Opened before the model loads: an unreadable results file stops the job before any long work.
    writer = ResultWriter(job.folder, legacy_file=job.legacy_file)
    _seed_everything(job.seed)
    batched.check_memory(job)  # a batch: its KV cache and weights against the device's memory, before loading
    loaded = load_model(job.model_cfg, job.hardware)
    build = getattr(job.method_config, "_store_build", None)  # a missing store the plan found quick to build
    if build is not None:
        build.run(loaded, progress=job.progress)
    prompts = _first_prompts(job, loaded)
    selected = [s for s in job.samples if s.sample_id in prompts]
    m = Measurement(job, loaded, writer, prompts)

    done = writer.done_keys()
    keys = [(s.sample_id, t, name, r) for r in range(job.repeats) for s in selected
            for name in job.rows for t in range(len(s.turns))]
    n_gen, n_done = len(keys), sum(k in done for k in keys)
    if n_done:
        print(f"resuming {job.folder}: {n_done} of {n_gen} generations already recorded", file=sys.stderr)
    if n_done < n_gen:
        m.warm_up()
    bar = tqdm(total=n_gen, initial=n_done, unit="gen", disable=not job.progress, file=sys.stderr,
               desc=f"{job.preset} on {job.dataset.name}" + (f" ×{job.repeats}" if job.repeats > 1 else ""))
    try:
        for repeat in range(job.repeats):
            m.new_repeat()
            if job.served:  # each method over every sample, batched; which goes first alternates by repeat
                for name in job.methods if repeat % 2 == 0 else job.methods[::-1]:
                    batched.measure(m, name, selected, repeat, bar, done)
                continue
            for i, sample in enumerate(selected):
                for name in job.rows if (i + repeat) % 2 == 0 else job.rows[::-1]:
                    m.measure_sample(name, sample, repeat, bar, done)
    finally:
        m.close()  # peer engines' servers: never left running
    bar.close()
    if writer.found_from_others:
        print(f"{writer.found_from_others} generations recorded by another job of this run: skipped", file=sys.stderr)

    rows = load_results([job.folder, *writer.legacy_files])
    summary = summarize(rows, baseline_method=BASELINE)
    print(format_summary(summary_frame(rows), legend=not in_multirun()))  # a sweep's own table ends with it
    _print_stores(rows, {n: c.get("datastore_fingerprint") for n, c in m.columns.items()})
    print(f"results: {job.folder}", file=sys.stderr)
    summary.attrs.update(results=str(job.folder), new_generations=n_gen - n_done, generations=n_gen)
    return summary


class Measurement:
    """The loaded model, a drafter per method, the budget planner and the rows: the working part of a job."""

    def __init__(self, job: Job, loaded: Any, writer: ResultWriter, prompts: dict[str, list[int]]) -> None:
        self.job, self.loaded, self.writer, self.prompts = job, loaded, writer, prompts
        self.target = make_target(loaded.model, getattr(loaded, "forward", "eager"), ahead=compiled_packages())
        longest = min(loaded.context_length, 2 * (max(map(len, prompts.values()), default=0) + job.max_new_tokens))
        print(announce(self.target, job.batch_size, longest), file=sys.stderr)  # compiled (up to a 2nd turn) untimed
        self.cost = None
        if job.auto or any(get_method(name).needs_reference for name in job.methods):
            from specbench.machine.costs import load_or_measure

            self.cost = load_or_measure(loaded, loaded.name, loaded.dtype,
                                        str(job.hardware.get("attn_implementation", "")), progress=job.progress,
                                        batch_size=job.batch_size, check=job.budget == "auto", target=self.target)
        drafter_context = DrafterContext(
            sampling=job.sampling,
            device=self.target.device,
            dtype=self.target.dtype,
            load_model=lambda name: load_draft(name, loaded.dtype, job.hardware),
            target_model=loaded.model,
            target_name=loaded.name,
            hardware=job.hardware,
            graphs=bool(getattr(self.target, "graphed", False)),
            target_heads=dict(job.model_cfg.get("heads") or {}),
            forward_cost=self.cost,
            reference=References(self.target, self.max_new, loaded.eos_token_ids),
        )
        self.drafters = {
            name: get_method(name)(job.config_of(name), vocab_size=loaded.vocab_size, seed=job.seed,
                                   tokenizer=loaded.tokenizer, context=drafter_context)
            for name in job.methods
        }
        seen = environment_info(loaded.device, devices=self.target.devices, quantization=loaded.quantization,
                                device_map=loaded.device_map, linear=loaded.linear)
        _warn_device_mismatch(job.hardware, seen["device_name"])
        curve = json.dumps(self.cost.to_dict()) if self.cost is not None else ""
        own = {name: name == job.method for name in job.methods}
        self.columns = {name: {"budget": job.budget if job.auto and own[name] else "fixed",
                               "cost_curve": curve if own[name] else "", **self.drafters[name].provenance()}
                        for name in job.methods}
        self.context = {
            **job.context(),
            "run_id": uuid.uuid4().hex[:12],
            "provenance": seen,
            "model": loaded.name,
            "dtype": loaded.dtype,
            "batch_size": job.batch_size,
        }
        self.params = {
            name: dataclasses.asdict(d.config) if dataclasses.is_dataclass(d.config) else {}
            for name, d in self.drafters.items()
        }
        self.peers = PeerRows(job.engines, loaded, job.engine_draft, job.hardware)  # engines=: their servers, started at their first use
        self.columns.update(self.peers.columns)
        self.params.update(self.peers.params)
        self.calibration = None  # drafting's cost measured in the warm-up (budget=auto)
        self.budgets = self._new_budgets()
        self.replayed: dict[tuple, list] = {}
        self.categories: dict[str, Any] = {}  # the dataset category each method's planner last learned from
        if job.budget == "replay":  # the recorded run's plans, its first turns checked before any decoding
            from specbench.results.plans import recorded_plans

            self.replayed = recorded_plans(job.replay, job.method, [(s.sample_id, 0, r) for r in range(job.repeats)
                                                                   for s in job.samples])
            self.columns[job.method].update(budget="replay", replayed_from=str(job.replay))

    def _new_budgets(self, calibrating: bool = False) -> dict[str, Any]:
        """budget=auto or static: one planner for the method (the baseline drafts nothing), fresh statistics; at
        batch size > 1 the first request's, the step planned for all rows by :attr:`plan_rows`. ``calibrating``:
        the warm-up's, which measures what drafting costs."""
        self.plan_rows = None
        if not self.job.auto:
            return {}
        from specbench.budget.batch import BatchBudget
        from specbench.budget.planner import AutoBudget

        static = self.job.budget == "static"
        drafting = None if calibrating or self.calibration is None else self.calibration.copy(frozen=static)
        kw = {"aux_feeds": get_method(self.job.method).AUX_FEEDS, "drafting": drafting, "static": static,
              "calibrating": calibrating, "catches_up": self.drafters[self.job.method].catches_up}
        if self.job.batch_size == 1:
            return {self.job.method: AutoBudget(self.cost, **kw)}
        self.plan_rows = BatchBudget(self.cost, **kw)
        return {self.job.method: self.plan_rows.planner()}

    def generate(self, name: str, ids: list[int], max_new: int, generator: torch.Generator,
                 key: tuple | None = None) -> Any:
        """One generation; ``key`` (sample_id, turn, repeat) for a recorded one: under budget=auto its plans go
        on the record (``rec.step_plans``), under budget=replay the recorded ones are made again."""
        from specbench.budget.replay import Recorder, Replay

        planner = self.budgets.get(name)
        if key is not None and name == self.job.method and planner is not None and self.job.batch_size == 1:
            planner = Recorder(planner)
        if key is not None and name == self.job.method and self.job.budget == "replay":
            plans = self.replayed.get(key)
            if plans is None:
                raise ConfigError(f"replay={self.job.replay}: sample {key[0]}, turn {key[1]}, repeat {key[2]} was "
                                  "not recorded there: replay the recorded run's limit, offset and repeats")
            planner = Replay(plans, f"sample {key[0]}, turn {key[1]}, repeat {key[2]}")
        rec = generate(self.target, self.drafters[name], ids, max_new_tokens=max_new,
                       sampling=self.job.sampling, eos_token_ids=self.loaded.eos_token_ids,
                       generator=generator, planner=planner)
        rec.step_plans = getattr(planner, "plans", None) if isinstance(planner, Recorder) else None
        return rec

    def warm_up(self) -> None:
        """``warmup`` short generations (batches at batch_size > 1) per method on the first prompt: nothing
        recorded but, under budget=auto or static, what drafting costs at several depths and top-ks, the table
        every planner of the run starts from (:mod:`specbench.budget.drafting`). budget=static keeps the first
        table measured for this machine and preset and reads it ever after."""
        warm, tokens = next(iter(self.prompts.values())), min(16, self.job.max_new_tokens)
        self.budgets = self._new_budgets(calibrating=True)
        for name in self.job.methods:
            for _ in range(self.job.warmup):
                if self.job.served:
                    batched.warm_up(self, name, warm, tokens)
                else:
                    if self.drafters[name].needs_reference:  # its reference generated before the timed span
                        self.drafters[name].context.reference(warm)
                    self.generate(name, warm, tokens, self.generator("warmup", 0, 0))
        for name in self.job.engines:  # each server's first request, not recorded
            self.peers.generate(name, warm, tokens)
        if self.job.method in self.budgets:
            self.calibration = self.budgets[self.job.method].drafting
            if self.job.budget == "static":
                self.calibration = self._stored_table(self.calibration)

    def _stored_table(self, measured: Any) -> Any:
        """budget=static: the drafting table stored for this machine and preset, or ``measured``, stored."""
        from specbench.machine.costs import cost_path, read_table, table_path, write_table
        from specbench.paths import exclusive

        path = table_path(cost_path(self.cost.key, self.loaded.name, self.loaded.dtype), self.job.preset,
                          {**self.params[self.job.method], "curve": self.cost.seconds})  # re-timed: a new table
        with exclusive(path):
            stored = read_table(path)
            if stored is None:
                write_table(path, measured)
                stored = measured.copy(frozen=True)
        self.columns[self.job.method]["drafting_table"] = str(path)
        return stored

    def close(self) -> None:
        self.peers.close()

    def generator(self, sample_id: str, turn: int, repeat: int) -> torch.Generator:
        return _generator(self.job.seed, sample_id, turn, repeat)

    def new_repeat(self) -> None:
        """Warm-up generations and earlier repeats teach a drafter, or the budget's statistics, nothing recorded."""
        for d in self.drafters.values():
            d.reset()
        self.peers.close()  # a peer engine's drafters too (ngram-mod and ngram-cache keep what they saw): restarted
        self.budgets = self._new_budgets()

    def measure_sample(self, name: str, sample: datasets_.Sample, repeat: int, bar: Any, done: set) -> None:
        """Every turn of ``sample`` with one method; a turn already recorded gives its text to the next."""
        engine = name in self.job.engines
        if not engine:
            self.drafters[name].begin_sample()
        planner, category = self.budgets.get(name), sample.meta.get("category")
        if planner is not None and category != self.categories.get(name, category):
            planner.new_category()  # acceptance learned afresh: a category's figures never depend on the order
        self.categories[name] = category
        answers: list[str] = []
        for turn in range(len(sample.turns)):
            ids = self.next_prompt(name, sample, turn, repeat, answers, bar, done)
            if ids is None:
                if len(answers) == turn:  # skipped: the sample ends here
                    break
                continue
            if not engine and self.drafters[name].needs_reference:  # the oracle: this prompt's AR output, untimed
                self.drafters[name].context.reference(ids)
            t0 = time.perf_counter()
            self.target.reset_peak_memory()
            rec = (self.peers.generate(name, ids, self.max_new(ids)) if engine else
                   self.generate(name, ids, self.max_new(ids), self.generator(sample.sample_id, turn, repeat),
                                 key=(sample.sample_id, turn, repeat)))
            if name == BASELINE and not self.job.sampling.temperature:
                self.drafters[name].context.reference.add(ids, rec.output_ids)
            answers.append(self.write(name, sample, turn, repeat, rec, self.target.peak_memory_gb()))
            bar.set_postfix(method=name, tok_s=f"{rec.new_tokens / max(time.perf_counter() - t0, 1e-9):.1f}")
            bar.update(1)

    def next_prompt(self, name: str, sample: datasets_.Sample, turn: int, repeat: int, answers: list[str],
                    bar: Any, done: set) -> list[int] | None:
        """The prompt of ``sample``'s turn ``turn``, checked; None when the turn is recorded already (its text
        is appended to ``answers``) or the dataset skips it (nothing appended: the sample ends)."""
        key = (sample.sample_id, turn, name, repeat)
        recorded = self.writer.recorded(key)  # also sees rows that concurrent jobs of this run wrote
        if recorded is not None:
            answers.append(recorded["output_text"])
            if key not in done:
                bar.update(1)
            return None
        job = self.job
        try:
            ids = (self.prompts[sample.sample_id] if turn == 0
                   else job.dataset.build_prompt(self.loaded.tokenizer, sample, turn, answers, job.dataset_cfg, job.chat))
        except datasets_.SampleSkipped:
            return None
        _check_length(ids, self.loaded.context_length, sample.sample_id)
        return ids

    def max_new(self, ids: list[int]) -> int:
        return min(self.job.max_new_tokens, self.loaded.context_length - len(ids))

    def write(self, name: str, sample: datasets_.Sample, turn: int, repeat: int, rec: Any, peak: float) -> str:
        """Append the row of one generation (unless a concurrent job of this run recorded it meanwhile); the
        text the sample's next turn builds on."""
        job = self.job
        text = self.loaded.tokenizer.decode(rec.output_ids, skip_special_tokens=True)
        category = sample.meta.get("category")
        extra = {**job.dataset.score(sample, text, turn, job.dataset_cfg), **self.columns[name],
                 "peak_memory_gb": peak, **({"category": category} if category else {})}
        if getattr(rec, "step_plans", None) is not None:  # budget=auto: each step's plan, for budget=replay
            extra["step_plans"] = json.dumps(rec.step_plans, separators=(",", ":"))
        if name == job.method and self.calibration is not None:  # the drafting table its planners started from
            extra["budget_calibration"] = json.dumps(self.calibration.to_dict())
        row = make_row(rec, context={**self.context, "method": name, "preset": job.preset_of(name),
                                     "method_params": self.params[name]},
                       sample_id=sample.sample_id, turn=turn, repeat=repeat, output_text=text, extra=extra)
        earlier = self.writer.add(row)  # an earlier row is kept (reading would keep it anyway): go on from its text
        return text if earlier is None else earlier["output_text"]


def _print_stores(rows: Any, current: dict[str, str | None]) -> None:
    """The datastores the rows read, per method, as the rows record them; a warning when one run's rows
    read different stores, or another store than the one there now (rows recorded before it was rebuilt)."""
    read: dict[str, set] = {}
    for method, preset, fingerprint, description in stores_read(rows):
        print(f"{preset} read the datastore {description}")
        read.setdefault(method, set()).add(fingerprint)
    for method, fingerprints in read.items():
        now = current.get(method)
        if len(fingerprints) > 1 or (now and now not in fingerprints):
            print(f"warning: {method}'s rows in this run read another store than the one there now (fingerprint "
                  f"{now}; it was rebuilt between runs): give this run another experiment_name to measure it",
                  file=sys.stderr)


def _first_prompts(job: Job, loaded: Any) -> dict[str, list[int]]:
    """Every selected sample's first-turn prompt, checked against the model's context before any decoding."""
    prompts = {}
    for sample in job.samples:
        try:
            ids = job.dataset.build_prompt(loaded.tokenizer, sample, 0, [], job.dataset_cfg, job.chat)
        except datasets_.SampleSkipped:
            continue
        _check_length(ids, loaded.context_length, sample.sample_id)
        prompts[sample.sample_id] = ids
    if not prompts:
        raise ConfigError(
            f"dataset {job.dataset.name}: every selected sample was skipped (see dataset.max_input_tokens)"
        )
    return prompts


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _generator(seed: int, sample_id: str, turn: int, repeat: int = 0) -> torch.Generator:
    """A sampling RNG per generation, the same for the method and its baseline; each repeat draws anew."""
    key = f"{sample_id}/{turn}" + (f"/{repeat}" if repeat else "")
    return torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(key.encode()))


def _warn_device_mismatch(hardware: DictConfig, device_name: str) -> None:
    """Warn when the device seen does not match the hardware label's ``expect_device``."""
    expect = hardware.get("expect_device")

    def norm(text: str) -> str:
        return "".join(ch for ch in str(text).lower() if ch.isalnum())

    if expect and norm(expect) not in norm(device_name):
        print(
            f"warning: hardware label '{hardware.label}' expects a {expect} but the device seen is "
            f"'{device_name}'; rows are filed under the label and record the device seen (device_name)",
            file=sys.stderr,
        )


def _check_length(ids: list[int], context_length: int, sample_id: str) -> None:
    if len(ids) >= context_length:
        raise ConfigError(
            f"sample {sample_id}: the prompt has {len(ids)} tokens but the model's context is {context_length}: "
            "use a model with a longer context, or set dataset.max_input_tokens to skip or truncate long inputs"
        )
