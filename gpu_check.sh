#!/usr/bin/env bash
# The GPU check on a machine with an NVIDIA GPU and no network: needs bash and a python3 that has torch (a CUDA
# build), transformers, accelerate, numpy and safetensors. What that python lacks of the rest (omegaconf,
# hydra-core, tokengrams) comes from the wheels `make gpu-bundle` put in .gpu-bundle/, installed offline into a
# temporary folder that is removed at the end. Nothing is downloaded, nothing outside that folder is written
# but the output folder.
#
#   bash gpu_check.sh [--out DIR] [--stages STAGE ...] [--deadline SECONDS] [any option of `specbench gpu-check --help`]
#
# Each stage's rows are written to DIR (default gpu-check/) as it finishes: DIR/gpu-check.md holds the table so
# far, DIR/<stage>.md and .json each stage's. Exit status: 0 all passed, 1 a check failed, 2 it could not run.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py="${PYTHON:-python3}"
bundle="${GPU_BUNDLE:-$here/.gpu-bundle}"
command -v "$py" >/dev/null || { echo "gpu_check.sh: no $py on PATH (set PYTHON=/path/to/python3)" >&2; exit 2; }
"$py" -c "import torch, transformers, accelerate, numpy, safetensors" 2>/dev/null || {
  echo "gpu_check.sh: $py lacks torch, transformers, accelerate, numpy or safetensors: use a python that has them (PYTHON=...)" >&2
  exit 2
}

target="$(mktemp -d "${TMPDIR:-/tmp}/specbench-gpu-bundle.XXXXXX")"
trap 'rm -rf "$target"' EXIT

# Install each bundled wheel whose module this python lacks, offline.
"$py" - "$bundle" "$target" <<'EOF'
import importlib.util, pathlib, subprocess, sys, zipfile
bundle, target = pathlib.Path(sys.argv[1]), sys.argv[2]
modules = {"omegaconf": "omegaconf", "antlr4_python3_runtime": "antlr4", "hydra_core": "hydra", "tokengrams": "tokengrams"}
wheels = sorted(bundle.glob("*.whl")) if bundle.is_dir() else []
missing = [m for m in modules.values() if importlib.util.find_spec(m) is None]
wanted = [w for w in wheels if modules.get(w.name.split("-")[0].lower()) in missing]
if wanted:
    pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0
    if pip:
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile",
                        "--disable-pip-version-check", "-q", "--target", target, *map(str, wanted)], check=True)
    else:  # a wheel is a zip laid out for site-packages
        for w in wanted:
            zipfile.ZipFile(w).extractall(target)
    print(f"gpu_check.sh: installed {', '.join(w.name.split('-')[0] for w in wanted)} offline", file=sys.stderr)
sys.path.insert(0, target)
importlib.invalidate_caches()
still = [m for m in ("omegaconf", "hydra") if importlib.util.find_spec(m) is None]
if still:
    sys.exit(f"gpu_check.sh: {', '.join(still)} missing and not in {bundle}: run `make gpu-bundle GPU_PY="
             f"{sys.version_info.major}.{sys.version_info.minor}` on a machine with network, and carry .gpu-bundle/")
EOF

export PYTHONPATH="$target:$here${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PIP_NO_INDEX=1 PYTHONDONTWRITEBYTECODE=1
cd "$here"
args=("$@")
[[ " ${args[*]-} " == *" --out "* ]] || args+=(--out gpu-check)
# a lent machine gives one command ten minutes: start no stage expected to end after 7.5 minutes (--deadline 0: none)
[[ " ${args[*]-} " == *" --deadline "* ]] || args+=(--deadline 450)
"$py" -m specbench gpu-check "${args[@]}"
