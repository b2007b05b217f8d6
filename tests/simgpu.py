"""Simulated CUDA GPUs on the CPU: the GPU path checked on machines that have none.

``with simulated_gpus(4) as sim:`` makes torch answer as a 4-GPU machine would (``torch.cuda.is_available()``,
``device_count()``, ``mem_get_info()``, ``synchronize()`` …), and every tensor placed on ``cuda:i`` computes
on the CPU while carrying that logical device:

* an op that mixes two devices raises as CUDA does (``Expected all tensors to be on the same device``); one
  0-dim CPU tensor may meet GPU tensors, in an elementwise op only (``index_select`` or an embedding with a 0-dim
  CPU index raises, as on CUDA); advanced indexing takes CPU indices, as on CUDA, and counts their blocking
  copy to the GPU (a sync and a pageable upload); a CPU generator handed to an op on GPU tensors raises;
* every device→host read is counted as a sync (``item()``, ``tolist()``, ``bool()``, ``.cpu()``, ``repr``
  and printing, indexing with a 0-dim GPU tensor, ops whose output shape depends on the data: ``nonzero``,
  boolean masks, ``unique`` …), with the line of our code that asked for it; ``torch.cuda.synchronize`` is
  counted apart (the timing's own);
* every host→device copy is an upload, pinned (``pin_memory()`` first) or pageable, with its bytes; a blocking
  one (``non_blocking=False``) is a sync too, as CUDA's ``memcpy_and_sync`` is; copies between GPUs are counted;
* ``torch.cuda.set_sync_debug_mode("warn")`` makes every counted sync warn with torch's own message ("error"
  raises), so code that counts syncs on a real GPU from those warnings is tested here.

How: a tensor subclass (:class:`SimTensor`, made with ``_make_wrapper_subclass``) holds a CPU tensor and
reports the logical device, so ``.device``, ``.is_cuda`` and every placement decision of transformers,
accelerate and our code see a real CUDA tensor. A ``TorchDispatchMode`` sees every aten op (those with
no tensor argument too, the factories with ``device="cuda:1"``), checks the devices, counts the traffic,
runs the op on the CPU tensors and wraps the result. torch's lazy CUDA initialisation is patched out so that
such factories reach the mode instead of failing in a CPU build; ``torch.tensor(..., device=cuda)``, which
skips the dispatcher's Python key, is caught one level up by a ``TorchFunctionMode`` and turned into a CPU
tensor and a (pageable) copy, which is what CUDA does. Among the routes tried, a mode alone with a side
table of devices left ``tensor.device`` saying ``cpu`` (so placement code took CPU paths), and PyTorch's
PrivateUse1 backend would be a device named ``privateuseone``, not ``cuda``, so code testing
``device.type == "cuda"`` would not take the GPU path; the wrapper subclass keeps both right.

A model loaded with ``device_map`` goes through accelerate's real hooks: the same code a sharded H100 run
takes. Numbers are the CPU's own, so a simulated run's outputs equal a plain CPU run's, token for token.
This module lives in the tests, not in the product.
"""

from __future__ import annotations

import contextlib
import traceback
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _device
from torch.utils._device import _device_constructors
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
_ACTIVE: list = []  # the simulated machines whose block is open, innermost last
SYNC_WARNING = "called a synchronizing CUDA operation"  # what torch's sync debug mode says, word for word
ROOT = Path(__file__).resolve().parents[1]
OURS = (str(ROOT / "specbench"), str(ROOT / "methods"))
GIB = 1 << 30

# Ops that may read tensors on several devices, as on CUDA.
CROSS_DEVICE = {aten._to_copy.default, aten.pin_memory.default, aten.copy_.default, aten._copy_from.default, aten.lift_fresh.default,
                aten.is_pinned.default, aten._pin_memory.default, aten.detach.default, aten.alias.default,
                aten._local_scalar_dense.default}
# Ops whose output shape depends on the data: CUDA must read a count back to the host.
DATA_DEPENDENT = {aten.nonzero.default, aten.masked_select.default, aten._unique2.default, aten.unique_dim.default,
                  aten.unique_consecutive.default, aten._unique.default, aten.repeat_interleave.Tensor,
                  aten.argwhere.default}
