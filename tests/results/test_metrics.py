"""Metrics on hand-made rows with hand-computed answers."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from specbench.results import metrics, stats
from specbench.results.summary import format_summary, summary_frame


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
        "step_drafted": [0] + [3] * (len(step_tokens) - 1),
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
    assert pld["acceptance_length"] == pytest.approx(1 + 7 / 5)
    assert pld["acceptance_rate"] == pytest.approx(7 / 15)  # 3 guesses drafted per decode step
    # decode steps only (the prefill left out): rates 12, 8, 2, 4, 4 -> mean 6; pooled 12 tokens / 2.5 s
    assert pld["mac_tp"] == pytest.approx(6.0)
    assert pld["mic_tp"] == pytest.approx(4.8)
    assert pld["wall_s"] == pytest.approx(4.0)
    # only a and b have a baseline partner: (12 / 3) / (12 / 6); with d it would differ
    assert pld["n_paired"] == 2
    assert pld["speedup"] == pytest.approx(2.0)
    assert pld["speedup_wall"] == pytest.approx(2.0)  # equal lengths: the time ratio is the same figure
    assert pld["n_prompts"] == 3 and pld["n_repeats"] == 1 and math.isnan(pld["speedup_std"])
    assert pld["speedup_lo"] <= pld["speedup"] <= pld["speedup_hi"]
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
    assert s.loc["pld", "speedup"] == pytest.approx(2.0)  # equal lengths: the token rates' ratio
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
    # rows without step_depth: every decode step counts as having drafted each depth
    assert list(t.loc["pld"]["rate"]) == pytest.approx([0.8, 0.4, 0.2])  # over 5 decode steps


def test_acceptance_by_position_over_steps_that_drafted_that_deep():
    """vLLM's per-position rate: steps that kept ≥ d guesses / steps whose draft reached depth d."""
    r = row("pld", "a", [1, 3, 1, 2, 1], [0.1] * 5, list(range(8)), step_depth=[0, 4, 1, 2, 0])
    t = metrics.acceptance_by_position(pd.DataFrame([r])).set_index("position")
    # accepted per decode step 2, 0, 1, 0; depths 4, 1, 2, 0
    assert list(t["accepted"]) == [2, 1]
    assert list(t["drafted"]) == [3, 2]
    assert list(t["rate"]) == pytest.approx([2 / 3, 1 / 2])
    assert list(t["of_steps"]) == pytest.approx([2 / 4, 1 / 4])
    s = metrics.summarize(pd.DataFrame([r])).iloc[0]
    assert s["acceptance_length"] == pytest.approx(1 + 3 / 4)  # Spec-Bench / vLLM: prefill not a step
    assert s["tau"] == pytest.approx(8 / 5)  # SPECTRA / Lookahead: prefill a step


def test_speedup_is_a_token_rate_ratio_when_outputs_differ():
    """At T > 0 the two texts differ in length: a method sample that stops at 200 tokens against a
    baseline sample of 900 at the same token rate is no speedup, though its wall time is 4.5× shorter."""
    rows = [
        row("pld", "a", [1] * 200, [0.01] * 200, [3] * 200, temperature=1.0),
        row("autoregressive", "a", [1] * 900, [0.01] * 900, [4] * 900, temperature=1.0),
        row("pld", "b", [2] * 100, [0.01] * 100, [3] * 200, temperature=1.0),
        row("autoregressive", "b", [1] * 300, [0.01] * 300, [4] * 300, temperature=1.0),
    ]
    df = pd.DataFrame(rows)
    s = metrics.summarize(df).set_index("method").loc["pld"]
    rate = (df[df.method == "pld"].new_tokens.sum() / df[df.method == "pld"].wall_s.sum()) / (
        df[df.method == "autoregressive"].new_tokens.sum() / df[df.method == "autoregressive"].wall_s.sum()
    )
    assert s["speedup"] == pytest.approx(rate) == pytest.approx((400 / 3.0) / (1200 / 12.0))
    assert s["speedup_wall"] == pytest.approx(12.0 / 3.0)  # the old figure, inflated by length
    assert math.isnan(s["greedy_match"])


def test_repeats_pair_by_repeat_and_give_a_spread():
    rows = []
    for rep, (m_wall, b_wall) in enumerate([(1.0, 2.0), (1.0, 3.0), (1.0, 2.5)]):
        for sid in ("a", "b"):
            rows.append(row("pld", sid, [2, 2], [m_wall / 2] * 2, [1, 2, 3, 4], repeat=rep))
            rows.append(row("autoregressive", sid, [1] * 4, [b_wall / 4] * 4, [1, 2, 3, 4], repeat=rep))
    s = metrics.summarize(pd.DataFrame(rows)).set_index("method").loc["pld"]
    assert s["n_paired"] == 6 and s["n_repeats"] == 3 and s["n_prompts"] == 2
    assert s["speedup"] == pytest.approx(7.5 / 3.0)
    assert s["speedup_std"] == pytest.approx(float(np.std([2.0, 3.0, 2.5], ddof=1)))
    # both prompts have the same ratio in every repeat: the bootstrap over prompts has no width
    assert s["speedup_lo"] == pytest.approx(2.5) and s["speedup_hi"] == pytest.approx(2.5)
    assert s["verdict"] == "faster"
    assert "2.50× ±0.50 [2.50, 2.50]" in format_summary(summary_frame(pd.DataFrame(rows)))


