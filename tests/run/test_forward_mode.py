"""``forward=eager|compiled`` in a run: checked before any model loads, carried by every row, its label, the run's
hash and the cost curve's key, so that no table mixes the two modes."""

import pytest

import specbench.run.runner as runner
from specbench.budget.costs import CostModel
from specbench.core.engine import make_target
from specbench.errors import ConfigError, UnknownNameError
from specbench.machine.costs import cost_key, same_mode
from specbench.results.rows import load_results
from specbench.run.job import hash_config, plan
from specbench.run.runner import run
from tests.run.test_config import make_cfg


def cfg_for(tmp_path, *extra):
    return make_cfg("experiment=smoke", f"results_dir={tmp_path}", "progress=false", *extra)


def test_a_compiled_run_files_its_rows_apart_from_an_eager_one(tmp_path, monkeypatch, capsys):
    # the static-shape path with torch.compile's eager backend: what the run does, without Inductor's minutes
    monkeypatch.setattr(runner, "make_target", lambda model, mode, **_: make_target(model, mode, backend="eager"))
    run(cfg_for(tmp_path, "method=pld", "forward=compiled"))
    assert "forward=compiled:" in capsys.readouterr().err
    run(cfg_for(tmp_path, "method=pld"))
    assert "forward=eager:" in capsys.readouterr().err
    df = load_results(tmp_path)
    compiled, eager = df[df.forward == "compiled"], df[df.forward == "eager"]
    assert len(compiled) == len(eager) > 0
    assert set(compiled.preset) == {"pld@compiled", "autoregressive@compiled"}
    assert set(eager.preset) == {"pld", "autoregressive"}
    assert set(compiled.config_hash).isdisjoint(eager.config_hash)
    # greedy and lossless in both modes: every output equals its own baseline's, and the modes agree
    for _, rows in df.groupby("forward"):
        outputs = rows.pivot_table(index=["sample_id", "turn"], columns="method", values="output_sha1", aggfunc="first")
        assert (outputs["pld"] == outputs["autoregressive"]).all()


def test_eager_hashes_as_before_the_setting_existed():
    assert hash_config(make_cfg("experiment=smoke", "forward=eager")) == hash_config(make_cfg("experiment=smoke"))
    assert hash_config(make_cfg("experiment=smoke", "forward=compiled")) != hash_config(make_cfg("experiment=smoke"))


@pytest.mark.parametrize(("overrides", "error", "says"), [
    (["forward=compild"], UnknownNameError, "did you mean 'compiled'"),
    (["forward=compiled", "model=tiny-gemma3"], ConfigError, "use forward=eager"),
    (["forward=compiled", "hardware.device=cuda", "hardware.device_map=auto"], ConfigError, "runs a model on one device"),
])
def test_a_mode_that_cannot_run_is_refused_before_the_model_loads(overrides, error, says, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(runner, "load_model", never)
    with pytest.raises(error, match=says):
        plan(make_cfg("experiment=smoke", *overrides))


def test_each_mode_has_its_own_cost_curve_and_refuses_the_other():
    keys = {mode: cost_key("m", "float32", "sdpa", "cpu", forward=mode) for mode in ("eager", "compiled")}
    assert keys["eager"] == cost_key("m", "float32", "sdpa", "cpu")  # eager keeps the curves measured before
    assert keys["compiled"] != keys["eager"]
    curve = CostModel(qs=[1, 2, 4, 8], contexts=[0], seconds=[[1.0, 1.5, 2.0, 3.0]], forward="compiled")
    assert CostModel.from_dict(curve.to_dict()).forward == "compiled"
    same_mode(curve, "compiled")
    with pytest.raises(ConfigError, match="timed with forward=compiled, and this run is forward=eager"):
        same_mode(curve, "eager")
    # a compiled curve prices a block at the width that runs: 3 tokens run as 4, 5 as 8
    assert curve(3) == curve(4) == 2.0 and curve(5) == 3.0
    assert CostModel(qs=[1, 2, 4, 8], contexts=[0], seconds=[[1.0, 1.5, 2.0, 3.0]])(3) == 1.75
