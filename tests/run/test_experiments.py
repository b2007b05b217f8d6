"""Every experiment composes (each swept value too), every smoke variant runs, sweeps report their jobs."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf

from methods.registry import get_method, method_names
from specbench.errors import ConfigError, ModelLoadError
from specbench.paths import CONF_DIR, conf_choices
from specbench.results.rows import load_results
from specbench.run.config import validate
from specbench.run.jobs import STATUS_FILE, sweep_summary
from specbench.run.runner import _warn_device_mismatch
from specbench.tables import report

ROOT = Path(__file__).resolve().parents[2]
# Method presets the paper's experiments name that are defined elsewhere (REST, SPECTRA, its RETRIEVAL
# module, Lookahead + REST): a sweep value may name them only when conf/method/<name>.yaml exists or here.
EXPECTED_ELSEWHERE: set[str] = set()  # method presets an experiment may name before they exist
EXPERIMENTS = conf_choices("experiment")
SMOKES = [e for e in EXPERIMENTS if e.endswith("_smoke")]
# Smoke sweeps short enough for the fast suite (each is one CLI process; the others are marked slow).
FAST_SMOKES = {"table7_smoke"}


def sweep_params(experiment: str) -> dict[str, list[str]]:
    raw = yaml.safe_load((CONF_DIR / "experiment" / f"{experiment}.yaml").read_text()) or {}
    params = ((raw.get("hydra") or {}).get("sweeper") or {}).get("params") or {}
    return {k: [v.strip() for v in str(val).split(",")] for k, val in params.items()}


def compose_cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def _method_of(key: str, value: str) -> str | None:
    """The method preset a sweep value selects (directly, or through a variant config)."""
    if key == "method":
        return value
    if key.lstrip("+") == "variant":
        raw = yaml.safe_load((CONF_DIR / "variant" / f"{value}.yaml").read_text())
        for entry in raw.get("defaults", []):
            if isinstance(entry, dict) and "override /method" in entry:
                return entry["override /method"]
    return None


@pytest.mark.parametrize(
    "experiment,key,value",
    [(e, k, v) for e in EXPERIMENTS for k, vs in sweep_params(e).items() for v in vs],
)
def test_every_swept_value_composes(experiment, key, value):
    method = _method_of(key, value)
    if method is not None and method not in conf_choices("method"):
        assert method in EXPECTED_ELSEWHERE, f"{experiment}: {key}={value} names no method preset"
        with pytest.raises(HydraException, match=method):
            compose_cfg(f"experiment={experiment}", f"{key}={value}")
        return
    cfg = compose_cfg(f"experiment={experiment}", f"{key}={value}")
    if cfg.hardware.device == "cpu":
        validate(cfg)
    else:  # GPU placements: every field still checked without a GPU, up to the missing device
        with pytest.raises(ValueError, match="CUDA"):
            validate(cfg)
    assert cfg.experiment_name == experiment.removesuffix("_smoke")


@pytest.mark.parametrize("experiment", [e for e in EXPERIMENTS if e.startswith(("table", "figure", "cpu_"))])
def test_smoke_variants_sweep_the_same_settings(experiment):
    if experiment.endswith("_smoke"):
        return
    smoke = f"{experiment}_smoke"
    assert smoke in SMOKES, f"{experiment} has no smoke variant"
    assert set(sweep_params(smoke)) == set(sweep_params(experiment))
    cfg = compose_cfg(f"experiment={smoke}")
    # llama.cpp's GGUF converter reads no tiny random tokenizer: the peers' smoke runs the embedded default
    small = cfg.model.name == "smollm2-135m" if cfg.get("engines") else cfg.model.tiny is not None
    assert small and cfg.hardware.device == "cpu" and cfg.results_dir == "results/smoke"


def test_smoke_runs_use_methods_of_this_code():
    for smoke in SMOKES:
        for key, values in sweep_params(smoke).items():
            for v in values:
                method = _method_of(key, v)
                if method is not None:
                    assert method in conf_choices("method"), f"{smoke}: {key}={v}"


def run_cli(*args: str, cwd: Path = ROOT, timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env=env)


RETRIEVAL = ("rest", "spectra", "lookahead_rest", "retrieval")


@pytest.fixture(scope="session")
def tiny_store_env(tmp_path_factory):
    """A cache holding the tiny model's `stdlib` store (20 files) and its refined copy, as
    `make smoke-experiments` builds them: the retrieval rows of the smoke sweeps read these."""
    cache = tmp_path_factory.mktemp("cache")
    env = {**os.environ, "SPECBENCH_CACHE": str(cache)}
    py = [sys.executable, "-m", "specbench", "datastore"]
    for cmd in (["build", "--model", "tiny-llama", "--source", "stdlib", "--limit", "20", "--quiet"],
                ["refine", "--model", "tiny-llama", "--store", "stdlib", "--keep", "0.5", "--sample", "40", "--quiet"]):
        done = subprocess.run(py + cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    return env


def _n_jobs(experiment: str) -> int:
    return math.prod(len(v) for v in sweep_params(experiment).values())


@pytest.mark.parametrize(
    "smoke",
    [pytest.param(s, marks=() if s in FAST_SMOKES else pytest.mark.slow) for s in SMOKES],
)
def test_smoke_experiment_runs_and_reports(smoke, tmp_path, request):
    swept = [v for values in sweep_params(smoke).values() for v in values]
    env = request.getfixturevalue("tiny_store_env") if any(v.startswith(RETRIEVAL) for v in swept) else None
    out = run_cli("-m", f"experiment={smoke}", f"results_dir={tmp_path}/results",
                  f"hydra.sweep.dir={tmp_path}/sweep", "progress=false", env=env)
    n = _n_jobs(smoke)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"{n} done, 0 skipped (already recorded), 0 failed" in out.stderr
    name = smoke.removesuffix("_smoke")
    df = load_results(tmp_path / "results" / name)
    assert len(df) and df["preset"].notna().all() and (df["preset"] != "").all()
    assert {"preset", "attn_implementation", "device"} <= set(df.columns)
    # the sweep ends with every preset side by side on stdout, its legend under it; logs go to stderr
    legend = out.stdout.rfind("- speedup: ")  # the last table before the speedup legend (a serving table follows)
    final = out.stdout[out.stdout.rfind("\n\n|", 0, legend) if legend >= 0 else -200 :]
    assert all(f"| {p} " in final for p in set(df["preset"])), out.stdout[-3000:]
    assert "- speedup: " in final and "make summary RESULTS=" in final
    assert "[HYDRA]" not in out.stdout and "][INFO]" not in out.stdout
    folders = {p.name.split("__")[1] for p in (tmp_path / "results" / name).iterdir()}  # named by their presets
    ours = df[(df["method"] != "autoregressive") & (df["engine"].fillna("") == "" if "engine" in df else True)]
    assert set(ours["preset"]) <= folders <= set(df["preset"]), folders  # a peer engine's rows: in the job's
    outputs = [o for o, src in report.SOURCES.items() if src == name]
    if outputs:
        report.write_report(outputs, tmp_path / "results", tmp_path / "report", paper_dir=None)
        for o in outputs:
            if o in report.BUILDERS:
                data = pd.read_csv(tmp_path / "report" / f"{o}.csv")
                assert data["ours"].notna().any(), o
            else:
                assert (tmp_path / "report" / f"{o}.png").stat().st_size > 1000
    if smoke == "table6_smoke":
        table6_rows_name_the_preset_and_label(df, tmp_path)


def table6_rows_name_the_preset_and_label(df, tmp_path):
    """Under Hydra the preset is the method group's choice; a re-run skips what is recorded."""
    spectra = df[df["method"] == "spectra_core"]
    assert set(spectra["preset"]) == {"spectra_core-cpu:auto"} and set(df["device"]) == {"1xCPU"}  # its budget
    assert set(df[df["method"] == "autoregressive"]["preset"]) == {"autoregressive"}
    again = run_cli("-m", "experiment=table6_smoke", f"results_dir={tmp_path}/results", "progress=false",
                    f"hydra.sweep.dir={tmp_path}/again")
    assert again.returncode == 0 and "0 done, 1 skipped (already recorded), 0 failed" in again.stderr


