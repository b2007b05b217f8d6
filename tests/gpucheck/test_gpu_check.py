"""``make gpu-check`` runs here as its one-line refusal, and its checks run on the CPU with tiny shapes: the same
code a CUDA machine runs. Each check is shown to fail on a broken forward, compaction or method."""

import pytest
import torch

from methods.registry import method_names, register_method
from specbench.cli import gpu_check as cli
from specbench.core import forward
from specbench.core.draft import Drafter
from specbench.core.forward import Target
from specbench.gpucheck import check as gpu_check
from specbench.gpucheck import models as gpu_models
from specbench.gpucheck import scenarios as gpu_scenarios
from specbench.gpucheck.check import TINY, build, check_compaction, check_methods, check_tree, prompts


def test_without_cuda_it_refuses_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_:
        cli.main([])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "sees no CUDA device" in err


# gpu-check's methods split between the CPU self-test and the simulated GPU below: each runs half of them,
# every one runs in one of the two (and every method runs on simulated GPUs in tests/methods/test_simulated_gpus.py).
SIM_METHODS = ("pld", "spectra", "token_recycling", "sps", "eagle", "medusa", "suffix", "lookahead_rest")
CPU_METHODS = tuple(m for m in method_names() if m not in SIM_METHODS and m != "autoregressive")


@pytest.mark.slow
def test_every_check_runs_on_the_cpu_with_tiny_shapes(capsys):
    cli.main(["--device", "cpu", "--tiny", "--layers", "2", "--speed-layers", "2", "--tokens", "16",
              "--long-context", "160", "--models", "llama2-7b", "--methods", *CPU_METHODS])  # llama3-8b: below
    out = capsys.readouterr().out
    assert "FAILED" not in out and "checks passed" in out
    for check in ("tree", "compaction", "lossless", "fixed point", "device_map", "tree, 160 context",
                  "compaction, 160 context", "lossless, 160 context", "sampling T = 1", "budget=auto", "batch of 2",
                  "70B plan (meta)"):
        assert f"| {check} |" in out
    assert out.count("| lossless | ") == 1 and f"{len(CPU_METHODS) + 1} methods equal autoregressive" in out
    assert out.count("| fixed point | ") == 2 and "llama3-8b" not in out
    assert all(f"| {m} |" in out for m in ("autoregressive", *CPU_METHODS))  # in the speed table
    assert not any(f"| {m} |" in out for m in SIM_METHODS)
    assert "cost curve, llama2-7b" in out


@pytest.fixture(scope="module")
def small():
    shape = TINY["llama3-8b"]
    return Target(build(shape, 2, torch.float32, "cpu")), prompts(shape["vocab_size"])


def test_the_tree_check_catches_a_mask_that_lets_branches_see_each_other(small, monkeypatch):
    target, texts = small
    assert check_tree(target, "fp32", "m", texts[0])[3]

    def leaky(draft):
        vis, offsets = block_layout(draft)
        return vis | True, offsets  # every row sees every other

    block_layout = forward.block_layout
    monkeypatch.setattr(forward, "block_layout", leaky)
    assert not check_tree(target, "fp32", "m", texts[0])[3]


def test_the_compaction_check_catches_a_cache_left_uncompacted(small, monkeypatch):
    target, texts = small
    assert check_compaction(target, "fp32", "m", texts[0])[3]

    def crop_only(cache, past_len, accepted_nodes):  # drops the tail but keeps the rejected branch's entries
        cache.crop(past_len + 1 + len(accepted_nodes) - cache.get_seq_length())

    monkeypatch.setattr(target, "compact", crop_only)
    assert not check_compaction(target, "fp32", "m", texts[0])[3]


@register_method
class WrongGuesses(Drafter):
    """Test method whose outputs the test below corrupts: a method that broke the law."""

    name = "test_gpu_check_wrong"


