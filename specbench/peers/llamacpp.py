"""llama.cpp's server as a peer engine: built once from the sources PyPI ships, fed the same model and prompts.

* :func:`build` (``make peers``): the ``llama-cpp-python`` sdist (:data:`VERSION`) carries llama.cpp's sources
  in ``vendor/llama.cpp``; its ``llama-server`` target is built with CMake (Ninja when there is one) into
  ``$SPECBENCH_CACHE/peers/llama.cpp-<version>/``, with a progress line. The sources stay there too: their
  ``convert_hf_to_gguf.py`` writes the GGUFs below.
* :func:`gguf_for`: the weights our run loaded, written as a GGUF of the same precision (F32 for fp32, BF16,
  F16) and kept per model and weights, so that llama.cpp's forward reads the very numbers ours does.
* :class:`LlamaServer`: a server process on a free loopback port, one speculative type (``none``: its own
  autoregressive decoding), stopped when the block ends, at exit, and with its parent (``PR_SET_PDEATHSIG``):
  never left running. :meth:`LlamaServer.complete` sends a prompt's token ids (the chat template already
  applied, the very tokens our run decodes) to ``/completion`` greedily, no prompt cache, and returns the
  output ids with the server's own timings and draft counts.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbench.core.record import GenerationRecord
from specbench.errors import ConfigError
from specbench.paths import cache_root

VERSION = "0.3.36"  # llama-cpp-python's sdist: vendor/llama.cpp is the engine measured
ENGINE = "llama.cpp"
SPEC_TYPES = ("none", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache", "draft-simple")
GGUF_TYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
START_TIMEOUT = 120.0  # seconds a server may take to load the model and answer /health


class PeerError(ConfigError):
    """A peer engine is missing, cannot be built or did not answer: the message names the fix."""


def home() -> Path:
    return cache_root() / "peers" / f"llama.cpp-{VERSION}"


def server_binary() -> Path | None:
    """The built ``llama-server`` (``$SPECBENCH_LLAMA_SERVER`` names another), or None."""
    named = os.environ.get("SPECBENCH_LLAMA_SERVER")
    path = Path(named) if named else home() / "bin" / "llama-server"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def require_server() -> Path:
    path = server_binary()
    if path is None:
        raise PeerError(f"llama.cpp's server is not built: run `make peers` (5-10 minutes on 2 cores; it goes "
                        f"to {home()})")
    return path


def sources() -> Path:
    return home() / "src" / "llama.cpp"


def build(jobs: int | None = None, progress: bool = True) -> Path:
    """Download the sdist (once), unpack its llama.cpp, build ``llama-server``; the binary's path."""
    cmake, compiler = shutil.which("cmake"), next(filter(None, map(shutil.which, ("c++", "g++", "clang++"))), None)
    missing = [name for name, found in (("cmake", cmake), ("a C++ compiler", compiler)) if not found]
    if missing:
        raise PeerError(f"make peers needs CMake and a C++ compiler; missing: {', '.join(missing)} (Debian: "
                        "apt-get install cmake g++; or pip install cmake)")
    root = home()
    root.mkdir(parents=True, exist_ok=True)
    src = sources()
    if not (src / "CMakeLists.txt").is_file():
        _unpack(_download(root / "sdist"), src)
    out = root / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    _run([cmake, "-S", str(src), "-B", str(out), *generator, "-DCMAKE_BUILD_TYPE=Release",
          "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
          "-DLLAMA_OPENSSL=OFF", "-DBUILD_SHARED_LIBS=OFF"], "configuring llama.cpp", progress=False)
    _run([cmake, "--build", str(out), "--target", "llama-server", "-j", str(jobs or os.cpu_count() or 2)],
         "building llama-server", progress=progress)
    binary = root / "bin" / "llama-server"
    binary.parent.mkdir(exist_ok=True)
    shutil.copy2(out / "bin" / "llama-server", binary)
    shutil.rmtree(out, ignore_errors=True)  # the objects (hundreds of MB); the sources stay for the converter
    return binary