@pytest.mark.slow
def test_a_failing_job_is_recorded_and_the_sweep_goes_on(tmp_path):
    out = run_cli("-m", "experiment=table6_smoke", "max_new_tokens=4,0", f"results_dir={tmp_path}/r",
                  f"hydra.sweep.dir={tmp_path}/s", "progress=false")
    assert out.returncode == 1
    assert "1 done, 0 skipped (already recorded), 1 failed" in out.stderr
    assert "max_new_tokens=0" in out.stderr and "max_new_tokens must be a positive" in out.stderr


def test_sweep_summary_counts_outcomes(tmp_path):
    for i, outcome in enumerate([
        {"status": "done"}, {"status": "skipped"}, {"status": "done"},
        {"status": "failed", "error": "unknown model 'x'", "overrides": ["model=x"]},
    ]):
        d = tmp_path / str(i)
        (d / ".hydra").mkdir(parents=True)
        (d / ".hydra" / "overrides.yaml").write_text("[]")
        (d / STATUS_FILE).write_text(json.dumps(outcome))
    killed = tmp_path / "9" / ".hydra"
    killed.mkdir(parents=True)
    (killed / "overrides.yaml").write_text("[]")
    s = sweep_summary(tmp_path)
    assert (s["done"], s["skipped"], s["failed"], s["silent"]) == (2, 1, 1, 1)
    assert "failed: model=x: unknown model 'x'" in s["text"] and "without an outcome" in s["text"]