INDEXING = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default}
# Ops answering a question about a tensor's metadata: no data is read.
METADATA = {aten.is_pinned.default, aten.is_same_size.default}


class SimTensor(torch.Tensor):
    """A CPU tensor (``elem``) that says it lives on a simulated GPU (``device``)."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor, device: torch.device | None = None, requires_grad: bool | None = None):
        if device is None:  # called as a parameter's class (accelerate re-making an offloaded weight on meta)
            return torch.nn.Parameter(elem, requires_grad=bool(requires_grad))
        r = torch.Tensor._make_wrapper_subclass(
            cls, elem.size(), strides=elem.stride(), storage_offset=elem.storage_offset(), dtype=elem.dtype,
            layout=elem.layout, device=device, requires_grad=elem.requires_grad)
        r.elem = elem
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(f"a simulated GPU tensor reached {func} outside simulated_gpus()")

    def __repr__(self) -> str:  # printing a CUDA tensor copies it to the host
        if _ACTIVE:
            _ACTIVE[-1].read(self.elem.numel() * self.elem.element_size())
        return f"SimTensor({self.elem!r}, device='{self.device}')"


def logical(t: torch.Tensor) -> torch.device:
    return t.device


def _elem(x):
    return x.elem if isinstance(x, SimTensor) else x


def _nests(x) -> bool:
    """Lists, and tuples other than a shape (named ones and torch's return types too), hold leaves."""
    return type(x) is list or (isinstance(x, tuple) and not isinstance(x, torch.Size))


def _leaves(tree) -> list:
    """The leaves of an op's arguments or outputs (:func:`_nests`, dicts' values; all else is a leaf): what
    ``torch.utils._pytree.tree_flatten`` finds there, at a fraction of its cost on every op."""
    out, stack = [], [tree]
    while stack:
        x = stack.pop()
        kind = type(x)
        if _nests(x):
            stack.extend(reversed(x))
        elif kind is dict:
            stack.extend(reversed(list(x.values())))
        else:
            out.append(x)
    return out


def _map(fn, tree):
    """``tree`` with ``fn`` applied to each leaf (the nesting of :func:`_leaves` kept)."""
    kind = type(tree)
    if _nests(tree):
        items = [_map(fn, x) for x in tree]
        return kind(*items) if hasattr(kind, "_fields") else kind(items)  # a named tuple takes its fields apart
    if kind is dict:
        return {k: _map(fn, v) for k, v in tree.items()}
    return fn(tree)


def _gpu_index(device):
    """A bare index as a device names the current accelerator: ``cuda:i`` here; ``cuda`` alone, the current GPU
    (CUDA resolves it through a device guard, which a CPU build cannot set)."""
    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("cuda", device)
    if isinstance(device, (str, torch.device)) and str(device) == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _site() -> str:
    """The innermost frame of specbench/ or methods/ on the stack (file:line function), else the test's."""
    frames = traceback.extract_stack()[:-3]
    for f in reversed(frames):
        if f.filename.startswith(OURS):
            return f"{Path(f.filename).relative_to(ROOT)}:{f.lineno} {f.name}"
    for f in reversed(frames):
        if "/tests/" in f.filename and not f.filename.endswith("simgpu.py"):
            return f"{Path(f.filename).name}:{f.lineno} {f.name}"
    return "?"


@dataclass
class Traffic:
    """What crossed between the host and the simulated GPUs."""

    syncs: int = 0  # implicit device→host reads (the host waits for the device)
    explicit_syncs: int = 0  # torch.cuda.synchronize
    uploads_pinned: int = 0
    uploads_pageable: int = 0
    upload_bytes: int = 0
    download_bytes: int = 0
    peer_copies: int = 0  # GPU→GPU
    peer_bytes: int = 0
    sync_sites: Counter = field(default_factory=Counter)
    pageable_sites: Counter = field(default_factory=Counter)

    def snapshot(self) -> Traffic:
        return Traffic(self.syncs, self.explicit_syncs, self.uploads_pinned, self.uploads_pageable,
                       self.upload_bytes, self.download_bytes, self.peer_copies, self.peer_bytes,
                       Counter(self.sync_sites), Counter(self.pageable_sites))

    def __sub__(self, other: Traffic) -> Traffic:
        return Traffic(self.syncs - other.syncs, self.explicit_syncs - other.explicit_syncs,
                       self.uploads_pinned - other.uploads_pinned, self.uploads_pageable - other.uploads_pageable,
                       self.upload_bytes - other.upload_bytes, self.download_bytes - other.download_bytes,
                       self.peer_copies - other.peer_copies, self.peer_bytes - other.peer_bytes,
                       self.sync_sites - other.sync_sites, self.pageable_sites - other.pageable_sites)

    @property
    def uploads(self) -> int:
        return self.uploads_pinned + self.uploads_pageable


class _Devices(TorchDispatchMode):
    """Every aten op: devices checked, traffic counted, computed on the CPU, results wrapped."""

    def __init__(self, sim: SimulatedGPUs) -> None:
        super().__init__()
        self.sim = sim

    def _device(self, device) -> torch.device:
        d = torch.device(device)
        if d.type != "cuda":
            return d
        index = self.sim.current if d.index is None else d.index
        if not 0 <= index < self.sim.n:
            raise RuntimeError(f"CUDA error: invalid device ordinal (cuda:{index} on a simulated machine of "
                               f"{self.sim.n} GPU{'s' * (self.sim.n > 1)})")
        return torch.device("cuda", index)

    def _copy(self, src: torch.Tensor, dst_device: torch.device, non_blocking: bool) -> None:
        """Count a copy of ``src`` to ``dst_device``."""
        s, traffic = logical(src), self.sim.traffic
        nbytes = src.numel() * src.element_size()
        if s.type == "cuda" and dst_device.type == "cpu":
            self.sim.read(nbytes)
        elif s.type == "cpu" and dst_device.type == "cuda" and nbytes:  # an empty copy moves nothing
            self.sim.upload(nbytes, pinned=getattr(src, "_sim_pinned", False), blocking=not non_blocking)
        elif s.type == "cuda" and dst_device.type == "cuda" and s != dst_device:
            traffic.peer_copies += 1
            traffic.peer_bytes += nbytes

    def _to(self, func, types, args, kwargs):
        """``aten.to.*`` (reached here undecomposed): as ``_to_copy``, or the tensor itself when nothing changes."""
        params = dict(zip([a.name for a in func._schema.arguments], args, strict=False), **kwargs)
        t = params["self"]
        if "other" in params:
            device, dtype = params["other"].device, params["other"].dtype
        else:
            device, dtype = params.get("device"), params.get("dtype")
        device = logical(t) if device is None else self._device(device)
        dtype = t.dtype if dtype is None else dtype
        if device == logical(t) and dtype == t.dtype and not params.get("copy"):
            return t
        return self.__torch_dispatch__(aten._to_copy.default, types, (t,), {
            "dtype": dtype, "device": device, "non_blocking": bool(params.get("non_blocking"))})

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket is aten.to:
            return self._to(func, types, args, kwargs)
        flat = _leaves((args, kwargs))
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        sim = [t for t in tensors if isinstance(t, SimTensor)]
        target = kwargs.get("device")
        target = self._device(target) if target is not None else None
        on_gpu = [logical(t) for t in sim]

        if func in (aten._pin_memory.default, aten.pin_memory.default):
            out = args[0].clone()
            out._sim_pinned = True
            return out
        if func is aten.is_pinned.default:
            return bool(getattr(args[0], "_sim_pinned", False))
        if func in (aten._to_copy.default,):
            dst = target if target is not None else logical(args[0])
            self._copy(args[0], dst, bool(kwargs.get("non_blocking")))
        elif func in (aten.copy_.default, aten._copy_from.default):
            self._copy(args[1], logical(args[0]), bool(args[2] if len(args) > 2 else kwargs.get("non_blocking")))
        elif func in INDEXING:
            self._check_indexing(func, args)
            if on_gpu:
                self._upload_indices(args)
        elif func not in CROSS_DEVICE:
            self._check_same(func, tensors)
        generator = kwargs.get("generator")
        if generator is not None and on_gpu and generator.device.type != "cuda":
            raise RuntimeError(f"Expected a 'cuda' device type for generator but found '{generator.device.type}' "
                               f"(simulated CUDA, {func})")

        if on_gpu and func in DATA_DEPENDENT:
            self.sim.read(8)
        if on_gpu and func in INDEXING:
            indices = args[1] if len(args) > 1 else kwargs.get("indices", [])
            if any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices):
                self.sim.read(8)  # a boolean mask is a nonzero()

        if func in (aten.copy_.default, aten._copy_from.default) and isinstance(args[0], SimTensor):
            out_device = logical(args[0])
        elif target is not None:
            out_device = target
        elif func is aten._to_copy.default:
            out_device = logical(args[0])
        else:
            out_device = next((d for d in on_gpu if d.type == "cuda"), None)

        u_args, u_kwargs = (_map(_elem, args), _map(_elem, kwargs)) if sim else (args, dict(kwargs))
        if target is not None and target.type == "cuda":
            u_kwargs["device"] = torch.device("cpu")
        if func is aten._to_copy.default and target is not None and target.type == "cuda":
            u_kwargs.pop("non_blocking", None)
        out = func(*u_args, **u_kwargs)

        if on_gpu and func not in METADATA and not any(isinstance(o, torch.Tensor) for o in _leaves(out)):
            self.sim.read(8)  # a Python number or bool from device data: item(), bool(), equal() …
        if out_device is None or out_device.type != "cuda":
            return out
        originals = {id(_elem(a)): a for a in flat if isinstance(a, SimTensor)}

        def wrap(o):
            if not isinstance(o, torch.Tensor) or isinstance(o, SimTensor):
                return o
            if id(o) in originals:  # an in-place op returns its input
                return originals[id(o)]
            return SimTensor(o, out_device)

        return _map(wrap, out)

    def _upload_indices(self, args) -> None:
        """CPU index tensors on a GPU tensor: CUDA copies them over first, blocking (a sync and a pageable
        upload each)."""
        indices = args[1] if len(args) > 1 else []
        for i in indices:
            if isinstance(i, torch.Tensor) and logical(i).type == "cpu" and i.numel():
                self.sim.upload(i.numel() * i.element_size(), pinned=getattr(i, "_sim_pinned", False), blocking=True)

    @staticmethod
    def _check_same(func, tensors) -> None:
        seen: list[torch.device] = []
        scalars = 0
        gpu = any(logical(t).type == "cuda" for t in tensors)
        for t in tensors:
            d = logical(t)
            if gpu and d.type == "cpu" and t.dim() == 0:
                # CUDA takes one CPU scalar beside GPU tensors, in an elementwise op only (index_select, embedding
                # and the like refuse it)
                scalars += 1
                if scalars == 1 and _elementwise(func):
                    continue
            if d not in seen:
                seen.append(d)
        if len(seen) > 1 and any(d.type == "cuda" for d in seen):
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"{seen[0]} and {seen[1]}! (simulated CUDA, {func})")

    @staticmethod
    def _check_indexing(func, args) -> None:
        self_t = args[0]
        indices = args[1] if len(args) > 1 else []
        d = logical(self_t)
        for i in indices:
            if i is None:
                continue
            di = logical(i)
            if di != d and di.type != "cpu":
                raise RuntimeError(f"indices should be either on cpu or on the same device as the indexed tensor "
                                   f"({d}); got {di} (simulated CUDA, {func})")
        if len(args) > 2 and isinstance(args[2], torch.Tensor):
            v = args[2]
            if logical(v) != d and not (logical(v).type == "cpu" and v.dim() == 0):
                raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two "
                                   f"devices, {d} and {logical(v)}! (simulated CUDA, {func})")