def test_the_lossless_check_names_a_method_that_changes_the_output(small, tmp_path, monkeypatch):
    target, texts = small
    real = gpu_check.generate

    def generate(target_, drafter, prompt, **kw):
        rec = real(target_, drafter, prompt, **kw)
        if isinstance(drafter, WrongGuesses):
            rec.output_ids[-1] = (rec.output_ids[-1] + 1) % 100
        return rec

    monkeypatch.setattr(gpu_check, "generate", generate)
    (row,) = check_methods(target, "fp32", "m", texts[:1], 8, tmp_path)
    assert not row[3] and "test_gpu_check_wrong" in row[4]
    (half,) = check_methods(target, "bf16", "m", texts[:1], 8, tmp_path / "b")
    assert not half[3] and "test_gpu_check_wrong" in half[4]


def test_speed_layers_shrink_to_the_gpus_free_memory():
    shape = gpu_check.SHAPES["llama2-7b"]
    assert gpu_check.fit_layers(shape, 32, 2, None) == 32 and gpu_check.fit_layers(shape, 32, 2, 80 * 10**9) == 32
    assert 20 < gpu_check.fit_layers(shape, 32, 2, 16 * 10**9) < 32
    assert gpu_check.fit_layers(shape, 32, 2, 10**9) == 1


def test_a_crashing_method_is_a_failed_row_and_the_rest_still_run(small, tmp_path, monkeypatch):
    target, texts = small
    real = gpu_check.generate

    def generate(target_, drafter, prompt, **kw):
        if getattr(drafter, "name", "") == "pld":
            raise RuntimeError("boom")
        return real(target_, drafter, prompt, **kw)

    monkeypatch.setattr(gpu_check, "generate", generate)
    monkeypatch.setattr(gpu_models, "method_names", lambda: ["autoregressive", "pld", "anpd"])
    rows = check_methods(target, "fp32", "small", texts[:1], 8, tmp_path)
    assert ("pld runs", "small", "fp32", False, "RuntimeError: boom") in rows
    assert any(r[0] == "lossless" and r[3] and "2 methods" in r[4] for r in rows)


def test_the_sampling_check_catches_a_token_the_target_would_not_sample(small, tmp_path, monkeypatch):
    target, texts = small
    real = gpu_scenarios.generate
    monkeypatch.setattr(gpu_models, "method_names", lambda: ["autoregressive", "pld"])
    (row,) = gpu_scenarios.check_sampling(target, "fp32", "m", texts[:1], 8, tmp_path)
    assert row[0] == "sampling T = 1" and row[3], row

    def generate(target_, drafter, prompt, **kw):  # pld samples greedily: the target's likeliest tokens
        rec = real(target_, drafter, prompt, **kw)
        if drafter.name == "pld":
            rec.output_ids = real(target_, Drafter(vocab_size=0), prompt, max_new_tokens=len(rec.output_ids)).output_ids
        return rec

    monkeypatch.setattr(gpu_scenarios, "generate", generate)
    (row,) = gpu_scenarios.check_sampling(target, "fp32", "m", texts[:1], 8, tmp_path / "b")
    assert not row[3] and "pld" in row[4]


def test_the_budget_check_names_a_method_whose_planned_drafts_change_the_output(small, tmp_path, monkeypatch):
    target, texts = small
    real = gpu_scenarios.generate
    monkeypatch.setattr(gpu_models, "method_names", lambda: ["autoregressive", "pld", "spectra_core"])
    expected = [real(target, Drafter(vocab_size=0), p, max_new_tokens=8).output_ids for p in texts[:1]]
    row = gpu_scenarios.check_budget_auto(target, "fp32", "m", texts[:1], 8, tmp_path, expected, qs=(1, 8))
    assert row[3] and "2 methods" in row[4], row

    def generate(target_, drafter, prompt, **kw):
        rec = real(target_, drafter, prompt, **kw)
        if drafter.name == "spectra_core" and kw.get("planner") is not None:
            rec.output_ids[-1] = (rec.output_ids[-1] + 1) % 100
        return rec

    monkeypatch.setattr(gpu_scenarios, "generate", generate)
    row = gpu_scenarios.check_budget_auto(target, "fp32", "m", texts[:1], 8, tmp_path / "b", expected, qs=(1, 8))
    assert not row[3] and "spectra_core" in row[4]


