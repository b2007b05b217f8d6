"""``make gpu-bundle`` (``specbench gpu-bundle``): the wheels a GPU machine without network lacks,
for ``./gpu_check.sh`` there.

A lent GPU machine has torch, transformers, accelerate, numpy, pandas, pyarrow, matplotlib, safetensors and
tokenizers, but not omegaconf (with antlr4, its parser), hydra-core or tokengrams. This downloads those, at the
versions installed here, as wheels for the GPU machine's Python (``--python 3.12``, manylinux x86_64), no
dependency pulled beyond them, into ``.gpu-bundle/`` (ignored by git, carried with the working tree).
tokengrams has no wheel for Python 3.12 and later: it is left out there and the datastore's numpy suffix table
stands in (:mod:`specbench.stores.suffix_table`).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

PACKAGES = ("omegaconf", "hydra-core", "tokengrams")
PURE_SDIST = ("antlr4-python3-runtime",)  # omegaconf's parser: an sdist only, built here into a py3 wheel
PLATFORMS = ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_28_x86_64")
LIMIT_BYTES = 48 * 2**20  # what the working tree may carry is 64 MiB in all


def pinned(name: str) -> str:
    try:
        return f"{name}=={metadata.version(name)}"
    except metadata.PackageNotFoundError:
        return name


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
                          capture_output=True, text=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="specbench gpu-bundle", description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default="3.12", help="the GPU machine's Python, major.minor (default 3.12)")
    ap.add_argument("--out", type=Path, default=Path(".gpu-bundle"))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        notes = []
        for name in PACKAGES:
            spec = pinned(name)
            got = pip("download", "--no-deps", "--only-binary=:all:", "--python-version", args.python,
                      "--implementation", "cp", *[f"--platform={p}" for p in PLATFORMS], "-d", tmp, spec)
            if got.returncode:
                if name == "tokengrams":
                    notes.append(f"{spec}: no wheel for Python {args.python}; the numpy suffix table stands in")
                    continue
                raise SystemExit(f"gpu-bundle: could not download {spec} for Python {args.python}: "
                                 f"{got.stderr.strip().splitlines()[-1] if got.stderr.strip() else got.returncode}")
        for name in PURE_SDIST:
            got = pip("wheel", "--no-deps", "-w", tmp, pinned(name))
            if got.returncode:
                raise SystemExit(f"gpu-bundle: could not build a wheel of {pinned(name)}: "
                                 f"{got.stderr.strip().splitlines()[-1] if got.stderr.strip() else got.returncode}")
        wheels = sorted(Path(tmp).glob("*.whl"))
        size = sum(w.stat().st_size for w in wheels)
        if size > LIMIT_BYTES:
            raise SystemExit(f"gpu-bundle: {size / 2**20:.1f} MiB of wheels, over {LIMIT_BYTES / 2**20:.0f} MiB")
        if args.out.exists():
            shutil.rmtree(args.out)
        args.out.mkdir(parents=True)
        for w in wheels:
            shutil.copy2(w, args.out / w.name)
    (args.out / "PYTHON").write_text(args.python + "\n")
    for w in wheels:
        print(f"  {w.name}")
    for n in notes:
        print(f"  ({n})")
    print(f"gpu-bundle: {len(wheels)} wheels, {size / 2**20:.1f} MiB, for Python {args.python} in {args.out}/; "
          "on the GPU machine: ./gpu_check.sh --out gpu-check")


if __name__ == "__main__":
    main()
