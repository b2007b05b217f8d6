"""A clone with nothing beside it: no default leaves the repository, and the whole smoke chain runs there."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_no_default_path_leaves_the_repository():
    """Every path-like default in conf/ (a value, or an ``${oc.env:VAR,default}``'s fallback) stays inside."""
    outside = []
    for file in sorted((ROOT / "conf").rglob("*.yaml")):
        for n, line in enumerate(file.read_text().splitlines(), 1):
            value = line.split("#", 1)[0]
            if re.search(r"(^|[\s,:'\"])\.\./", value) or re.search(r"[:\s]/(work|home|tmp|root)/", value):
                outside.append(f"{file.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not outside, "defaults outside the repository:\n" + "\n".join(outside)


def test_published_figures_are_read_by_default():
    from specbench.tables.paper import PAPER_FILES, default_paper_dir
    from specbench.tables.spec_bench import LEADERBOARD_FILE, default_spec_bench_dir

    for folder, files in ((default_paper_dir(), PAPER_FILES.values()), (default_spec_bench_dir(), [LEADERBOARD_FILE])):
        assert folder.is_relative_to(ROOT)
        assert all((folder / f).is_file() for f in files), folder


@pytest.mark.slow
def test_the_smoke_chain_runs_from_a_copy_with_nothing_beside_it(tmp_path):
    """``make smoke-experiments`` in a copy of the project (tracked and new files) alone in its folder, with an
    empty cache and none of the settings that point at files: it exits 0, and its reports carry the shipped
    published figures (the Spec-Bench table's published column) and say the tiny model is not in the paper."""
    proj = tmp_path / "alone" / "specbench"
    proj.mkdir(parents=True)
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (proj / name).parent.mkdir(parents=True, exist_ok=True)
            (proj / name).write_bytes(src.read_bytes())
    assert sorted(p.name for p in proj.parent.iterdir()) == ["specbench"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECBENCH_")}
    env["SPECBENCH_CACHE"] = str(tmp_path / "cache")
    venv = Path(sys.executable).parent.parent  # this environment, not set up again (-o setup)
    done = subprocess.run(["make", "-o", "setup", "smoke-experiments", f"VENV={venv}"], cwd=proj, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "no paper figures" not in done.stderr and "no Spec-Bench leaderboard" not in done.stderr
    table1 = (proj / "reports" / "smoke" / "table1.md").read_text()
    assert "tiny-llama (not in the paper)" in table1
    board = (proj / "reports" / "smoke" / "spec_bench" / "spec_bench.md").read_text()
    assert "1.66" in board  # PLD's published overall speedup (Vicuna-7B, A100), shipped with the project


def test_make_help_lists_every_target():
    """Every target of the Makefile (underscores in names too: spec_bench, batch_sweep) is in ``make help``."""
    text = (ROOT / "Makefile").read_text()
    targets = {t for line in re.findall(r"^([a-z0-9][a-z0-9_ -]*):(?!=)", text, re.M) for t in line.split()}
    shown = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    listed = {t for line in re.findall(r"^  make (\S.*?) {2,}", shown, re.M) for t in line.split()}
    assert targets - listed == set(), targets - listed
    assert {"spec_bench", "batch_sweep", "memory_scopes", "summary", "gpu-bundle"} <= listed
