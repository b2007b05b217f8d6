"""Result rows, crash-safe parquet files, resume, and provenance."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from specbench import provenance
from specbench.core.record import GenerationRecord
from specbench.errors import ConfigError
from specbench.results import metrics
from specbench.results.rows import (
    ResultWriter,
    _to_table,
    key_hash,
    load_results,
    make_row,
    output_sha1,
    run_dir_path,
    run_file_path,
    run_name,
)

REPO = Path(__file__).resolve().parents[2]


def record() -> GenerationRecord:
    return GenerationRecord(
        prompt_len=12,
        output_ids=[5, 6, 7, 8, 9, 2],
        step_tokens=[1, 3, 2],
        step_times=[0.4, 0.2, 0.1],
        step_drafted=[0, 4, 3],
        step_aux=[0, 2, 2],
        step_accepted=[0, 2, 1],
        step_depth=[0, 3, 2],
        step_draft_s=[0.0, 0.01, 0.02],
        drafted_by_source=Counter({"prompt": 5, "ngram": 2}),
        accepted_by_source=Counter({"prompt": 3}),
        prefill_s=0.4,
        decode_s=0.35,
        finish_reason="eos",
    )


@pytest.fixture(scope="module")
def context() -> dict:
    return {
        "run_id": "r1",
        "experiment": "unit",
        "config_hash": "abc123",
        "provenance": provenance.environment_info("cpu"),
        "model": "org/Tiny-LM",
        "method": "pld",
        "method_params": {"k": 3, "min_n": 1},
        "dataset": "toy",
        "dataset_version": "v1",
        "dtype": "float32",
        "temperature": 0,
        "top_p": 1.0,
        "top_k": None,
        "seed": 0,
        "max_new_tokens": 32,
        "device": "cpu-2t",
    }


def test_make_row_fields(context):
    r = make_row(
        record(), context=context, sample_id="q1", turn=1, output_text="hello", extra={"rouge1": 0.5}
    )
    assert (r["new_tokens"], r["steps"], r["prompt_tokens"]) == (6, 3, 12)
    assert r["tau"] == pytest.approx(2.0)
    assert r["mac_tp"] == pytest.approx((3 / 0.2 + 2 / 0.1) / 2)  # decode steps: the prefill left out
    assert r["mic_tp"] == pytest.approx(5 / 0.3)
    assert r["repeat"] == 0 and r["step_depth"] == [0, 3, 2]
    assert r["wall_s"] == pytest.approx(0.75)
    assert r["accepted_per_step"] == [2, 1]
    assert r["draft_overhead_s"] == pytest.approx(0.03)
    assert json.loads(r["accepted_by_position"]) == {"1": 2, "2": 1}
    assert json.loads(r["method_params"]) == {"k": 3, "min_n": 1}
    assert r["output_sha1"] == output_sha1([5, 6, 7, 8, 9, 2]) != output_sha1([5, 6, 7, 8, 9])
    assert r["temperature"] == 0.0 and r["top_k"] == 0 and r["rouge1"] == 0.5
    assert r["git_commit"] == context["provenance"]["git_commit"]
    with pytest.raises(ValueError):
        make_row(record(), context=context, sample_id="q1", turn=0, output_text="", extra={"tau": 1})
    with pytest.raises(KeyError):
        make_row(record(), context={"run_id": "x"}, sample_id="q1", turn=0, output_text="")


def test_round_trip(tmp_path, context):
    row = make_row(
        record(), context=context, sample_id="q1", turn=0, output_text="héllo", extra={"rouge1": 0.5}
    )
    path = run_dir_path(tmp_path, "unit", "job")
    ResultWriter(path).append(row)
    assert ResultWriter(path).rows == [row]
    df = load_results(tmp_path)
    assert len(df) == 1
    assert list(df.loc[0, "step_tokens"]) == [1, 3, 2]
    assert list(df.loc[0, "output_ids"]) == [5, 6, 7, 8, 9, 2]
    assert json.loads(df.loc[0, "drafted_by_source"]) == {"prompt": 5, "ngram": 2}
    # a baseline row for the same sample: the join and greedy match work on arrays read back from parquet
    ar = GenerationRecord(
        prompt_len=12, output_ids=[5, 6, 7, 8, 9, 2], step_tokens=[1] * 6, step_times=[0.25] * 6
    )
    ar.prefill_s, ar.decode_s = 0.25, 1.25
    ResultWriter(run_dir_path(tmp_path, "unit", "baseline")).append(
        make_row(ar, context={**context, "method": "autoregressive"}, sample_id="q1", turn=0, output_text="")
    )
    s = metrics.summarize(load_results(tmp_path)).set_index("method")
    assert s.loc["pld", "tau"] == pytest.approx(2.0)
    assert s.loc["pld", "speedup"] == pytest.approx(1.5 / 0.75)
    assert s.loc["pld", "greedy_match"] == 1.0


def test_resume(tmp_path, context):
    path = tmp_path / "exp" / "job"
    w = ResultWriter(path)
    for i in range(3):
        w.append(make_row(record(), context=context, sample_id=f"q{i}", turn=0, output_text=""))
    w2 = ResultWriter(path)
    assert w2.done_keys() == {(f"q{i}", 0, "pld", 0) for i in range(3)}
    with pytest.raises(ValueError):
        w2.append(make_row(record(), context=context, sample_id="q1", turn=0, output_text=""))
    w2.append(make_row(record(), context=context, sample_id="q1", turn=1, output_text=""))
    assert len(ResultWriter(path)) == 4
    assert len(load_results([path])) == 4


def test_repeats_are_rows_of_their_own_and_resume_per_repeat(tmp_path, context):
    path = tmp_path / "exp" / "job"
    w = ResultWriter(path)
    w.append(make_row(record(), context=context, sample_id="q0", turn=0, output_text="r0"))
    w.append(make_row(record(), context=context, sample_id="q0", turn=0, output_text="r1", repeat=1))
    with pytest.raises(ValueError, match="already recorded"):
        w.append(make_row(record(), context=context, sample_id="q0", turn=0, output_text="again", repeat=1))
    w2 = ResultWriter(path)
    assert w2.done_keys() == {("q0", 0, "pld", 0), ("q0", 0, "pld", 1)}
    assert w2.recorded(("q0", 0, "pld"))["output_text"] == "r0"  # a key without a repeat is repeat 0
    assert w2.recorded(("q0", 0, "pld", 2)) is None
    df = load_results(tmp_path)
    assert sorted(df["repeat"]) == [0, 1] and sorted(df["output_text"]) == ["r0", "r1"]
    # repeat 0 keeps the file name of rows written before repeats existed
    assert key_hash("q0", 0, "pld", 0) == key_hash("q0", 0, "pld") != key_hash("q0", 0, "pld", 1)


def test_rows_without_a_repeat_column_read_as_repeat_0(tmp_path, context):
    row = make_row(record(), context=context, sample_id="q0", turn=0, output_text="old")
    del row["repeat"]
    folder = tmp_path / "exp" / "job"
    folder.mkdir(parents=True)
    pq.write_table(_to_table([row]), folder / f"pld__{key_hash('q0', 0, 'pld')}__old.parquet")
    assert ResultWriter(folder).done_keys() == {("q0", 0, "pld", 0)}
    assert list(load_results(tmp_path)["repeat"]) == [0]


def test_leftover_tmp_is_ignored_and_left_alone(tmp_path, context):
    path = tmp_path / "job"
    ResultWriter(path).append(make_row(record(), context=context, sample_id="q0", turn=0, output_text=""))
    tmp = path / ".pld__0123__other-writer.parquet.tmp"  # another job's write in progress, or a killed one
    tmp.write_bytes(b"PAR1 half a file")
    w = ResultWriter(path)
    assert tmp.exists()  # never deleted: it may belong to a job that is still running
    assert w.done_keys() == {("q0", 0, "pld", 0)}
    assert len(load_results(tmp_path)) == 1  # the .tmp is never picked up


def test_a_legacy_single_file_run_is_read_and_resumed(tmp_path, context):
    """Runs that earlier versions wrote as one file beside the folder resume from it."""
    legacy = run_file_path(tmp_path, "exp", "job")
    legacy.parent.mkdir(parents=True)
    pq.write_table(_to_table([make_row(record(), context=context, sample_id="q0", turn=0, output_text="")]), legacy)
    w = ResultWriter(run_dir_path(tmp_path, "exp", "job"), legacy_file=legacy)
    assert w.done_keys() == {("q0", 0, "pld", 0)}
    with pytest.raises(ValueError, match="already recorded"):
        w.append(make_row(record(), context=context, sample_id="q0", turn=0, output_text=""))
    w.append(make_row(record(), context=context, sample_id="q1", turn=0, output_text=""))
    assert sorted(load_results(tmp_path).sample_id) == ["q0", "q1"]


def test_writers_of_one_run_share_it(tmp_path, context):
    """Two writers of one run: each sees the other's rows, a key is written once, reading keeps one row."""
    folder = tmp_path / "exp" / "job"
    a, b = ResultWriter(folder), ResultWriter(folder)
    a.append(make_row(record(), context=context, sample_id="q0", turn=0, output_text="from a"))
    assert b.recorded(("q0", 0, "pld"))["output_text"] == "from a"  # b finds a's row before generating
    assert b.found_from_others == 1
    with pytest.raises(ValueError, match="already recorded"):
        b.append(make_row(record(), context=context, sample_id="q0", turn=0, output_text="from b"))
    b.append(make_row(record(), context=context, sample_id="q1", turn=0, output_text="from b"))
    # a race: two jobs generated q2 before either wrote it. Both rows stay on disk; reading keeps the earlier.
    first = make_row(record(), context=context, sample_id="q2", turn=0, output_text="first")
    second = make_row(record(), context=context, sample_id="q2", turn=0, output_text="second")
    b.append(first)
    late = folder / f"pld__{key_hash('q2', 0, 'pld')}__zz-late-writer.parquet"  # what a's append would write
    pq.write_table(_to_table([second]), late)
    df = load_results(tmp_path)
    assert len(df) == 3 and not df.duplicated(["sample_id", "turn", "method"]).any()
    assert df.set_index("sample_id").loc["q2", "output_text"] == "first"
    assert ResultWriter(folder).recorded(("q2", 0, "pld"))["output_text"] == "first"
    assert len(list(folder.glob("*.parquet"))) == 4  # nothing on disk was lost or overwritten
    # a job that looked before generating, while another wrote the row meanwhile: add() keeps the other's row
    assert a.recorded(("q3", 0, "pld")) is None
    b.add(make_row(record(), context=context, sample_id="q3", turn=0, output_text="from b"))
    assert a.add(make_row(record(), context=context, sample_id="q3", turn=0, output_text="from a"))["output_text"] \
        == "from b"
    assert a.add(make_row(record(), context=context, sample_id="q4", turn=0, output_text="from a")) is None
    assert ResultWriter(folder).recorded(("q4", 0, "pld"))["output_text"] == "from a"


