"""The SLURM pieces that need no cluster: the launcher's wait on the queue, what rows say of the job, threads
from the allocation, the launcher config, one cost measurement for jobs that start together.
(``tests/slurm`` runs sweeps on a real one: ``make slurm-test``.)"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from specbench.models.load import allocated_cpus
from specbench.paths import CONF_DIR
from specbench.provenance import scheduler_info
from specbench.run import slurm


def fake_job(tmp_path: Path, job_id: str, log: str = "") -> SimpleNamespace:
    paths = SimpleNamespace(result_pickle=tmp_path / f"{job_id}_result.pkl", stderr=tmp_path / f"{job_id}.err",
                            stdout=tmp_path / f"{job_id}.out")
    paths.stderr.write_text(log)
    return SimpleNamespace(job_id=job_id, paths=paths)


def test_a_task_that_leaves_the_queue_without_a_result_is_reported_with_slurms_reason(tmp_path):
    done = fake_job(tmp_path, "7_0")
    cancelled = fake_job(tmp_path, "7_1", "x\nslurmstepd-n1: error: *** JOB 9 ON n1 CANCELLED AT 2026-01-01T00:00:00 ***\n"
                                          "srun: error: Timed out waiting for job step to complete\n")
    requeued = fake_job(tmp_path, "7_2")
    looks = iter([
        {"7_0", "7_1", "7_2"},
        None, None,  # squeue did not answer: nobody counts as gone
        {"7_0", "7_2"},  # 7_1 missing once
        {"7_0"},  # 7_1 missing twice: ended; 7_2 missing once (SLURM requeueing it)
        {"7_0", "7_2"},  # 7_2 back
    ])

    def queue():
        ids = next(looks)
        if len(seen) == 5:  # the last look: both finished
            done.paths.result_pickle.write_text("ok")
            requeued.paths.result_pickle.write_text("ok")
        seen.append(ids)
        return ids

    seen: list = []
    ended = slurm.wait_for([done, cancelled, requeued], queue=queue, poll_s=0.001)
    assert len(seen) == 6
    assert ended == {"7_1": "SLURM job 7_1 ended without a result: *** JOB 9 ON n1 CANCELLED AT 2026-01-01T00:00:00 "
                            "*** (re-run the sweep to resume it)"}


def test_one_missed_look_is_not_an_ending(tmp_path):
    job = fake_job(tmp_path, "3")
    looks = iter([set(), {"3"}, set()])

    def queue():
        ids = next(looks)
        if not ids and job.job_id in seen:  # gone once, back, gone again: finished in between
            job.paths.result_pickle.write_text("ok")
        seen.update(ids)
        return ids

    seen: set = set()
    assert slurm.wait_for([job], queue=queue, poll_s=0.01) == {}  # gone once, back: a requeue, not an end


def test_rows_name_the_slurm_job_node_and_restarts(monkeypatch):
    for var in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURMD_NODENAME", "SLURM_RESTART_COUNT"):
        monkeypatch.delenv(var, raising=False)
    assert scheduler_info() == {"slurm_job_id": "", "slurm_node": "", "slurm_restarts": ""}
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu07")
    assert scheduler_info() == {"slurm_job_id": "41", "slurm_node": "gpu07", "slurm_restarts": "0"}
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "40")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    assert scheduler_info() == {"slurm_job_id": "40_1", "slurm_node": "gpu07", "slurm_restarts": "2"}


def test_torch_threads_follow_the_allocation(monkeypatch):
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    assert allocated_cpus() is None
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")
    assert allocated_cpus() == 3
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "")
    assert allocated_cpus() is None


def test_the_slurm_launcher_config_names_our_launcher_and_sets_up_each_job(monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", "/shared/cache")
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.setenv("HOME", "/home/u")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["hydra/launcher=slurm"], return_hydra_config=True)
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert launcher["_target_"] == "hydra_plugins.specbench_slurm.SlurmLauncher"
    assert launcher["setup"] == ["export SPECBENCH_CACHE=/shared/cache", "export HF_HOME=/home/u/.cache/huggingface",
                                 "export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK"]
    assert launcher["additional_parameters"] == {"requeue": True} and launcher["max_num_timeout"] == 3
    from hydra_plugins.specbench_slurm import SlurmLauncher

    assert issubclass(SlurmLauncher, slurm.SurvivingSlurmLauncher)


def test_jobs_that_start_together_measure_one_cost_curve(tmp_path, monkeypatch):
    from specbench.machine import costs

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    measured = []

    def measure(target, vocab, **kw):
        measured.append(1)
        time.sleep(0.3)
        return costs.CostModel.flat(8)

    monkeypatch.setattr(costs, "measure", measure)
    monkeypatch.setattr("specbench.core.forward.Target", lambda model: SimpleNamespace(device="cpu", devices=["cpu"]))
    loaded = SimpleNamespace(model=None, vocab_size=10, context_length=64)
    got = []
    threads = [threading.Thread(target=lambda: got.append(costs.load_or_measure(loaded, "m", "float32", "sdpa")))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(measured) == 1 and len(got) == 3  # one measured; the others waited and read its curve


@pytest.mark.parametrize("subdir,idx,expected", [("${hydra.job.num}", 3, "3"), ("job_${hydra.job.num}", 4, "job_4")])
def test_a_failed_tasks_outcome_goes_where_the_job_would_have_written_it(subdir, idx, expected):
    launcher = slurm.SurvivingSlurmLauncher.__new__(slurm.SurvivingSlurmLauncher)
    launcher.config = OmegaConf.create({"hydra": {"sweep": {"dir": "/s", "subdir": subdir}}})
    assert launcher._subdir(idx) == expected
