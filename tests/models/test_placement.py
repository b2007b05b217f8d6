"""Where weights go: the placement rules, the memory each placement may count, the after-load check and the
hardware a draft gets. The GPU count and free memory are arguments, so the rules run here without a GPU."""

import pytest
import torch

from specbench.errors import ModelLoadError
from specbench.models import config as model_settings
from specbench.models import resolve_hardware
from specbench.models.placement import check_placed, draft_hardware, gpus_used, offloaded, placement_kwargs

GB = 10**9


def hw(**kw):
    return {"device": "cuda", "attn_implementation": "sdpa", "device_map": None, "num_threads": None,
            "num_gpus": None, **kw}


def free(i):
    return (10 + i) * GB


def test_the_cpu_is_left_to_from_pretrained():
    assert gpus_used(hw(device="cpu"), None, 0) == [] and placement_kwargs(hw(device="cpu"), None, 0, free) == {}


def test_one_gpu_loads_straight_onto_it():
    assert placement_kwargs(hw(), None, 8, free) == {"device_map": {"": 0}}


def test_int8_stays_on_one_gpu_unless_told_otherwise():
    assert placement_kwargs(hw(), "int8", 8, free) == {"device_map": {"": 0}}
    spread = placement_kwargs(hw(num_gpus=2), "int8", 8, free)
    assert spread == {"device_map": "auto", "max_memory": {0: 10 * GB, 1: 11 * GB}}


def test_sharding_uses_the_first_num_gpus_and_never_the_cpu():
    kw = placement_kwargs(hw(device_map="auto", num_gpus=4), None, 8, free)
    assert kw["device_map"] == "auto" and list(kw["max_memory"]) == [0, 1, 2, 3]  # no "cpu" key: no offload
    assert list(placement_kwargs(hw(device_map="auto"), None, 3, free)["max_memory"]) == [0, 1, 2]
    assert placement_kwargs(hw(device_map="balanced"), None, 3, free) == {"device_map": "balanced"}


def test_memory_check_counts_the_gpus_the_load_may_use(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (free(i), 80 * GB))
    assert model_settings._available_bytes(hw()) == (10 * GB, "cuda:0")  # not the sum over 8 GPUs
    assert model_settings._available_bytes(hw(device_map="auto", num_gpus=2)) == (21 * GB, "2 GPUs")
    with pytest.raises(ModelLoadError, match=r"needs ~138 GB in float16 but cuda:0 has 10 GB"):
        model_settings._memory_check({"name": "llama2-70b", "params_b": 69, "dtype": "float16"}, hw())


class Fake(torch.nn.Module):
    def __init__(self, device_map=None, device="cpu"):
        super().__init__()
        self.layer = torch.nn.Linear(2, 2, device=device)
        if device_map is not None:
            self.hf_device_map = device_map


def test_layers_offloaded_to_the_cpu_or_disk_fail_the_load_in_one_line():
    model = Fake({"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": "cpu", "lm_head": "disk"})
    assert offloaded(model) == ["model.layers.1", "lm_head"]
    with pytest.raises(ModelLoadError, match=r"model 'big': model.layers.1, lm_head landed on the CPU or disk") as e:
        check_placed(model, "big", hw(device_map="auto"))
    assert "hardware.num_gpus" in str(e.value) and "\n" not in str(e.value)
    check_placed(Fake({"model": 0, "lm_head": 1}), "big", hw(device_map="auto"))  # all on GPUs: fine


def test_a_cuda_run_whose_weights_stayed_on_the_cpu_fails():
    with pytest.raises(ModelLoadError, match="landed on the CPU"):
        check_placed(Fake(), "small", hw())
    check_placed(Fake(), "small", hw(device="cpu"))  # a CPU run is meant to be there


def test_a_draft_gets_one_device_of_the_targets_hardware():
    draft = draft_hardware(hw(device_map="auto", num_gpus=8, attn_implementation="eager"))
    assert draft["device_map"] is None and draft["num_gpus"] is None
    assert draft["device"] == "cuda" and draft["attn_implementation"] == "eager"


def test_auto_hardware_follows_what_torch_sees(monkeypatch):
    auto = {"device": "auto", "label": "auto", "attn_implementation": "sdpa"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cpu = resolve_hardware(auto)
    assert (cpu.device, cpu.label) == ("cpu", "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu = resolve_hardware(auto)
    assert (gpu.device, gpu.label) == ("cuda", "cuda")
    assert resolve_hardware({**auto, "label": "H100"}).label == "H100"
    assert resolve_hardware({"device": "cpu", "label": "cpu"}).device == "cpu"


def test_loaded_model_says_how_it_was_placed(tiny_llama):
    assert tiny_llama.quantization == "" and tiny_llama.device_map == ""
