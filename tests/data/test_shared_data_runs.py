"""Slow: SmolLM2 over 3 samples of each public data copy beside the project, read through dataset.path."""

from pathlib import Path

import pytest

from specbench.results.rows import load_results
from specbench.run.runner import run
from tests.run.test_config import make_cfg

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
SETS = {
    "gsm8k": "gsm8k_test.jsonl",
    "classeval": "classeval.json",
    "humaneval": "humaneval.jsonl",
    "mtbench": "mtbench_questions.jsonl",
    "spec_bench": "spec_bench_questions.jsonl",
}


@pytest.mark.slow
@pytest.mark.parametrize("dataset", list(SETS))
def test_three_samples_of_each_shared_set(dataset, tmp_path):
    path = DATA / SETS[dataset]
    if not path.exists():
        pytest.skip(f"no local copy at {path.name}")
    cfg = make_cfg(
        f"dataset={dataset}",
        f"dataset.path={path}",
        "limit=3",
        "max_new_tokens=24",
        "baseline=false",
        f"results_dir={tmp_path}",
        "progress=false",
    )
    run(cfg)
    df = load_results(tmp_path)
    assert df.sample_id.nunique() == 3
    assert (df.new_tokens > 0).all() and (df.prompt_tokens > 0).all()
    assert (df.output_text.str.len() > 0).all()
    if dataset == "mtbench":
        assert sorted(df.turn.unique()) == [0, 1]
