"""One-token steps compiled ahead of time (:mod:`specbench.core.aot`): what they take, what names a package, and
(once, with a real AOTInductor build of a two-layer model) greedy decoding through them equal to torch.compile's."""

import time

import pytest
import torch

from specbench.core.aot import AheadOfTime
from specbench.core.decode import Request, decode_batch, generate
from specbench.core.draft import Drafter
from specbench.core.engine import CompiledTarget, announce
from specbench.core.forward import Target
from tests.core.test_engine import PROMPT, build


def test_only_one_row_with_contiguous_inputs_is_taken():
    store = torch.zeros(2, 2, 3, 2, 40, 16)  # layers, k/v, slots, kv heads, capacity, dim
    one, rot, where, visible = torch.zeros(1, 64), torch.zeros(1, 16), torch.zeros(1, 1), torch.zeros(1, 1, 2, 9)
    alone = [store[0, :, :1].clone(), store[1, :, :1].clone()]  # a one-slot cache's rows
    assert AheadOfTime.takes("layers", (one, rot, rot, alone, where, visible))
    assert not AheadOfTime.takes("layers", (one, rot, rot, [store[0, :, 1:2], store[1, :, 1:2]], where, visible))
    assert not AheadOfTime.takes("layers", (torch.zeros(2, 64), rot, rot, alone, where, visible))  # two rows
    assert not AheadOfTime.takes("layers", (one, rot, rot, alone, where, visible[..., :1].expand(1, 1, 2, 9)))
    assert AheadOfTime.takes("head", (one,)) and not AheadOfTime.takes("head", (torch.zeros(4, 64),))


def test_a_package_is_named_by_what_it_is_built_from(monkeypatch):
    x, kv, visible = torch.zeros(1, 64), torch.zeros(2, 1, 2, 40, 16), torch.zeros(1, 1, 2, 30)
    tensors = [x, x, x, x, visible, kv, torch.zeros(64, 64)]
    name = AheadOfTime._digest(("layers", 1, ()), tensors, 4, 6)
    longer = [x, x, x, x, torch.zeros(1, 1, 2, 90), torch.zeros(2, 1, 2, 400, 16), torch.zeros(64, 64)]
    assert AheadOfTime._digest(("layers", 1, ()), longer, 4, 6) == name  # the span and the capacity are dynamic
    assert AheadOfTime._digest(("layers", 1, ()), tensors[:-1] + [torch.zeros(64, 32)], 4, 6) != name  # a weight
    assert AheadOfTime._digest(("layers", 1, (1e-5,)), tensors, 4, 6) != name  # a constant of the layers
    assert AheadOfTime._digest(("layers", 1, ()), [t.double() for t in tensors], 4, 6) != name  # a dtype
    monkeypatch.setattr(torch, "get_num_threads", lambda: 97)  # compiled code keeps its threads
    assert AheadOfTime._digest(("layers", 1, ()), tensors, 4, 6) != name


def batch(target, prompts) -> dict:
    """Greedy outputs of ``prompts`` decoded two at a time (a cache of two slots)."""
    queue = iter([Request(prompt_ids=p, max_new_tokens=n, drafter=Drafter(vocab_size=0), tag=i)
                  for i, (p, n) in enumerate(prompts)])
    return {req.tag: rec.output_ids for req, rec in decode_batch(target, lambda: next(queue, None), batch_size=2)}


@pytest.fixture(scope="module")
def model():
    return build("llama", layers=2)


def test_a_package_that_cannot_be_built_leaves_its_steps_to_torch_compile(model, tmp_path, monkeypatch, capsys):
    def fails(*args, **kwargs):
        raise RuntimeError("no C++ compiler here\nthe rest of a long message")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", fails)
    plain, ahead = CompiledTarget(model, backend="eager"), CompiledTarget(model, backend="eager", ahead=tmp_path)
    with torch.inference_mode():
        want = generate(plain, Drafter(vocab_size=0), PROMPT, max_new_tokens=12).output_ids
        assert generate(ahead, Drafter(vocab_size=0), PROMPT, max_new_tokens=12).output_ids == want
    lines = [line for line in capsys.readouterr().err.splitlines() if "package was not built" in line]
    assert len(lines) == 2 and all(line.endswith("no C++ compiler here)") for line in lines)  # once a package
    assert not list(tmp_path.iterdir())


def test_greedy_decoding_through_the_packages_is_the_static_shape_paths(model, tmp_path_factory):
    """A real build (AOTInductor, tens of seconds): one-token steps run through the packages; requests of other
    lengths (another span and cache capacity) decode as the static-shape path decodes them (torch.compile's eager
    backend here, so that only the packages are compiled), and so does a batch (whose rows are not taken); a second
    target finds the packages on disk and builds nothing."""
    folder = tmp_path_factory.mktemp("packages")
    plain, ahead = CompiledTarget(model, backend="eager"), CompiledTarget(model, backend="eager", ahead=folder)
    prompts = [(PROMPT, 24), (PROMPT[:5], 40), ([7] * 90, 12)]
    with torch.inference_mode():
        line = announce(ahead)
        assert "one-token steps ahead of time" in line and sorted(p.name.split("-")[0] for p in folder.iterdir()) == [
            "head", "layers"]
        assert {k for k in ahead.compiled if k[1]} == {("layers", True, 1, 1, 2), ("head", True, 1)}
        built = ahead.ahead.build_s
        for prompt, n in prompts:
            want = generate(plain, Drafter(vocab_size=0), prompt, max_new_tokens=n).output_ids
            assert generate(ahead, Drafter(vocab_size=0), prompt, max_new_tokens=n).output_ids == want
        assert ahead.ahead.build_s == built  # every request, every span and capacity: the same two packages
        assert batch(ahead, prompts) == batch(plain, prompts)
        again = CompiledTarget(model, backend="eager", ahead=folder)
        start = time.perf_counter()
        out = generate(again, Drafter(vocab_size=0), PROMPT, max_new_tokens=24).output_ids
        assert again.ahead.build_s < 10 and time.perf_counter() - start < 60 and len(list(folder.iterdir())) == 2
        eager = generate(Target(model), Drafter(vocab_size=0), PROMPT, max_new_tokens=24).output_ids
        assert out == eager
