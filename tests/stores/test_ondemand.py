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
    monkeypatch.setattr(ondemand, "gemm_rate", lambda device, dtype=None: 1e9)  # a slow machine: 1 GFLOP/s
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
    monkeypatch.setattr(ondemand, "gemm_rate", lambda device, dtype=None: 1e15)
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
    assert f"fingerprint {first};" in out  # the summary names the store the rows read ...
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


# ----------------------------------------------------------------------------- datastore: auto


def test_auto_reads_the_papers_corpus_for_the_models_domain_and_names_a_fallback(tmp_path, monkeypatch):
    from specbench import hub
    from specbench.stores.naming import choose_store

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    chat, code = {"name": "m"}, {"name": "m", "domain": "code"}
    name, why = choose_store(chat, refined=True)  # the hub offline (every test's default)
    assert name == "stdlib" and "fallback" in why and "ultrachat (chat model)" in why and "unreachable" in why
    assert choose_store(code)[0] == "stdlib" and "the-stack-python (code model)" in choose_store(code)[1]
    monkeypatch.setattr(hub, "reachable", lambda *a, **k: True)
    assert choose_store(chat) == ("ultrachat", "auto -> ultrachat (chat model)")
    monkeypatch.setattr("huggingface_hub.get_token", lambda: None)
    name, why = choose_store(code)  # The Stack is gated: without a token, the fallback, saying why
    assert name == "stdlib" and "bigcode/the-stack is gated and no hub token is set" in why
    monkeypatch.setattr(hub, "reachable", lambda *a, **k: False)
    built = resolve_store("the-stack-python", code)
    built.mkdir(parents=True)
    (built / datastore.META).write_text("{}")
    assert choose_store(code, refined=True)[0] == "the-stack-python"  # built already: read it offline


def test_an_offline_auto_run_says_so_first_and_in_every_row_and_hashes_as_stdlib(small_stdlib, tmp_path, capsys):
    job = plan(cfg_for(tmp_path / "r", "method=spectra_retrieval"))
    err = capsys.readouterr().err
    assert err.splitlines()[0] == ("spectra_retrieval: datastore auto -> stdlib, a fallback: ultrachat (chat model) "
                                   "unavailable, the Hugging Face hub is unreachable (set method.datastore= to choose)")
    assert job.method_config.datastore == "stdlib"
    explicit = plan(cfg_for(tmp_path / "r", "method=spectra_retrieval", "method.datastore=stdlib"))
    assert job.config_hash == explicit.config_hash  # results of either resume the other
    assert not hasattr(explicit.method_config, "_store_choice")
    run(cfg_for(tmp_path / "r", "method=spectra_retrieval", "limit=1", "max_new_tokens=8"))
    out = capsys.readouterr().out
    rows = load_results(tmp_path / "r")
    mine = rows[rows.method == "spectra_retrieval"]
    assert mine.datastore_choice.str.startswith("auto -> stdlib, a fallback").all()
    assert "spectra_retrieval read the datastore stdlib-refined (" in out and "; auto -> stdlib, a fallback" in out


@pytest.fixture
def hub_corpus(small_stdlib, monkeypatch):
    """The hub "reachable", UltraChat streaming a few local conversations (its record count kept small)."""
    from specbench import hub

    monkeypatch.setattr(hub, "reachable", lambda *a, **k: True)
    streamed = []

    def texts(preset, field_name, limit):
        for i in range(limit):
            streamed.append(i)
            yield f"User: how do I add {i} and {i + 1}?\nAssistant: {i} + {i + 1} = {2 * i + 1}. " * 20

    monkeypatch.setattr(corpus, "_hub_texts", texts)
    monkeypatch.setattr(corpus.HUB_PRESETS["ultrachat"], "records", 7)
    return streamed


