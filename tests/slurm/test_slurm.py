"""Sweeps through ``hydra/launcher=slurm`` on a real (throw-away, one-node) SLURM cluster, as a user runs
them: every job under SLURM, the sweep report, shards, a cancelled and a requeued job that resume, a re-run
that skips what is done, a job whose node lacks the weights. ``make slurm-test`` (marked ``slurm``: never
part of ``make test`` or ``make test-slow``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specbench.results.rows import load_results
from tests.slurm.cluster import LocalSlurm

pytestmark = [pytest.mark.slow, pytest.mark.slurm]
ROOT = Path(__file__).resolve().parents[2]
# A random model big enough that a generation takes about a second on one core (a job can be caught mid-run).
SLOW_TINY = ["model.tiny.hidden_size=1024", "model.tiny.intermediate_size=2048", "model.tiny.num_hidden_layers=8",
             "model.tiny.max_position_embeddings=4096"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalSlurm(tmp_path_factory.mktemp("slurm"), cpus=2) as c:
        yield c


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("work")


def sweep(cluster: LocalSlurm, work: Path, name: str, *overrides: str, background: bool = False):
    """``python run.py -m hydra/launcher=slurm ...`` as a user types it (one core and 2 GB a job)."""
    cmd = [sys.executable, "run.py", "-m", "hydra/launcher=slurm", "hydra.launcher.partition=debug",
           "hydra.launcher.gpus_per_node=0", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=2",
           "hydra.launcher.timeout_min=15", "hydra.launcher.array_parallelism=2",
           f"hydra.launcher.submitit_folder={work}/submitit/%j", f"hydra.sweep.dir={work}/sweeps/{name}",
           f"results_dir={work}/results", "hardware=cpu", "progress=false", *overrides]
    env = cluster.env({**os.environ, "SPECBENCH_CACHE": str(work / "cache")})
    if background:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def report_line(stderr: str) -> str:
    (line,) = [ln for ln in stderr.splitlines() if ln.startswith("sweep ")]
    return line.split(": ", 1)[1]


def rows(work: Path, experiment: str):
    return load_results(work / "results" / experiment, quiet=True)


def test_a_smoke_sweep_of_two_methods_by_two_datasets_runs_every_job_under_slurm(cluster, work):
    args = ("experiment=table1_smoke", "method=anpd,rest", "temperature=0")
    out = sweep(cluster, work, "smoke", *args)
    assert out.returncode == 0, out.stderr[-3000:]
    assert report_line(out.stderr) == "4 done, 0 skipped (already recorded), 0 failed"
    df = rows(work, "table1")
    assert set(df.method) == {"anpd", "rest", "autoregressive"} and set(df.dataset) == {"humaneval", "mtbench"}
    assert df.slurm_job_id.str.fullmatch(r"\d+_[0-3]").all() and (df.slurm_node == cluster.node).all()
    assert df.slurm_job_id.nunique() == 4  # one array task a job, each row naming its own
    print(f"smoke sweep: {report_line(out.stderr)}; jobs {sorted(df.slurm_job_id.unique())} on {cluster.node}, "
          f"{len(df)} rows")
    logs = [p.read_text() for p in (work / "submitit").rglob("*_log.err")]
    built = [log for log in logs if "rest: building the stdlib store" in log]
    waited = [log for log in logs if "rest: another job is building" in log and "read the store another job built" in log]
    assert len(built) == len(waited) == 1  # two rest jobs started together: one built the store, the other read it
    again = sweep(cluster, work, "smoke-again", *args)
    assert again.returncode == 0 and report_line(again.stderr) == "0 done, 4 skipped (already recorded), 0 failed"


def _task_rows(work: Path, task: str) -> int:
    try:
        df = rows(work, "smoke")
    except Exception:  # no rows yet
        return 0
    return int((df.slurm_job_id == task).sum()) if "slurm_job_id" in df.columns else 0


def _wait(predicate, what: str, timeout: float = 300.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def test_shards_a_cancelled_and_a_requeued_job_resume_and_a_rerun_finishes_only_what_is_left(cluster, work):
    args = ("experiment=smoke", "dataset=mtbench", "method=pld", "max_new_tokens=32", "offset=0,6", "limit=6",
            *SLOW_TINY)
    proc = sweep(cluster, work, "shards", *args, background=True)
    ids = _wait(lambda: sorted(i for i in cluster.run("squeue", "-h", "-r", "-o", "%i").split() if "_" in i)
                or None, "the array tasks")
    cancelled, requeued = ids  # task 0: offset=0, task 1: offset=6
    _wait(lambda: _task_rows(work, cancelled) >= 3 and _task_rows(work, requeued) >= 3, "rows from both shards")
    cluster.run("scancel", cancelled)
    cluster.run("scontrol", "requeue", requeued)
    _wait(lambda: cluster.job(requeued).get("JobState") == "PENDING", "the requeued task to be pending")
    cluster.run("scontrol", "update", f"jobid={requeued}", "StartTime=now")  # SLURM holds a requeued job ~2 min
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 1, err[-3000:]  # a failed job fails the sweep, after its report
    assert report_line(err) == "1 done, 0 skipped (already recorded), 1 failed"
    (failed,) = [ln for ln in err.splitlines() if ln.startswith("  failed:")]
    assert "offset=0" in failed and f"SLURM job {cancelled} ended without a result" in failed and "CANCELLED" in failed
    assert cluster.job(requeued).get("Restarts") == "1"

    df = rows(work, "smoke")
    mine = df[df.slurm_job_id == requeued]
    before, after = int((mine.slurm_restarts == "0").sum()), int((mine.slurm_restarts == "1").sum())
    kept = int((df.slurm_job_id == cancelled).sum())
    per_shard = 6 * 2 * 2  # 6 MT-Bench questions, two turns each, by pld and its baseline
    assert 3 <= kept < per_shard and before >= 3 and before + after == per_shard  # the requeued task redid nothing
    print(f"shards: {report_line(err)}; cancelled {cancelled} after {kept} of {per_shard} rows; requeued {requeued}: "
          f"{before} rows before, {after} after its restart; {failed.strip()[-160:]}")

    rerun = sweep(cluster, work, "shards-again", *args)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert report_line(rerun.stderr) == "1 done, 1 skipped (already recorded), 0 failed"
    df = rows(work, "smoke")
    assert len(df[~df.slurm_job_id.isin([cancelled, requeued])]) == per_shard - kept  # only what was missing
    files = list((work / "results" / "smoke").rglob("*.parquet"))
    assert len(df) == 2 * per_shard == len(files)  # one file a generation: none was generated twice
    print(f"re-run: {report_line(rerun.stderr)}; the cancelled shard's new job generated {per_shard - kept} rows")


def test_a_job_whose_node_lacks_the_weights_fails_in_one_line_in_the_sweep_report(cluster, work):
    out = sweep(cluster, work, "weights", "experiment=smoke", "model=tiny-llama,llama2-7b", "method=pld")
    assert out.returncode == 1
    assert report_line(out.stderr) == "1 done, 0 skipped (already recorded), 1 failed"
    (failed,) = [ln for ln in out.stderr.splitlines() if ln.startswith("  failed:")]
    print(f"missing weights: {report_line(out.stderr)}; {failed.strip()[-200:]}")
    assert re.search(r"model=llama2-7b.*: model 'llama2-7b' \(meta-llama/Llama-2-7b-chat-hf\) is not in the Hugging "
                     r"Face cache", failed) and "hf download" in failed