def _download(folder: Path) -> Path:
    found = sorted(folder.glob(f"llama_cpp_python-{VERSION}.tar.gz"))
    if found:
        return found[0]
    print(f"downloading llama-cpp-python {VERSION}'s sources (76 MB) …", file=sys.stderr)
    _run([sys.executable, "-m", "pip", "download", f"llama-cpp-python=={VERSION}", "--no-deps", "--no-binary",
          ":all:", "-d", str(folder)], "downloading the llama-cpp-python sdist", progress=False)
    return next(folder.glob(f"llama_cpp_python-{VERSION}.tar.gz"))


def _unpack(sdist: Path, dest: Path) -> None:
    prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
        for m in members:
            m.name = m.name[len(prefix):]
        tar.extractall(tmp, members=[m for m in members if m.name], filter="data")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def _run(cmd: list[str], what: str, progress: bool) -> None:
    """Run ``cmd``; with ``progress``, Ninja's or Make's ``[n/N]`` / ``[ p%]`` as a progress bar; on failure,
    the last lines of its output in the error."""
    from tqdm.auto import tqdm

    bar = tqdm(total=100, desc=what, disable=not progress, file=sys.stderr,
               bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]")
    tail: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            tail = (tail + [line.rstrip()])[-20:]
            m = re.match(r"\[\s*(\d+)/(\d+)\]", line) or re.match(r"\[\s*(\d+)%\]", line)
            if m:
                done = 100 * int(m[1]) / int(m[2]) if m.lastindex == 2 else int(m[1])
                bar.update(max(done - bar.n, 0))
    bar.close()
    if proc.returncode:
        raise PeerError(f"{what} failed (exit {proc.returncode}):\n" + "\n".join(tail))


def gguf_for(model: Any, tokenizer: Any, name: str, dtype: str) -> Path:
    """The GGUF of ``model``'s weights as loaded, in ``dtype``'s precision, written once per model and weights."""
    import tempfile

    from specbench.paths import atomic_publish, exclusive, private_tmp

    if dtype not in GGUF_TYPES:
        raise PeerError(f"llama.cpp runs the weights at {', '.join(GGUF_TYPES)}; this run loaded {dtype}")
    path = home() / "models" / f"{name}-{GGUF_TYPES[dtype]}-{_fingerprint(model)}.gguf"
    if path.is_file():
        return path
    src = sources()
    if not (src / "convert_hf_to_gguf.py").is_file():
        raise PeerError("llama.cpp's sources are not unpacked: run `make peers`")
    path.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(path):
        if path.is_file():
            return path
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            out = private_tmp(path)
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src / "gguf-py"), str(src)])}
            done = subprocess.run([sys.executable, str(src / "convert_hf_to_gguf.py"), tmp, "--outfile", str(out),
                                   "--outtype", GGUF_TYPES[dtype]], env=env, capture_output=True, text=True)
            if done.returncode or not out.is_file():
                out.unlink(missing_ok=True)
                raise PeerError(f"writing {name}'s {GGUF_TYPES[dtype]} GGUF failed:\n{done.stderr[-2000:]}")
            atomic_publish(out, path)
    return path


def _fingerprint(model: Any) -> str:
    """Which weights: the config and a sample of every tensor's bytes."""
    digest = hashlib.sha256(json.dumps(model.config.to_dict(), sort_keys=True, default=str).encode())
    for key, tensor in model.state_dict().items():
        digest.update(key.encode())
        digest.update(tensor.detach().flatten()[:256].float().cpu().numpy().tobytes())
    return digest.hexdigest()[:12]


