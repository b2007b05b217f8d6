"""The report on hand-made rows and hand-made paper figures, checked against hand-computed tables."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from specbench.core.record import GenerationRecord
from specbench.results import metrics
from specbench.results.rows import make_row
from specbench.tables import figures, memory, render, report
from specbench.tables import paper as paper_tables

ROOT = Path(__file__).resolve().parents[2]
PAPER = paper_tables.default_paper_dir()  # the paper's CSV files shipped with the project (conf/config.yaml)


def row(method, sample_id, step_tokens, wall, *, job="j1", preset=None, dataset="gsm8k", model="llama2-7b",
        temperature=0.0, params=None, device="A100-80GB", attn="sdpa", **extra):
    n = len(step_tokens)
    return {
        "run_id": "r-" + job, "config_hash": job, "experiment": "t", "model": model, "dataset": dataset,
        "method": method, "preset": preset or method, "method_params": json.dumps(params or {}),
        "sample_id": sample_id, "turn": 0, "temperature": temperature, "top_p": 1.0, "top_k": 0, "seed": 0,
        "max_new_tokens": 64, "device_name": "GPU X", "device": device, "attn_implementation": attn,
        "dtype": "float16", "new_tokens": sum(step_tokens), "steps": n, "step_tokens": step_tokens,
        "step_times": [wall / n] * n, "wall_s": wall, "accepted_per_step": [t - 1 for t in step_tokens[1:]],
        "draft_overhead_s": 0.0, "output_ids": list(range(sum(step_tokens))),
        "drafted_by_source": json.dumps(extra.pop("drafted", {})),
        "accepted_by_source": json.dumps(extra.pop("accepted", {})),
        "accepted_by_position": "{}", **extra,
    }


@pytest.fixture
def paper_dir(tmp_path):
    """Hand-made paper CSVs with the real files' columns."""
    d = tmp_path / "paper"
    d.mkdir()
    (d / "table1_speedup_tau.csv").write_text(
        "table,temperature,model,method,dataset,speedup,tau,suspect\n"
        "table1,0.0,L2-7B,SPECTRA,gsm8k,2.00,2.50,0\n"
        "table1,0.0,L2-7B,SPECTRA,mtbench,2.02,2.59,0\n"
        "table1,0.0,L2-7B,REST,gsm8k,1.01,1.47,0\n"
        "table1,1.0,CL-7B,SPECTRA,gsm8k,3.00,3.00,1\n"
    )
    (d / "table2_ablation.csv").write_text(
        "table,model,temperature,variant,gsm8k_speedup,gsm8k_tau,mtbench_speedup,mtbench_tau\n"
        "table2,L2-7B,0.0,CORE w/o Forward Dict,1.50,1.68,1.20,1.37\n"
        "table2,L2-7B,0.0,SPECTRA,2.14,2.64,2.02,2.59\n"
    )
    (d / "table4_throughput.csv").write_text(
        "table,temperature,model,method,dataset,mac_tp,mic_tp\n"
        "table4,0.0,L2-7B,Autoregressive,gsm8k,40.0,40.0\n"
        "table4,0.0,L2-7B,SPECTRA,gsm8k,80.0,100.0\n"
    )
    (d / "table7_rouge.csv").write_text(
        "table,model,temperature,dataset,method,rouge1,rouge2,rougeL,speedup,tau\n"
        "table7,L2-7B,1.0,xsum,SPECTRA,18.13,4.40,12.49,1.69,2.08\n"
    )
    return d


@pytest.fixture
def t1_rows():
    return pd.DataFrame([
        # job j1: the baseline and SPECTRA on two GSM8K samples.
        row("autoregressive", "a", [1] * 4, 4.0),
        row("autoregressive", "b", [1] * 6, 6.0),
        row("spectra", "a", [1, 3], 2.0),
        row("spectra", "b", [1, 2, 3], 2.0),
        # another job's baseline for sample a, 100 s: must not enter SPECTRA's speedup.
        row("autoregressive", "a", [1] * 4, 100.0, job="j2"),
    ])


