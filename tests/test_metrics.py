"""Metrics on hand-made rows with hand-computed answers."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from specbench import metrics


def row(
    method,
    sample_id,
    step_tokens,
    step_times,
    output_ids,
    *,
    overhead=0.0,
    drafted=None,
    accepted=None,
    positions=None,
    temperature=0.0,
    device="cpu A",
    **extra,
):
    return {
        "model": "m",
        "dataset": "d",
        "method": method,
        "method_params": "{}",
        "sample_id": sample_id,
        "turn": 0,
        "temperature": temperature,
        "top_p": 1.0,
        "top_k": 0,
        "seed": 0,
        "max_new_tokens": 64,
        "device_name": device,
        "dtype": "float32",
        "new_tokens": sum(step_tokens),
        "steps": len(step_tokens),
        "step_tokens": step_tokens,
        "step_times": step_times,
        "wall_s": sum(step_times),
        "accepted_per_step": [n - 1 for n in step_tokens[1:]],
        "draft_overhead_s": overhead,
        "lookup_s": overhead / 5,
        "output_ids": output_ids,
        "drafted_by_source": json.dumps(drafted or {}),
        "accepted_by_source": json.dumps(accepted or {}),
        "accepted_by_position": json.dumps(positions or {}),
        **extra,
    }


def ar(sample_id, ids, wall, **kw):
    n = len(ids)
    return row("autoregressive", sample_id, [1] * n, [wall / n] * n, ids, **kw)


@pytest.fixture
def df():
    rows = [
        ar("a", [1, 2, 3, 4, 5, 6], 2.0, rouge1=0.4),
        ar("b", [7, 8, 9, 10, 11, 12], 4.0, rouge1=0.6),
        ar("c", [1, 1, 1], 6.0, rouge1=0.5),
        # a: same output as the baseline; b: differs in one token; d: no baseline partner.
        row(
            "pld",
            "a",
            [1, 3, 2],
            [0.5, 0.25, 0.25],
            [1, 2, 3, 4, 5, 6],
            overhead=0.01,
            drafted={"prompt": 4, "ngram": 2},
            accepted={"prompt": 3},
            positions={"1": 2, "2": 1},
            rouge1=0.4,
        ),
        row(
            "pld",
            "b",
            [1, 1, 4],
            [0.5, 0.5, 1.0],
            [7, 8, 9, 10, 99, 12],
            overhead=0.02,
            drafted={"prompt": 5},
            accepted={"prompt": 2, "ngram": 1},
            positions={"1": 1, "2": 1, "3": 1},
            rouge1=0.7,
        ),
        row(
            "pld",
            "d",
            [1, 2],
            [0.5, 0.5],
            [5, 5, 5],
            overhead=0.005,
            accepted={},
            positions={"1": 1},
            rouge1=1.0,
        ),
    ]
    return pd.DataFrame(rows)


def test_mac_and_mic_tp_differ_on_uneven_steps():
    tokens, times = [2, 6, 1], [1.0, 1.0, 0.5]
    # Mac: mean(2/1, 6/1, 1/0.5) = 10/3; Mic: 9 / 2.5 = 3.6
    assert metrics.mac_tp(tokens, times) == pytest.approx(10 / 3)
    assert metrics.mic_tp(tokens, times) == pytest.approx(3.6)
    assert math.isnan(metrics.mic_tp([], []))
    assert math.isnan(metrics.mac_tp([1], [0.0]))


def test_tau():
    assert metrics.tau(15, 8) == pytest.approx(1.875)
    assert metrics.tau(7, 7) == 1.0
    assert math.isnan(metrics.tau(3, 0))


def test_summarize_method(df):
    s = metrics.summarize(df).set_index("method")
    pld = s.loc["pld"]
    assert pld["n_samples"] == 3
    assert pld["tau"] == pytest.approx(15 / 8)
    assert pld["mean_accepted"] == pytest.approx(7 / 5)  # (2+1+0+3+1) / 5 decode steps
    # per-step rates 2, 12, 8, 2, 2, 4, 2, 4 -> mean 4.5; pooled 15 tokens / 4 s
    assert pld["mac_tp"] == pytest.approx(4.5)
    assert pld["mic_tp"] == pytest.approx(3.75)
    assert pld["wall_s"] == pytest.approx(4.0)
    # only a and b have a baseline partner: (2 + 4) / (1 + 2); with d it would be 1.5
    assert pld["n_paired"] == 2
    assert pld["speedup"] == pytest.approx(2.0)
    assert pld["greedy_match"] == pytest.approx(0.5)  # b differs in one token
    assert pld["overhead_ms_per_step"] == pytest.approx(7.0)  # 35 ms / 5 decode steps
    assert pld["lookup_ms_per_step"] == pytest.approx(1.4)  # a fifth of it in lookups
    assert pld["rouge1"] == pytest.approx(0.7)


def test_summarize_baseline(df):
    base = metrics.summarize(df).set_index("method").loc["autoregressive"]
    assert base["tau"] == 1.0
    assert base["speedup"] == 1.0
    assert base["greedy_match"] == 1.0
    assert base["mean_accepted"] == 0.0
    assert base["n_samples"] == 3


def test_speedup_needs_same_device_and_sampling_gives_no_greedy_match(df):
    other = df.copy()
    other.loc[other["method"] == "pld", "device_name"] = "cpu B"
    s = metrics.summarize(other).set_index(["method", "device_name"])
    assert s.loc[("pld", "cpu B"), "n_paired"] == 0
    assert math.isnan(s.loc[("pld", "cpu B"), "speedup"])

    hot = df.copy()
    hot["temperature"] = 0.7
    s = metrics.summarize(hot).set_index("method")
    assert s.loc["pld", "speedup"] == pytest.approx(2.0)
    assert math.isnan(s.loc["pld", "greedy_match"])


def test_duplicate_baseline_rows_are_averaged(df):
    extra = pd.DataFrame([ar("a", [1, 2, 3, 4, 5, 6], 4.0)])  # a second baseline measurement of a
    s = metrics.summarize(pd.concat([df, extra], ignore_index=True)).set_index("method")
    assert s.loc["pld", "n_paired"] == 2
    assert s.loc["pld", "speedup"] == pytest.approx((3.0 + 4.0) / 3.0)


def test_acceptance_by_source(df):
    t = metrics.acceptance_by_source(df).set_index(["method", "source"])
    assert t.loc[("pld", "prompt"), "drafted"] == 9
    assert t.loc[("pld", "prompt"), "accepted"] == 5
    assert t.loc[("pld", "prompt"), "rate"] == pytest.approx(5 / 9)
    assert t.loc[("pld", "ngram"), "drafted"] == 2
    assert t.loc[("pld", "ngram"), "rate"] == pytest.approx(0.5)
    assert ("autoregressive", "prompt") not in t.index


def test_acceptance_by_position(df):
    t = metrics.acceptance_by_position(df).set_index(["method", "position"])
    assert list(t.loc["pld"]["accepted"]) == [4, 2, 1]
    assert list(t.loc["pld"]["rate"]) == pytest.approx([0.8, 0.4, 0.2])  # over 5 decode steps


def test_format_table(df):
    text = metrics.format_table(metrics.summarize(df))
    lines = text.splitlines()
    assert len(lines) == 4
    assert "preset" in lines[0] and "τ" in lines[0] and "Mac-TP" in lines[0] and "rouge1" in lines[0]
    pld = next(ln for ln in lines if "pld" in ln)
    assert "2.00×" in pld and "50%" in pld and "1.88" in pld and "7.00" in pld
    assert len({len(ln) for ln in lines}) == 1  # fixed width
    assert metrics.format_table(pd.DataFrame()) == "(no results)"


def test_presets_of_one_method_never_merge(df):
    """Two budgets of one method (presets) are two summary rows, labelled by preset."""
    pld = df[df["method"] == "pld"]
    other = pld.assign(preset="pld-cpu", wall_s=pld["wall_s"] * 2)
    both = pd.concat([df.assign(preset=df["method"]), other], ignore_index=True)
    s = metrics.summarize(both)
    assert sorted(s["preset"]) == ["autoregressive", "pld", "pld-cpu"]
    assert s.set_index("preset").loc["pld-cpu", "speedup"] == pytest.approx(2.0 / 2)
    table = metrics.format_table(s)
    assert "pld-cpu" in table and len(table.splitlines()) == 5


def test_rows_without_preset_are_grouped_by_method(df):
    s = metrics.summarize(df)
    assert list(s["preset"]) == list(s["method"])


def test_same_job_pairs_only_with_the_baseline_of_the_same_job(df):
    # The baseline of sample b was measured in another job: with same_job it is not a partner.
    df = df.assign(config_hash="job1")
    df.loc[(df["method"] == "autoregressive") & (df["sample_id"] == "b"), "config_hash"] = "job2"
    pld = metrics.summarize(df, same_job=True).set_index("method").loc["pld"]
    assert pld["n_paired"] == 1 and pld["speedup"] == pytest.approx(2.0 / 1.0)
    assert metrics.summarize(df).set_index("method").loc["pld", "n_paired"] == 2