def test_bootstrap_interval_over_prompts_and_its_verdict():
    m = np.array([1.0, 2.0, 0.8, 1.5, 0.9])  # per-prompt method seconds for 10 tokens each
    parts = {"m_tokens": [10] * 5, "m_seconds": m, "b_tokens": [10] * 5, "b_seconds": [1.2] * 5}
    lo, hi = stats.bootstrap_interval(parts, stats.speedup_ratio)
    point = stats.speedup_ratio(50, m.sum(), 50, 6.0)
    assert lo < point < hi and lo < 1 < hi
    assert (lo, hi) == stats.bootstrap_interval(parts, stats.speedup_ratio)  # seeded
    assert stats.verdict(lo, hi) == stats.NO_CHANGE
    assert stats.verdict(1.1, 1.3) == "faster" and stats.verdict(0.7, 0.9) == "slower"
    one = {k: v[:1] for k, v in parts.items()}
    assert all(math.isnan(x) for x in stats.bootstrap_interval(one, stats.speedup_ratio))
    # a wider spread between prompts gives a wider interval
    wide = {**parts, "m_seconds": np.array([0.3, 3.0, 0.5, 2.5, 0.7])}
    wlo, whi = stats.bootstrap_interval(wide, stats.speedup_ratio)
    assert whi - wlo > hi - lo


def test_format_summary(df):
    text = format_summary(summary_frame(df))
    lines = text.split("\n\n")[0].splitlines()
    assert len(lines) == 4
    assert "preset" in lines[0] and "τ" in lines[0] and "Mac-TP" in lines[0] and "rouge1" in lines[0]
    pld = next(ln for ln in lines if "pld" in ln)
    assert "2.00×" in pld and "50%" in pld and "1.88" in pld and "7.00" in pld
    assert len({len(ln) for ln in lines}) == 1  # fixed width
    assert "- speedup: " in text and "- quality: " in text  # the legend, every column it shows
    assert format_summary(pd.DataFrame()) == "(no results)"


def test_presets_of_one_method_never_merge(df):
    """Two budgets of one method (presets) are two summary rows, labelled by preset."""
    pld = df[df["method"] == "pld"]
    other = pld.assign(preset="pld-cpu", wall_s=pld["wall_s"] * 2)
    both = pd.concat([df.assign(preset=df["method"]), other], ignore_index=True)
    s = metrics.summarize(both)
    assert sorted(s["preset"]) == ["autoregressive", "pld", "pld-cpu"]
    assert s.set_index("preset").loc["pld-cpu", "speedup"] == pytest.approx(2.0 / 2)
    text = format_summary(summary_frame(both), legend=False)
    assert "pld-cpu" in text and len(text.splitlines()) == 5


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


def test_limit_is_each_speedup_over_the_oracles_with_a_paired_interval():
    rows = []
    # per prompt: baseline 1 token / 0.1 s; pld 2× on a, 1.5× on b, 1.2× on c; the oracle 4× on a, 2× on b and c
    for sid, pld, best in (("a", 2.0, 4.0), ("b", 1.5, 2.0), ("c", 1.2, 2.0)):
        rows.append(row("autoregressive", sid, [1] * 8, [0.1] * 8, list(range(8))))
        rows.append(row("pld", sid, [2] * 4, [0.2 / pld] * 4, list(range(8))))
        rows.append(row("oracle", sid, [4] * 2, [0.4 / best] * 2, list(range(8))))
    df = pd.DataFrame(rows)
    s = metrics.summarize(df).set_index("method")
    pld, oracle = s.loc["pld"], s.loc["oracle"]
    assert pld["limit"] == pytest.approx(pld["speedup"] / oracle["speedup"])
    assert pld["speedup"] == pytest.approx(24 / (0.4 + 0.8 / 1.5 + 0.8 / 1.2) / 10)
    assert pld["limit_lo"] < pld["limit"] < pld["limit_hi"] < 1  # prompts disagree: an interval with width
    assert oracle["limit"] == pytest.approx(1.0) and math.isnan(s.loc["autoregressive", "limit"])
    assert "limit" in format_summary(summary_frame(df)).splitlines()[0]
    pld_line = next(ln for ln in format_summary(summary_frame(df)).splitlines() if "| pld" in ln)
    assert f"{pld['limit']:.0%} [{pld['limit_lo']:.0%}, {pld['limit_hi']:.0%}]" in pld_line
    # on another device the oracle is not this row's limit
    other = pd.DataFrame([r for r in rows if r["method"] != "oracle"]
                         + [{**r, "device_name": "gpu B"} for r in rows if r["method"] in ("oracle", "autoregressive")])
    assert math.isnan(metrics.summarize(other).set_index(["method", "device_name"]).loc[("pld", "cpu A"), "limit"])
