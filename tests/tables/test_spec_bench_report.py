"""Spec-Bench's leaderboard layout on hand-made rows, and its smoke sweep end to end."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from specbench.data.chat import SPEC_BENCH_CATEGORIES
from specbench.results.rows import load_results
from specbench.tables import report
from specbench.tables.spec_bench import load_leaderboard, published_row_for, settings_note, spec_bench_table

ROOT = Path(__file__).resolve().parents[2]
BOARD = (
    "device,model,method,mt_bench,translation,summarization,qa,math_reasoning,rag,mean_accepted_tokens,overall\n"
    "3090,Vicuna-7B-v1.3,PLD,1.64,1.15,2.46,1.28,1.72,1.71,1.73,1.64\n"
    "A100,Vicuna-7B-v1.3,PLD,1.60,1.06,2.66,1.19,1.62,1.86,1.75,1.66\n"
    "A100,Vicuna-13B-v1.3,PLD,1.50,1.00,2.50,1.10,1.50,1.70,1.70,1.55\n"
    "A100,Vicuna-7B-v1.3,SAMD[EAGLE2],3.30,2.01,3.19,2.36,2.96,2.52,4.58,2.73\n"
    "A100,Vicuna-7B-v1.3,EAGLE2,2.84,1.88,2.34,2.15,2.79,2.13,4.34,2.36\n"
    "A100,Vicuna-7B-v1.3,Medusa,1.97,1.65,1.57,1.65,1.94,1.49,2.31,1.71\n"
)
# one question per task (MT-Bench's categories are Spec-Bench's mt_bench)
CATEGORY_OF = {"q1": "writing", "q2": "coding", "q3": "translation", "q4": "summarization", "q5": "qa",
               "q6": "math_reasoning", "q7": "rag"}


def row(method, sample_id, tokens, wall, *, model="lmsys/vicuna-7b-v1.3", device_name="NVIDIA A100-SXM4-80GB",
        accepted=None):
    n_steps = len(tokens)
    return {
        "config_hash": "j1", "model": model, "dataset": "spec_bench", "method": method, "preset": method,
        "method_params": "{}", "sample_id": sample_id, "turn": 0, "repeat": 0, "temperature": 0.0, "top_p": 1.0,
        "top_k": 0, "seed": 0, "max_new_tokens": 64, "device_name": device_name, "device": "a100",
        "dtype": "float16", "new_tokens": sum(tokens), "steps": n_steps, "step_tokens": tokens,
        "step_times": [wall / n_steps] * n_steps, "wall_s": wall,
        "accepted_per_step": accepted if accepted is not None else [t - 1 for t in tokens[1:]],
        "step_drafted": [0] + [4] * (n_steps - 1), "draft_overhead_s": 0.0,
        "output_ids": list(range(sum(tokens))), "drafted_by_source": "{}", "accepted_by_source": "{}",
        "accepted_by_position": "{}", "category": CATEGORY_OF[sample_id],
    }


@pytest.fixture
def board_dir(tmp_path):
    d = tmp_path / "spec_bench"
    d.mkdir()
    (d / "leaderboard.csv").write_text(BOARD)
    return d


@pytest.fixture
def rows():
    out = []
    for i, sid in enumerate(CATEGORY_OF):
        wall = 1.0 + i  # the baseline takes 1..7 s for 8 tokens; PLD half of it, for the same 8 tokens
        out.append(row("autoregressive", sid, [1] * 8, wall))
        out.append(row("pld", sid, [1, 3, 2, 2], wall / 2))
    return pd.DataFrame(out)


def test_cells_are_speedups_per_task_beside_the_matching_published_row(rows, board_dir):
    t = spec_bench_table(rows, {"spec_bench": load_leaderboard(board_dir)})
    d = t.data.set_index(["preset", "metric"])
    for task in SPEC_BENCH_CATEGORIES:
        assert d.loc[("pld", task), "ours"] == pytest.approx(2.0)
        assert d.loc[("autoregressive", task), "ours"] == pytest.approx(1.0)
    # MT-Bench's two categories are one task; its interval is over those two questions
    assert d.loc[("pld", "mt_bench"), "paper"] == pytest.approx(1.60)  # the A100 row: the device seen
    assert d.loc[("pld", "overall"), "ours"] == pytest.approx(2.0)
    assert d.loc[("pld", "overall"), "paper"] == pytest.approx(1.66)
    assert d.loc[("pld", "mean_accepted_tokens"), "ours"] == pytest.approx(1 + 4 / 3)  # tokens per decode step
    assert d.loc[("autoregressive", "mean_accepted_tokens"), "ours"] == pytest.approx(1.0)
    md = t.markdown()
    header = next(ln for ln in md.splitlines() if ln.startswith("| model"))
    assert all(task in header for task in SPEC_BENCH_CATEGORIES) and "overall" in header
    pld = next(ln for ln in md.splitlines() if "| pld |" in ln)
    assert "2.00 [2.00, 2.00] / 1.66 (1.20)" in pld  # overall, with its interval over the 7 questions
    assert "A100 Vicuna-7B-v1.3" in md


def test_trained_head_methods_meet_their_leaderboard_rows(board_dir):
    """eagle is Spec-Bench's EAGLE2 (EAGLE-2's tree, an EAGLE-1 head), medusa its Medusa, and SAM-Decoding
    only in its EAGLE-2 preset its SAMD[EAGLE2]; the Token Recycling preset has no published row."""
    out = []
    for sid in CATEGORY_OF:
        out.append(row("autoregressive", sid, [1] * 8, 1.0))
        for method, preset in [("eagle", "eagle"), ("medusa", "medusa"), ("sam_decoding", "sam_decoding-eagle"),
                               ("sam_decoding", "sam_decoding")]:
            out.append({**row(method, sid, [1, 3, 2, 2], 0.5), "preset": preset})
    d = spec_bench_table(pd.DataFrame(out), {"spec_bench": load_leaderboard(board_dir)}).data
    paper = d.set_index(["preset", "metric"])["paper"]
    assert paper[("eagle", "overall")] == pytest.approx(2.36)
    assert paper[("medusa", "overall")] == pytest.approx(1.71)
    assert paper[("sam_decoding-eagle", "overall")] == pytest.approx(2.73)
    assert math.isnan(paper[("sam_decoding", "overall")])


@pytest.mark.parametrize(("model", "preset", "name", "same"), [
    ("vicuna-7b", "sam_decoding-eagle", "SAMD[EAGLE2]", True), ("vicuna-7b", "eagle", "EAGLE2", True),
    ("vicuna-13b", "eagle3", "EAGLE3", True), ("llama3.1-8b", "eagle3", "EAGLE3", True),
    ("vicuna-7b", "sam_decoding-eagle-samd", "SAMD[EAGLE2]", False), ("vicuna-7b", "eagle3-cpu", "EAGLE3", False),
    ("smollm2-135m", "eagle", "EAGLE2", False)])
def test_head_presets_run_the_published_settings_and_say_so(model, preset, name, same):
    """The presets beside a published head row run its settings (the tree, SAM-Decoding's thresholds, fp16);
    a variant, a CPU budget or another precision is named as a difference."""
    from omegaconf import OmegaConf

    from tests.run.test_experiments import compose_cfg

    cfg = compose_cfg(f"model={model}", f"method={preset}")
    note = settings_note(preset, name, OmegaConf.to_container(cfg.method, resolve=True), str(cfg.model.dtype))
    assert note.startswith(f"{preset} ({name}) ran ")
    assert ("the published run's settings" in note) == same, note


def test_the_table_names_the_settings_each_head_row_ran(board_dir):
    out = []
    for sid in CATEGORY_OF:
        out.append(row("autoregressive", sid, [1] * 8, 1.0))
        params = '{"num_draft": 39, "len_threshold": 5, "len_bias": 5, "eagle_depth": 6, "eagle_top_k": 4, ' \
                 '"eagle_total_tokens": 63, "datastore": null}'
        out.append({**row("sam_decoding", sid, [1, 3, 2, 2], 0.5), "preset": "sam_decoding-eagle",
                    "method_params": params})
        out.append({**row("pld", sid, [1, 3, 2, 2], 0.5), "method_params": '{"num_draft": 10}'})
    notes = spec_bench_table(pd.DataFrame(out), {"spec_bench": load_leaderboard(board_dir)}).notes
    ran = [n for n in notes if " ran " in n]
    assert ran == ["sam_decoding-eagle (SAMD[EAGLE2]) ran num_draft 39, len_threshold 5, len_bias 5, eagle_depth 6, "
                   "eagle_top_k 4, eagle_total_tokens 63, datastore none, float16: differs from the published run: "
                   "eagle_top_k 4 (published 8)."]


def test_the_published_row_follows_the_device_and_model_seen(board_dir):
    board = load_leaderboard(board_dir)
    assert published_row_for(board, "lmsys/vicuna-7b-v1.3", "NVIDIA GeForce RTX 3090") == ("3090", "Vicuna-7B-v1.3")
    assert published_row_for(board, "lmsys/vicuna-13b-v1.3", "H100") == ("A100", "Vicuna-13B-v1.3")
    assert published_row_for(board, "smollm2-135m", "AMD EPYC") == ("A100", "Vicuna-7B-v1.3")
    assert published_row_for(None, "x", "y") is None


def test_a_missing_leaderboard_leaves_published_cells_empty_and_says_where_it_goes(rows, tmp_path, capsys):
    assert load_leaderboard(tmp_path / "nowhere") is None
    assert "leaderboard.csv" in capsys.readouterr().err
    t = spec_bench_table(rows, {"spec_bench": None})
    assert t.data["paper"][t.data["method"] == "pld"].isna().all()
    assert "spec_bench_dir" in t.markdown() and "2.00" in t.markdown()


@pytest.mark.slow
def test_the_spec_bench_smoke_sweep_runs_and_reports(tmp_path):
    """experiment=spec_bench_smoke end to end with nothing set (the project's own sample questions), then the
    report from its rows: six task columns, the baseline at 1.00, the shipped leaderboard's figures beside ours."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("SPECBENCH_SPEC_BENCH_QUESTIONS", "SPECBENCH_SPEC_BENCH_DIR")}
    done = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "-m", "experiment=spec_bench_smoke", f"results_dir={tmp_path}/r",
         f"hydra.sweep.dir={tmp_path}/sweep", "progress=false", "max_new_tokens=6"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "3 done, 0 skipped (already recorded), 0 failed" in done.stderr
    written = report.write_report(["spec_bench"], tmp_path / "r", tmp_path / "out")
    assert tmp_path / "out" / "spec_bench.md" in written
    data = pd.read_csv(tmp_path / "out" / "spec_bench.csv")
    ours = data.set_index(["preset", "metric"])["ours"]
    for task in SPEC_BENCH_CATEGORIES:
        assert ours[("autoregressive", task)] == pytest.approx(1.0)
        assert not math.isnan(ours[("pld", task)])
    published = data[(data["preset"] == "pld")].set_index("metric")["paper"]
    assert published["overall"] == pytest.approx(1.66)
    df = load_results(tmp_path / "r" / "spec_bench")
    assert sorted(df["repeat"].unique()) == [0, 1] and df["category"].notna().all()
