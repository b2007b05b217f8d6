"""Medusa's heads and its sparse tree, in the published format.

Head i (of K) reads the target's last hidden state (after its final norm) at the position whose next
token is the root, and predicts the token i + 1 places after the root: L residual blocks
(``x + SiLU(W x + b)``) and a projection to the vocabulary. Checkpoints as Medusa's authors publish them:
``config.json`` (``medusa_num_heads``, ``medusa_num_layers``) and ``medusa_lm_head.pt`` or
``medusa_lm_head.safetensors`` with keys ``"{i}.{l}.linear.weight"``, ``"{i}.{l}.linear.bias"`` and
``"{i}.{L}.weight"``; the head count is read from the weights (a published config says 2 where the
weights hold 5). A head trained here may share the target's LM head as its projection (``"tied": true``
in its config, no ``{i}.{L}.weight``): K projections then cost one LM-head call over K rows.

The tree is a list of paths of ranks: path ``(r1, …, rd)`` is the node whose token is head d's r_d-th
best, under the node ``(r1, …, r_{d-1})``. :func:`best_paths` builds one from measured accuracies (the
paper's construction: the N paths with the highest products of per-head, per-rank accuracies, which is
closed under parents); :data:`MC_SIM_7B_63` is the paper's tree for Vicuna-7B.
"""

from __future__ import annotations

import heapq
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from specbench.errors import ConfigError

WEIGHT_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")

# The sparse tree Medusa ships for Vicuna-7B (medusa_choices.py, ``mc_sim_7b_63``): 63 paths of ranks.
MC_SIM_7B_63 = [
    (0,), (0, 0), (1,), (0, 1), (2,), (0, 0, 0), (1, 0), (0, 2), (3,), (0, 3), (4,), (0, 4), (2, 0), (0, 5),
    (0, 0, 1), (5,), (0, 6), (6,), (0, 7), (0, 1, 0), (1, 1), (7,), (0, 8), (0, 0, 2), (3, 0), (0, 9), (8,),
    (9,), (1, 0, 0), (0, 2, 0), (1, 2), (0, 0, 3), (4, 0), (2, 1), (0, 0, 4), (0, 0, 5), (0, 0, 0, 0),
    (0, 1, 1), (0, 0, 6), (0, 3, 0), (5, 0), (1, 3), (0, 0, 7), (0, 0, 8), (0, 0, 9), (6, 0), (0, 4, 0),
    (1, 4), (7, 0), (0, 1, 2), (2, 0, 0), (3, 1), (2, 2), (8, 0), (0, 5, 0), (1, 5), (1, 0, 1), (0, 2, 1),
    (9, 0), (0, 6, 0), (0, 0, 0, 1), (1, 6), (0, 7, 0),
]


class ResBlock(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)  # Medusa starts each block as the identity

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """K heads; ``tied``: their projection is the target's LM head (passed to :meth:`logits`)."""

    def __init__(self, hidden: int, vocab: int, heads: int, layers: int = 1, tied: bool = False) -> None:
        super().__init__()
        self.hidden, self.vocab, self.n_layers, self.tied = hidden, vocab, layers, tied
        blocks = []
        for _ in range(heads):
            parts = [ResBlock(hidden) for _ in range(layers)]
            if not tied:
                parts.append(nn.Linear(hidden, vocab, bias=False))
            blocks.append(nn.Sequential(*parts))
        self.heads = nn.ModuleList(blocks)

    def __len__(self) -> int:
        return len(self.heads)

    def states(self, hidden: torch.Tensor, first: int | None = None) -> torch.Tensor:
        """[K, n, H]: each head's residual blocks over ``hidden`` [n, H] (the ``first`` K heads only)."""
        return torch.stack([h[: self.n_layers](hidden) for h in self.heads[:first]])

    def logits(self, hidden: torch.Tensor, lm_head: nn.Module | None = None, first: int | None = None) -> torch.Tensor:
        """[K, n, V]: every head's logits after ``hidden`` [n, H]; ``first``: only the first K heads (a step whose
        draft is capped at depth K computes no deeper head)."""
        states = self.states(hidden, first)
        if self.tied:
            return lm_head(states.reshape(-1, self.hidden)).reshape(states.shape[0], hidden.shape[0], -1)
        return torch.stack([h[self.n_layers](s) for h, s in zip(self.heads, states, strict=False)])


def save_medusa(heads: MedusaHeads, directory: Path, extra: dict | None = None) -> Path:
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    cfg = {"medusa_num_heads": len(heads), "medusa_num_layers": heads.n_layers, "hidden_size": heads.hidden,
           "vocab_size": heads.vocab, "tied": heads.tied, **(extra or {})}
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))
    state = {k.removeprefix("heads."): v.detach().contiguous().cpu() for k, v in heads.state_dict().items()}
    save_file(state, str(directory / WEIGHT_FILES[0]))
    return directory