def test_table1_matches_hand_computed_values(t1_rows, paper_dir):
    paper = paper_tables.load_paper(paper_dir, required=True)
    t = paper_tables.table1(t1_rows, paper)
    d = t.data.set_index(["temperature", "preset", "dataset", "metric"])
    # speedup = Σ baseline wall / Σ method wall over the same job = (4 + 6) / (2 + 2); τ = 10 / 5.
    assert d.loc[(0.0, "spectra", "gsm8k", "speedup"), "ours"] == pytest.approx(2.5)
    assert d.loc[(0.0, "spectra", "gsm8k", "tau"), "ours"] == pytest.approx(2.0)
    assert d.loc[(0.0, "spectra", "gsm8k", "speedup"), "paper"] == pytest.approx(2.0)
    assert d.loc[(0.0, "spectra", "gsm8k", "speedup"), "ratio"] == pytest.approx(1.25)
    assert d.loc[(0.0, "spectra", "gsm8k", "tau"), "ratio"] == pytest.approx(0.8)
    # mtbench: the paper has a value, we have no rows: missing, not zero.
    assert math.isnan(d.loc[(0.0, "spectra", "mtbench", "speedup"), "ours"])
    md = t.markdown()
    spectra_line = next(ln for ln in md.splitlines() if "| spectra |" in ln)
    cells = [c.strip() for c in spectra_line.strip("|").split("|")]
    assert cells[0] == "L2-7B"
    # gsm8k speedup with its bootstrap interval over the two prompts (2.0 and 3.0 each), τ (the same on both)
    assert cells[4:6] == ["2.50 [2.00, 3.00] / 2.00 (1.25)", "2.00 [2.00, 2.00] / 2.50 (0.80)"]
    assert cells[2:4] == ["—", "—"]  # classeval: neither side has a value
    assert cells[10:12] == ["— / 2.02", "— / 2.59"]  # mtbench: only the paper's
    assert "0.00" not in md
    # The paper's REST row is listed although we did not run REST, ours missing.
    rest = next(ln for ln in md.splitlines() if "REST not run" in ln)
    assert "— / 1.01" in rest and "— / 1.47" in rest
    assert "compare across machines" in md or "compare them only" in md
    tex = t.latex()
    assert "\\begin{tabular}" in tex and "2.50 [2.00, 3.00] / 2.00 (1.25)" in tex and "\\tau" in tex


def test_table1_other_model_beside_a_paper_model(t1_rows, paper_dir):
    rows = t1_rows.assign(model="smollm2-135m")
    paper = paper_tables.load_paper(paper_dir, required=True)
    alone = paper_tables.table1(rows, paper)
    assert alone.data["paper"].isna().all()
    assert "not in the paper" in alone.markdown()
    beside = paper_tables.table1(rows, paper, {"smollm2-135m": "L2-7B"})
    d = beside.data.set_index(["preset", "dataset", "metric"])
    assert d.loc[("spectra", "gsm8k", "tau"), "paper"] == pytest.approx(2.5)
    assert "smollm2-135m (vs L2-7B)" in beside.markdown()


def test_throughput_tables(t1_rows, paper_dir):
    paper = paper_tables.load_paper(paper_dir, required=True)
    t4, t5 = paper_tables.table4(t1_rows, paper), paper_tables.table5(t1_rows, paper)
    d4 = t4.data.set_index(["preset", "dataset"])
    d5 = t5.data.set_index(["preset", "dataset"])
    # SPECTRA: steps of a: 1 token in 1 s, 3 in 1 s; b: 1, 2, 3 tokens in 2/3 s each; the prefill
    # (each row's first step) is left out of both, as the paper's rates over decoding steps.
    mac = (3 + 3 + 4.5) / 3
    assert d4.loc[("spectra", "gsm8k"), "ours"] == pytest.approx(mac)
    assert d5.loc[("spectra", "gsm8k"), "ours"] == pytest.approx(8 / (1 + 4 / 3))
    assert d4.loc[("spectra", "gsm8k"), "paper"] == 80.0 and d5.loc[("spectra", "gsm8k"), "paper"] == 100.0
    assert d4.loc[("autoregressive", "gsm8k"), "paper"] == 40.0
    assert "Mac-TP" in t4.title and "Mic-TP" in t5.title