def test_the_70b_plan_fits_four_h100s_offloads_on_small_gpus_and_refuses_one_gpu():
    ok = gpu_scenarios.plan_70b(gpu_bytes=80 * 2**30, gpus=4)
    assert ok[3] and "69.0B parameters" in ok[4] and "refused before loading" in ok[4]
    per_gpu = [int(n) for n in ok[4].split("layers per GPU ")[1].split(";")[0].split("/")]
    assert sum(per_gpu) == 80
    small = gpu_scenarios.plan_70b(gpu_bytes=24 * 2**30, gpus=4)  # 96 GiB cannot hold 138 GB of weights
    assert not small[3] and "offloaded" in small[4]


def test_the_70b_refusal_scales_with_the_gpus_memory(monkeypatch):
    """An H200 (141 GB) holds the 138 GB of fp16 weights and a 2k-token KV cache: not refused, and the row passes;
    a GPU 1 GB short of weights plus cache is refused. A refusal that ignored the size fails the row."""
    h200 = gpu_scenarios.plan_70b(gpu_bytes=141 * 10**9, gpus=4)
    assert h200[3] and "fits, not refused" in h200[4], h200
    need = 69.0e9 * 2 + 2 * 80 * 8 * 128 * 2 * 2048
    short = gpu_scenarios.plan_70b(gpu_bytes=int(need - 10**9), gpus=4)
    assert short[3] and "refused before loading" in short[4], short
    from specbench.models import config

    def always(cfg, hw, have=None, reserve=0):
        raise config.ModelLoadError("refused")

    monkeypatch.setattr(config, "_memory_check", always)
    assert not gpu_scenarios.plan_70b(gpu_bytes=141 * 10**9, gpus=4)[3]


def test_every_check_passes_on_a_simulated_gpu():
    """gpu-check's CUDA path as a lent GPU runs it (torch.cuda's queries, the sync debug mode, the model split
    between cuda:0 and host memory through accelerate's offload hooks), on one simulated GPU."""
    from tests.simgpu import simulated_gpus

    with simulated_gpus(1, 8 * 2**30):
        result = gpu_check.run_checks("cuda", tiny=True, layers=2, speed_layers=2, new_tokens=8, speed_tokens=8,
                                      long_context=64, models=("llama3-8b",), dtypes=("fp32",), methods=SIM_METHODS)
    failed = [r for r in result["checks"] if not r[3]]
    assert not failed, failed
    names = {r[0] for r in result["checks"]}
    assert {"device_map", "cuda:0 + CPU split", "sampling T = 1", "budget=auto", "batch of 2",
            "lossless, 64 context", "host syncs, greedy", "host syncs, T = 1", "sdpa math", "70B plan (meta)",
            "graphs: logits", "graphs: lossless", "graphs: t(q) at 128", "graphs: t(q) at 64", "graphs: per step"} <= names
    syncs = [r for r in result["checks"] if r[0].startswith("host syncs")]
    assert all(f"{len(SIM_METHODS) + 1} methods" in r[4] for r in syncs), syncs  # every method counted, both ways
    assert all(r["syncs"] >= 1 for r in result["speed"])  # counted from the sync debug mode's warnings
    assert {r["method"] for r in result["speed"]} == {"autoregressive", *SIM_METHODS}
    assert all(r["rounds"] == 3 and r["forward_range"][0] <= r["forward_ms"] <= r["forward_range"][1]
               for r in result["speed"])
    assert "llama3-8b, K/V repeated (hardware.gqa=repeat)" in result["curves"]


