"""End to end on the tiny random model: rows, baseline pairing, resume, early errors."""

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from methods.registry import register_method
from specbench.core.draft import Draft, Drafter
from specbench.errors import ConfigError
from specbench.results.rows import load_results
from specbench.run.runner import run
from tests.run.test_config import ROOT, make_cfg


@dataclass
class RepeatConfig:
    k: int = 3


@register_method
class CopyLast(Drafter):
    """Test drafter: the k tokens that followed the previous occurrence of the last token."""

    name = "test_copy_last"
    Config = RepeatConfig

    def propose(self, state):
        seq = state.tokens
        for i in range(len(seq) - 2, -1, -1):
            if seq[i] == seq[-1]:
                return Draft.chain(seq[i + 1 : i + 1 + self.config.k], "copy")
        return None


def cfg_for(tmp_path, *extra):
    return make_cfg("experiment=smoke", f"results_dir={tmp_path}", "progress=false", *extra)


def test_method_and_baseline_rows_pair_up(tmp_path, capsys):
    summary = run(cfg_for(tmp_path, "method=autoregressive", "method.name=test_copy_last", "limit=3"))
    df = load_results(tmp_path)
    # 3 prompts of the built-in set, one of them two-turn; each run by the method and the baseline
    n_turns = df[df.method == "autoregressive"].shape[0]
    assert n_turns >= 3
    assert set(df.method) == {"test_copy_last", "autoregressive"}
    assert (df.groupby("method").size() == n_turns).all()
    assert (df.steps[df.method == "autoregressive"] == df.new_tokens[df.method == "autoregressive"]).all()
    method_rows = df[df.method == "test_copy_last"]
    assert (method_rows.steps < method_rows.new_tokens).any()  # some guesses were accepted
    row = summary.set_index("method").loc["test_copy_last"]
    assert row.greedy_match == 1.0 and row.tau > 1.0 and row.speedup > 0
    for col in (
        "git_commit",
        "torch_version",
        "transformers_version",
        "device_name",
        "gpu_count",
        "quantization",
        "cuda_version",
        "config_hash",
        "output_ids",
    ):
        assert col in df.columns and df[col].notna().all()
    assert (df.gpu_count == "0").all() and df.peak_memory_gb.isna().all()  # the CPU: no GPU memory to track
    assert "speedup" in capsys.readouterr().out


def test_rerun_resumes_and_extends(tmp_path):
    run(cfg_for(tmp_path, "limit=1"))
    first = load_results(tmp_path)
    run(cfg_for(tmp_path, "limit=2"))
    second = load_results(tmp_path)
    # limit is not part of the run's identity: both jobs wrote one run folder
    assert len({p.parent for p in Path(tmp_path).rglob("*.parquet")}) == 1
    keys = ["sample_id", "turn", "method"]
    assert not second.duplicated(keys).any()
    kept = second.merge(first[keys + ["run_id"]], on=keys, suffixes=("", "_first"))
    assert len(kept) == len(first) and (kept.run_id == kept.run_id_first).all()  # not recomputed
    assert second.sample_id.nunique() == 2


@pytest.mark.slow
def test_killed_run_loses_at_most_the_sample_in_flight(tmp_path):
    args = [
        sys.executable,
        str(ROOT / "run.py"),
        "experiment=smoke",
        f"results_dir={tmp_path}",
        "limit=5",
        "max_new_tokens=200",
        "progress=false",
        f"hydra.run.dir={tmp_path}/hydra",
    ]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if len(list(Path(tmp_path).rglob("*.parquet"))) >= 2:  # one file per row
            break
        time.sleep(0.05)
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = load_results(tmp_path)
    assert 2 <= len(partial)
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    final = load_results(tmp_path)
    assert not final.duplicated(["sample_id", "turn", "method"]).any()
    assert final.sample_id.nunique() == 5
    assert set(partial.run_id) <= set(final.run_id)


def test_prompt_longer_than_context_fails_before_generation(tmp_path):
    cfg = cfg_for(tmp_path, "model.tiny.max_position_embeddings=8")
    with pytest.raises(ConfigError, match="the prompt has .* tokens but the model's context is 8"):
        run(cfg)
    assert not list(Path(tmp_path).rglob("*.parquet"))


def _job(tmp_path, *extra):
    return subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "run.py"),
            "experiment=smoke",
            f"results_dir={tmp_path}",
            "progress=false",
            "warmup=0",
            f"hydra.run.dir={tmp_path}/hydra",
            *extra,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize(
    "shards",
    [
        pytest.param((["offset=0", "limit=2"], ["offset=2", "limit=2"]),  # a run split by offset/limit
                     marks=pytest.mark.slow),  # (the overlap below is the harder case; make test-slow runs this)
        (["limit=4"], ["limit=4"]),  # full overlap: a requeued job while the first still runs
    ],
    ids=["shards", "overlap"],
)
def test_concurrent_jobs_of_one_run_lose_no_row(tmp_path, shards):
    jobs = [_job(tmp_path, *args) for args in shards]
    for job in jobs:
        out, err = job.communicate(timeout=300)
        assert job.returncode == 0, err
    df = load_results(tmp_path)
    keys = ["sample_id", "turn", "method"]
    assert df.sample_id.nunique() == 4 and not df.duplicated(keys).any()
    per_sample = df[df.method == "autoregressive"].groupby("sample_id").size()
    assert (df.groupby("method").size() == per_sample.sum()).all()  # every turn of every sample, both methods
    # the files on disk hold every row at least once; duplicates (a race) are only ever identical keys
    on_disk = pd.concat([pd.read_parquet(p) for p in Path(tmp_path).rglob("*.parquet")])
    assert set(map(tuple, on_disk[keys].values)) == set(map(tuple, df[keys].values))