def test_table2_names_rows_from_method_settings(paper_dir):
    rows = pd.DataFrame([
        row("autoregressive", "a", [1] * 6, 6.0),
        row("spectra_core", "a", [1, 2, 3], 3.0, preset="spectra_core", params={"use_forward_dict": False}),
        row("autoregressive", "a", [1] * 6, 3.0, job="j2", dataset="mtbench"),
        row("spectra", "a", [1, 5], 1.0, job="j2", dataset="mtbench"),
    ])
    t = paper_tables.table2(rows, paper_tables.load_paper(paper_dir, required=True))
    d = t.data.set_index(["variant", "dataset", "metric"])
    assert d.loc[("CORE w/o Forward Dict", "gsm8k", "speedup"), "ours"] == pytest.approx(2.0)
    assert d.loc[("CORE w/o Forward Dict", "gsm8k", "speedup"), "paper"] == pytest.approx(1.5)
    assert d.loc[("SPECTRA", "mtbench", "tau"), "ours"] == pytest.approx(3.0)
    assert d.loc[("SPECTRA", "mtbench", "tau"), "paper"] == pytest.approx(2.59)
    assert math.isnan(d.loc[("SPECTRA", "gsm8k", "tau"), "ours"])
    md = t.markdown()
    assert md.index("CORE w/o Forward Dict") < md.index("| SPECTRA")  # the paper's row order


def test_tables_name_the_store_each_retrieval_row_read(paper_dir):
    store = {"datastore_tokens": 51124, "datastore_kind": "refined (200 of 400 pieces)"}
    rows = pd.DataFrame([
        row("autoregressive", "a", [1] * 6, 6.0),
        row("spectra_retrieval", "a", [1, 2, 3], 3.0, params={"refine": True}, datastore="stdlib-refined",
            datastore_fingerprint="f7f7", datastore_choice="auto -> stdlib, a fallback: ultrachat unavailable", **store),
        row("spectra_retrieval", "a", [1, 2, 3], 3.0, job="j2", params={"refine": False}, datastore="ultrachat",
            datastore_fingerprint="abcd", datastore_tokens=9, datastore_kind="hub"),
    ])
    notes = paper_tables.table2(rows, paper_tables.load_paper(paper_dir, required=True)).notes
    assert ("spectra_retrieval read the datastore stdlib-refined (51,124 tokens, refined (200 of 400 pieces), "
            "fingerprint f7f7; auto -> stdlib, a fallback: ultrachat unavailable).") in notes
    assert "spectra_retrieval read the datastore ultrachat (9 tokens, hub, fingerprint abcd)." in notes
    assert not [n for n in render._notes(rows[rows.method == "autoregressive"]) if "datastore" in n]


@pytest.mark.parametrize(
    "method,params,variant",
    [
        ("spectra_core", {}, "CORE Module"),
        ("spectra_core", {"use_backward_dict": False}, "CORE w/o Backward Dict"),
        ("spectra_core", {"sub_ngrams": False}, "CORE w/o Sub-Ngram"),
        ("spectra_retrieval", {"refine": True}, "RETRIEVAL Module"),
        ("spectra_retrieval", {"refine": False}, "RETRIEVAL w/o PPL refine"),
        ("lookahead_rest", {}, "Lookahead + REST"),
        ("rest", {}, "REST"),
    ],
)
def test_ablation_variant_names(method, params, variant):
    assert paper_tables.ablation_variant(method, json.dumps(params)) == variant


def test_table3_and_table6_by_hardware_label(paper_dir):
    rows = pd.DataFrame([
        row("autoregressive", "a", [1] * 4, 4.0, dataset="mtbench", device="2xH100 fp16"),
        row("spectra", "a", [1, 3], 1.0, dataset="mtbench", device="2xH100 fp16"),
    ])
    paper = paper_tables.load_paper(paper_dir, required=True)
    (paper_dir / "table6_multigpu.csv").write_text(
        "table,model,temperature,setting,method,mtbench_mac_tp,mtbench_mic_tp,mtbench_speedup,mtbench_tau\n"
        "table6,L2-7B,0.0,2xH100 fp16,SPECTRA,29.62,28.91,2.00,2.52\n"
    )
    paper = paper_tables.load_paper(paper_dir, required=True)
    d = paper_tables.table6(rows, paper).data.set_index(["preset", "metric"])
    assert d.loc[("spectra", "speedup"), "ours"] == pytest.approx(4.0)
    assert d.loc[("spectra", "speedup"), "paper"] == pytest.approx(2.0)
    assert d.loc[("spectra", "tau"), "ours"] == pytest.approx(2.0)
    t3 = paper_tables.table3(rows, paper)
    assert "2xH100 fp16" in t3.markdown() and "GPU X" in t3.markdown()