def test_a_reachable_hub_corpus_is_streamed_estimated_and_built_by_the_run(hub_corpus, tmp_path, capsys):
    job = plan(cfg_for(tmp_path / "r", "method=spectra_retrieval", "limit=1", "max_new_tokens=8"))
    build = job.method_config._store_build
    assert job.method_config.datastore == "ultrachat" and build.limit == 7 and "download" in build.seconds
    assert build.describe().startswith("the ultrachat store (7 records of ~")
    assert "fallback" not in capsys.readouterr().err
    run(cfg_for(tmp_path / "r", "method=spectra_retrieval", "limit=1", "max_new_tokens=8"))
    assert len(hub_corpus) == 7  # the record limit reached the stream
    meta = datastore.read_meta(resolve_store("ultrachat", {"name": "tiny-llama"}))
    assert meta["source"]["hub_id"] == "stingning/ultrachat" and meta["bytes"] > 0
    rows = load_results(tmp_path / "r")
    mine = rows[rows.method == "spectra_retrieval"]
    assert (mine.datastore == "ultrachat-refined").all()
    assert (mine.datastore_choice == "auto -> ultrachat (chat model)").all()


def test_the_papers_store_for_a_big_model_is_refused_in_one_line_with_the_command(hub_corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(corpus.HUB_PRESETS["ultrachat"], "records", 100_000)
    monkeypatch.setattr(ondemand, "SAMPLE", {"cpu": 100_000, "cuda": 100_000})
    monkeypatch.setattr(ondemand, "gemm_rate", lambda device, dtype=None: 1e12)
    cfg = cfg_for(tmp_path / "r", "method=spectra_retrieval", "model.params_b=6.74")
    with pytest.raises(ConfigError) as err:
        plan(cfg)
    line = str(err.value)
    assert "\n" not in line and line.startswith("spectra_retrieval: building the ultrachat store (100,000 records of")
    assert line.endswith("`make datastore MODEL=tiny-llama SOURCE=ultrachat LIMIT=100000 && make datastore-refine "
                         "MODEL=tiny-llama STORE=ultrachat SAMPLE=100000` (or set build_budget=)")


def test_a_hub_store_named_offline_is_refused_before_the_model_loads(small_stdlib, tmp_path):
    with pytest.raises(ConfigError) as err:
        plan(cfg_for(tmp_path / "r", "method=rest", "method.datastore=ultrachat"))
    assert "the Hugging Face hub is unreachable: build it where the hub is reachable with `make datastore " \
           "MODEL=tiny-llama SOURCE=ultrachat LIMIT=100000`, or choose another store (method.datastore=stdlib)" \
           in str(err.value)


def test_make_datastore_takes_the_lock_runs_take(small_stdlib, monkeypatch):
    from contextlib import contextmanager

    from specbench.cli import datastore as cli

    locked = []

    @contextmanager
    def lock(path):
        locked.append(path.name)
        yield

    monkeypatch.setattr(cli, "store_lock", lock)
    monkeypatch.setattr(cli, "build_from_args", lambda args: None)
    monkeypatch.setattr(cli, "refine_from_args", lambda args: None)
    cli.main(["build", "--model", "tiny-llama", "--source", "stdlib"])
    cli.main(["refine", "--model", "tiny-llama", "--store", "stdlib"])
    assert locked == ["stdlib", "stdlib"]  # the refinement waits on the parent's lock, as a run's build holds it


def test_a_model_domain_outside_chat_and_code_is_refused():
    from specbench.errors import ModelLoadError
    from specbench.models.config import model_config_check

    with pytest.raises(ModelLoadError, match="domain must be one of chat, code"):
        model_config_check({"name": "m", "hub_id": "x/y", "domain": "math"})


def test_a_paper_model_without_weights_stops_in_one_line_before_any_store_talk(small_stdlib, capsys):
    from tests.run.test_runner import make_cfg

    with pytest.raises(Exception) as err:
        plan(make_cfg("model=llama2-7b", "method=spectra"))
    assert "llama2-7b" in str(err.value) and "\n" not in str(err.value)
    assert capsys.readouterr().err == ""  # no store choice, estimate or build said first