def test_appending_costs_one_new_file(tmp_path, context):
    """A row is one new file: earlier files are never rewritten, however long the run."""
    folder = tmp_path / "job"
    w = ResultWriter(folder)
    for i in range(20):
        w.append(make_row(record(), context=context, sample_id=f"q{i}", turn=0, output_text=""))
    before = {p: p.stat().st_mtime_ns for p in folder.glob("*.parquet")}
    w.append(make_row(record(), context=context, sample_id="last", turn=0, output_text=""))
    after = {p: p.stat().st_mtime_ns for p in folder.glob("*.parquet")}
    assert len(after) == 21 and all(after[p] == t for p, t in before.items())


def test_unreadable_file_is_reported_and_the_rest_read(tmp_path, context, capsys):
    folder = tmp_path / "exp" / "job"
    w = ResultWriter(folder)
    for i in range(3):
        w.append(make_row(record(), context=context, sample_id=f"q{i}", turn=0, output_text=""))
    victim = sorted(folder.glob("*.parquet"))[1]
    victim.write_bytes(victim.read_bytes()[:100])  # truncated, as a killed copy or a full disk leaves it
    df = load_results(tmp_path)
    assert len(df) == 2 and df.attrs["unreadable"] == [str(victim)]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(victim) in err[0] and "move it aside" in err[0]
    size = victim.stat().st_size
    with pytest.raises(ConfigError, match="unreadable .* move it aside"):
        ResultWriter(folder)  # the run's own file: stop before any work, never overwrite it
    assert victim.stat().st_size == size


