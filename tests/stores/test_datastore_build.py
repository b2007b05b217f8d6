"""Building stores from the command line (sources, errors), the overlap guard, and perplexity refinement."""

import json
import os
import subprocess
import sys

import pytest
import torch

from specbench.cli.datastore import main
from specbench.errors import ConfigError
from specbench.stores.datastore import Datastore
from specbench.stores.naming import resolve_store
from specbench.stores.refine import kept_indices, pieces, refine_store, sequence_perplexities
from tests.conftest import model_cfg
from tests.run.test_config import ROOT
from tests.run.test_runner import cfg_for


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def corpus_dir(tmp_path):
    d = tmp_path / "code"
    (d / "pkg").mkdir(parents=True)
    (d / "a.py").write_text("def add(a, b):\n    return a + b\n")
    (d / "pkg" / "b.py").write_text("def sub(a, b):\n    return a - b\n")
    (d / "notes.txt").write_text("not python")
    return d


def _error_line(capsys, argv):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_build_from_a_directory(cache, corpus_dir, capsys):
    main(["build", "--model", "tiny-llama", "--source", f"dir:{corpus_dir}", "--name", "code", "--quiet"])
    store = Datastore.load(resolve_store("code", model_cfg("tiny-llama")))
    texts = ["def add(a, b):\n    return a + b\n", "def sub(a, b):\n    return a - b\n"]
    from specbench.models import build_tiny_tokenizer

    tok = build_tiny_tokenizer(128)
    assert [d.tolist() for d in store.documents()] == [tok.encode(t, add_special_tokens=False) for t in texts]
    meta = store.meta
    assert meta["source"]["kind"] == "dir" and meta["source"]["files"] == 2
    assert meta["bytes"] == sum(len(t.encode()) for t in texts)
    assert meta["tokenizer"]["name"] == "tiny-llama" and meta["tokenizer"]["vocab_size"] == 128
    # the end of a build says tokens, bytes and seconds
    main(["build", "--model", "tiny-llama", "--source", f"dir:{corpus_dir}", "--out", str(cache / "x")])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{meta['tokens']:,} tokens" in last and f"{meta['bytes']:,} bytes" in last and last.endswith(" s")


def test_build_from_a_jsonl_file(cache, tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [{"text": "abc"}, {"messages": [{"content": "hi"}, {"content": "yo"}]}]))
    main(["build", "--model", "tiny-llama", "--source", f"file:{f}", "--out", str(tmp_path / "s"), "--quiet"])
    s = Datastore.load(tmp_path / "s")
    assert s.meta["documents"] == 2 and s.meta["bytes"] == len("abc") + len("hi\nyo")


def test_stdlib_source_reads_the_interpreters_library():
    from specbench.stores.corpus import open_corpus

    corp = open_corpus("stdlib", limit=2)
    texts = list(corp.texts)
    assert corp.source["kind"] == "stdlib" and len(texts) == 2 and all(texts)


def test_source_errors_are_one_line(cache, capsys, monkeypatch):
    assert "is not a directory" in _error_line(capsys, ["build", "--model", "tiny-llama", "--source", "dir:/nope"])
    assert "unknown datastore source 'wiki'" in _error_line(capsys, ["build", "--model", "tiny-llama",
                                                                       "--source", "wiki"])
    assert "unknown model 'tiny-lama'" in _error_line(capsys, ["build", "--model", "tiny-lama"])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    line = _error_line(capsys, ["build", "--model", "tiny-llama", "--source", "ultrachat"])
    assert "needs the Hugging Face hub, which is unreachable" in line and "SOURCE=stdlib" in line


def test_gated_source_says_how_to_authenticate(monkeypatch):
    import huggingface_hub

    from specbench import hub
    from specbench.data import base
    from specbench.stores import corpus

    monkeypatch.setattr(base, "hub_cached", lambda *a, **k: False)
    monkeypatch.setattr(hub, "reachable", lambda *a, **k: True)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    with pytest.raises(ConfigError, match=r"bigcode/the-stack is gated: .*`hf auth login` \(or set HF_TOKEN\)"):
        corpus.open_corpus("the-stack-python")