def _elementwise(func) -> bool:
    """An op CUDA runs through its elementwise kernels (TensorIterator), the ones that take a CPU scalar."""
    return torch.Tag.pointwise in getattr(func, "tags", ()) or func.overloadpacket in ELEMENTWISE_EXTRA


# Elementwise ops torch does not tag as pointwise
ELEMENTWISE_EXTRA = {aten.where, aten.fill_, aten.masked_fill, aten.masked_fill_}


def _in_gpu_block() -> bool:
    current = _device.CURRENT_DEVICE
    return current is not None and torch.device(current).type == "cuda"


class _Factories(TorchFunctionMode):
    """What the dispatcher's Python key does not see: ``torch.tensor``/``as_tensor`` straight onto a GPU (made on
    the host, then copied, as CUDA does), and host reads done outside aten (``tolist``, ``numpy``)."""

    def __init__(self, sim: SimulatedGPUs) -> None:
        super().__init__()
        self.sim = sim

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.device and len(args) == 1 and isinstance(args[0], int) and not kwargs:
            return torch.device("cuda", args[0])  # a bare index names the current accelerator
        if "device" in kwargs:  # likewise where a device is asked for
            kwargs["device"] = _gpu_index(kwargs["device"])
        elif _in_gpu_block() and func in _device_constructors():
            kwargs["device"] = _gpu_index(_device.CURRENT_DEVICE)  # a `with torch.device("cuda")` block's
        if func is torch.Tensor.to and len(args) > 1:
            args = (args[0], _gpu_index(args[1]), *args[2:])
        if func in (torch.tensor, torch.as_tensor) and kwargs.get("device") is not None \
                and torch.device(kwargs["device"]).type == "cuda":
            device = kwargs.pop("device")
            if func is torch.as_tensor and isinstance(args[0], torch.Tensor):
                return args[0].to(device=device, dtype=kwargs.get("dtype"))
            return func(*args, **kwargs, device="cpu").to(device)  # "cpu" said: a torch.device block would not
        if func is torch.Tensor.tolist and isinstance(args[0], SimTensor):
            t = args[0]
            self.sim.read(t.numel() * t.element_size())
            return t.elem.tolist()
        if func in (torch.Tensor.numpy, torch.Tensor.__array__) and isinstance(args[0], SimTensor):
            raise TypeError(f"can't convert {args[0].device} device type tensor to numpy. Use Tensor.cpu() to "
                            "copy the tensor to host memory first. (simulated CUDA)")
        if func is torch.Tensor.__getitem__ and isinstance(args[0], SimTensor):
            return self._getitem(*args)
        if func is torch.Tensor.__setitem__ and isinstance(args[0], SimTensor):
            return self._setitem(*args)
        if func is torch.nn.functional.scaled_dot_product_attention and isinstance(args[0], SimTensor):
            return self._on_cpu(func, args, kwargs)  # its backend choice sets a CUDA device guard
        if func is torch.Tensor.copy_ and isinstance(args[0], SimTensor):
            # the Python method sets a CUDA device guard first, which a CPU build cannot: go to the op itself
            return aten.copy_.default(*args, **kwargs)
        if func is torch.Tensor.contiguous and isinstance(args[0], SimTensor):
            t, fmt = args[0], kwargs.get("memory_format", args[1] if len(args) > 1 else torch.contiguous_format)
            return t if t.is_contiguous(memory_format=fmt) else aten.clone.default(t, memory_format=fmt)
        if func is torch.Tensor.data_ptr and isinstance(args[0], SimTensor):
            return args[0].elem.data_ptr()
        if func is torch.Tensor.untyped_storage and isinstance(args[0], SimTensor):
            return args[0].elem.untyped_storage()
        try:
            return func(*args, **kwargs)
        except RuntimeError as err:
            # Other Python bindings that set a CUDA device guard before dispatching: the same on the CPU tensors
            if "not linked with support for cuda" not in str(err):
                raise
            out = self._on_cpu(func, args, kwargs)
            if not any(isinstance(o, torch.Tensor) for o in _leaves(out)):
                self.sim.read(8)
            return out


    # Indexing from Python sets a CUDA device guard first (see copy_ above): done on the CPU tensor instead, with
    # CUDA's rules for where index tensors and values may live.
    def _indices(self, t: SimTensor, index):
        flat = index if isinstance(index, tuple) else (index,)
        for i in _leaves(list(flat)):
            if isinstance(i, torch.Tensor):
                if logical(i).type == "cuda" and logical(i) != logical(t):
                    raise RuntimeError(f"indices should be either on cpu or on the same device as the indexed "
                                       f"tensor ({t.device}); got {i.device} (simulated CUDA)")
                if i.dtype in (torch.bool, torch.uint8) and i.dim() > 0:
                    self.sim.read(8)  # a boolean mask is a nonzero()
                elif logical(i).type == "cuda" and i.dim() == 0:
                    self.sim.read(8)  # a 0-dim index is read as a Python integer (item())
                elif logical(i).type == "cpu" and i.numel():
                    # CPU indices are copied to the GPU first, blocking
                    self.sim.upload(i.numel() * i.element_size(), pinned=getattr(i, "_sim_pinned", False),
                                    blocking=True)
        return _map(_elem, index)

    @staticmethod
    def _on_cpu(func, args, kwargs):
        """``func`` computed on the CPU tensors, after CUDA's check that its tensors share one device."""
        tensors = [t for t in _leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        _Devices._check_same(func, tensors)
        device = next(logical(t) for t in tensors if isinstance(t, SimTensor))
        out = func(*_map(_elem, args), **_map(_elem, kwargs))
        return _map(lambda o: SimTensor(o, device) if isinstance(o, torch.Tensor) else o, out)

    def _getitem(self, t: SimTensor, index):
        out = t.elem[self._indices(t, index)]
        return SimTensor(out, t.device)

    def _setitem(self, t: SimTensor, index, value) -> None:
        if isinstance(value, torch.Tensor) and value.device != t.device and \
                not (value.device.type == "cpu" and value.dim() == 0):
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"{t.device} and {value.device}! (simulated CUDA, index_put_)")
        t.elem[self._indices(t, index)] = _elem(value)


