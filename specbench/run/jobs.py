"""Sweeps: one job never stops the others, and the sweep ends with what happened to each job.

``python run.py -m experiment=table1`` launches one job per combination (locally,
or on SLURM with ``hydra/launcher=slurm``). Each job:

* runs :func:`specbench.run.runner.run`; a user error (bad setting, missing model or
  data, a refused combination) is recorded as the job's failure and the sweep
  goes on; in a single run it still ends the program with one line;
* reports ``done`` (it recorded new generations) or ``skipped`` (everything was
  already in its results file: a re-run of a finished job).

:class:`SweepReport` (a Hydra callback, ``hydra.callbacks`` in ``conf/config.yaml``)
writes each job's outcome next to the job's Hydra output (``specbench_job.json``,
so that it works the same when jobs run on other machines) and, at the end of a
sweep, prints jobs done, skipped and failed (with the error) on stderr, then the summary of every row the jobs
recorded (each preset against its own job's baseline) on stdout.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from specbench.errors import one_line_errors, user_error_types
from specbench.run.job import in_multirun, plan

STATUS_FILE = "specbench_job.json"


def run_job(cfg: DictConfig) -> dict[str, Any]:
    """Run one job and say how it went: ``{"status": done|skipped|failed, ...}``."""
    if not in_multirun():
        with one_line_errors():
            return _outcome(_run(cfg))
    try:
        return _outcome(_run(cfg))
    except user_error_types() as err:
        print(f"error: {err}", file=sys.stderr)
        return {"status": "failed", "error": str(err)}
    except Exception as err:  # a bug: keep its traceback in the job's log, go on with the sweep
        traceback.print_exc()
        return {"status": "failed", "error": f"{type(err).__name__}: {err}"}


def _run(cfg: DictConfig) -> Any:
    job = plan(cfg)  # every check, before the runner's imports (pandas, pyarrow) cost a bad command's time
    from specbench.run.runner import execute

    return execute(job)


def _outcome(summary: Any) -> dict[str, Any]:
    attrs = getattr(summary, "attrs", {}) or {}
    new = int(attrs.get("new_generations", 1))
    return {
        "status": "done" if new else "skipped",
        "new_generations": new,
        "results": str(attrs.get("results", "")),
    }


class SweepReport(Callback):
    """Record each job's outcome beside its output; print a summary at the end of a sweep."""

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        from hydra.core.utils import JobStatus

        if job_return.status == JobStatus.COMPLETED and isinstance(job_return.return_value, dict):
            outcome = dict(job_return.return_value)
        elif job_return.status == JobStatus.COMPLETED:
            outcome = {"status": "done"}
        else:  # an exception escaped the job (SystemExit, an error outside the runner)
            err = job_return._return_value
            outcome = {"status": "failed", "error": f"{type(err).__name__}: {err}"}
        outcome["overrides"] = list(job_return.overrides or [])
        out_dir = Path(config.hydra.runtime.output_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / STATUS_FILE).write_text(json.dumps(outcome, indent=1))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        summary = sweep_summary(Path(config.hydra.sweep.dir))
        print(summary["text"], file=sys.stderr)
        if summary["results"]:  # every job's rows side by side, each preset against its own job's baseline
            print("\n" + sweep_table(summary["results"]), flush=True)
        if summary["failed"] or summary["silent"]:
            raise SystemExit(1)


def sweep_summary(sweep_dir: Path) -> dict[str, Any]:
    """Count the outcomes recorded under ``sweep_dir``; ``text`` is the printed report."""
    outcomes = []
    for path in sorted(sweep_dir.rglob(STATUS_FILE)):
        try:
            outcomes.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            outcomes.append({"status": "failed", "error": f"unreadable {path}", "overrides": []})
    count = {s: [o for o in outcomes if o.get("status") == s] for s in ("done", "skipped", "failed")}
    # A job directory without an outcome: the job was killed (time limit, out of memory) or never ran.
    silent = [
        d
        for d in sorted(p.parent.parent for p in sweep_dir.rglob(".hydra/overrides.yaml"))
        if not (d / STATUS_FILE).exists()
    ]
    results = sorted({o["results"] for o in outcomes if o.get("results") and o.get("status") != "failed"})
    lines = [
        f"sweep {sweep_dir}: {len(count['done'])} done, {len(count['skipped'])} skipped (already recorded), "
        f"{len(count['failed'])} failed" + (f", {len(silent)} without an outcome (killed?)" if silent else "")
    ]
    for o in count["failed"]:
        lines.append(f"  failed: {' '.join(o.get('overrides', []))}: {o.get('error', '?')}")
    for d in silent:
        lines.append(f"  no outcome: {d} (see its log)")
    return {**{k: len(v) for k, v in count.items()}, "silent": len(silent), "text": "\n".join(lines),
            "results": results}


def sweep_table(folders: list[str]) -> str:
    """The summary of the rows the sweep's jobs wrote (:mod:`specbench.results.summary`), with its legend and
    the command that writes it to files (a folder they share, or each folder)."""
    import os

    from specbench.results.rows import load_results
    from specbench.results.summary import format_summary, summary_frame

    rows = load_results([f for f in folders if Path(f).exists()], quiet=True)
    common = os.path.commonpath(folders) if folders else ""
    common = str(Path(common).parent) if len(folders) == 1 else common
    return (format_summary(summary_frame(rows)) + f"\n\nsummary.md, .csv and .png: make summary RESULTS={common}"
            f" (or specbench report summary --results {common})")