@pytest.mark.slow
def test_missing_store_and_mismatch_through_run_py(cache, tmp_path, corpus_dir):
    env = {**os.environ, "SPECBENCH_CACHE": str(cache)}
    args = [sys.executable, "run.py", "experiment=smoke", "method=rest", f"results_dir={tmp_path}/r", "progress=false"]
    proc = subprocess.run(args + ["build_budget=0"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("error: rest: building the stdlib store (~"), proc.stderr
    assert lines[-1].endswith("over build_budget=0 s: build it first with `make datastore MODEL=tiny-llama "
                              "SOURCE=stdlib` (or set build_budget=)"), proc.stderr
    proc = subprocess.run(args + ["method.datastore=chat"], cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=300)  # a store of model answers is never built on demand
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: no datastore at {cache}/datastores/tiny-llama/chat: build one with "
        "`make datastore MODEL=tiny-llama SOURCE=chat`"), proc.stderr
    assert "Traceback" not in proc.stderr
    # a store built for another tokenizer (the tiny tokenizer over 128 ids; the model here has 130)
    main(["build", "--model", "tiny-llama", "--source", f"dir:{corpus_dir}", "--out", str(tmp_path / "g"), "--quiet"])
    proc = subprocess.run(args + [f"method.datastore={tmp_path}/g", "model.tiny.vocab_size=130"], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: datastore {tmp_path}/g was built for tokenizer tiny-llama (vocab 128), not for ")
    assert "(vocab 130): build one for this model with `specbench datastore build --model tiny-llama" in last
    assert not list(tmp_path.rglob("*.parquet"))


def test_generated_store_refuses_its_own_prompts(cache, tmp_path):
    from specbench.run.runner import run

    main(["build", "--model", "tiny-llama", "--source", "generate:prompts", "--limit", "2", "--max-new-tokens", "8",
          "--name", "gen", "--quiet"])
    path = resolve_store("gen", model_cfg("tiny-llama"))
    meta = Datastore.load(path).meta
    assert meta["prompts"]["dataset"] == "prompts" and len(meta["prompts"]["sample_ids"]) == 2
    assert meta["documents"] == 2 and (path.parent / "gen.work" / "generations.jsonl").exists()
    base = ["method=rest", "method.datastore=gen", "max_new_tokens=8", "warmup=0", "baseline=false"]
    with pytest.raises(ConfigError, match=r"holds model outputs for 1 of this run's prompts \(prompts/.*allow_overlap=true"):
        run(cfg_for(tmp_path, *base, "limit=1"))
    assert not list(tmp_path.rglob("*.parquet"))  # refused before anything ran
    env = {**os.environ, "SPECBENCH_CACHE": str(cache)}
    proc = subprocess.run([sys.executable, "run.py", "experiment=smoke", f"results_dir={tmp_path}", "progress=false",
                           *base, "limit=1"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: datastore ") and "set method.allow_overlap=true" in last
    run(cfg_for(tmp_path, *base, "limit=1", "offset=2"))  # disjoint prompts run
    run(cfg_for(tmp_path, *base, "limit=1", "method.allow_overlap=true"))
    assert len(list(tmp_path.rglob("*.parquet"))) == 2


def test_generation_resumes(cache, tmp_path):
    argv = ["build", "--model", "tiny-llama", "--source", "generate:prompts", "--limit", "3", "--max-new-tokens", "6",
            "--out", str(tmp_path / "g"), "--quiet"]
    main(argv)
    log = tmp_path / "g.work" / "generations.jsonl"
    rows = log.read_text().splitlines()
    assert len(rows) == 3
    first = Datastore.load(tmp_path / "g").tokens.tolist()
    log.write_text("\n".join(rows[:1]) + "\n" + rows[1][:10])  # a kill mid-line after one answer
    main(argv)
    assert len(log.read_text().splitlines()) == 4  # two answers regenerated (the cut line is ignored)
    assert Datastore.load(tmp_path / "g").tokens.tolist() == first


# ---------------------------------------------------------------- refinement


def test_refinement_keeps_the_lowest_perplexity_and_resumes(tiny_llama, tmp_path):
    from specbench.stores.datastore import tokenizer_identity, write_store

    tok = tiny_llama.tokenizer
    texts = ["aaaaaaaaaaaaaaaaaaaa", "the cat sat on the mat", "zq#x!v@k%p&w*j(y)u~r", "abababababababab",
             "hello hello hello", "{[<>]}|\\^`_;:,.?/'\""]
    docs = [tok.encode(t, add_special_tokens=False) for t in texts]
    parent = write_store(tmp_path / "p", docs, tokenizer=tokenizer_identity(tok, "tiny-llama"),
                         source={"kind": "hand"}, progress=False)
    seqs = pieces(parent, max_len=256)
    assert [s.tolist() for s in seqs] == docs
    expected = [sequence_perplexities(tiny_llama.model, [s])[0] for s in seqs]  # one at a time, unpadded
    batched = sequence_perplexities(tiny_llama.model, seqs)
    assert batched == pytest.approx(expected, rel=1e-4)  # padding does not change a score
    # by hand: PPL = exp(mean NLL of tokens 2..t)
    ids = torch.tensor([docs[1]])
    with torch.no_grad():
        logp = torch.log_softmax(tiny_llama.model(ids).logits[0, :-1].float(), -1)
    nll = -logp[torch.arange(len(docs[1]) - 1), ids[0, 1:]].mean()
    assert expected[1] == pytest.approx(float(torch.exp(nll)), rel=1e-4)

    calls = []

    def interrupt(done):
        calls.append(done)
        if len(calls) == 1:
            raise KeyboardInterrupt  # a kill after the first batch

    with pytest.raises(KeyboardInterrupt):
        refine_store(tmp_path / "p", tmp_path / "r", tiny_llama.model, tok, keep=0.5, batch_size=2,
                     model_name="tiny-llama", progress=False, on_batch=interrupt)
    scores_file = tmp_path / "r.work" / "scores.tsv"
    assert len(scores_file.read_text().splitlines()) == 1 + 2  # header + the first batch
    assert not (tmp_path / "r").exists()
    calls.clear()
    refined = refine_store(tmp_path / "p", tmp_path / "r", tiny_llama.model, tok, keep=0.5, batch_size=2,
                           model_name="tiny-llama", progress=False, on_batch=calls.append)
    assert calls == [4, 6]  # resumed: two batches left
    lowest = sorted(range(6), key=lambda i: expected[i])[:3]
    assert [d.tolist() for d in refined.documents()] == [docs[i] for i in sorted(lowest)]
    meta = refined.meta
    assert meta["parent"]["fingerprint"] == parent.meta["fingerprint"]
    assert meta["refinement"]["kept"] == 3 and meta["refinement"]["kept_fraction"] == 0.5
    assert meta["source"]["kind"] == "refined"
    # a count instead of a fraction
    again = refine_store(tmp_path / "p", tmp_path / "r2", tiny_llama.model, tok, keep=2, batch_size=4,
                         progress=False)
    assert [d.tolist() for d in again.documents()] == [docs[i] for i in sorted(lowest[:2])]
    # the control at a matched size: as many pieces, drawn at random, nothing scored (no model)
    control = refine_store(tmp_path / "p", tmp_path / "r3", None, tok, keep=0.5, progress=False, select="random")
    picked = [d.tolist() for d in control.documents()]
    assert len(picked) == 3 and all(p in docs for p in picked) and len({tuple(p) for p in picked}) == 3
    assert control.meta["source"]["kind"] == "random-subset" and control.meta["refinement"]["select"] == "random"
    assert not (tmp_path / "r3.work").exists()
    with pytest.raises(ConfigError, match="select must be one of"):
        refine_store(tmp_path / "p", tmp_path / "r4", None, tok, select="best")


def test_kept_indices():
    scores = {0: 5.0, 1: 1.0, 2: 3.0, 3: 1.0}
    assert kept_indices(scores, 0.5) == [1, 3]
    assert kept_indices(scores, 3) == [1, 2, 3]
    assert kept_indices(scores, 0.01) == [1]
    with pytest.raises(ConfigError):
        kept_indices(scores, 0)


def test_pieces_of_one_length_score_unmasked_as_they_do_alone(tiny_llama):
    from specbench.stores.refine import BATCH_TOKENS, default_batch_size

    gen = torch.Generator().manual_seed(0)
    same = [torch.randint(3, 128, (24,), generator=gen).numpy() for _ in range(3)]
    alone = [sequence_perplexities(tiny_llama.model, [s])[0] for s in same]
    assert sequence_perplexities(tiny_llama.model, same) == pytest.approx(alone, rel=1e-4)
    assert default_batch_size(tiny_llama.model, 256) == BATCH_TOKENS["cpu"] // 256
    assert default_batch_size(tiny_llama.model, 10**6) == 1