@dataclass
class Completion:
    """One generation by the server: its tokens, its own timings (seconds) and draft counts."""

    tokens: list[int]
    prompt_s: float
    decode_s: float
    client_s: float  # the request as the client timed it (HTTP and JSON included)
    drafted: int
    accepted: int

    @property
    def seconds(self) -> float:
        """Prefill and decoding, as the server timed them: the figure compared with our ``wall_s``."""
        return self.prompt_s + self.decode_s

    @property
    def steps(self) -> int:
        """Target forwards, the prefill counted as one: each decode step brings 1 + the guesses it accepted."""
        return 1 + max(len(self.tokens) - 1 - self.accepted, 0) if self.tokens else 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # in the child, before exec: SIGTERM when the parent dies (Linux)
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class LlamaServer:
    """``llama-server`` for one GGUF and one speculative type, on a free loopback port."""

    def __init__(self, gguf: Path, spec_type: str = "none", threads: int | None = None, context: int = 4096,
                 binary: Path | None = None, extra: tuple[str, ...] = ()) -> None:
        if spec_type not in SPEC_TYPES:
            raise PeerError(f"llama.cpp spec type {spec_type!r}: one of {', '.join(SPEC_TYPES)}")
        self.binary, self.gguf, self.spec_type = binary or require_server(), Path(gguf), spec_type
        self.threads, self.context, self.extra = threads or _threads(), context, tuple(extra)
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.log = home() / "logs" / f"server-{os.getpid()}-{spec_type}.log"

    @property
    def command(self) -> list[str]:
        spec = [] if self.spec_type == "none" else ["--spec-type", self.spec_type]
        return [str(self.binary), "-m", str(self.gguf), "--host", "127.0.0.1", "--port", str(self.port),
                "-t", str(self.threads), "-tb", str(self.threads), "-c", str(self.context), "-np", "1",
                "--no-webui", *spec, *self.extra]

    def __enter__(self) -> LlamaServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.port = _free_port()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        atexit.register(self.stop)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PeerError(f"llama-server exited ({self.proc.returncode}) while starting:\n{self._tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        self.stop()
        raise PeerError(f"llama-server did not answer within {START_TIMEOUT:.0f} s:\n{self._tail()}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        atexit.unregister(self.stop)

    def _tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def complete(self, prompt_ids: list[int], max_new_tokens: int) -> Completion:
        """A greedy generation after the token ids ``prompt_ids`` (no prompt cache: every request prefills)."""
        body = {"prompt": list(prompt_ids), "n_predict": max_new_tokens, "temperature": 0.0, "top_k": 1,
                "cache_prompt": False, "return_tokens": True, "stream": False, "seed": 0}
        req = urllib.request.Request(f"{self.url}/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        start = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                answer = json.loads(r.read())
        except (urllib.error.URLError, ConnectionError) as err:
            raise PeerError(f"llama-server ({self.spec_type}) did not answer: {err}\n{self._tail()}") from err
        client = time.perf_counter() - start
        t = answer.get("timings", {})
        return Completion(tokens=[int(x) for x in answer.get("tokens", [])], prompt_s=t.get("prompt_ms", 0) / 1000,
                          decode_s=t.get("predicted_ms", 0) / 1000, client_s=client, drafted=int(t.get("draft_n", 0)),
                          accepted=int(t.get("draft_n_accepted", 0)))


def _threads() -> int:
    import torch

    return torch.get_num_threads()



@dataclass
class EngineRecord(GenerationRecord):
    """A peer engine's generation as a result row reads it: the server reports totals, not steps, so ``steps``
    is its count (:attr:`Completion.steps`) and the per-step lists stay empty."""

    counted_steps: int = 0

    @property
    def steps(self) -> int:
        return self.counted_steps


def engine_record(done: Completion, prompt_ids: list[int], max_new_tokens: int, source: str) -> EngineRecord:
    """``done`` as a record: tokens, the server's prefill and decode seconds, its steps, and its guesses drafted and
    accepted under ``source`` (the row's name)."""
    return EngineRecord(prompt_len=len(prompt_ids), output_ids=list(done.tokens), prefill_s=done.prompt_s,
                        decode_s=done.decode_s, drafted_by_source=Counter({source: done.drafted}),
                        accepted_by_source=Counter({source: done.accepted}), counted_steps=done.steps,
                        finish_reason="length" if len(done.tokens) >= max_new_tokens else "eos")
