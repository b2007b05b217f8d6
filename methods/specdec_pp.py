"""SpecDec++: draft-model speculative sampling with an adaptive draft length (Huang, Guo, Wang 2024).

Drafting is :mod:`methods.sps`'s (a chain from a draft model, verified with
``min(1, p/q)``), but its length is decided token by token: a trained
acceptance head (``specbench/drafting/acceptance_head.py``: a residual MLP with SiLU,
``depth`` blocks, over the draft's last hidden state of the newest token)
predicts ``p̂_i``, the chance that drafted token ``i`` is accepted, and drafting
stops as soon as ``1 - Π p̂_i > threshold`` (the paper's threshold rule, h =
0.7), or at ``max_k`` = 20 tokens. The token whose prediction crossed the
threshold is still proposed: it costs nothing more to verify.

The head is trained per target × draft pair
(``specbench train-acceptance-head model=<target> method=specdec_pp ...`` or
``make train-acceptance-head``) and read from
``$SPECBENCH_CACHE/acceptance_heads/<target>__<draft>.pt`` (or ``head_path``);
greedy runs read the head trained on greedy labels (``--temperature 0``,
``...__greedy.pt``): at T = 0 a token is accepted only when it is the target's
argmax, far less often than ``min(1, p/q)`` says. A run without its head stops
before loading any model, naming the command that trains it.

The stopping rule only changes how many tokens are proposed, so greedy output
stays the autoregressive output and sampling keeps the target's distribution.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from methods.registry import register_method
from specbench.drafting.acceptance_head import head_file, load_head, train_command
from specbench.drafting.draft_model import DraftModelSettings, ModelDrafter
from specbench.errors import ConfigError


@dataclass
class SpecDecPPConfig(DraftModelSettings):
    threshold: float = 0.7  # h: stop when the predicted chance of a rejection exceeds it
    max_k: int = 20  # hard cap on drafted tokens per step
    head_path: str | None = None  # default: the cache's head for this target × draft

    def validate(self) -> None:
        super().validate()
        if not 0 < self.threshold < 1:
            raise ValueError(f"specdec_pp: threshold must be in (0, 1), got {self.threshold}")
        if self.max_k < 1:
            raise ValueError(f"specdec_pp: max_k must be >= 1, got {self.max_k}")

    def head(self, target_name: str, greedy: bool) -> Path:
        if self.head_path:
            return Path(self.head_path).expanduser()
        return head_file(target_name, self.identity(), greedy)


@register_method
class SpecDecPP(ModelDrafter):
    name = "specdec_pp"

    @classmethod
    def host_reads(cls, config: SpecDecPPConfig, drafted: int) -> int:
        return 2 * drafted  # each drafted position: its tokens, and the acceptance head's verdicts on them
    Config = SpecDecPPConfig
    needs_last_hidden = True

    def __init__(self, config: SpecDecPPConfig | None = None, **kwargs) -> None:
        super().__init__(config, **kwargs)
        target = self.context.target_name
        greedy = self.params.greedy
        path = self.config.head(target, greedy)
        if not path.is_file():
            raise ConfigError(missing_head(path, target, self.config, greedy))
        hidden = self.lm.base.config.hidden_size
        self.head = load_head(path, target, self.config.identity(), hidden, greedy).to(self.lm.hidden_device)
        self.kept = 1.0

    @classmethod
    def preflight(cls, config: SpecDecPPConfig, run_cfg) -> None:
        config.preflight()
        target, greedy = run_cfg.model.name, float(run_cfg.get("temperature", 0.0)) == 0
        path = config.head(target, greedy)
        if not path.is_file():
            raise ConfigError(missing_head(path, target, config, greedy))

    def max_length(self) -> int:
        return self.config.max_k

    def begin_chain(self) -> None:
        self.kept = 1.0  # predicted chance that every token drafted so far is accepted

    def keep_drafting(self, hidden) -> bool:
        return self.keep_drafting_rows([self], hidden[None])[0]

    def keep_drafting_rows(self, drafters: list[SpecDecPP], hidden) -> list[bool]:
        """The head's verdicts on every row's newest token in one pass and one read."""
        for d, p in zip(drafters, self.head(hidden).sigmoid().tolist(), strict=True):
            d.kept *= p
        return [1.0 - d.kept <= d.config.threshold for d in drafters]


def missing_head(path: Path, target: str, config: SpecDecPPConfig, greedy: bool) -> str:
    labels = "greedy" if greedy else "sampling"
    return (
        f"specdec_pp: no acceptance head ({labels} labels) for target '{target}' with draft '{config.identity()}' "
        f"({path}): train one with `{train_command(target, config, greedy)}` (or set method.head_path)"
    )