class _DeviceGuard:
    """``torch.cuda.device(i)``: sets the current device for its block."""

    def __init__(self, sim: SimulatedGPUs, device) -> None:
        self.sim, self.index = sim, (torch.device(device).index if not isinstance(device, int) else device)

    def __enter__(self):
        self.prev, self.sim.current = self.sim.current, self.index if self.index is not None else self.sim.current

    def __exit__(self, *exc):
        self.sim.current = self.prev


class SimulatedGPUs:
    """The state of one simulated machine: its GPUs and the traffic counted so far."""

    def __init__(self, n: int, free: int | None = None, name: str = "NVIDIA H100 80GB HBM3 (simulated)") -> None:
        self.n, self.memory, self.name = n, 80 * GIB, name
        self.free = self.memory - GIB if free is None else int(free)
        self.current = 0
        self.traffic = Traffic()
        self.debug_mode = 0  # torch.cuda.set_sync_debug_mode: 0 default, 1 warn, 2 error

    def read(self, nbytes: int) -> None:
        """A device→host read: the host waits (a sync)."""
        self.traffic.download_bytes += nbytes
        self.sync()

    def sync(self) -> None:
        """An implicit sync, warned of or refused as torch's sync debug mode says."""
        self.traffic.syncs += 1
        self.traffic.sync_sites[_site()] += 1
        if self.debug_mode == 1:
            warnings.warn(SYNC_WARNING, UserWarning, stacklevel=2)
        elif self.debug_mode == 2:
            raise RuntimeError(SYNC_WARNING)

    def upload(self, nbytes: int, pinned: bool, blocking: bool) -> None:
        """A host→device copy: from pinned or pageable memory; a blocking one waits for the device (a sync)."""
        self.traffic.upload_bytes += nbytes
        if pinned:
            self.traffic.uploads_pinned += 1
        else:
            self.traffic.uploads_pageable += 1
            self.traffic.pageable_sites[_site()] += 1
        if blocking:
            self.sync()

    def set_sync_debug_mode(self, mode) -> None:
        modes = {"default": 0, "warn": 1, "error": 2}
        self.debug_mode = modes[mode] if isinstance(mode, str) else int(mode)

    def _index(self, device=None) -> int:
        if device is None:
            return self.current
        if isinstance(device, int):
            return device
        d = torch.device(device)
        return self.current if d.index is None else d.index

    def synchronize(self, device=None) -> None:
        self._index(device)
        self.traffic.explicit_syncs += 1

    def patches(self) -> list:
        props = type("Props", (), {"name": self.name, "total_memory": self.memory, "major": 9, "minor": 0,
                                   "multi_processor_count": 132})
        cuda = torch.cuda
        shallow = torch._has_compatible_shallow_copy_type

        def compatible(input: torch.Tensor, from_: torch.Tensor) -> bool:  # noqa: A002 - torch's own names
            return not isinstance(input, SimTensor) and not isinstance(from_, SimTensor) and shallow(input, from_)

        return [
            # Module.to() would set a CPU parameter's .data to a simulated tensor (leaving a CUDA tensor with no
            # CPU tensor behind it): it makes a new Parameter instead, as for any tensor subclass
            mock.patch.object(torch, "_has_compatible_shallow_copy_type", compatible),
            # transformers loads weights in worker threads, where this thread's modes do not reach
            mock.patch.dict("os.environ", {"HF_DEACTIVATE_ASYNC_LOAD": "1"}),
            mock.patch.object(cuda, "_lazy_init", lambda: None),
            mock.patch.object(cuda, "is_initialized", lambda: True),
            mock.patch.object(cuda, "is_available", lambda: True),
            mock.patch.object(cuda, "device_count", lambda: self.n),
            mock.patch.object(cuda, "current_device", lambda: self.current),
            mock.patch.object(cuda, "set_device", lambda d: setattr(self, "current", self._index(d))),
            mock.patch.object(cuda, "device", lambda d: _DeviceGuard(self, d)),
            mock.patch.object(cuda, "synchronize", self.synchronize),
            mock.patch.object(cuda, "mem_get_info", lambda d=None: (self.free, self.memory)),
            mock.patch.object(cuda, "get_device_name", lambda d=None: self.name),
            mock.patch.object(cuda, "get_device_properties", lambda d=None: props),
            mock.patch.object(cuda, "get_device_capability", lambda d=None: (9, 0)),
            mock.patch.object(cuda, "is_bf16_supported", lambda *a, **k: True),
            mock.patch.object(cuda, "max_memory_allocated", lambda d=None: 0),
            mock.patch.object(cuda, "memory_allocated", lambda d=None: 0),
            mock.patch.object(cuda, "memory_reserved", lambda d=None: 0),
            mock.patch.object(cuda, "reset_peak_memory_stats", lambda d=None: None),
            mock.patch.object(cuda, "empty_cache", lambda: None),
            mock.patch.object(cuda, "set_sync_debug_mode", self.set_sync_debug_mode),
            mock.patch.object(cuda, "get_sync_debug_mode", lambda: self.debug_mode),
            mock.patch.object(cuda, "manual_seed", lambda s: None),
            mock.patch.object(cuda, "manual_seed_all", lambda s: None),
        ]


@contextlib.contextmanager
def simulated_gpus(n: int = 1, free: int | None = None) -> Iterator[SimulatedGPUs]:
    """A machine of ``n`` simulated 80 GB GPUs for the block (see the module's docstring); ``free``: the bytes
    each reports free, small enough that ``device_map=auto`` splits a tiny model as it splits a 70B one."""
    sim = SimulatedGPUs(n, free)
    with contextlib.ExitStack() as stack:
        for p in sim.patches():
            stack.enter_context(p)
        stack.enter_context(_Factories(sim))
        stack.enter_context(_Devices(sim))
        _ACTIVE.append(sim)
        try:
            yield sim
        finally:
            _ACTIVE.remove(sim)
