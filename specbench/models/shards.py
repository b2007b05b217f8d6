"""Inputs shared by every layer of a sharded model, copied to each device once per forward, not once per layer.

A model dispatched over several devices (``device_map``) carries accelerate's hook on each layer: before the
layer runs, the hook moves every tensor it is given to the layer's device. The attention mask, the rotary
``cos``/``sin`` and the positions are computed once, on the first device, and handed to every layer, so a
device holding 20 layers receives 20 copies of each, every step. A tree step's mask grows with the context
(q × context), so the copies are not free, and all of them are device-to-device traffic in the step.

:func:`share_layer_inputs` puts a pre-hook in front of each hooked module: a keyword tensor not on the
module's device is copied there once, and the next module on that device is handed the same copy, which
the accelerate hook then leaves alone. Copies are found by the tensor they came from (the same object) and
are forgotten when the next forward of the model starts, so nothing outlives the step that made it, and a
buffer refilled in place between steps is copied afresh.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

KEPT_PER_DEVICE = 8  # the mask, cos, sin, positions: a forward's shared inputs, with room to spare


class _Copies:
    """One copy per (source tensor, device) in the current forward: the last :data:`KEPT_PER_DEVICE` per device."""

    def __init__(self) -> None:
        self.by_device: dict[torch.device, OrderedDict] = {}

    def forget(self, *_) -> None:
        self.by_device.clear()

    def to(self, value: Any, device: torch.device) -> Any:
        if isinstance(value, (tuple, list)):
            return type(value)(self.to(v, device) for v in value)
        if not isinstance(value, torch.Tensor) or value.device == device:
            return value
        kept = self.by_device.setdefault(device, OrderedDict())
        key = id(value)
        hit = kept.get(key)
        if hit is not None and hit[0] is value:
            kept.move_to_end(key)
            return hit[1]
        copy = value.to(device, non_blocking=device.type == "cuda")  # a copy to the host must be complete
        kept[key] = (value, copy)
        while len(kept) > KEPT_PER_DEVICE:
            kept.popitem(last=False)
        return copy


def share_layer_inputs(model: torch.nn.Module) -> int:
    """Give each module of ``model`` that accelerate's hook moves to a device (a sharded model's layers) one
    copy per device of its keyword tensors; return how many modules it applies to (0: not sharded)."""
    hooked = [(m, m._hf_hook) for m in model.modules()
              if m is not model and getattr(getattr(m, "_hf_hook", None), "execution_device", None) is not None]
    devices = {str(h.execution_device) for _, h in hooked}
    if len(devices) < 2:
        return 0
    copies = _Copies()
    for entry in {id(model): model, id(model.base_model): model.base_model}.values():  # where a forward starts
        entry.register_forward_pre_hook(copies.forget)
    for module, hook in hooked:
        device = torch.device(hook.execution_device)
        keys = getattr(hook, "skip_keys", None)
        skip = set(keys) if isinstance(keys, (list, tuple, set, frozenset)) else {keys}

        def pre(module, args, kwargs, device=device, skip=skip):
            return args, {k: v if k in skip else copies.to(v, device) for k, v in kwargs.items()}

        module.register_forward_pre_hook(pre, with_kwargs=True)
    return len(hooked)
