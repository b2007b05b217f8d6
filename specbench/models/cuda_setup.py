"""Why torch sees no GPU, said in one line with the fix: a CPU build of torch on a machine that has a GPU (a
`.venv` set up before the GPU's driver was there, or by hand) is the usual trap; ``make setup TORCH_SPEC=…``
replaces it."""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys

import torch

CUDA_SETUP = 'make setup TORCH_SPEC="torch==2.11.0" TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cu128"'


@functools.cache
def gpu_listed() -> bool:
    """Whether ``nvidia-smi -L`` lists a GPU here (False without nvidia-smi, or when it fails)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return False
    try:
        done = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0 and "GPU" in done.stdout


def no_cuda_reason() -> str:
    """Why torch sees no CUDA device, with what to do (torch is a CPU build, or a CUDA build that finds none)."""
    if torch.version.cuda is None:
        return (f"this environment's torch {torch.__version__} is a CPU build: install a CUDA build ({CUDA_SETUP}) "
                "or use hardware.device=cpu")
    return (f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU: check nvidia-smi and "
            "CUDA_VISIBLE_DEVICES, or use hardware.device=cpu")


_warned: list[bool] = []


def warn_if_gpu_unused() -> None:
    """On ``hardware.device=auto`` falling back to the CPU: say so once when the machine lists a GPU that this
    environment's torch cannot use (a run on the CPU may be wanted, so it is a note, not an error)."""
    if _warned or torch.cuda.is_available() or not gpu_listed():
        return
    _warned.append(True)
    print(f"note: this machine has a GPU (nvidia-smi) but runs on the CPU: {no_cuda_reason()}", file=sys.stderr)
