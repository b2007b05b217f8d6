"""The results site, built from a real (tiny) run: tables in wide form with the report's cells, runs with their
provenance, and each generation's tokens placed in their steps with their sources."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from specbench.core.record import TARGET_TOKEN
from specbench.models import model_preset
from specbench.models.load import load_tokenizer
from specbench.results.rows import load_results
from specbench.run.runner import run
from specbench.tables.site import table_view, write_site
from tests.run.test_config import make_cfg

ROOT = Path(__file__).resolve().parents[2]


def site_data(index: Path) -> dict:
    text = index.read_text()
    payload = re.search(r'<script id="site-data" type="application/json">(.*?)</script>', text, re.S).group(1)
    return json.loads(payload.replace("<\\/", "</"))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """A table1-shaped experiment: the tiny model, PLD and SPECTRA-CORE beside the baseline, two samples."""
    folder = tmp_path_factory.mktemp("results")
    for method in ("pld", "spectra_core-cpu"):
        run(make_cfg("experiment=smoke", f"method={method}", "dataset=mtbench", f"results_dir={folder}",
                     "experiment_name=table1", "limit=2", "max_new_tokens=24", "progress=false"))
    return folder


def test_the_site_carries_tables_runs_and_every_token_with_its_step_and_source(results, tmp_path):
    index = write_site(results, tmp_path / "site")
    data = site_data(index)
    assert not (set(data) - {"results", "tables", "figures", "runs", "generations", "filters", "source_labels",
                             "total_generations"})
    table1 = next(t for t in data["tables"] if t["name"] == "table1")
    rows = load_results(results)
    presets = {r["keys"]["preset"] for r in table1["rows"]}
    assert len(presets) == 2 and "pld" in presets  # PLD and SPECTRA-CORE, as the report names them
    assert {c["key"] for c in table1["columns"]} == {"mtbench speedup", "mtbench tau"}
    assert {r["preset"] for r in data["runs"]} == set(rows.preset) and all(r["torch_version"] for r in data["runs"])
    assert len(data["generations"]) == len(rows) == data["total_generations"]
    tok = load_tokenizer(model_preset("tiny-llama"))
    by_key = {(r.preset, r.sample_id, r.turn): r for r in rows.itertuples()}
    drafted = 0
    for g in data["generations"]:
        row = by_key[(g["preset"], g["sample_id"], g["turn"])]
        assert len(g["tokens"]) == len(g["step"]) == len(g["sources"]) == len(row.output_ids)
        assert "".join(g["tokens"]) == tok.decode(list(row.output_ids))  # its pieces are the text, specials shown
        assert g["sources"] == list(row.token_sources)
        for s, n in enumerate(row.step_tokens):  # every token in its step
            assert g["step"].count(s) == n
        drafted += sum(s != TARGET_TOKEN for s in g["sources"])
        if g["preset"] == "autoregressive":
            assert set(g["sources"]) == {TARGET_TOKEN}
    assert drafted == int(rows.accepted_per_step.map(sum).sum())  # every accepted guess shows its source
    html = index.read_text()
    assert "http://" not in html and "https://" not in html  # nothing fetched: opens from file://


def test_table_view_keeps_rows_with_our_figures_and_columns_with_any():
    data = pd.DataFrame([
        dict(model="m", preset="a", dataset="d1", metric="tau", ours=1.5, lo=1.2, hi=1.8, paper=2.0, ratio=0.75),
        dict(model="m", preset="a", dataset="d2", metric="tau", ours=None, lo=None, hi=None, paper=None, ratio=None),
        dict(model="m", preset="b", dataset="d1", metric="tau", ours=None, lo=None, hi=None, paper=1.0, ratio=None),
    ])
    view = table_view("t", "T", data, [])
    assert [r["keys"]["preset"] for r in view["rows"]] == ["a"]  # b has no figure of ours
    assert [c["key"] for c in view["columns"]] == ["d1 tau"]  # d2 has no value at all
    assert view["rows"][0]["cells"]["d1 tau"] == dict(ours=1.5, lo=1.2, hi=1.8, paper=2.0, ratio=0.75)
    assert table_view("t", "T", data.assign(ours=None), []) is None
    long = table_view("t", "T", data, [], long=True)  # the dataset a row key after the preset, the metric a column
    assert long["row_keys"] == ["model", "preset", "dataset"] and [c["key"] for c in long["columns"]] == ["tau"]
    assert [r["keys"] for r in long["rows"]] == [{"model": "m", "preset": "a", "dataset": "d1"}]


@pytest.mark.slow
def test_site_command_and_a_missing_results_folder(results, tmp_path):
    done = subprocess.run([sys.executable, "-m", "specbench", "report", "site", "--results", str(results), "--out",
                           str(tmp_path / "s")], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "s" / "index.html").is_file()
    bad = subprocess.run([sys.executable, "-m", "specbench", "report", "site", "--results", str(tmp_path / "none")],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert bad.returncode != 0 and "no results folder" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_the_summary_pairs_each_preset_with_its_own_jobs_baseline(results):
    """Two jobs, each with its own autoregressive baseline: each preset's speedup is its job's own (the figure
    the job printed), and a job whose baseline ran slower moves its own preset's speedup alone (a pooled
    baseline would move both)."""
    from specbench.results.metrics import summarize
    from specbench.results.summary import summary_frame

    rows = load_results(results)
    summary = summary_frame(rows).set_index("preset")
    jobs = sorted((results / "table1").iterdir())
    assert len(jobs) == 2
    for job in jobs:
        own = summarize(load_results(job)).set_index("preset")
        preset = next(p for p in own.index if p != "autoregressive")
        assert summary.loc[preset, "speedup"] == pytest.approx(own.loc[preset, "speedup"])
        assert job.name.split("__")[1] == preset  # the folder carries the preset's name
    slow = rows.copy()
    second = slow["config_hash"] == slow[slow["preset"] == "pld"]["config_hash"].iloc[0]
    slow.loc[second & (slow["method"] == "autoregressive"), "wall_s"] *= 2
    moved = summary_frame(slow).set_index("preset")
    other = next(p for p in summary.index if p not in ("pld", "autoregressive"))
    assert moved.loc["pld", "speedup"] == pytest.approx(2 * summary.loc["pld", "speedup"])
    assert moved.loc[other, "speedup"] == pytest.approx(summary.loc[other, "speedup"])
    pooled = summarize(slow).set_index("preset")
    assert pooled.loc[other, "speedup"] != pytest.approx(summary.loc[other, "speedup"])


def test_the_site_and_the_summary_command_show_every_preset_of_any_folder(results, tmp_path, capsys):
    """A folder of the user's own runs: the site's first table is the summary, a row per preset with speedup, τ
    and tokens/s and their intervals, the summary figure beside it; the command writes summary.md/.csv/.png."""
    from specbench.cli import report as cli

    data = site_data(write_site(results, tmp_path / "site"))
    summary = data["tables"][0]
    assert summary["name"] == "summary"
    assert summary["row_keys"][summary["row_keys"].index("preset") + 1] == "dataset"  # reads down: a row a dataset
    rows = {(r["keys"]["preset"], r["keys"]["dataset"]): r["cells"] for r in summary["rows"]}
    assert {("pld", "mtbench"), ("autoregressive", "mtbench")} <= set(rows) and len(rows) == 3
    pld = rows["pld", "mtbench"]
    assert {"speedup", "τ", "tokens/s"} <= set(pld)
    for metric in ("speedup", "τ", "tokens/s"):
        cell = pld[metric]
        assert cell["ours"] is not None and cell["lo"] <= cell["ours"] <= cell["hi"], (metric, cell)
    wide = {r["keys"]["preset"]: r["cells"] for r in summary["wide"]["rows"]}  # its wide form, a click away
    assert "dataset" not in summary["wide"]["row_keys"] and wide["pld"]["mtbench speedup"] == pld["speedup"]
    assert any(f["name"] == "summary" and (tmp_path / "site" / f["file"]).stat().st_size > 1000
               for f in data["figures"])
    cli.main(["summary", "--results", str(results), "--out", str(tmp_path / "out")])
    printed = capsys.readouterr().out
    assert "| pld " in printed and "- speedup: " in printed
    assert {p.name for p in (tmp_path / "out").iterdir()} >= {"summary.md", "summary.csv", "summary.png"}
    csv = pd.read_csv(tmp_path / "out" / "summary.csv")
    assert set(csv["preset"]) == {p for p, _ in rows} and csv["speedup_lo"].notna().sum() == 2
