"""rest and spectra_retrieval on SmolLM2 (fp32) with a small store of standard-library files:
greedy output equals autoregressive output; `python run.py method=rest` end to end."""

import subprocess
import sys

import pytest

from methods.rest import REST, RESTConfig
from methods.spectra_retrieval import SpectraRetrieval, SpectraRetrievalConfig
from specbench.core.draft import SOURCE_RETRIEVAL
from specbench.core.forward import Target
from specbench.stores.corpus import open_corpus, tokenized
from specbench.stores.datastore import tokenizer_identity, write_store
from tests.lossless import CODE_EDIT, MORE, assert_greedy_lossless, autoregressive_output, chat
from tests.run.test_config import ROOT


@pytest.fixture(scope="module")
def smol_store(smollm2, tmp_path_factory):
    """A few stdlib files plus SmolLM2's own answer to one prompt (so that long runs get accepted)."""
    tok = smollm2.tokenizer
    docs = list(tokenized(open_corpus("stdlib", limit=5).texts, tok))
    docs.append(autoregressive_output(Target(smollm2.model), chat(smollm2, MORE[2]), 64))
    path = tmp_path_factory.mktemp("smol") / "stdlib-small"
    write_store(path, docs, tokenizer=tokenizer_identity(tok, "smollm2-135m"), source={"kind": "stdlib"},
                progress=False)
    return path


@pytest.mark.slow  # a real model over a real store: make test-slow (the contract runs both on a tiny model)
@pytest.mark.parametrize("method", ["rest", "spectra_retrieval"])
def test_greedy_lossless_on_smollm2(smollm2, smol_store, method):
    make = {
        "rest": lambda: REST(RESTConfig(datastore=str(smol_store)), vocab_size=smollm2.vocab_size,
                             tokenizer=smollm2.tokenizer),
        "spectra_retrieval": lambda: SpectraRetrieval(
            SpectraRetrievalConfig(datastore=str(smol_store), refine=False), vocab_size=smollm2.vocab_size,
            tokenizer=smollm2.tokenizer),
    }[method]
    target = Target(smollm2.model)
    eos = smollm2.eos_token_ids
    edit, hint = assert_greedy_lossless(target, make, [chat(smollm2, CODE_EDIT), chat(smollm2, MORE[2])], 64,
                                        eos=eos)
    assert hint.steps < hint.new_tokens / 2  # the store holds this answer
    assert edit.drafted_by_source[SOURCE_RETRIEVAL] > 0


@pytest.mark.slow
def test_run_py_rest_on_humaneval(smol_store, tmp_path):
    args = [sys.executable, "run.py", "method=rest", f"method.datastore={smol_store}", "dataset=humaneval", "limit=1",
            "max_new_tokens=48", f"results_dir={tmp_path}", "progress=false"]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    import pandas as pd

    from specbench.results.rows import load_results

    df = load_results(tmp_path)
    assert set(df.method) == {"rest", "autoregressive"}
    rest, ar = (df[df.method == m].iloc[0] for m in ("rest", "autoregressive"))
    assert list(rest.output_ids) == list(ar.output_ids)
    assert "| rest" in proc.stdout and pd.notna(rest.steps)
