"""A missing store built by the run that needs it: estimated before any work, built after the model loads
(once, whatever the number of jobs), refused in one line with the estimate and the command when too slow."""

import threading

import pytest

from specbench.errors import ConfigError
from specbench.results.rows import load_results
from specbench.run.job import plan
from specbench.run.runner import run
from specbench.stores import corpus, datastore, ondemand
from specbench.stores.naming import resolve_store
from tests.run.test_runner import cfg_for


@pytest.fixture
def small_stdlib(tmp_path, monkeypatch):
    """A cache of its own and a "standard library" of a few files, so that builds take a second."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    lib = tmp_path / "lib"
    lib.mkdir()
    for i in range(6):
        (lib / f"m{i}.py").write_text("".join(f"def f{j}(x):\n    return x + {i * j}\n\n" for j in range(40)))
    monkeypatch.setattr(corpus, "stdlib_dir", lambda: lib)
    monkeypatch.setattr(ondemand, "SAMPLE", {"cpu": 6, "cuda": 6})
    return lib


def test_the_estimate_comes_before_any_work_and_refuses_past_the_budget(small_stdlib, monkeypatch):
    monkeypatch.setattr(ondemand, "gemm_rate", lambda device: 1e9)  # a slow machine: 1 GFLOP/s
    cfg = cfg_for(small_stdlib, "method=spectra_retrieval", "model=smollm2-135m")
    built = []
    monkeypatch.setattr(datastore, "write_store", lambda *a, **k: built.append(a))
    with pytest.raises(ConfigError) as err:
        plan(cfg)
    line = str(err.value)
    assert line.startswith("spectra_retrieval: building the stdlib store (~0 s) and its perplexity-refined copy "
                           "(6 pieces scored, ~")
    assert "over build_budget=600 s: build it first with `make datastore MODEL=smollm2-135m SOURCE=stdlib && " \
           "make datastore-refine MODEL=smollm2-135m STORE=stdlib`" in line and "\n" not in line
    assert built == []
    monkeypatch.setattr(ondemand, "gemm_rate", lambda device: 1e15)
    job = plan(cfg)
    build = job.method_config._store_build
    assert build.build_parent and build.refined == resolve_store("stdlib", cfg.model, refined=True)
    assert build.sample == 6 and build.total_seconds < 1


def test_a_run_builds_its_missing_store_and_rows_name_it(small_stdlib, tmp_path, capsys):
    summary = run(cfg_for(tmp_path / "r", "method=spectra_retrieval", "limit=1", "max_new_tokens=8"))
    out, err = capsys.readouterr()
    refined = resolve_store("stdlib", {"name": "tiny-llama"}, refined=True)
    assert (refined / datastore.META).exists() and (resolve_store("stdlib", {"name": "tiny-llama"}) / "meta.json").exists()
    assert "spectra_retrieval: building the stdlib store" in err and "store ready in" in err
    rows = load_results(tmp_path / "r")
    mine = rows[rows.method == "spectra_retrieval"]
    meta = datastore.read_meta(refined)
    assert (mine.datastore == "stdlib-refined").all() and (mine.datastore_tokens == meta["tokens"]).all()
    assert (mine.datastore_fingerprint == meta["fingerprint"][:16]).all()
    assert mine.datastore_kind.iloc[0] == f"refined ({meta['refinement']['kept']} of 6 pieces)"
    assert f"spectra_retrieval read the datastore stdlib-refined ({meta['tokens']:,} tokens" in out
    assert summary.attrs["new_generations"] > 0
    capsys.readouterr()
    run(cfg_for(tmp_path / "r2", "method=spectra_retrieval", "limit=1", "max_new_tokens=8"))
    assert "building" not in "".join(capsys.readouterr())  # the next run reads it


def test_rows_recorded_with_a_store_since_rebuilt_are_named_as_such(small_stdlib, tmp_path, capsys, monkeypatch):
    import shutil

    cfg = ("method=spectra_retrieval", "limit=1", "max_new_tokens=8")
    run(cfg_for(tmp_path / "r", *cfg))
    first = datastore.read_meta(resolve_store("stdlib", {"name": "tiny-llama"}, refined=True))["fingerprint"][:16]
    capsys.readouterr()
    shutil.rmtree(resolve_store("stdlib", {"name": "tiny-llama"}, refined=True))
    monkeypatch.setattr(ondemand, "SAMPLE", {"cpu": 4, "cuda": 4})  # rebuilt from another sample
    run(cfg_for(tmp_path / "r", *cfg))  # every generation recorded: nothing decoded with the new store
    out, err = capsys.readouterr()
    assert f"fingerprint {first})" in out  # the summary names the store the rows read ...
    assert "rows in this run read another store than the one there now" in err  # ... and says it changed


def test_jobs_that_need_one_store_build_it_once(small_stdlib, tmp_path, monkeypatch):
    from specbench.models import load_model
    from tests.conftest import model_cfg

    builds = [plan(cfg_for(tmp_path / f"r{i}", "method=rest")).method_config._store_build for i in range(3)]
    loaded = load_model(model_cfg("tiny-llama"), {"device": "cpu"})
    written = []
    real = datastore.write_store
    monkeypatch.setattr(datastore, "write_store", lambda *a, **k: written.append(a[0]) or real(*a, **k))
    threads = [threading.Thread(target=b.run, args=(loaded,), kwargs={"progress": False}) for b in builds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert written == [resolve_store("stdlib", {"name": "tiny-llama"})]


def test_parameter_counts_come_from_the_settings():
    assert ondemand.parameters({"params_b": 6.74}) == pytest.approx(6.74e9)
    tiny = {"tiny": {"hidden_size": 64, "vocab_size": 128, "intermediate_size": 128, "num_hidden_layers": 2}}
    assert ondemand.parameters(tiny) == 2 * 128 * 64 + 2 * (4 * 64 * 64 + 3 * 64 * 128)
    assert ondemand.parameters({"hub_id": "x/y"}) == 1e9
