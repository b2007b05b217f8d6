"""Slow: SmolLM2 over 3 samples of each public data copy ($SPECBENCH_DATA_DIR), read through dataset.path."""

import pytest

from specbench.results.rows import load_results
from specbench.run.runner import run
from tests.run.test_config import make_cfg

SETS = {
    "gsm8k": "gsm8k_test.jsonl",
    "classeval": "classeval.json",
    "humaneval": "humaneval.jsonl",
    "mtbench": "mtbench_questions.jsonl",
    "spec_bench": "spec_bench_questions.jsonl",
}


@pytest.mark.slow
@pytest.mark.data
@pytest.mark.parametrize("dataset", list(SETS))
def test_three_samples_of_each_shared_set(dataset, tmp_path, public_data):
    path = public_data / SETS[dataset]
    assert path.is_file(), f"no {path.name} in {public_data}"
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