def test_flash_attention_refuses_tree_methods_in_one_line(tmp_path):
    out = run_cli("experiment=smoke", "method=lookahead", "hardware.attn_implementation=flash_attention_2",
                  f"results_dir={tmp_path}", f"hydra.run.dir={tmp_path}/h", timeout=300)
    assert out.returncode == 2
    err = out.stderr.strip()
    assert err.startswith("error: method lookahead drafts trees") and "flash_attention_2" in err
    assert len(err.splitlines()) == 1 and "Traceback" not in out.stderr
    assert not list(tmp_path.rglob("*.parquet"))


def test_tree_and_chain_methods():
    chains = {n for n in method_names() if not get_method(n).tree_drafts}
    assert {"autoregressive", "pld", "anpd"} <= chains
    assert get_method("lookahead").tree_drafts and get_method("spectra_core").tree_drafts
    # A chain method passes the attention check (and fails later only for want of CUDA here).
    cfg = compose_cfg("method=pld", "hardware.attn_implementation=flash_attention_2")
    with pytest.raises(ValueError) as err:
        validate(cfg)
    assert "drafts trees" not in str(err.value)
    with pytest.raises(ConfigError, match="drafts trees"):
        validate(compose_cfg("method=spectra_core", "hardware.attn_implementation=flash_attention_2"))


def test_device_mismatch_warns(capsys):
    hw = OmegaConf.create({"label": "A40", "expect_device": "A40"})
    _warn_device_mismatch(hw, "NVIDIA A40")
    assert capsys.readouterr().err == ""
    _warn_device_mismatch(hw, "NVIDIA A100-SXM4-80GB")
    err = capsys.readouterr().err
    assert "warning: hardware label 'A40'" in err and "A100-SXM4" in err
    _warn_device_mismatch(OmegaConf.create({"label": "RTX8000", "expect_device": "RTX 8000"}),
                          "Quadro RTX 8000")
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("gpu", ["a40", "a6000", "rtx8000", "rtx3090", "a100", "h100", "cpu"])
def test_hardware_labels_exist(gpu):
    cfg = compose_cfg(f"hardware={gpu}")
    assert cfg.hardware.label and "expect_device" in cfg.hardware


def test_int8_is_a_clear_error_without_bitsandbytes_or_cuda():
    cfg = compose_cfg("model=llama2-70b", "model.quantization=int8")
    with pytest.raises(ModelLoadError, match="bitsandbytes|CUDA") as err:
        validate(cfg)
    assert "\n" not in str(err.value)
    with pytest.raises(ModelLoadError, match="quantization 'int4' is not one of int8"):
        validate(compose_cfg("model=llama2-70b", "model.quantization=int4"))
    with pytest.raises(ModelLoadError, match="not tiny or GGUF"):
        validate(compose_cfg("model=tiny-llama", "model.quantization=int8"))


def test_int8_on_the_command_line_is_one_line(tmp_path):
    out = run_cli("model=llama2-70b", "model.quantization=int8", f"results_dir={tmp_path}",
                  f"hydra.run.dir={tmp_path}/h", timeout=300)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "model.quantization=int8" in out.stderr


def test_the_same_sweep_goes_to_slurm_with_the_outcome_report():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["experiment=table1", "hydra/launcher=slurm"], return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher")
    assert cfg.hydra.sweeper.params.method == "anpd,lookahead,rest,spectra"
    assert cfg.hydra.callbacks.sweep_report._target_ == "specbench.run.jobs.SweepReport"
