"""Where the verification core puts its tensors: the same code a sharded CUDA model runs, checked on the CPU
with a head moved to the meta device (a stand-in for "another GPU") and devices recorded instead of synced."""

import numpy as np
import pytest
import torch

from specbench.core import kv
from specbench.core.draft import Draft
from specbench.core.forward import Target, block_layout, model_devices, runs_on, upload
from tests.core.test_tree_forward import PREFIX, build


def test_upload_keeps_values_and_dtype():
    t = upload([[1, 2, 3]], torch.device("cpu"))
    assert t.tolist() == [[1, 2, 3]] and t.dtype == torch.int64
    assert upload(np.array([True, False]), torch.device("cpu")).dtype == torch.bool
    assert upload([0.5], "cpu", torch.float16).dtype == torch.float16


def test_kept_rows_index_goes_where_the_final_hidden_states_are(monkeypatch):
    """A sharded model's final hidden states come out of its final norm, on the last GPU: the kept rows' index
    goes there, while ids, positions and the mask go to the embedding's device."""
    model = build("llama")
    model.model.norm.to("meta")
    target = Target(model)
    assert target.device == torch.device("cpu") and target.head_device == torch.device("meta")
    assert model_devices(model) == [torch.device("cpu")]  # weights on meta are not computed there
    seen = {}

    def fake_forward(ids, positions, mask, cache, lo=0, keep=None, features=()):
        seen.update(ids=ids.device, positions=positions.device, mask=mask.device, keep=keep.device)
        return torch.zeros(1)

    monkeypatch.setattr(target, "_forward", fake_forward)
    draft = Draft(tokens=[3, 4], parents=[-1, -1], sources=["t", "t"], aux_tokens=[7, 8],
                  aux_positions=[1, 2], aux_visible=[[False, False], [True, False]], aux_logit_rows=[1])
    target.forward_draft(5, draft, target.new_cache())
    assert seen == dict(ids=torch.device("cpu"), positions=torch.device("cpu"), mask=torch.device("cpu"),
                        keep=torch.device("meta"))


def test_an_offloaded_module_runs_where_its_hook_executes_it():
    """accelerate keeps an offloaded module's weights on meta between forwards and runs it on its hook's
    execution device: the core sends the kept rows, and counts the device, there."""
    from types import SimpleNamespace

    model = build("llama")
    model.model.norm.to("meta")
    model.model.norm._hf_hook = SimpleNamespace(execution_device="cpu")
    assert runs_on(model.model.norm) == torch.device("cpu") and Target(model).head_device == torch.device("cpu")
    assert model_devices(model) == [torch.device("cpu")]


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_mask_built_on_the_device_equals_the_host_built_one(kind):
    """Only the block's visibility crosses from the host; the result is the mask as built entirely on the host."""
    target = Target(build(kind))
    draft = Draft(tokens=[3, 4, 5, 6], parents=[-1, 0, -1, 2], sources=["t"] * 4)
    vis, offsets = block_layout(draft)
    past = len(PREFIX) + 3
    q = len(offsets)
    allowed = torch.ones((q, past + q), dtype=torch.bool)
    allowed[:, past:] = torch.from_numpy(vis)
    if target.has_sliding:
        q_pos = torch.from_numpy(offsets + past)
        k_pos = torch.cat([torch.arange(past), q_pos])
        allowed_sliding = allowed & ((q_pos[:, None] - k_pos[None, :]) < target.sliding_window)
    neg = torch.finfo(target.dtype).min

    def reference(ok):
        return torch.zeros(ok.shape, dtype=target.dtype).masked_fill(~ok, neg)[None, None]

    mask = target._mask(vis, offsets, past)
    if target.has_sliding:
        assert torch.equal(mask["full_attention"], reference(allowed))
        assert torch.equal(mask["sliding_attention"], reference(allowed_sliding))
        assert not torch.equal(mask["sliding_attention"], mask["full_attention"])  # the window bites
    else:
        assert torch.equal(mask, reference(allowed))


def test_compaction_uploads_its_index_once_per_device_not_per_layer(monkeypatch):
    target = Target(build("gemma3"))  # three layers
    cache = target.new_cache()
    target.prefill(PREFIX, cache)
    past = cache.get_seq_length()
    target.forward_draft(PREFIX[-1], Draft(tokens=[3, 4, 5], parents=[-1, -1, 1], sources=["t"] * 3), cache)
    calls = []
    monkeypatch.setattr(kv, "upload", lambda values, device, dtype=None: calls.append(device) or
                        torch.as_tensor(values, device=device))
    target.compact(cache, past, [1, 2])
    assert len(cache.layers) == 3 and calls == [torch.device("cpu")]
    assert cache.get_seq_length() == past + 3


def test_sync_waits_for_every_gpu_the_model_is_on(monkeypatch):
    target = Target(build("llama"))
    target.devices = [torch.device("cuda", 0), torch.device("cuda", 3), torch.device("cpu")]
    target.is_cuda = True
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    target.sync()
    assert synced == [torch.device("cuda", 0), torch.device("cuda", 3)]


def test_peak_memory_is_not_a_number_on_the_cpu():
    target = Target(build("llama"))
    target.reset_peak_memory()
    assert np.isnan(target.peak_memory_gb())


def test_a_draft_reads_its_last_hidden_states_where_its_final_norm_is():
    """SpecDec++'s head goes to the device its input comes out on: a sharded model's last one, here the meta device
    standing in for it."""
    from specbench.drafting.draft_model import DraftLM

    model = build("llama")
    model.model.norm.to("meta")
    draft = DraftLM(model, [0], vocab_size=96)
    assert draft.hidden_device == torch.device("meta") and draft.shape.device == torch.device("cpu")