def test_each_stage_is_written_as_it_finishes_and_a_crash_is_its_failed_row(tmp_path, monkeypatch, capsys):
    """A stage that raises (an out-of-memory error while building its model) is one failed row; the stages after
    it still run, and every finished stage's tables are on disk, in markdown and JSON."""
    import json

    real = gpu_check.build

    def build(shape, layers, dtype, device, seed=0):
        if dtype == torch.float16:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(shape, layers, dtype, device, seed)

    monkeypatch.setattr(gpu_check, "build", build)
    seen = []
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--device", "cpu", "--tiny", "--layers", "2", "--speed-layers", "2", "--tokens", "4",
                  "--speed-tokens", "4", "--long-context", "64", "--models", "llama3-8b", "--methods", "pld",
                  "--stages", "plan", "fp16", "fp32", "--out", str(tmp_path)])
    assert exit_.value.code == 1
    for name in ("plan", "llama3-8b-fp32", "llama3-8b-fp16"):
        seen.append(json.loads((tmp_path / f"{name}.json").read_text()))
        assert (tmp_path / f"{name}.md").read_text().startswith("# gpu-check on")
    fp16 = seen[2]["checks"]
    assert [c["ok"] for c in fp16] == [False] and "OutOfMemoryError" in fp16[0]["detail"]
    assert all(c["ok"] for c in seen[1]["checks"]) and any(c["check"] == "lossless" for c in seen[1]["checks"])
    combined = (tmp_path / "gpu-check.md").read_text()
    assert "| stage llama3-8b-fp16 |" in combined and "| lossless |" in combined and "| 70B plan (meta) |" in combined
    assert [s["stage"] for s in json.loads((tmp_path / "gpu-check.json").read_text())] == \
        ["plan", "llama3-8b-fp32", "llama3-8b-fp16"]


def test_an_unknown_stage_is_refused_in_one_line_naming_the_stages(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--device", "cpu", "--tiny", "--stages", "llama3-8b-fp8"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "llama3-8b-fp16" in err


def test_random_heads_are_written_once_per_shape_in_fp16_and_reused(small, tmp_path):
    target, texts = small
    heads = tmp_path / "heads"
    first = gpu_models.drafters(target, 1024, tmp_path / "a", texts, only=("eagle", "medusa"), heads=heads)
    stamp = {p: p.stat().st_mtime_ns for p in heads.rglob("*.safetensors")}
    gpu_models.drafters(target, 1024, tmp_path / "b", texts, only=("eagle", "medusa", "sam_decoding"), heads=heads)
    assert len(stamp) == 2 and stamp == {p: p.stat().st_mtime_ns for p in heads.rglob("*.safetensors")}
    from safetensors import safe_open

    for path in stamp:
        with safe_open(str(path), "pt") as f:
            assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}
    assert first["eagle"]().head.c.kind == "eagle"


