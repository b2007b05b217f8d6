"""Every config composes; bad input fails early with one line naming the fix."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from methods.registry import method_names
from specbench.errors import ConfigError, UnknownNameError
from specbench.paths import CONF_DIR, conf_choices
from specbench.run.config import check_overrides, validate

ROOT = Path(__file__).resolve().parents[2]


def make_cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.mark.parametrize(
    "group,choice",
    [(g, c) for g in ("model", "method", "dataset", "hardware") for c in conf_choices(g)],
)
def test_every_group_choice_composes_and_validates(group, choice):
    cfg = make_cfg(f"{group}={choice}")
    if group == "method":  # a method may have several presets (lookahead, lookahead-readme)
        assert cfg.method.name in method_names()
    elif group != "hardware":
        assert cfg[group].name == ("auto" if choice == "hf" else choice)  # model=hf: named after its checkpoint
    if choice == "hf":  # one's own checkpoint: nothing to validate until model.path or model.hub_id is set
        with pytest.raises(ValueError, match="model=hf needs the checkpoint"):
            validate(cfg)
        return
    if cfg.hardware.device == "cuda" and not torch.cuda.is_available():
        with pytest.raises(ValueError, match="torch sees no CUDA device"):
            validate(cfg)
        return
    validate(cfg)  # settings, method dataclass, dataset name, model config


@pytest.mark.parametrize("experiment", conf_choices("experiment"))
def test_every_experiment_composes(experiment):
    cfg = make_cfg(f"experiment={experiment}", "hardware=cpu")  # GPU experiments validated on this CPU
    assert cfg.hardware.device == "cpu"
    validate(cfg)
    assert cfg.experiment_name != "default"  # an experiment files its results under its own name


def test_defaults():
    cfg = make_cfg()
    assert (
        cfg.model.name == "smollm2-135m"
        and cfg.dataset.name == "mtbench"
        and cfg.method.name == "spectra_core"
    )
    assert cfg.temperature == 0.0 and cfg.baseline is True
    OmegaConf.to_container(cfg, resolve=True)


@pytest.mark.parametrize(
    "override,expected",
    [
        ("model=llama2-7", "did you mean 'llama2-7b'"),
        ("method=autoregresive", "did you mean 'autoregressive'"),
        ("dataset=gsm8", "did you mean 'gsm8k'"),
        ("hardware=cuad", "did you mean 'cuda'"),
    ],
)
def test_bad_group_names_suggest(override, expected):
    with pytest.raises(ConfigError, match=expected):
        check_overrides([override])


def test_sweep_lists_and_plain_settings_are_not_group_names():
    check_overrides(["-m", "method=autoregressive,autoregressive", "limit=3", "model.dtype=bfloat16"])


def test_hydras_own_groups_and_settings_pass_and_a_misspelt_setting_does_not():
    line = ["-m", "hydra/launcher=slurm", "hydra.launcher.partition=gpu", "hydra.sweep.dir=/x"]
    assert check_overrides(line)[:4] == line
    with pytest.raises(UnknownNameError, match="did you mean 'limit'"):
        check_overrides(["limt=3"])


@pytest.mark.parametrize(
    "override,message",
    [
        ("max_new_tokens=0", "max_new_tokens must be a positive"),
        ("max_new_tokens=-5", "max_new_tokens must be a positive"),
        ("temperature=-0.5", "temperature must be a number >= 0"),
        ("top_p=1.5", "top_p must be in"),
        ("limit=0", "limit must be a positive"),
        ("limit=abc", "limit must be a positive number of samples (null: all; auto: 8 × batch_size, what a batch point needs), got 'abc'"),
        ("offset=-1", "offset must be a whole number >= 0"),
        ("offset=1.5", "offset must be a whole number >= 0, got 1.5"),
        ("seed=x", "seed must be a whole number, got 'x'"),
        ("temperature=hot", "temperature must be a number >= 0"),
        ("top_k=many", "top_k must be a whole number >= 0"),
        ("warmup=-2", "warmup must be a whole number"),
        ("max_new_tokens=lots", "max_new_tokens must be a positive"),
        ("hardware.num_threads=0", "num_threads must be a positive number of threads"),
        ("method.pool_size=abc", "method spectra_core: pool_size must be a whole number, got 'abc'"),
        ("method.coverage=maybe", "coverage must be true or false"),
        ("model.dtype=float64", "dtype 'float64' is not one of"),
        ("hardware.device=tpu", "hardware.device 'tpu' is not one of"),
    ],
)
def test_bad_values_are_rejected_before_any_work(override, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        validate(make_cfg(override))


def test_method_fields_on_the_command_line():
    """``method.<field>=`` is checked against the selected method; a field its YAML omits is passed as ``++``."""
    assert check_overrides(["method=spectra_core", "method.pool_size=4"]) == [
        "method=spectra_core",
        "method.pool_size=4",
    ]
    with pytest.raises(UnknownNameError, match="unknown setting of method spectra_core 'pool_sise'; did you mean"):
        check_overrides(["method.pool_sise=4"])  # the default method
    with pytest.raises(UnknownNameError, match="unknown setting of method pld 'foo'"):
        check_overrides(["method=pld", "method.foo=1"])
    with pytest.raises(UnknownNameError, match="method lookahead 'max_ngram'"):
        check_overrides(["-m", "method=pld,lookahead", "method.max_ngram=2"])  # every swept method must have it
    with pytest.raises(UnknownNameError, match="method autoregressive"):
        check_overrides(["experiment=smoke", "method=autoregressive", "method.k=2"])


def test_a_method_field_the_preset_omits_is_passed_on(tmp_path, monkeypatch):
    """A field of the method that its preset's YAML does not list: Hydra would refuse it, so it becomes ``++``."""
    import shutil

    import specbench.paths
    import specbench.run.config

    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    (conf / "method" / "pld-short.yaml").write_text("name: pld\nnum_draft: 4\n")
    monkeypatch.setattr(specbench.run.config, "CONF_DIR", conf)
    monkeypatch.setattr(specbench.paths, "CONF_DIR", conf)
    line = check_overrides(["method=pld-short", "method.match=latest", "method.num_draft=5"])
    assert line == ["method=pld-short", "++method.match=latest", "method.num_draft=5"]
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose("config", overrides=line)
    assert cfg.method.match == "latest" and cfg.method.num_draft == 5