CHILD = """
import sys
from specbench.results.rows import ResultWriter
w = ResultWriter(sys.argv[1])
i = len(w)
while True:
    w.append({"sample_id": f"s{i}", "turn": 0, "method": "m", "ids": list(range(i % 97)), "x": float(i)})
    print(i, flush=True)
    i += 1
"""


def test_kill_9_loses_at_most_the_row_in_flight(tmp_path):
    path = tmp_path / "job"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    reported: set[int] = set()
    deadline = time.monotonic() + 8
    for kill_after in (5, 12):
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, text=True, env=env
        )
        seen = 0
        for line in proc.stdout:
            reported.add(int(line))
            seen += 1
            if seen >= kill_after or time.monotonic() > deadline:
                break
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        reported |= {int(x) for x in proc.stdout.read().split()}  # printed before the kill
        proc.stdout.close()
        written = {int(r["sample_id"][1:]) for r in ResultWriter(path).rows}
        assert len(written) == len(ResultWriter(path).rows)
        assert reported <= written
        assert written - reported <= {max(reported) + 1}
        reported = written
    assert len(reported) >= 6


def test_run_name_and_path(tmp_path):
    name = run_name("HuggingFaceTB/SmolLM2-135M", "spectra", "mt bench", 0.7, 1, "abc123")
    assert name == "SmolLM2-135M__spectra__mt-bench__t0.7__s1__abc123"
    assert re.fullmatch(r"[A-Za-z0-9._-]+", name)
    assert run_name("m", "x", "d", 0.0, 0, "h") == "m__x__d__t0__s0__h"
    assert run_file_path(tmp_path, "table1", name) == tmp_path / "table1" / f"{name}.parquet"


