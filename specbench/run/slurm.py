"""Sweeps on SLURM: Hydra's submitit launcher, made to survive what a cluster does to jobs.

``hydra/launcher=slurm`` submits one array task per job (``conf/hydra/launcher/slurm.yaml``). Each
task runs :func:`specbench.run.jobs.run_job`, which never raises: a user error is the job's ``failed``
outcome. What can still end a task without an outcome is the cluster: ``scancel``, a node failure, the
time limit, the out-of-memory killer. The stock launcher then waits on ``sacct`` (absent where the cluster
keeps no accounting) and ends the whole sweep with that one job's exception, before the report.

:class:`SurvivingSlurmLauncher` (``hydra_plugins.specbench_slurm.SlurmLauncher``, where Hydra looks for
launchers) waits on the results the tasks write and on ``squeue`` instead: a task that left
the queue without a result is recorded as ``failed`` with what its log says (``CANCELLED``, ``TIME
LIMIT``, ...), the other jobs' outcomes are collected as usual, and the sweep report lists them all. A
requeued task (``scontrol requeue``, preemption, a time limit with ``max_num_timeout``) stays in the
queue and runs again; the runner skips every generation it had recorded, so it loses at most the one in
flight.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as _SubmititSlurmLauncher
from omegaconf import OmegaConf

from specbench.run.jobs import STATUS_FILE

log = logging.getLogger(__name__)
POLL_S = 5.0  # between looks at the queue
GONE_CHECKS = 2  # a task must be missing from the queue this many looks in a row (a requeue passes through)


def queued_ids() -> set[str] | None:
    """Every job and array-task id ``squeue`` lists (``123``, ``123_4``), or None when it cannot answer."""
    try:
        out = subprocess.run(["squeue", "-h", "-r", "-o", "%i"], capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return {line.strip() for line in out.stdout.splitlines() if line.strip()}


def _why_it_ended(job: Any) -> str:
    """The scheduler's last word on a task that ended without a result, from its log."""
    lines: list[str] = []
    for path in (job.paths.stderr, job.paths.stdout):
        try:
            lines += [ln.strip() for ln in Path(path).read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            continue
    # slurmstepd's own word ("*** JOB 7 ON node CANCELLED AT ... ***", "... DUE TO TIME LIMIT ***") first
    said = [ln[ln.index("***"):] for ln in lines if "***" in ln] or [ln for ln in lines if "error" in ln.lower()]
    reason = said[-1] if said else "no result and no reason in its log"
    return f"SLURM job {job.job_id} ended without a result: {reason} (re-run the sweep to resume it)"


def wait_for(jobs: Sequence[Any], *, queue=queued_ids, poll_s: float = POLL_S) -> dict[str, str]:
    """Wait until every task has a result or has left the queue for good; ``{job_id: why}`` of the latter."""
    missing: dict[str, int] = {}
    ended: dict[str, str] = {}
    while True:
        waiting = [j for j in jobs if j.job_id not in ended and not j.paths.result_pickle.exists()]
        if not waiting:
            return ended
        ids = queue()
        for job in waiting:
            if ids is None or job.job_id in ids:
                missing.pop(job.job_id, None)
                continue
            missing[job.job_id] = missing.get(job.job_id, 0) + 1
            if missing[job.job_id] >= GONE_CHECKS and not job.paths.result_pickle.exists():
                ended[job.job_id] = _why_it_ended(job)
                log.warning(ended[job.job_id])
        time.sleep(poll_s)


class SurvivingSlurmLauncher(_SubmititSlurmLauncher):
    """The submitit SLURM launcher whose sweep outlives any one task (see the module's doc)."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit

        params = dict(self.params)
        executor = submitit.AutoExecutor(cluster=self._EXECUTOR, folder=params.pop("submitit_folder"),
                                         slurm_max_num_timeout=params.pop("max_num_timeout", 0))
        common = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{k if k in common else f"slurm_{k}": v for k, v in params.items()})
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        log.info(f"SLURM sweep: {len(job_overrides)} jobs, output under {sweep_dir}")
        indices = [initial_job_idx + i for i in range(len(job_overrides))]
        for idx, overrides in zip(indices, job_overrides, strict=True):
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
        state = Singleton.get_state()
        jobs = executor.map_array(self, [list(o) for o in job_overrides], ["hydra.sweep.dir"] * len(indices),
                                  indices, [f"job_id_for_{i}" for i in indices], [state] * len(indices))
        ended = wait_for(jobs)
        return [self._outcome(job, idx, list(overrides), sweep_dir, ended.get(job.job_id))
                for job, idx, overrides in zip(jobs, indices, job_overrides, strict=True)]

    def _outcome(self, job: Any, idx: int, overrides: list[str], sweep_dir: Path, ended: str | None) -> JobReturn:
        if ended is None:
            try:
                return job.results()[0]
            except Exception as err:  # the task raised outside the runner (its traceback is in its log)
                ended = f"SLURM job {job.job_id} failed: {str(err).strip().splitlines()[-1] if str(err) else err!r}"
        outcome = {"status": "failed", "error": ended, "overrides": overrides, "slurm_job_id": job.job_id}
        out_dir = sweep_dir / self._subdir(idx)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / STATUS_FILE).write_text(json.dumps(outcome, indent=1))
        result = JobReturn(overrides=overrides, status=JobStatus.COMPLETED)
        result.return_value = outcome  # the job's outcome is "failed"; the sweep goes on to its report
        return result

    def _subdir(self, idx: int) -> str:
        """The job's output folder under the sweep's (``hydra.sweep.subdir``, the job number by default)."""
        subdir = str(OmegaConf.to_container(self.config.hydra.sweep, resolve=False).get("subdir", ""))
        return str(idx) if subdir == "${hydra.job.num}" else subdir.replace("${hydra.job.num}", str(idx))
