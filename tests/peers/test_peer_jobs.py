"""Peer-engine rows in a job (``engines=``), through the runner, with a stand-in server that answers as
llama-server does: rows beside ours, paired with the engine's own autoregressive run, servers stopped after."""

from __future__ import annotations

import pytest
from omegaconf import open_dict

from specbench.errors import ConfigError
from specbench.peers import llamacpp
from specbench.results.metrics import summarize
from specbench.results.rows import load_results
from specbench.run.job import hash_config
from specbench.run.runner import run
from specbench.tables.site import build_tables
from tests.peers.test_peer_parts import alive, fake, seen  # noqa: F401  (fake: a fixture)
from tests.run.test_runner import cfg_for


@pytest.fixture
def served(fake, monkeypatch, tmp_path):  # noqa: F811
    monkeypatch.setenv("SPECBENCH_LLAMA_SERVER", str(fake))
    monkeypatch.setattr(llamacpp, "gguf_for", lambda *a: tmp_path / "weights.gguf")
    return fake


def test_engine_rows_sit_beside_ours_and_pair_with_the_engines_own_autoregressive_run(served, tmp_path):
    run(cfg_for(tmp_path / "r", "method=pld", "engines=[llama.cpp:ngram-simple]", "limit=2", "max_new_tokens=8"))
    df = load_results(tmp_path / "r")
    assert set(df.method) == {"pld", "autoregressive", "llama.cpp:ar", "llama.cpp:ngram-simple"}
    engine = df[df.method.str.startswith("llama.cpp")]
    assert set(engine.engine) == {"llama.cpp"} and df[~df.method.str.startswith("llama.cpp")].engine.isna().all()
    assert (engine.new_tokens == 8).all() and (engine.steps == 8 - 4).all()  # 4 guesses accepted a generation
    assert list(engine.wall_s) == pytest.approx([0.1] * len(engine))  # the server's own prefill + decode seconds
    assert "--spec-type" in engine[engine.method == "llama.cpp:ngram-simple"].engine_command.iloc[0]
    s = summarize(df, same_job=True).set_index("method")
    ngram = s.loc["llama.cpp:ngram-simple"]
    assert ngram.speedup == pytest.approx(1.0) and ngram.greedy_match == 1.0  # over llama.cpp:ar, not ours
    assert ngram.acceptance_rate == pytest.approx(4 / 6) and ngram.tau == pytest.approx(2.0)
    assert s.loc["llama.cpp:ar", "speedup"] == 1.0 and s.loc["pld", "n_paired"] == len(df[df.method == "pld"])
    assert not alive(seen(served)["pid"])  # the job stopped its servers
    view = next(v for v in build_tables(tmp_path / "r") if v["name"] == "summary")  # the site marks them
    marked = {r["keys"]["preset"] for r in view["rows"] if r["keys"].get("engine") == "llama.cpp"}
    assert "engine" in view["row_keys"] and marked == {"llama.cpp:ar", "llama.cpp:ngram-simple"}


def test_each_repeat_starts_the_engines_afresh(served, tmp_path):
    """ngram-mod and ngram-cache keep what a server saw: each repeat starts a new server, as it starts our
    drafters empty (and the warm-up's server is not the measured one)."""
    run(cfg_for(tmp_path / "r", "method=pld", "engines=[llama.cpp:ngram-mod]", "limit=1", "max_new_tokens=4",
                "repeats=2", "warmup=1"))
    starts = (served.parent / "starts.txt").read_text().splitlines()
    assert sum("ngram-mod" in line for line in starts) == 3  # the warm-up's, then one per repeat


def test_a_draft_model_row_serves_the_drafts_gguf_beside_the_targets(served, tmp_path, monkeypatch):
    written = []
    monkeypatch.setattr(llamacpp, "gguf_for", lambda model, tok, name, dtype: written.append(name) or
                        tmp_path / f"{name}.gguf")
    run(cfg_for(tmp_path / "r", "method=pld", "engines=[llama.cpp:draft-simple]", "engine_draft=tiny-gemma3",
                "limit=1", "max_new_tokens=6"))
    args = seen(served)["args"]
    assert args[args.index("--spec-type") + 1] == "draft-simple"
    assert args[args.index("-md") + 1] == str(tmp_path / "tiny-gemma3.gguf") and "tiny-gemma3" in written
    rows = load_results(tmp_path / "r")
    assert set(rows[rows.method == "llama.cpp:draft-simple"].engine_draft) == {"tiny-gemma3"}


@pytest.mark.parametrize(("overrides", "message"), [
    (["engines=[llama.cpp:draft-simple]"], "engine_draft=<model>"),
    (["engines=[llama.cpp:draft-simple]", "engine_draft=tiny-lama"], "did you mean"),
    (["engines=[llama.cpp:bogus]"], "not a peer engine row"),
    (["engines=[vllm:ar]"], "not a peer engine row"),
    (["engines=[llama.cpp:ngram-mod]", "temperature=1"], "greedily"),
])
def test_engine_settings_are_checked_before_loading(served, tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        run(cfg_for(tmp_path, "method=pld", *overrides))


def test_without_a_build_a_job_with_engines_names_make_peers(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "empty"))
    monkeypatch.delenv("SPECBENCH_LLAMA_SERVER", raising=False)
    with pytest.raises(ConfigError, match="make peers"):
        run(cfg_for(tmp_path, "method=pld", "engines=[llama.cpp:ngram-simple]"))


def test_no_engines_hash_as_runs_made_before_engines_existed(tmp_path):
    cfg = cfg_for(tmp_path, "method=pld")
    before = cfg.copy()
    with open_dict(before):
        del before["engines"]
    assert hash_config(cfg) == hash_config(before)
    assert hash_config(cfg_for(tmp_path, "method=pld", "engines=[llama.cpp:ngram-mod]")) != hash_config(cfg)
