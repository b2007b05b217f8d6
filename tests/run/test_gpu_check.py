"""``make gpu-check`` runs here as its one-line refusal, and its checks run on the CPU with tiny shapes: the same
code a CUDA machine runs. Each check is shown to fail on a broken forward, compaction or method."""

import pytest
import torch

from methods.registry import method_names, register_method
from specbench.cli import gpu_check as cli
from specbench.core import forward
from specbench.core.draft import Drafter
from specbench.core.forward import Target
from specbench.run import gpu_check
from specbench.run.gpu_check import TINY, build, check_compaction, check_methods, check_tree, prompts


def test_without_cuda_it_refuses_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_:
        cli.main([])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "sees no CUDA device" in err


def test_every_check_runs_on_the_cpu_with_tiny_shapes(capsys):
    cli.main(["--device", "cpu", "--tiny", "--layers", "2", "--speed-layers", "2", "--tokens", "16"])
    out = capsys.readouterr().out
    assert "FAILED" not in out and "checks passed" in out
    for check in ("tree", "compaction", "lossless", "fixed point", "device_map"):
        assert f"| {check} |" in out
    assert out.count("| lossless | ") == 2 and f"{len(method_names())} methods equal autoregressive" in out
    assert all(f"| {m} |" in out for m in method_names())  # every method in the speed table
    assert "cost curve, llama3-8b" in out


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
    monkeypatch.setattr(gpu_check, "method_names", lambda: ["autoregressive", "pld", "anpd"])
    rows = check_methods(target, "fp32", "small", texts[:1], 8, tmp_path)
    assert ("pld runs", "small", "fp32", False, "RuntimeError: boom") in rows
    assert any(r[0] == "lossless" and r[3] and "2 methods" in r[4] for r in rows)