def test_table7_rouge(paper_dir):
    rows = pd.DataFrame([
        row("autoregressive", "a", [1] * 4, 4.0, dataset="xsum", temperature=1.0, rouge1=10.0, rouge2=1.0,
            rougeL=8.0),
        row("spectra", "a", [1, 3], 2.0, dataset="xsum", temperature=1.0, rouge1=20.0, rouge2=2.0, rougeL=9.0),
        row("spectra", "b", [1, 1], 2.0, dataset="xsum", temperature=1.0, rouge1=16.0, rouge2=4.0, rougeL=7.0),
    ])
    t = paper_tables.table7(rows, paper_tables.load_paper(paper_dir, required=True))
    d = t.data.set_index(["preset", "metric"])
    assert d.loc[("spectra", "rouge1"), "ours"] == pytest.approx(18.0)
    assert d.loc[("spectra", "rouge1"), "paper"] == pytest.approx(18.13)
    assert d.loc[("spectra", "speedup"), "ours"] == pytest.approx(4.0 / 2.0)  # b has no baseline partner
    assert math.isnan(d.loc[("autoregressive", "rouge1"), "paper"])


def test_cell_formatting_never_shows_missing_as_zero():
    assert render.cell(None, None) == "—"
    assert render.cell(math.nan, 2.0) == "— / 2.00"
    assert render.cell(1.5, math.nan) == "1.50 / —"
    assert render.cell(0.0, 2.0) == "0.00 / 2.00 (0.00)"  # a real zero stays a zero
    assert render.cell(3.0, 2.0) == "3.00 / 2.00 (1.50)"


def test_cumulative_tokens_hand_computed():
    rows = pd.DataFrame([
        row("spectra", "a", [1, 3, 2], 1.0, dataset="mtbench"),
        row("spectra", "b", [1, 1], 1.0, dataset="mtbench"),
    ])
    c = figures.cumulative_tokens(rows)
    # a: 1, 4, 6; b: 1, 2, then stays 2: mean 1, 3, 4.
    assert list(c["tokens"]) == [1.0, 3.0, 4.0] and list(c["step"]) == [1, 2, 3]


def test_figures_written(tmp_path):
    pytest.importorskip("matplotlib")
    rows = pd.DataFrame([
        row("autoregressive", "a", [1] * 4, 4.0, dataset="mtbench"),
        row("spectra", "a", [1, 3], 1.0, dataset="mtbench", drafted={"fwd_dict": 4, "bwd_dict": 2},
            accepted={"fwd_dict": 2}),
        row("autoregressive", "a", [1] * 4, 5.0, dataset="mtbench", attn="eager", job="j3"),
        row("spectra", "a", [1, 3], 2.0, dataset="mtbench", attn="eager", job="j3"),
        row("pld", "a", [1, 2, 1], 2.0, dataset="mtbench", attn="flash_attention_2", job="j4"),
        row("autoregressive", "a", [1] * 4, 4.0, dataset="mtbench", attn="flash_attention_2", job="j4"),
    ])
    for fig in (figures.figure3, figures.figure4, figures.figure6):
        paths = fig(rows, tmp_path)
        assert [p.suffix for p in paths] == [".png", ".pdf"]
        assert all(p.stat().st_size > 1000 for p in paths)
    acc = metrics.acceptance_by_source(rows[rows["method"] != "autoregressive"], by=("preset",))
    assert acc.set_index("source").loc["fwd_dict", "rate"] == pytest.approx(0.5)


