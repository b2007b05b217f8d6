"""The simulated GPUs (tests/simgpu.py) hold the code to CUDA's rules: for each rule, a case that must raise
or be counted, and the case beside it that CUDA allows."""

import warnings

import pytest
import torch

from tests.simgpu import SYNC_WARNING, simulated_gpus


def gpu(*values, dtype=torch.float32, device="cuda:0"):
    return torch.tensor(list(values), dtype=dtype).to(device, non_blocking=True)


def test_mixing_two_devices_raises_and_one_cpu_scalar_in_an_elementwise_op_does_not():
    with simulated_gpus(2) as sim:
        a, b = gpu(1.0, 2.0), gpu(3.0, 4.0, device="cuda:1")
        with pytest.raises(RuntimeError, match="same device"):
            a + b
        with pytest.raises(RuntimeError, match="same device"):
            a + torch.ones(2)
        before = sim.traffic.snapshot()
        assert (a * torch.tensor(2.0)).device == a.device  # one 0-dim CPU tensor: CUDA takes it
        assert (sim.traffic - before).syncs == 0


def test_a_cpu_scalar_is_refused_outside_elementwise_ops_and_twice_in_one():
    with simulated_gpus(1):
        table = gpu(1.0, 2.0, 3.0, 4.0).reshape(2, 2)
        with pytest.raises(RuntimeError, match="same device"):
            torch.index_select(table, 0, torch.tensor(1))
        with pytest.raises(RuntimeError, match="same device"):
            torch.nn.functional.embedding(torch.tensor(1), table)
        with pytest.raises(RuntimeError, match="same device"):
            torch.lerp(table, torch.tensor(1.0), torch.tensor(0.5))
        assert torch.index_select(table, 0, gpu(1, dtype=torch.long)).shape == (1, 2)


def test_a_cpu_index_tensor_on_a_gpu_tensor_is_a_blocking_pageable_upload():
    with simulated_gpus(2) as sim:
        x = gpu(1.0, 2.0, 3.0)
        before = sim.traffic.snapshot()
        assert x[torch.tensor([0, 2])].device == x.device
        spent = sim.traffic - before
        assert (spent.syncs, spent.uploads_pageable) == (1, 1)
        on_gpu = gpu(0, 2, dtype=torch.long)
        before = sim.traffic.snapshot()
        x[on_gpu]  # an index already on the GPU: nothing crosses
        assert (sim.traffic - before).syncs == 0 and (sim.traffic - before).uploads == 0
        with pytest.raises(RuntimeError, match="indices should be either on cpu or on the same device"):
            x[gpu(0, dtype=torch.long, device="cuda:1")]


def test_indexing_with_a_0_dim_gpu_tensor_reads_it():
    with simulated_gpus(1) as sim:
        x, i = gpu(1.0, 2.0, 3.0), gpu(2, dtype=torch.long)[0]
        before = sim.traffic.snapshot()
        assert float(x[i].elem) == 3.0
        assert (sim.traffic - before).syncs == 1


def test_printing_a_gpu_tensor_reads_it():
    with simulated_gpus(1) as sim:
        x = gpu(1.0, 2.0)
        before = sim.traffic.snapshot()
        text = repr(x) + str(x)
        assert "cuda:0" in text and (sim.traffic - before).syncs == 2


def test_a_cpu_generator_is_refused_with_gpu_tensors():
    gen = torch.Generator().manual_seed(0)
    with simulated_gpus(1):
        probs = gpu(0.2, 0.8)
        with pytest.raises(RuntimeError, match="device type for generator"):
            torch.multinomial(probs, 1, generator=gen)
        assert torch.multinomial(probs, 1).device == probs.device
        assert torch.rand(3, generator=gen).device.type == "cpu"  # on the host it is the host's generator


def test_a_blocking_upload_is_a_sync_and_a_pinned_asynchronous_one_is_not():
    with simulated_gpus(1) as sim:
        before = sim.traffic.snapshot()
        torch.ones(4).to("cuda:0")
        spent = sim.traffic - before
        assert (spent.syncs, spent.uploads_pageable) == (1, 1)
        before = sim.traffic.snapshot()
        torch.ones(4).pin_memory().to("cuda:0", non_blocking=True)
        spent = sim.traffic - before
        assert (spent.syncs, spent.uploads_pinned, spent.uploads_pageable) == (0, 1, 0)


def test_reads_are_counted_and_the_sync_debug_mode_warns_or_raises_as_torch_does():
    with simulated_gpus(1) as sim:
        x = gpu(1.0, 2.0)
        before = sim.traffic.snapshot()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            x.sum().item()
            torch.cuda.set_sync_debug_mode("warn")
            assert torch.cuda.get_sync_debug_mode() == 1
            x.tolist()
            x[x > 1]  # a boolean mask: nonzero, a read of the count
            torch.cuda.set_sync_debug_mode("default")
            x.sum().item()
        assert (sim.traffic - before).syncs == 4
        assert [str(w.message) for w in seen] == [SYNC_WARNING] * 2
        torch.cuda.set_sync_debug_mode("error")
        with pytest.raises(RuntimeError, match="synchronizing"):
            x.sum().item()
        torch.cuda.set_sync_debug_mode(0)