def load_medusa(directory: Path, target_config) -> tuple[MedusaHeads, dict]:
    """Heads saved by :func:`save_medusa` or published by Medusa's authors, checked against the target;
    with their config (a trained head's measured accuracies among it)."""
    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise ConfigError(f"medusa: no config.json in {directory}")
    cfg = json.loads((directory / "config.json").read_text())
    state = None
    for name in WEIGHT_FILES:
        path = directory / name
        if path.is_file():
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                state = load_file(str(path))
            else:
                state = torch.load(path, map_location="cpu", weights_only=True)
            break
    if state is None:
        raise ConfigError(f"medusa: no {' or '.join(WEIGHT_FILES)} in {directory}")
    tc = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
    base, target = str(cfg.get("base_model_name_or_path") or ""), str(getattr(target_config, "_name_or_path", ""))
    if hub_id(base) and hub_id(target) and base.lower() != target.lower():
        raise ConfigError(f"medusa heads in {directory} were trained for {base}, not for the target {target}: "
                          "use the heads published for this target")
    n_heads = 1 + max(int(k.split(".")[0]) for k in state)
    layers = int(cfg.get("medusa_num_layers", 1))
    tied = bool(cfg.get("tied", False))
    hidden = state["0.0.linear.weight"].shape[1]
    if hidden != tc.hidden_size:
        raise ConfigError(f"medusa heads in {directory} are for another model (hidden {hidden}; the target has "
                          f"{tc.hidden_size}): use heads trained for this target")
    heads = MedusaHeads(hidden, tc.vocab_size, n_heads, layers, tied)
    if not tied and state[f"0.{layers}.weight"].shape[0] != tc.vocab_size:
        raise ConfigError(f"medusa heads in {directory} predict {state[f'0.{layers}.weight'].shape[0]} tokens; "
                          f"the target has {tc.vocab_size}: use heads trained for this target")
    missing, unexpected = heads.load_state_dict({f"heads.{k}": v for k, v in state.items()}, strict=False)
    if missing or unexpected:
        raise ConfigError(f"medusa heads in {directory}: weights do not match (missing {sorted(missing)[:3]}, "
                          f"unexpected {sorted(unexpected)[:3]})")
    return heads, cfg


def hub_id(name: str) -> bool:
    """A hub repository's name (owner/name), not a local path."""
    return name.count("/") == 1 and not name.startswith((".", "/", "~")) and not Path(name).exists()


def best_paths(accuracy: list[list[float]], nodes: int) -> list[tuple[int, ...]]:
    """The ``nodes`` paths with the highest products of ``accuracy[depth][rank]`` (head ``depth``'s rank-th
    token right), best first: Medusa's tree construction. Closed under parents (a prefix never scores lower)."""
    heap: list[tuple[float, tuple[int, ...]]] = [(-accuracy[0][0], (0,))]
    seen = {(0,)}
    out = []
    while heap and len(out) < nodes:
        neg, path = heapq.heappop(heap)
        out.append(path)
        d, r = len(path) - 1, path[-1]
        nexts = []
        if r + 1 < len(accuracy[d]):
            nexts.append((-neg / max(accuracy[d][r], 1e-12) * accuracy[d][r + 1], path[:-1] + (r + 1,)))
        if d + 1 < len(accuracy):
            nexts.append((-neg * accuracy[d + 1][0], path + (0,)))
        for score, p in nexts:
            if p not in seen:
                seen.add(p)
                heapq.heappush(heap, (-score, p))
    return out


def tree_draft(paths: list[tuple[int, ...]], top: list[list[int]]) -> tuple[list[int], list[int]]:
    """(tokens, parents) of the tree ``paths`` over ``top[depth - 1][rank]`` (each head's ranked tokens),
    parents first, siblings in rank order; paths deeper than ``len(top)`` are left out."""
    kept = sorted((p for p in paths if len(p) <= len(top) and all(r < len(top[d]) for d, r in enumerate(p))),
                  key=lambda p: (len(p), p))
    at = {p: i for i, p in enumerate(kept)}
    tokens, parents = [], []
    for p in kept:
        if len(p) > 1 and p[:-1] not in at:
            raise ValueError(f"medusa tree: path {p} has no parent {p[:-1]}")
        tokens.append(int(top[len(p) - 1][p[-1]]))
        parents.append(at[p[:-1]] if len(p) > 1 else -1)
    return tokens, parents