@pytest.mark.slow
def test_job_stops_before_work_when_its_results_file_is_unreadable(tmp_path):
    first = _job(tmp_path, "limit=1")
    assert first.wait(timeout=300) == 0
    victim = next(Path(tmp_path).rglob("*.parquet"))
    victim.write_bytes(b"PAR1 not really")
    job = _job(tmp_path, "limit=2")
    out, err = job.communicate(timeout=300)
    assert job.returncode == 2 and "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert line.startswith("error: results file") and "move it aside" in line
    assert victim.read_bytes() == b"PAR1 not really"


@register_method
class HookLog(Drafter):
    """Test drafter: logs the runner's lifecycle calls (class-level, the runner builds the instance)."""

    name = "test_hook_log"
    Config = RepeatConfig
    calls: list[str] = []

    def reset(self):
        self.calls.append("reset")

    def begin_sample(self):
        self.calls.append("sample")

    def start(self, prompt_ids):
        self.calls.append("start")


def test_runner_forgets_the_warm_up_and_announces_each_sample(tmp_path):
    HookLog.calls.clear()
    run(cfg_for(tmp_path, "method=autoregressive", "method.name=test_hook_log", "limit=3", "warmup=1"))
    df = load_results(tmp_path)
    turns = df[df.method == "test_hook_log"].groupby("sample_id").size().tolist()  # recorded turns per sample
    log = "".join({"reset": "R", "sample": "S", "start": "s"}[c] for c in HookLog.calls)
    assert log.startswith("sR")  # the warm-up generation, then everything it taught is forgotten
    per_sample = log[2:].split("S")  # then each sample announced before its turns
    assert per_sample[0] == "" and sorted(len(x) for x in per_sample[1:]) == sorted(turns)
    assert set("".join(per_sample)) == {"s"}


def test_repeats_alternate_the_order_resume_per_repeat_and_give_intervals(tmp_path, capsys):
    """repeats=N measures every (sample, turn, method) N times; a sampled run's speedup is the ratio of
    token rates computed from its rows; a larger repeats resumes the same run."""
    args = ("method=autoregressive", "method.name=test_copy_last", "limit=3", "temperature=1")
    summary = run(cfg_for(tmp_path, *args, "repeats=2"))
    df = load_results(tmp_path)
    per_key = df.groupby(["sample_id", "turn", "method"])["repeat"].apply(sorted)
    assert (per_key.apply(list) == pd.Series([[0, 1]] * len(per_key), index=per_key.index)).all()
    # the method runs first on even samples, the baseline first on odd ones, swapping each repeat
    first = df[df.turn == 0].sort_values("finished_at").groupby(["repeat", "sample_id"], sort=False)["method"].first()
    samples = list(dict.fromkeys(df.sort_values("finished_at").sample_id))  # in the order they ran
    for r in (0, 1):
        order = [first.loc[(r, s)] for s in samples]
        assert order[0] != order[1] and order[(1 - r) % 2] == "autoregressive"
    m, b = df[df.method == "test_copy_last"], df[df.method == "autoregressive"]
    rate = (m.new_tokens.sum() / m.wall_s.sum()) / (b.new_tokens.sum() / b.wall_s.sum())
    row = summary.set_index("method").loc["test_copy_last"]
    assert row.speedup == pytest.approx(rate)
    assert row.n_repeats == 2 and row.speedup_lo <= row.speedup <= row.speedup_hi and row.speedup_std >= 0
    assert row.tau_lo <= row.tau <= row.tau_hi
    out = capsys.readouterr().out
    assert f"{row.speedup:.2f}× ±" in out and "vs AR" in out
    # sampling draws afresh in each repeat (the method and its baseline share each draw)
    keys = ["sample_id", "turn", "method"]
    draws = df[df.repeat == 0].merge(df[df.repeat == 1], on=keys, suffixes=("_0", "_1"))
    assert len(draws) == len(df) // 2 and (draws.output_sha1_0 != draws.output_sha1_1).any()

    run(cfg_for(tmp_path, *args, "repeats=3"))
    more = load_results(tmp_path)
    assert len({p.parent for p in Path(tmp_path).rglob("*.parquet")}) == 1
    assert sorted(more.repeat.unique()) == [0, 1, 2] and len(more) == 3 * len(df) // 2
    kept = more.merge(df[["sample_id", "turn", "method", "repeat", "run_id"]],
                      on=["sample_id", "turn", "method", "repeat"], suffixes=("", "_first"))
    assert len(kept) == len(df) and (kept.run_id == kept.run_id_first).all()  # not recomputed
