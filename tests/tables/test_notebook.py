"""notebooks/figures.py (a jupytext notebook) runs top to bottom on smoke results."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_figures_notebook_executes_on_smoke_results(tmp_path, monkeypatch):
    jupytext = pytest.importorskip("jupytext")
    nbclient = pytest.importorskip("nbclient")
    for smoke in ("figure3_smoke", "figure4_smoke", "figure6_smoke"):
        out = subprocess.run(
            [sys.executable, str(ROOT / "run.py"), "-m", f"experiment={smoke}", f"results_dir={tmp_path}/results",
             f"hydra.sweep.dir={tmp_path}/sweep-{smoke}", "progress=false"],
            capture_output=True, text=True, cwd=ROOT, timeout=900,
        )
        assert out.returncode == 0, out.stderr[-2000:]
    nb = jupytext.read(ROOT / "notebooks" / "figures.py")
    monkeypatch.setenv("SPECBENCH_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("SPECBENCH_FIGURES", str(tmp_path / "figures"))
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=600,
                            resources={"metadata": {"path": str(ROOT)}}).execute()
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.get("output_type") == "display_data" and "image/png" in o.get("data", {})]
    assert len(images) == 3
    for name in ("figure3", "figure4", "figure6"):
        assert (tmp_path / "figures" / f"{name}.png").stat().st_size > 1000
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "ran with sdpa:" in text
