"""A torch that cannot use the machine's GPU is named in one line with the fix (specbench.models.cuda_setup)."""

import os
import stat

import pytest
import torch

from specbench.errors import ModelLoadError
from specbench.models import cuda_setup
from specbench.models.config import _hardware


@pytest.fixture
def fresh(monkeypatch):
    cuda_setup.gpu_listed.cache_clear()
    monkeypatch.setattr(cuda_setup, "_warned", [])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    yield
    cuda_setup.gpu_listed.cache_clear()


def fake_nvidia_smi(folder, monkeypatch, listing: str) -> None:
    """An ``nvidia-smi`` on the PATH that prints ``listing`` for ``-L``."""
    exe = folder / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\necho '{listing}'\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")


def test_a_cpu_build_asked_for_cuda_names_the_setup_that_fixes_it(fresh, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(ModelLoadError, match="is a CPU build: install a CUDA build .*make setup TORCH_SPEC") as err:
        _hardware({"device": "cuda"})
    assert "\n" not in str(err.value)


def test_a_cuda_build_that_sees_no_gpu_says_where_to_look(fresh, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    with pytest.raises(ModelLoadError, match="sees no GPU: check nvidia-smi and CUDA_VISIBLE_DEVICES"):
        _hardware({"device": "cuda"})


def test_auto_on_a_machine_with_an_unused_gpu_says_so_once(fresh, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.version, "cuda", None)
    fake_nvidia_smi(tmp_path, monkeypatch, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)")
    assert _hardware({"device": "auto"})["device"] == "cpu"
    assert _hardware({"device": "auto"})["device"] == "cpu"
    err = capsys.readouterr().err
    assert err.count("note: this machine has a GPU") == 1 and "CPU build" in err


def test_auto_without_a_gpu_says_nothing(fresh, monkeypatch, tmp_path, capsys):
    fake_nvidia_smi(tmp_path, monkeypatch, "No devices were found")
    assert _hardware({"device": "auto"})["device"] == "cpu"
    assert capsys.readouterr().err == ""


def planned_setup(tmp_path, monkeypatch, listing: str | None, *args: str) -> str:
    """The commands `make setup` would run for a fresh venv (``make -n``), with an nvidia-smi that lists
    ``listing`` (None: no nvidia-smi on the PATH)."""
    import subprocess
    from pathlib import Path

    if listing is not None:
        fake_nvidia_smi(tmp_path, monkeypatch, listing)
    else:
        monkeypatch.setenv("PATH", os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                                   if not (Path(p) / "nvidia-smi").exists()))
    for var in ("TORCH_SPEC", "TORCH_PIP_ARGS"):
        monkeypatch.delenv(var, raising=False)
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(["make", "-n", "-C", str(root), f"VENV={tmp_path / 'venv'}", "setup", *args],
                          capture_output=True, text=True, check=True)
    return done.stdout


def test_setup_installs_a_cuda_build_where_nvidia_smi_lists_a_gpu_and_the_default_elsewhere(tmp_path, monkeypatch):
    gpu = planned_setup(tmp_path, monkeypatch, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)")
    assert '--index-url https://download.pytorch.org/whl/cu128 "torch==2.11.0"' in gpu
    for listing in (None, "No devices were found"):
        cpu = planned_setup(tmp_path, monkeypatch, listing)
        assert 'install  "torch==2.13.0"' in cpu and "cu128" not in cpu


def test_a_torch_asked_for_later_replaces_the_one_set_up_before(tmp_path, monkeypatch):
    """The trap: `make demo` set up the default torch, then `make setup TORCH_SPEC=…` did nothing. Now a
    TORCH_SPEC given to make is checked against the installed torch (version and CUDA or not) and installed."""
    asked = planned_setup(tmp_path, monkeypatch, None, "TORCH_SPEC=torch==2.11.0",
                          "TORCH_PIP_ARGS=--index-url https://download.pytorch.org/whl/cu128")
    assert "install --force-reinstall --index-url https://download.pytorch.org/whl/cu128 \"torch==2.11.0\"" in asked
    assert "torch.version.cuda is not None" in asked  # installed only when the one there differs
