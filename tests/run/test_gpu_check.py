"""``make gpu-check`` runs here as its one-line refusal, and its checks run on the CPU with tiny shapes: the same
code a CUDA machine runs. Each check is shown to fail on a broken forward, compaction or method."""

import pytest
import torch

from methods.registry import method_names, register_method
from specbench.cli import gpu_check as cli
from specbench.core import forward
from specbench.core.draft import Drafter
from specbench.core.forward import Target
from specbench.run import gpu_check, gpu_models, gpu_scenarios
from specbench.run.gpu_check import TINY, build, check_compaction, check_methods, check_tree, prompts


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
            "lossless, 64 context"} <= names
    assert all(r["syncs"] == r["syncs"] for r in result["speed"])  # counted (NaN without CUDA)
    assert {r["method"] for r in result["speed"]} == {"autoregressive", *SIM_METHODS}
    assert "llama3-8b, K/V repeated (hardware.gqa=repeat)" in result["curves"]
