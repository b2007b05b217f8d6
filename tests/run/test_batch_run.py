"""A job at batch_size > 1: rows for every sample × turn × method, outputs as at batch size 1, resuming, and
the settings a batch cannot run refused in one line before any work."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from methods.registry import register_method
from specbench.core.draft import Drafter
from specbench.errors import ConfigError
from specbench.results.metrics import summarize
from specbench.results.rows import load_results
from specbench.run.job import hash_config, plan
from specbench.run.runner import run
from specbench.tables.batches import batch_sweep, stops_paying
from tests.run.test_config import make_cfg


def cfg_for(tmp_path, *extra):
    return make_cfg("experiment=smoke", f"results_dir={tmp_path}", "progress=false", *extra)


@pytest.fixture(scope="module")
def one_at_a_time(tmp_path_factory):
    """The same job at batch size 1 (greedy): the outputs a batch must give."""
    folder = tmp_path_factory.mktemp("b1")
    run(cfg_for(folder, "method=pld", "limit=5"))
    return load_results(folder)


def test_a_batched_job_records_every_turn_with_the_outputs_of_batch_one(tmp_path, one_at_a_time, capsys):
    summary = run(cfg_for(tmp_path, "method=pld", "limit=5", "batch_size=3"))
    df = load_results(tmp_path)
    keys = ["sample_id", "turn", "method"]
    assert len(df) == len(one_at_a_time) and not df.duplicated(keys).any()
    assert df.turn.max() >= 1  # a two-turn sample: its second turn was built on its batched first answer
    merged = df.merge(one_at_a_time, on=keys, suffixes=("", "_b1"))
    assert len(merged) == len(df)
    assert (merged.output_ids.map(list) == merged.output_ids_b1.map(list)).all()
    assert (df.batch_size == 3).all() and (one_at_a_time.batch_size == 1).all()
    assert set(df.slot) <= {0, 1, 2} and df.slot.nunique() > 1
    assert (df.finished_s > df.started_s).all() and (df.arrival_s <= df.started_s).all()
    for _, rows in df.groupby("method"):  # requests overlapped: some pair (i ≠ j) decoded at the same time
        start, end = rows.started_s.to_numpy(), rows.finished_s.to_numpy()
        both = (start[:, None] < end[None, :]) & (start[None, :] < end[:, None])
        assert both.sum() - len(rows) > 0
        first = rows[rows.turn == 0]
        assert (first.arrival_s == 0).all()  # all at once: every first turn arrived at the start
        later = rows[rows.turn == 1].merge(first[["sample_id", "finished_s"]], on="sample_id")
        assert (later.arrival_s == later.finished_s_y).all()  # a next turn arrives when the answer is in
    assert set(summary.method) == {"pld", "autoregressive"}
    assert "speedup" in capsys.readouterr().out
    for _, r in summary.iterrows():
        assert 0 < r.ttft_ms <= r.e2e_ms and r.latency_p90_s >= r.latency_p50_s and r.itl_p90_ms >= r.itl_p50_ms
        assert 1.0 < r.occupancy <= 3.0  # requests overlapped, never more than the batch
        tokens = df[df.method == r.method].new_tokens.mean()  # both throughputs over the same span
        assert r.output_throughput / r.request_throughput == pytest.approx(tokens)


def test_summaries_keep_batch_sizes_apart(tmp_path):
    """Batch 1 and batch 2 rows in one folder: each pairs with its own baseline, never across batch sizes."""
    run(cfg_for(tmp_path, "method=pld", "limit=2", "batch_size=2"))
    run(cfg_for(tmp_path, "method=pld", "limit=2"))
    df = load_results(tmp_path)
    summary = summarize(df)
    assert sorted(summary.batch_size) == [1, 1, 2, 2]
    rows_per = len(df) // 4
    assert (summary.n_paired == rows_per).all() and (summary.n_samples == rows_per).all()
    base = summary[summary.method == "autoregressive"]
    assert (base.throughput_speedup == 1.0).all()
    assert summary[summary.method == "pld"].throughput_speedup.notna().all()
    legacy = df[df.batch_size == 1].drop(columns=["batch_size", "started_s", "finished_s", "slot", "arrival_s",
                                                  "step_ends_s", "request_rate", "max_concurrency"])
    assert summarize(legacy).batch_size.tolist() == [1, 1]  # rows from before batches count as batch size 1
    table = batch_sweep(df)
    (_, header, rows), = table.sections
    assert header[3:6] == ["B = 1", "B = 2", "stops paying"] and len(rows) == 1 and rows[0][2] == "pld"
    assert set(table.data.batch_size) == {1, 2}
    assert table.data[table.data.metric == "output_throughput"].ours.gt(0).all()


def test_where_a_method_stops_paying():
    assert stops_paying([(1, "faster"), (2, "faster"), (4, "no measurable change"), (8, "slower")]) == \
        "no measurable gain from B = 4, slower from B = 8"
    assert stops_paying([(1, "faster"), (2, "slower"), (4, "no measurable change")]) == "slower from B = 2"
    assert stops_paying([(1, "faster"), (2, "no measurable change"), (4, "faster")]) == \
        "no measurable gain from B = 2"
    assert stops_paying([(1, "faster"), (16, "faster")]) == "pays up to B = 16"


def test_a_batched_job_resumes_without_decoding_recorded_turns_again(tmp_path):
    run(cfg_for(tmp_path, "method=pld", "limit=2", "batch_size=2"))
    first = load_results(tmp_path)
    run(cfg_for(tmp_path, "method=pld", "limit=4", "batch_size=2"))
    second = load_results(tmp_path)
    keys = ["sample_id", "turn", "method"]
    kept = second.merge(first[[*keys, "run_id"]], on=keys, suffixes=("", "_first"))
    assert len(kept) == len(first) and (kept.run_id == kept.run_id_first).all()
    assert second.sample_id.nunique() == 4 and not second.duplicated(keys).any()


def test_batch_size_one_hashes_as_before_batches_existed():
    plain = make_cfg("method=pld")
    assert hash_config(plain) == hash_config(make_cfg("method=pld", "batch_size=1"))
    assert hash_config(plain) != hash_config(make_cfg("method=pld", "batch_size=2"))


@dataclass
class _NoSettings:
    pass


@register_method
class OneAtATime(Drafter):
    name = "test_one_at_a_time"
    Config = _NoSettings
    batchable = False


@pytest.mark.parametrize(("overrides", "message"), [
    (["batch_size=0"], "batch_size must be a positive number"),
    (["batch_size=two"], "batch_size must be a positive number"),
    (["batch_size=9", "limit=3", "method=pld"], "batch_size=9 is more than the 3 samples selected"),
    (["batch_size=2", "method=autoregressive", "method.name=test_one_at_a_time"], "cannot decode a batch yet"),
    (["batch_size=2", "method=pld", "hardware.attn_implementation=flash_attention_2"], "flash_attention_2"),
    (["request_rate=0"], "request_rate must be requests per second > 0"),
    (["request_rate=fast"], "request_rate must be requests per second"),
    (["batch_size=2", "max_concurrency=3", "method=pld"], "max_concurrency=3 is more than batch_size=2"),
    (["limit=many"], "limit must be a positive number of samples"),
])
def test_a_setting_a_batch_cannot_run_is_one_line_before_any_work(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        plan(cfg_for(tmp_path, *overrides))
    assert "\n" not in str(err.value)
    assert not list(Path(tmp_path).rglob("*.parquet"))


def test_requests_arriving_at_a_rate_wait_for_their_arrival_and_share_the_schedule(tmp_path):
    """Poisson arrivals, seeded: the method and its baseline see the same arrival times; no request starts
    before it arrives; the rows carry the load they were measured at."""
    from specbench.run.batched import arrivals

    summary = run(cfg_for(tmp_path, "method=pld", "limit=4", "batch_size=2", "request_rate=20"))
    df = load_results(tmp_path)
    first = df[df.turn == 0].sort_values("sample_id")
    for _, rows in first.groupby("method"):
        assert sorted(rows.arrival_s) == pytest.approx(arrivals(4, 20.0, 0, 0))
    assert (df.started_s >= df.arrival_s - 1e-9).all()
    assert (df.request_rate == 20.0).all() and (summary.request_rate == 20.0).all()
    assert arrivals(4, 20.0, 0, 0) != arrivals(4, 20.0, 0, 1)  # each repeat draws its own arrivals
    gaps = np.diff(arrivals(4000, 20.0, 0, 0))
    assert gaps.mean() == pytest.approx(1 / 20, rel=0.1)  # exponential gaps of the rate asked


def test_max_concurrency_caps_the_requests_in_flight(tmp_path):
    run(cfg_for(tmp_path, "method=pld", "limit=4", "batch_size=2", "max_concurrency=1"))
    df = load_results(tmp_path)
    for _, rows in df.groupby("method"):
        rows = rows.sort_values("started_s")
        assert (rows.started_s.to_numpy()[1:] >= rows.finished_s.to_numpy()[:-1] - 1e-9).all()
    assert (df.max_concurrency == 1).all()
    assert (summarize(df).occupancy <= 1.0 + 1e-9).all()


def test_limit_auto_takes_eight_samples_per_slot_and_says_when_the_dataset_has_fewer(tmp_path, capsys):
    job = plan(cfg_for(tmp_path, "limit=auto", "method=pld", "dataset=code_edits", "request_rate=2"))
    assert len(job.samples) == 8 and job.served and job.batch_size == 1
    assert "per slot" not in capsys.readouterr().err
    job = plan(cfg_for(tmp_path, "limit=auto", "batch_size=2", "method=pld", "dataset=code_edits"))
    assert len(job.samples) == 8
    assert "8 samples at batch_size=2: fewer than 8 per slot" in capsys.readouterr().err


def test_unset_arrival_settings_hash_as_before_and_a_rate_is_a_new_run():
    plain = make_cfg("method=pld")
    assert hash_config(plain) == hash_config(make_cfg("method=pld", "request_rate=null", "max_concurrency=null"))
    assert hash_config(plain) != hash_config(make_cfg("method=pld", "request_rate=4"))