def test_stages_run_kind_by_kind_over_both_shapes_and_a_deadline_skips_what_would_end_after_it(
        tmp_path, monkeypatch, capsys):
    """fp32 on both shapes before any fp16; a stage expected to end after the deadline is not started and is
    named with the command that runs it, a shorter one after it still runs; each check's seconds are kept."""
    import json

    from specbench.gpucheck import stages as gpu_stages

    order = [st.name for st in gpu_check.plan_stages(tiny=True)]
    assert order[:4] == ["plan", "sdpa", "llama2-7b-fp32", "llama3-8b-fp32"] and order[-1] == "llama3-8b-forward"
    monkeypatch.setitem(gpu_stages.H100_SECONDS, "llama3-8b-fp16", 1e9)  # fp16 would never end in time
    cli.main(["--device", "cpu", "--tiny", "--layers", "2", "--tokens", "4", "--long-context", "64",
              "--models", "llama3-8b", "--methods", "pld", "--stages", "fp32", "fp16", "bf16",
              "--deadline", "300", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "not run before the deadline: llama3-8b-fp16 (run them next: `bash gpu_check.sh --stages llama3-8b-fp16`)" \
        in out and "1 stages not run before the deadline" in out
    assert not (tmp_path / "llama3-8b-fp16.json").exists() and (tmp_path / "llama3-8b-bf16.json").exists()
    fp32 = json.loads((tmp_path / "llama3-8b-fp32.json").read_text())
    assert {"lossless", "budget=auto", "batch of 2", "device_map"} <= set(fp32["seconds_per_check"])


def test_a_stages_estimate_scales_with_its_tokens_and_the_pace_of_the_stages_before_it():
    from specbench.gpucheck.stages import FIXED, H100_SECONDS, Stage, estimate, pace

    fp16 = Stage("llama2-7b", "fp16")
    assert estimate(fp16, 32, 24, 24) == pytest.approx(H100_SECONDS["llama2-7b-fp16"])
    half = estimate(fp16, 16, 24, 24)
    assert half == pytest.approx(FIXED["fp16"] + (H100_SECONDS["llama2-7b-fp16"] - FIXED["fp16"]) / 2)
    assert estimate(Stage("llama3-8b", "fp16"), 16, 24, 24) == pytest.approx(H100_SECONDS["llama3-8b-fp16"])
    for model in ("llama2-7b", "llama3-8b"):  # measured at 3 rounds x 24 + 2 x 12 tokens
        speed = Stage(model, "speed")
        assert estimate(speed, 32, 24, 12) == pytest.approx(H100_SECONDS[f"{model}-speed"])
        assert estimate(speed, 32, 12, 6) == pytest.approx(FIXED["speed"] + (H100_SECONDS[f"{model}-speed"]
                                                                               - FIXED["speed"]) / 2)
    done = Stage("llama2-7b", "fp32", seconds=30.0)
    assert pace([], {}) == 1.0 and pace([done], {"llama2-7b-fp32": 60.0}) == pytest.approx(0.5)


def test_the_speed_stage_profiles_the_methods_it_is_asked_to(tmp_path, capsys):
    cli.main(["--device", "cpu", "--tiny", "--speed-layers", "2", "--speed-tokens", "4", "--models", "llama3-8b",
              "--methods", "pld", "--stages", "llama3-8b-speed", "--profile", "pld", "--out", str(tmp_path)])
    table = (tmp_path / "profile-llama3-8b-pld.txt").read_text()
    assert table.startswith("pld: ") and "aten::" in table and "Self CPU" in table


def test_the_forward_stage_checks_graphs_against_eager_and_catches_a_graph_that_reads_stale_inputs(tmp_path,
                                                                                                  monkeypatch):
    """``<model>-forward`` (forward=compiled's CUDA graphs, rehearsed on the CPU): the logits and every method's
    output equal eager decoding's, and the step times and per-step counts are reported; a graph whose inputs are
    never refreshed (it replays the step it was captured on) fails the logits and lossless rows."""
    from specbench.core.graphs import StepGraph
    from specbench.gpucheck.stages import Stage

    def run():
        stage = gpu_check.run_stage(Stage("llama3-8b", "forward"), "cpu", tmp_path / "work", tmp_path / "heads",
                                    tiny=True, layers=2, speed_layers=2, new_tokens=8, long_context=160,
                                    methods=("pld", "eagle3"))
        return {r[0]: r for r in stage.rows}

    rows = run()
    assert set(rows) == {"graphs: logits", "graphs: lossless", "graphs: t(q) at 128", "graphs: t(q) at 160",
                         "graphs: per step"}
    assert all(r[3] for r in rows.values()), rows
    assert "q=128" in rows["graphs: t(q) at 160"][4]
    assert "eagle3:" in rows["graphs: per step"][4] and "dflash:" in rows["graphs: per step"][4]
    call = StepGraph.__call__
    monkeypatch.setattr(StepGraph, "__call__", lambda self, *values: call(self, *self.inputs))  # stale inputs
    rows = run()
    assert not rows["graphs: logits"][3] and not rows["graphs: lossless"][3], rows
