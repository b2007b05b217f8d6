"""A job at batch_size > 1: rows for every sample × turn × method, outputs as at batch size 1, resuming, and
the settings a batch cannot run refused in one line before any work."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
    assert (df.finished_s > df.started_s).all()
    for _, rows in df.groupby("method"):  # requests overlapped: some started before another ended
        assert (rows.started_s.values[:, None] < rows.finished_s.values[None, :]).sum() > len(rows)
    assert set(summary.method) == {"pld", "autoregressive"}
    assert "speedup" in capsys.readouterr().out
    assert (summary.throughput > 0).all() and (summary.latency_p90_s >= summary.latency_p50_s).all()
    span = df.groupby("method").finished_s.max() - df.groupby("method").started_s.min()
    throughput = (df.groupby("method").new_tokens.sum() / span).to_dict()
    assert summary.set_index("method").throughput.to_dict() == pytest.approx(throughput)


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
    legacy = df[df.batch_size == 1].drop(columns=["batch_size", "started_s", "finished_s", "slot"])
    assert summarize(legacy).batch_size.tolist() == [1, 1]  # rows from before batches count as batch size 1
    table = batch_sweep(df)
    (_, header, rows), = table.sections
    assert header[-3:] == ["B = 1", "B = 2", "stops paying"] and len(rows) == 1 and rows[0][2] == "pld"
    assert set(table.data.batch_size) == {1, 2} and table.data[table.data.metric == "throughput"].ours.gt(0).all()


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
])
def test_a_setting_a_batch_cannot_run_is_one_line_before_any_work(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        plan(cfg_for(tmp_path, *overrides))
    assert "\n" not in str(err.value)
    assert not list(Path(tmp_path).rglob("*.parquet"))