def test_git_commit_format():
    commit = provenance.git_commit()
    assert commit == "unknown" or re.fullmatch(r"[0-9a-f]{7,40}(\+dirty)?", commit)
    info = provenance.environment_info("cpu")
    assert info["git_commit"] == commit
    assert "hostname" not in info
    assert re.search(r"\(\d+ threads\)$", info["device_name"])
    assert info["torch_version"] and info["transformers_version"] and info["specbench_version"]
    assert (info["gpu_count"], info["cuda_version"], info["driver_version"], info["quantization"]) == ("0", "", "", "")


def test_provenance_names_the_placement(monkeypatch):
    monkeypatch.setattr(provenance, "driver_version", lambda: "550.54")
    monkeypatch.setattr(provenance, "device_name", lambda device: "NVIDIA H100 80GB HBM3")
    info = provenance.environment_info("cuda:0", devices=["cuda:0", "cuda:1", "cuda:1"], quantization="int8",
                                       device_map="auto")
    assert info["gpu_count"] == "2" and info["device_map"] == "auto" and info["quantization"] == "int8"
    assert info["driver_version"] == "550.54" and info["cuda_version"] == (torch.version.cuda or "")


def test_config_hash_stable_and_order_independent():
    a = {"model": {"name": "x", "dtype": "bf16"}, "method": {"name": "pld", "k": 3}, "seed": 0}
    b = {"seed": 0, "method": {"k": 3, "name": "pld"}, "model": {"dtype": "bf16", "name": "x"}}
    assert provenance.config_hash(a) == provenance.config_hash(b)
    assert re.fullmatch(r"[0-9a-f]{12}", provenance.config_hash(a))
    canonical = '{"method":{"k":3,"name":"pld"},"model":{"dtype":"bf16","name":"x"},"seed":0}'
    assert (
        provenance.config_hash(a) == hashlib.sha256(canonical.encode()).hexdigest()[:12]
    )  # no per-process salt
    assert provenance.config_hash({**a, "seed": 1}) != provenance.config_hash(a)
