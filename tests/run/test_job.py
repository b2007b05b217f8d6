"""The job a config describes: checked once, before any model loads; the runner reads only the Job."""

import dataclasses

import pytest
import torch

from specbench.errors import ConfigError
from specbench.results.metrics import BASELINE
from specbench.results.rows import load_results
from specbench.run import runner
from specbench.run.job import Job, hash_config, plan
from tests.run.test_config import make_cfg


def cfg_for(tmp_path, *extra):
    return make_cfg("experiment=smoke", f"results_dir={tmp_path}", "progress=false", *extra)


def test_plan_describes_the_job_without_a_model(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "load_model", lambda *a, **k: pytest.fail("planning loaded a model"))
    cfg = cfg_for(tmp_path, "method=pld", "limit=2", "temperature=1", "repeats=3", "max_new_tokens=7")
    job = plan(cfg)
    assert isinstance(job, Job)
    assert job.method == "pld" and job.methods == ["pld", BASELINE]
    assert job.method_config.max_ngram == cfg.method.max_ngram  # the filled dataclass, not the node
    assert len(job.samples) == 2 and job.repeats == 3 and job.max_new_tokens == 7
    assert job.sampling.temperature == 1 and job.budget == "fixed" and job.preset == "pld"
    assert job.folder.parent == tmp_path / cfg.experiment_name and job.folder.name == job.name
    assert job.config_hash in job.name and job.hardware.device in ("cpu", "cuda")  # hardware=auto, resolved
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.method = "autoregressive"


def test_plan_marks_auto_presets_and_drops_the_baseline_of_the_baseline(tmp_path):
    auto = plan(cfg_for(tmp_path, "method=spectra_core-cpu", "budget=auto"))
    assert auto.auto and auto.preset == "spectra_core:auto" and auto.preset_of(BASELINE) == BASELINE
    assert auto.config_of(BASELINE) is None and auto.config_of("spectra_core") is auto.method_config
    assert plan(cfg_for(tmp_path, "method=autoregressive")).methods == [BASELINE]
    assert plan(cfg_for(tmp_path, "method=pld", "baseline=false")).methods == ["pld"]


def test_bookkeeping_settings_leave_the_job_hash_alone(tmp_path):
    base = plan(cfg_for(tmp_path, "limit=1"))
    assert plan(cfg_for(tmp_path / "other", "limit=3", "repeats=2", "warmup=0")).config_hash == base.config_hash
    assert plan(cfg_for(tmp_path, "limit=1", "seed=1")).config_hash != base.config_hash


def test_a_new_results_version_measures_afresh(tmp_path, monkeypatch):
    """Raising RESULTS_VERSION (a changed rule under unchanged settings) changes every job's hash, so a re-run
    writes new rows instead of resuming the old rule's."""
    import specbench.run.job as job_module

    cfg = cfg_for(tmp_path, "limit=1")
    before = plan(cfg).config_hash
    monkeypatch.setattr(job_module, "RESULTS_VERSION", job_module.RESULTS_VERSION + 1)
    assert plan(cfg).config_hash != before


def test_auto_hardware_is_resolved_before_hashing(tmp_path, monkeypatch):
    """On a CPU machine the default (hardware=auto) is the CPU preset: the same hash, so earlier results resume;
    on a GPU machine the job, its label and its hash name CUDA."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    default, cpu = cfg_for(tmp_path), cfg_for(tmp_path, "hardware=cpu")
    assert default.hardware.device == "auto"
    assert plan(default).config_hash == plan(cpu).config_hash == hash_config(cpu)
    assert plan(default).hardware.label == "cpu" and plan(default).context()["device"] == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    job = plan(default)
    assert (job.hardware.device, job.hardware.label) == ("cuda", "cuda") and job.config_hash != hash_config(cpu)


def test_a_cpu_preset_on_a_gpu_and_a_big_model_on_the_cpu_warn(tmp_path, monkeypatch, capsys):
    from specbench.run import job as job_module

    monkeypatch.setattr(job_module, "preset_name", lambda cfg: "spectra_core-cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    job_module._warn_device_fit(job_module.OmegaConf.create(
        {"hardware": {"device": "cuda"}, "model": {"name": "tiny"}}))
    assert "on this GPU the paper's budget is method=spectra_core" in capsys.readouterr().err
    job_module._warn_device_fit(job_module.OmegaConf.create(
        {"hardware": {"device": "cpu"}, "model": {"name": "llama2-7b", "params_b": 6.7}}))
    err = capsys.readouterr().err
    assert "~6.7B parameters and will decode on the CPU" in err and err.count("\n") == 1
    monkeypatch.undo()
    plan(cfg_for(tmp_path, "hardware=cpu"))  # the tiny model on the CPU: quiet
    assert "warning" not in capsys.readouterr().err


def test_plan_refuses_an_empty_selection(tmp_path):
    with pytest.raises(ConfigError, match="no samples selected"):
        plan(cfg_for(tmp_path, "offset=10000"))


def test_execute_runs_from_the_job_alone(tmp_path):
    cfg = cfg_for(tmp_path, "method=pld", "limit=1", "max_new_tokens=8")
    job = plan(cfg)
    cfg.method.name = "autoregressive"  # the config is not read again once planned
    cfg.results_dir = str(tmp_path / "elsewhere")
    summary = runner.execute(job)
    df = load_results(tmp_path)
    assert set(df.method) == {"pld", BASELINE} and summary.attrs["results"] == str(job.folder)
    assert (df.new_tokens <= 8).all()


def test_a_paper_preset_on_a_laptop_says_what_it_runs(tmp_path, monkeypatch, capsys):
    """`python run.py method=spectra` finding no GPU says it runs the paper's GPU budget and names the CPU sizing;
    the CPU preset, budget=auto, and a method without a CPU twin say nothing."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    plan(cfg_for(tmp_path, "method=spectra_core"))
    err = capsys.readouterr().err
    assert "method=spectra_core runs the paper's GPU budget" in err and "method=spectra_core-cpu or budget=auto" in err
    assert err.count("\n") == 1
    for quiet in (("method=spectra_core-cpu",), ("method=spectra_core", "budget=auto"), ("method=pld",)):
        plan(cfg_for(tmp_path, *quiet))
        assert "GPU budget" not in capsys.readouterr().err, quiet


def test_the_run_folder_is_named_by_preset_and_an_earlier_method_named_one_is_resumed(tmp_path):
    """The folder carries the preset as tables and the progress bar name it (a budget's ``:auto`` too); a run an
    earlier version recorded under the method's name is found and resumed where it is, not started again."""
    job = plan(cfg_for(tmp_path, "method=spectra_core-cpu", "budget=auto", "limit=1", "max_new_tokens=4"))
    assert job.name.split("__")[1] == job.preset == "spectra_core:auto" and job.folder.name == job.name
    runner.execute(job)
    first = load_results(job.folder)
    legacy = job.folder.with_name(job.legacy_name)
    job.folder.rename(legacy)
    again = plan(cfg_for(tmp_path, "method=spectra_core-cpu", "budget=auto", "limit=1", "max_new_tokens=4"))
    assert again.folder == legacy
    assert runner.execute(again).attrs["new_generations"] == 0 and len(load_results(legacy)) == len(first)
