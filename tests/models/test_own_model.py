"""docs/own-model.md, run as a reader would: its commands on a tiny Llama saved as a local folder (``model=hf
model.path=<folder>``), its preset template validated, and the ``auto`` fields read from the checkpoint; each
wrong input is one line before anything loads."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from specbench.cli import report
from specbench.errors import ModelLoadError
from specbench.models import model_config_check
from specbench.models.own import resolve_model
from specbench.results.rows import load_results
from specbench.run.job import plan
from specbench.run.runner import run
from tests.methods.test_simulated_gpus import save_tiny
from tests.run.test_config import make_cfg

PAGE = Path(__file__).resolve().parents[2] / "docs" / "own-model.md"
PLACEHOLDER = "/path/to/my-model"
QUICK = ["limit=1", "max_new_tokens=8", "progress=false"]


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", PAGE.read_text(), flags=re.S)


def commands() -> list[list[str]]:
    """The page's ``python run.py`` lines, as argument lists."""
    return [shlex.split(line.split("#")[0]) for block in blocks("bash") for line in block.splitlines()
            if line.startswith("python run.py")]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path, size, _ = save_tiny(tmp_path_factory.mktemp("own") / "my-model")
    return path, size


def runs(args: list[str], folder: Path, results: Path) -> list[list[str]]:
    """The overrides of each job a command starts (a ``-m`` sweep: one per method), on ``folder``, quick."""
    overrides = [a.replace(PLACEHOLDER, str(folder)) for a in args[2:] if a != "-m"]
    overrides = [a for a in overrides if not a.startswith(("results_dir=", "limit="))]
    methods = next(a for a in overrides if a.startswith("method=")).split("=", 1)[1].split(",")
    rest = [a for a in overrides if not a.startswith("method=")]
    return [[*rest, f"method={m}", *QUICK, f"results_dir={results}"] for m in methods]


def test_the_pages_commands_run_on_a_model_saved_as_a_folder(folder, tmp_path):
    path, _ = folder
    local = [c for c in commands() if any("model.path=" in a for a in c)]
    assert len(local) == 2 and any("-m" in c for c in local), local  # one job, one sweep
    for command in local:
        for overrides in runs(command, path, tmp_path / "results"):
            run(make_cfg(*overrides))
    rows = load_results(tmp_path / "results")
    assert set(rows.model) == {"my-model"}
    assert {"pld", "token_recycling", "suffix", "autoregressive"} <= set(rows.method)
    report.main(["summary", "--results", str(tmp_path / "results"), "--out", str(tmp_path / "reports")])
    summary = (tmp_path / "reports" / "summary.md").read_text()
    assert all(f"| {preset} " in summary for preset in ("pld", "token_recycling", "suffix", "autoregressive"))
    report.main(["site", "--results", str(tmp_path / "results"), "--out", str(tmp_path / "site")])
    assert (tmp_path / "site" / "index.html").exists()


def test_the_auto_fields_are_read_from_the_checkpoint(folder):
    path, size = folder
    cfg = resolve_model(dict(make_cfg("model=hf", f"model.path={path}").model), "cpu")
    assert cfg["name"] == "my-model" and cfg["dtype"] == "float32" and cfg["chat"] is True
    assert cfg["params_b"] == pytest.approx(size / 4 / 1e9, rel=0.01)  # float32 weights: 4 bytes a parameter


def test_the_preset_template_is_a_valid_model_config(folder):
    path, _ = folder
    (template,) = blocks("yaml")
    cfg = yaml.safe_load(template.replace(PLACEHOLDER, str(path)))
    model_config_check(cfg)
    assert resolve_model(cfg)["name"] == "my-model"


@pytest.mark.parametrize(("overrides", "says"), [
    ([], "model=hf needs the checkpoint: model.hub_id=<owner/name>"),
    (["model.path=/no/such/folder"], "has no config.json"),
    (["model.hub_id=nobody/not-cached"], "hf download nobody/not-cached"),
    (["model.dtype=float64"], "dtype 'float64' is not one of"),
])
def test_a_wrong_checkpoint_is_one_line_before_loading(overrides, says, folder, monkeypatch):
    from specbench import hub

    monkeypatch.setattr(hub, "reachable", lambda *a, **k: False)
    if overrides and overrides[0].startswith("model.dtype"):
        overrides = [f"model.path={folder[0]}", *overrides]
    with pytest.raises(ModelLoadError, match=re.escape(says)) as err:
        plan(make_cfg("experiment=smoke", "model=hf", *overrides))
    assert "\n" not in str(err.value)