def test_unknown_method_setting_suggests():
    with pytest.raises(
        UnknownNameError, match="unknown setting of method spectra_core 'pool_sise'; did you mean 'pool_size'"
    ):
        validate(make_cfg("+method.pool_sise=3"))


def run_cli(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            str(ROOT / "run.py"),
            f"results_dir={tmp_path}",
            f"hydra.run.dir={tmp_path}/hydra",
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )


@pytest.mark.parametrize(  # each a run.py process (~3 s); make test-slow runs them all
    "args,message",
    [
        (["model=tiny-lama"], "unknown model 'tiny-lama'; did you mean 'tiny-llama'"),
        (["method=nope"], "unknown method 'nope'"),
        (["experiment=smoke", "max_new_tokens=0"], "max_new_tokens must be a positive"),
        pytest.param(["experiment=smoke", "dataset=gsm8k", "dataset.path=/nonexistent/gsm8k.jsonl"], "gsm8k",
                     marks=pytest.mark.slow),
        pytest.param(["experiment=smoke", "limit=abc"], "limit must be a positive number of samples (null: all; auto: 8 × batch_size, what a batch point needs)",
                     marks=pytest.mark.slow),
        (["experiment=smoke", "method.foo=1"], "unknown setting of method spectra_core 'foo'"),
        pytest.param(["experiment=smoke", "method.pool_size=x"], "pool_size must be a whole number, got 'x'",
                     marks=pytest.mark.slow),
        pytest.param(["experiment=smoke", "max_new_token=5"],
                     "unknown setting 'max_new_token'; did you mean 'max_new_tokens'", marks=pytest.mark.slow),
        (["experiment=smoke", "dataset=gsm8k", "dataset.path={broken}"], "broken.jsonl line 2 is not valid JSON"),
    ],
)
def test_cli_errors_are_one_line(args, message, tmp_path):
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "1+1?", "answer": "#### 2"}\n{"question": "2+2?", "answer\n')
    proc = run_cli(*[a.format(broken=broken) for a in args], tmp_path=tmp_path)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_bad_path_is_refused_before_the_runner_or_pandas_is_imported(tmp_path):
    """The checks of a job's inputs run before the runner's imports (pandas, pyarrow, the results), which cost
    a bad command most of a second for nothing."""
    proc = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "run.py"), f"results_dir={tmp_path}",
                           f"hydra.run.dir={tmp_path}/hydra", "method=eagle-cpu", "method.head=/nonexistent"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 2 and "error: eagle: head '/nonexistent'" in proc.stderr, proc.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time")}
    assert "specbench.core.draft" in imported  # the log is read right: the methods' modules are there
    assert not imported & {"specbench.run.runner", "pandas", "pyarrow"}


def test_slurm_launcher_composes():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["hydra/launcher=slurm"], return_hydra_config=True)
    assert cfg.hydra.launcher._target_ == "hydra_plugins.specbench_slurm.SlurmLauncher"
    assert cfg.hydra.launcher.gpus_per_node == 1


