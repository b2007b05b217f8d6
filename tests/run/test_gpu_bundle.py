"""``make gpu-bundle`` then ``./gpu_check.sh`` as on a lent GPU machine: a python that has torch and transformers
but not omegaconf, hydra-core or tokengrams, no network (``unshare -n`` where this machine allows it), the
bundle's wheels installed offline into a temporary folder, the check's table left in the output folder."""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LACKING = ("omegaconf", "hydra", "antlr4", "tokengrams", "hydra_core", "antlr4_python3_runtime")


def bare_python(tmp: Path) -> Path:
    """A venv whose site-packages are this one's but for the bundled packages and the editable specbench."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp / "venv")], check=True)
    py = tmp / "venv" / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    mirror = tmp / "site"
    mirror.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = entry.name.lower()
        if name.endswith(".pth") or name.startswith(("__editable__", "specbench", "_specbench", *LACKING)):
            continue
        (mirror / entry.name).symlink_to(entry)
    (site / "mirror.pth").write_text(str(mirror) + "\n")
    return py


def offline_prefix() -> list[str]:
    ok = shutil.which("unshare") and subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0
    return ["unshare", "-n"] if ok else []


def test_gpu_check_sh_installs_the_bundle_offline_and_writes_its_table(tmp_path):
    py = bare_python(tmp_path)
    missing = subprocess.run([str(py), "-c", "import omegaconf"], capture_output=True, text=True)
    assert missing.returncode != 0 and "omegaconf" in missing.stderr
    assert subprocess.run([str(py), "-c", "import torch, transformers, accelerate"]).returncode == 0
    bundle = tmp_path / "bundle"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    made = subprocess.run([sys.executable, "-m", "specbench.cli.gpu_bundle", "--python", version, "--out", str(bundle)],
                          cwd=ROOT, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    wheels = sorted(p.name.split("-")[0] for p in bundle.glob("*.whl"))
    assert wheels == ["antlr4_python3_runtime", "hydra_core", "omegaconf", "tokengrams"]
    assert sum(p.stat().st_size for p in bundle.iterdir()) < 48 * 2**20
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(PYTHON=str(py), GPU_BUNDLE=str(bundle), PIP_INDEX_URL="http://127.0.0.1:9/simple")
    run = subprocess.run([*offline_prefix(), "bash", str(ROOT / "gpu_check.sh"), "--device", "cpu", "--tiny",
                          "--stages", "plan", "llama3-8b-fp32", "--methods", "pld", "rest", "--layers", "2",
                          "--tokens", "4", "--long-context", "64", "--out", str(out)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "installed antlr4_python3_runtime, hydra_core, omegaconf, tokengrams offline" in run.stderr
    table = (out / "gpu-check.md").read_text()
    assert "| lossless | llama3-8b | fp32 | ok | 3 methods equal autoregressive |" in table
    assert "| 70B plan (meta) |" in table and (out / "llama3-8b-fp32.json").exists()
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob("specbench-gpu-bundle.*/omegaconf"))  # removed


def test_gpu_check_sh_without_its_bundle_says_what_to_run(tmp_path):
    py = bare_python(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(PYTHON=str(py), GPU_BUNDLE=str(tmp_path / "none"))
    run = subprocess.run(["bash", str(ROOT / "gpu_check.sh"), "--device", "cpu", "--tiny"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "make gpu-bundle GPU_PY=" in run.stderr
    assert run.stderr.strip().count("\n") == 0, run.stderr


def test_gpu_check_sh_is_executable_in_a_clone():
    """`./gpu_check.sh` as the docs write it: git records the script with its executable bit."""
    mode = subprocess.run(["git", "ls-files", "-s", "gpu_check.sh"], cwd=ROOT, capture_output=True, text=True)
    assert mode.stdout.startswith("100755 "), mode.stdout
