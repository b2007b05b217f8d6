"""Where a result comes from: code version, library versions, device, config hash.

Every result row carries these fields so that a table can always be traced
back to the code, the software stack and the machine that produced it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

import specbench

_PACKAGE_DIR = Path(__file__).resolve().parent


def _git(*args: str) -> str | None:
    """Output of ``git -C <package dir> <args>``, or None when git fails or is absent."""
    try:
        out = subprocess.run(
            ["git", "--no-optional-locks", "-C", str(_PACKAGE_DIR), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def git_commit() -> str:
    """Short commit hash of the repository holding the package.

    ``"+dirty"`` is appended when tracked files have uncommitted changes
    (untracked files are ignored); ``"unknown"`` outside a git work tree.
    """
    head = _git("rev-parse", "--short", "HEAD")
    if not head:
        return "unknown"
    status = _git("status", "--porcelain", "--untracked-files=no")
    return head + ("+dirty" if status else "")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def device_name(device: str | torch.device) -> str:
    """Human-readable device: the GPU's name, or the CPU model and torch's thread count."""
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(dev)
    if dev.type == "cpu":
        return f"{_cpu_model()} ({torch.get_num_threads()} threads)"
    return str(dev)


def driver_version() -> str:
    """The NVIDIA driver's version ("" without CUDA or when it cannot be read)."""
    if not torch.cuda.is_available():
        return ""
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # no pynvml, or NVML refused: ask nvidia-smi
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True)
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return ""


def environment_info(device: str | torch.device, *, devices: list | None = None, quantization: str = "",
                     device_map: str = "", linear: str = "") -> dict[str, Any]:
    """Code and software versions, the device's name and the model's placement (no hostname).

    ``devices``: every device holding the model's weights (``Target.devices``); ``gpu_count`` counts the
    GPUs among them. ``quantization``, ``device_map`` and ``linear`` (packed or plain CPU linear layers) as the
    model was loaded (``LoadedModel``).
    """
    import transformers

    gpus = {str(d) for d in (devices or [device]) if torch.device(d).type == "cuda"}
    return {
        "git_commit": git_commit(),
        "specbench_version": specbench.__version__,
        "python_version": platform.python_version() or sys.version.split()[0],
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "device_name": device_name(device),
        "gpu_count": str(len(gpus)),
        "device_map": device_map or "",
        "quantization": quantization or "",
        "cuda_version": (torch.version.cuda or "") if gpus else "",
        "driver_version": driver_version() if gpus else "",
        "linear": linear or "plain",
        **scheduler_info(),
    }


def scheduler_info() -> dict[str, str]:
    """The SLURM job a row was measured in (``slurm_job_id``: ``<array job>_<task>`` for an array task), the
    node it ran on and how often SLURM had restarted it (requeue, preemption); empty outside SLURM."""
    env = os.environ
    job = env.get("SLURM_JOB_ID", "")
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        job = f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return {"slurm_job_id": job, "slurm_node": env.get("SLURMD_NODENAME", "") if job else "",
            "slurm_restarts": env.get("SLURM_RESTART_COUNT", "0") if job else ""}


def config_hash(cfg: dict[str, Any], length: int = 12) -> str:
    """Stable short sha256 of the settings that define a result.

    The hash covers a JSON dump with sorted keys at every level, so it does not
    depend on key order; values JSON cannot encode are hashed via ``str``.
    """
    dump = json.dumps(cfg, sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=True)
    return hashlib.sha256(dump.encode("utf-8")).hexdigest()[:length]