@pytest.mark.parametrize(
    "ablation,field",
    [("no_fwd", "use_forward_dict"), ("no_bwd", "use_backward_dict"), ("no_sub", "sub_ngrams")],
)
def test_table2_ablations_switch_one_part_off(ablation, field):
    cfg = make_cfg("method=spectra_core", f"+ablation={ablation}")
    assert cfg.method[field] is False
    others = {"use_forward_dict", "use_backward_dict", "sub_ngrams"} - {field}
    assert all(cfg.method[f] is True for f in others)
    assert validate(cfg)["method"].__getattribute__(field) is False


def test_a_misspelt_setting_gets_did_you_mean_not_hydras_advice():
    with pytest.raises(UnknownNameError, match="unknown setting 'max_new_token'; did you mean 'max_new_tokens'"):
        check_overrides(["max_new_token=5"])
    with pytest.raises(UnknownNameError, match="unknown setting 'hardwre'; did you mean 'hardware'"):
        check_overrides(["hardwre.num_threads=1"])
    # known settings, group fields and explicit additions pass
    assert check_overrides(["max_new_tokens=5", "hardware.num_threads=1", "+extra=1", "repeats=2"]) == [
        "max_new_tokens=5", "hardware.num_threads=1", "+extra=1", "repeats=2"]


@pytest.mark.parametrize("group,bad,good", [
    ("variant", "core_no_fw", "core_no_fwd"), ("ablation", "no_bw", "no_bwd"), ("placement", "h100x3", "h100x2"),
    ("hardware", "a10", "a100"), ("experiment", "tabel1", "table1"),
])
def test_every_config_group_gets_did_you_mean(group, bad, good):
    with pytest.raises(ConfigError, match=f"unknown {group} '{bad}'; did you mean .*'{good}'"):
        check_overrides([f"+{group}={bad}"])


def test_every_config_group_is_checked():
    groups = {p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name != "hydra"}
    from specbench.run.config import GROUPS

    assert groups == set(GROUPS)


@pytest.mark.parametrize("preset", [p.stem for p in sorted((CONF_DIR / "method").glob("*-cpu.yaml"))])
def test_cpu_presets_are_their_paper_preset_plus_what_differs(preset):
    """Each -cpu preset names its paper preset in its defaults and lists only the keys that differ; Hydra's
    composition and the runner's own reading of presets agree."""
    from specbench.run.config import method_preset

    raw = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "method" / f"{preset}.yaml"))
    base = preset.removesuffix("-cpu")
    assert raw["defaults"] == [base, "_self_"]
    paper = method_preset(base)
    own = {k: v for k, v in raw.items() if k != "defaults"}
    assert own and all(paper.get(k) != v for k, v in own.items()), "a key equal to the paper preset's"
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"method={preset}"])
    composed = OmegaConf.to_container(cfg.method)
    assert composed == method_preset(preset) == {**paper, **own}


@pytest.mark.parametrize("variant,ablation", [("core", "core"), ("core_no_fwd", "no_fwd"),
                                              ("core_no_bwd", "no_bwd"), ("core_no_sub", "no_sub")])
def test_table2_variants_compose_their_ablation(variant, ablation):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"+variant={variant}"])
    settings = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "ablation" / f"{ablation}.yaml"))
    assert cfg.method.name == "spectra_core" and cfg.method.pool_size == 15
    assert all(cfg.method[k] == v for k, v in settings.items())


def test_a_gpu_bound_job_that_names_no_method_takes_the_paper_budget():
    from specbench.run.config import GPU_DEFAULT_METHOD, device_defaults

    assert device_defaults([], cuda=True) == [f"method={GPU_DEFAULT_METHOD}"]  # hardware=auto on a GPU
    assert device_defaults([], cuda=False) == []
    assert device_defaults(["hardware=a100"], cuda=False) == [f"method={GPU_DEFAULT_METHOD}"]  # a CUDA preset
    assert device_defaults(["hardware=cpu"], cuda=True) == []
    assert device_defaults(["method=pld"], cuda=True) == []
    assert device_defaults(["experiment=table1"], cuda=True) == []  # its methods are its own
    assert device_defaults(["experiment=smoke"], cuda=True) == [f"method={GPU_DEFAULT_METHOD}"]
    assert device_defaults(["experiment=table3"], cuda=True) == []  # it chooses a GPU itself
    cfg = make_cfg(*device_defaults(["hardware=h100"]))
    assert cfg.method.name == "spectra_core" and cfg.method.get("budget") in (None, "fixed")
