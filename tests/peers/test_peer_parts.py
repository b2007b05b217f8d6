"""The peer engine's parts that need no build: counting, errors that name the fix, and the server's life (start,
a request, stop, never an orphan) against a stand-in server that answers as llama-server does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from specbench.peers import llamacpp
from specbench.peers.llamacpp import Completion, LlamaServer, PeerError

# Answers /health, and /completion with the prompt's last token repeated, timings and draft counts as
# llama-server words them; writes its pid and its arguments beside itself.
FAKE = textwrap.dedent('''\
    import json, os, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    with open(os.path.join(os.path.dirname(__file__), "seen.json"), "w") as f:
        json.dump({"pid": os.getpid(), "args": args}, f)
    with open(os.path.join(os.path.dirname(__file__), "starts.txt"), "a") as f:
        f.write(" ".join(args) + "\\n")
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a): pass
        def reply(self, body):
            data = json.dumps(body).encode()
            self.send_response(200); self.send_header("Content-Length", str(len(data))); self.end_headers()
            self.wfile.write(data)
        def do_GET(self): self.reply({"status": "ok"})
        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            n = req["n_predict"]
            self.reply({"tokens": [req["prompt"][-1]] * n, "timings": {"prompt_ms": 10.0, "predicted_ms": 90.0,
                        "predicted_n": n, "draft_n": 6, "draft_n_accepted": 4}})
    HTTPServer(("127.0.0.1", port), H).serve_forever()
''')


@pytest.fixture
def fake(tmp_path, monkeypatch):
    script = tmp_path / "llama-server"
    script.write_text(f"#!{sys.executable}\n" + FAKE)
    script.chmod(0o755)
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    return script


def seen(fake) -> dict:
    return json.loads((fake.parent / "seen.json").read_text())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead
        return f.read().split(")")[-1].split()[0] != "Z"


def test_steps_count_the_prefill_and_one_per_decode_step_with_its_accepted_guesses():
    done = Completion(tokens=list(range(10)), prompt_s=0.1, decode_s=0.9, client_s=1.1, drafted=8, accepted=5)
    assert done.steps == 1 + (9 - 5) and done.seconds == pytest.approx(1.0)
    assert Completion([], 0, 0, 0, 0, 0).steps == 1


def test_a_server_starts_answers_and_stops(fake, tmp_path):
    with LlamaServer(tmp_path / "m.gguf", "ngram-simple", threads=2, context=512, binary=fake) as server:
        assert server.running
        done = server.complete([5, 6, 7], 4)
        args = seen(fake)["args"]
    assert done.tokens == [7] * 4 and (done.drafted, done.accepted) == (6, 4) and done.seconds == pytest.approx(0.1)
    assert done.client_s > 0
    assert args[args.index("--spec-type") + 1] == "ngram-simple" and args[args.index("-t") + 1] == "2"
    assert args[args.index("--host") + 1] == "127.0.0.1"
    assert not server.running and not alive(seen(fake)["pid"])


def test_autoregressive_runs_without_a_spec_type(fake, tmp_path):
    with LlamaServer(tmp_path / "m.gguf", "none", binary=fake):
        assert "--spec-type" not in seen(fake)["args"]


def test_a_server_that_dies_while_starting_says_so_with_its_log(tmp_path):
    broken = tmp_path / "llama-server"
    broken.write_text("#!/bin/sh\necho 'error: failed to load model' >&2\nexit 3\n")
    broken.chmod(0o755)
    with pytest.raises(PeerError, match="exited \\(3\\)(.|\\n)*failed to load model"):
        LlamaServer(tmp_path / "m.gguf", binary=broken).start()


def test_no_orphan_when_the_harness_is_killed(fake, tmp_path):
    code = (f"import sys, time; sys.path.insert(0, {str(llamacpp.__file__.rsplit('/specbench/', 1)[0])!r}); "
            "from specbench.peers.llamacpp import LlamaServer; from pathlib import Path; "
            f"s = LlamaServer(Path('m.gguf'), binary=Path({str(fake)!r})); s.start(); print('up', flush=True); "
            "time.sleep(60)")
    harness = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "SPECBENCH_CACHE": str(tmp_path / "cache")})
    assert harness.stdout.readline().strip() == "up"
    pid = seen(fake)["pid"]
    assert alive(pid)
    harness.send_signal(signal.SIGKILL)  # no atexit, no cleanup: the kernel must take the server down
    harness.wait()
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid)


def test_missing_build_and_tools_name_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    monkeypatch.delenv("SPECBENCH_LLAMA_SERVER", raising=False)
    assert llamacpp.server_binary() is None
    with pytest.raises(PeerError, match="make peers"):
        llamacpp.require_server()
    with pytest.raises(PeerError, match="make peers"):
        LlamaServer(tmp_path / "m.gguf")
    monkeypatch.setattr(llamacpp.shutil, "which", lambda name: None)
    with pytest.raises(PeerError, match="cmake, a C\\+\\+ compiler"):
        llamacpp.build()
    with pytest.raises(PeerError, match="spec type"):
        LlamaServer(tmp_path / "m.gguf", "ngram-bogus", binary=tmp_path)
