"""Where a model's weights go, decided before loading and checked after.

- CPU: loaded there (no ``device_map``).
- One GPU (``device: cuda``, no ``device_map``): straight onto the current GPU
  (``device_map={"": i}``), never through host memory; the memory check counts that GPU alone.
- ``quantization: int8`` without a ``device_map``: one GPU as well (bitsandbytes needs a
  map; ``hardware.num_gpus`` spreads it over the first N).
- ``device_map: auto``: sharded over the first ``num_gpus`` GPUs (all visible ones when
  null), each given its free memory as ``max_memory`` and the CPU none.

After loading, :func:`check_placed` refuses a model any part of which landed on
the CPU or the disk of a CUDA run (accelerate offloads silently when the GPUs are
too small): such a run would measure the offload, not the method.

The functions take the GPU count and free memory as arguments, so that the
logic is tested on a machine without GPUs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specbench.errors import ModelLoadError


def gpus_used(hw: dict, quantization: str | None, visible: int) -> list[int]:
    """The GPU indices a load may put weights on (empty on the CPU)."""
    if hw["device"] != "cuda":
        return []
    n = hw["num_gpus"]
    if hw["device_map"] is None:
        return list(range(n)) if quantization and n else [0]
    return list(range(n or visible))


def placement_kwargs(hw: dict, quantization: str | None, visible: int, free: Callable[[int], int]) -> dict[str, Any]:
    """``from_pretrained`` keywords that place the weights (``device_map``, ``max_memory``); {} for the CPU.

    ``free(i)``: free bytes on GPU ``i``. The int8 ``quantization_config`` is added by the loader.
    """
    if hw["device"] != "cuda":
        return {}
    gpus = gpus_used(hw, quantization, visible)
    if hw["device_map"] is None and len(gpus) == 1:
        return {"device_map": {"": gpus[0]}}
    device_map = hw["device_map"] or "auto"
    if device_map != "auto":  # an explicit map (a dict or a strategy name) is the user's
        return {"device_map": device_map}
    return {"device_map": "auto", "max_memory": {i: int(free(i)) for i in gpus}}


def offloaded(model: Any) -> list[str]:
    """Modules of a loaded model that sit on the CPU or the disk (from ``hf_device_map``, else the parameters)."""
    device_map = getattr(model, "hf_device_map", None)
    if device_map:
        return [name or "(whole model)" for name, where in device_map.items() if str(where) in ("cpu", "disk", "meta")]
    return sorted({name.rsplit(".", 1)[0] for name, p in model.named_parameters() if p.device.type != "cuda"})


def check_placed(model: Any, name: str, hw: dict) -> None:
    """A CUDA run with any weights off the GPUs fails here, in one line naming the fix."""
    if hw["device"] != "cuda":
        return
    off = offloaded(model)
    if off:
        shown = ", ".join(off[:3]) + (f" and {len(off) - 3} more" if len(off) > 3 else "")
        raise ModelLoadError(
            f"model '{name}': {shown} landed on the CPU or disk (the GPUs given are too small), which would time "
            "the offload, not the method: use more GPUs (hardware.device_map=auto, hardware.num_gpus), "
            "model.quantization=int8, or a smaller model"
        )


def draft_hardware(hw: dict) -> dict:
    """The hardware a draft model is loaded with: the target's device, one GPU, no sharding (a small draft split
    over GPUs would pay a hop per drafted token)."""
    return {**hw, "device_map": None, "num_gpus": None}