def test_report_on_runner_rows(tmp_path, paper_dir):
    """Rows as the runner writes them (make_row) go through write_report into every output."""
    ctx = {"run_id": "r", "experiment": "table1", "config_hash": "h", "provenance": {"device_name": "cpu X"},
           "model": "llama2-7b", "dataset": "gsm8k", "dtype": "float32", "temperature": 0.0, "top_p": 1.0,
           "top_k": 0, "seed": 0, "max_new_tokens": 8, "device": "cpu", "attn_implementation": "sdpa"}
    rows = []
    for method, tokens, secs in (("autoregressive", [1, 1, 1, 1], 0.4), ("spectra", [1, 3], 0.1)):
        r = GenerationRecord(prompt_len=5)
        for t in tokens:
            r.step_tokens.append(t)
            r.step_times.append(secs)
        r.output_ids = list(range(sum(tokens)))
        rows.append(make_row(r, context={**ctx, "method": method, "preset": method}, sample_id="a", turn=0,
                             output_text="x"))
    assert rows[1]["preset"] == "spectra" and rows[1]["attn_implementation"] == "sdpa"
    exp = tmp_path / "results" / "table1"
    exp.mkdir(parents=True)
    pd.DataFrame(rows).to_parquet(exp / "x.parquet")
    paths = report.write_report(["table1", "table4"], tmp_path / "results", tmp_path / "out", paper_dir)
    names = {p.name for p in paths}
    assert {"table1.md", "table1.tex", "table1.csv", "table4.md", "report.md"} <= names
    d = pd.read_csv(tmp_path / "out" / "table1.csv").set_index(["preset", "dataset", "metric"])
    assert d.loc[("spectra", "gsm8k", "tau"), "ours"] == pytest.approx(rows[1]["tau"])


def test_cli_bad_paper_dir_is_one_line(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "specbench", "report", "table1", "--results", str(tmp_path),
         "--out", str(tmp_path / "o"), "--paper-dir", str(tmp_path / "nope")],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    assert out.returncode == 2
    assert out.stderr.strip().startswith("error: paper directory") and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_cli_unknown_output_suggests(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "specbench", "report", "tabel1", "--results", str(tmp_path), "--out",
         str(tmp_path / "o")],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    assert out.returncode == 2 and "did you mean 'table1'" in out.stderr


def test_the_shipped_paper_files_are_the_default_and_have_the_columns_the_report_reads(t1_rows):
    assert PAPER.is_relative_to(ROOT) and PAPER.is_dir()  # in the project, read without any setting
    paper = paper_tables.load_paper(None)
    assert set(paper_tables.PAPER_FILES) <= set(paper)
    t = paper_tables.table1(t1_rows, paper)
    d = t.data.set_index(["temperature", "preset", "dataset", "metric"])
    assert not math.isnan(d.loc[(0.0, "spectra", "gsm8k", "tau"), "paper"])
    t2 = paper_tables.table2(t1_rows.assign(method="spectra_core", preset="spectra_core"), paper)
    assert t2.data["paper"].notna().any()


def test_memory_scopes_table_per_turn_tau_by_scope():
    def two_turns(method, memory, sid, t1, t2, wall):
        params = {"memory": memory} if memory else {}
        a = row(method, sid, t1, wall, dataset="mtbench", params=params, job="m")
        b = row(method, sid, t2, wall, dataset="mtbench", params=params, job="m", turn=1)
        return [a, b]

    rows = pd.DataFrame([
        *two_turns("autoregressive", None, "q", [1] * 6, [1] * 6, 6.0),
        *two_turns("suffix", "turn", "q", [1, 1, 4], [1, 2, 3], 3.0),  # τ 2.0 and 2.0
        *two_turns("suffix", "run", "q", [1, 1, 4], [1, 5], 2.5),  # τ 2.0 and 3.0
    ])
    t = memory.memory_scopes(rows)
    d = t.data.set_index(["memory", "metric"])
    assert d.loc[("turn", "tau_turn2"), "ours"] == pytest.approx(2.0)
    assert d.loc[("run", "tau_turn2"), "ours"] == pytest.approx(3.0)
    assert d.loc[("run", "tau"), "ours"] == pytest.approx(12 / 5)
    assert d.loc[("run", "speedup"), "ours"] == pytest.approx(12 / 5.0)  # 12 s of baseline vs 5 s
    md = t.markdown()
    assert md.index("| turn |") < md.index("| run |")  # turn, sample, run order


def test_every_draft_source_has_a_figure_label():
    from specbench.core import draft

    sources = {v for k, v in vars(draft).items() if k.startswith("SOURCE_") and isinstance(v, str)}
    assert sources == set(draft.SOURCE_LABELS)
