"""Training an EAGLE head on the target's teacher-forced features (EAGLE's recipe, scaled to one machine).

Data: conversations the target's chat template wraps, from text every Python installation carries and no
evaluation set contains (:func:`offline_conversations`): the language reference's topics
(``pydoc_data.topics``: "explain the topic X" → its text) and the standard library's docstrings of
modules, classes and functions ("what does X do?" → its docstring), parsed from the source, never imported. The target runs each once; its features (the hidden states
the head reads) are kept, so epochs cost the head alone.

Loss (EAGLE-1/2): at every position t of the answer (the reference's loss mask: the prompt and the chat
template's header before the answer are left out) the head reads ``(f_t + noise, embedding of x_{t+1})`` and
predicts ``f_{t+1}``: SmoothL1 to the true feature plus 0.1 × the cross-entropy of its LM-head distribution
against the target's (soft labels), the reference's weights, each a mean over the answer's positions; the
noise is uniform, ±0.1 × 512 / length, as the reference adds it. EAGLE-3 (no feature loss, no noise): the
cross-entropy alone, over the head's draft vocabulary, with the training-time test: the head's own outputs
fed back for ``steps`` draft steps (seven, the reference's), step s weighted 0.8 ** s (:func:`head_loss`);
as the reference, a position counts only in the answer and when the target's token is in the draft
vocabulary, and the sum is divided by the sequence's length at every step (the reference's mean over all
of its positions).

Held-out: the loss and the head's top-1 agreement with the target's next token at the held-out
conversations' answer positions, teacher-forced (the acceptance rate of a depth-1 guess, α), and with the
training-time test, per step.

A data item is ``(ids, features)`` or ``(ids, features, answer_start)``: the index of the answer's first
token (:func:`answer_starts`; 0, every position, when absent).
"""

from __future__ import annotations

import copy
import random
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from specbench.drafting.eagle_head import EagleHead
from specbench.drafting.head_parts import HeadCache

W_CLS = 0.1  # the classification loss's weight (the reference's p_w)
NOISE = 0.1  # uniform noise half-width on input features, at 512 tokens (the reference's std 0.2 → ±0.1)


def offline_conversations(limit: int | None = None, seed: int = 0) -> list[tuple[str, str]]:
    """(question, answer) pairs from the Python reference's topics and the standard library's docstrings
    (modules, classes and functions), read from the source files without importing them."""
    pairs: list[tuple[str, str]] = []
    try:
        from pydoc_data.topics import topics
    except ImportError:  # a trimmed Python: the docstrings alone
        topics = {}
    for key in sorted(topics):
        text = topics[key].strip()
        if len(text) > 200:
            pairs.append((f"Explain the Python language topic '{key}'.", text))
    pairs.extend(_docstrings())
    random.Random(seed).shuffle(pairs)
    return pairs[:limit] if limit else pairs


def _docstrings(min_chars: int = 300) -> Iterator[tuple[str, str]]:
    """Docstrings of the stdlib's pure-Python modules and of their public classes and functions."""
    import ast
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        rel = path.relative_to(root)
        if any(part.startswith(("_", "test", "idlelib", "tkinter", "turtledemo", "site-packages")) for part in rel.parts):
            continue
        module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        doc = ast.get_docstring(tree)
        if doc and len(doc) >= min_chars:
            yield f"What does the Python module `{module}` do?", doc
        for node in tree.body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef) and not node.name.startswith("_"):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= min_chars:
                    kind = "class" if isinstance(node, ast.ClassDef) else "function"
                    yield f"Explain the {kind} `{module}.{node.name}` of Python's standard library.", doc


def encode(tokenizer, pairs: list[tuple[str, str]], max_len: int) -> list[list[int]]:
    """Each pair through the chat template (or as plain text without one), cut to ``max_len`` tokens."""
    out = []
    for question, answer in pairs:
        if getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": question}, {"role": "assistant", "content": answer}], tokenize=True)
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        else:
            ids = tokenizer(question + "\n" + answer)["input_ids"]
        out.append([int(t) for t in ids[:max_len]])
    return out


def answer_starts(tokenizer, pairs: list[tuple[str, str]], sequences: list[list[int]]) -> list[int]:
    """Where each encoded pair's answer starts: the length of its question through the chat template with the
    assistant's header (or of the question and its newline as plain text), within the sequence."""
    out = []
    for (question, _), ids in zip(pairs, sequences, strict=True):
        if getattr(tokenizer, "chat_template", None):
            head = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=True,
                                                 add_generation_prompt=True)
            head = head["input_ids"] if isinstance(head, dict) or hasattr(head, "keys") else head
        else:
            head = tokenizer(question + "\n")["input_ids"]
        out.append(min(len(head), len(ids)))
    return out


def item(entry) -> tuple[torch.Tensor, dict[int, torch.Tensor], int]:
    """A data item as (ids, features, answer start)."""
    ids, feats, *rest = entry
    return ids, feats, int(rest[0]) if rest else 0


@torch.no_grad()  # not inference mode: training reads these tensors under autograd
def features_of(model, sequences: list[list[int]], layers: tuple[int, ...], progress: bool = True
                ) -> list[tuple[torch.Tensor, dict[int, torch.Tensor]]]:
    """(ids, {layer: [n, H]}) per sequence, the target teacher-forced once; kept on the CPU."""
    device = model.get_input_embeddings().weight.device
    out = []
    for ids in tqdm(sequences, desc="target features", unit="seq", disable=not progress, file=sys.stderr):
        res = model(input_ids=torch.tensor([ids], device=device), output_hidden_states=True, use_cache=False)
        out.append((torch.tensor(ids), {i: res.hidden_states[i][0].float().cpu() for i in layers}))
    return out


TTT_STEPS = 7  # EAGLE-3's training-time test: draft steps unrolled per position (the reference's length)
TTT_DECAY = 0.8  # step i's loss weight is 0.8 ** i (the reference's)


def head_loss(head: EagleHead, lm_weight: torch.Tensor, embed: torch.nn.Module, ids: torch.Tensor,
              feats: dict[int, torch.Tensor], noise: float = 0.0, generator: torch.Generator | None = None,
              steps: int = 1, start: int = 0) -> tuple[torch.Tensor, list[float], list[int]]:
    """The loss of one sequence whose answer starts at token ``start``, and per draft step its correct guesses
    and how many were judged (at the answer's positions).

    EAGLE-1/2 (one step): the head reads true features. EAGLE-3 with ``steps`` > 1 unrolls the training-time
    test: step s reads, at every position t, the head's own step-(s-1) output (its predicted feature at
    t + s) with the embedding of token t + s + 1, at position t + s, and sees the true features' entries up to
    t and its own chain's entries of steps 1 … s at t, as a depth-(s+1) node of the draft tree does; its
    loss, against the target's distribution at t + s + 1, weighs 0.8 ** s."""
    n = ids.shape[0]
    m = n - 1
    x = head.fuse(feats)[:-1]
    if noise:
        x = x + (torch.rand(x.shape, generator=generator) - 0.5) * (2 * noise * 512 / n)
    with torch.no_grad():
        target_all = F.linear(feats[-1], lm_weight)  # row t: the target's distribution of token t + 1
        truth_all = target_all.argmax(-1)
    steps = max(1, min(steps, m)) if head.c.kind == "eagle3" else 1
    total, right, judged = x.new_zeros(()), [], []
    for s, pred in enumerate(unroll(head, x, lambda a, b: embed(ids[a:b]).float().detach(), steps)):
        rows = pred.shape[0]
        target_logits, truth = target_all[s + 1 : s + 1 + rows], truth_all[s + 1 : s + 1 + rows]
        answer = torch.arange(rows) + s >= start  # row t of step s reads position t + s: its token in the answer
        if head.c.kind == "eagle":
            logits = F.linear(pred, lm_weight)
            if answer.any():
                cls = -(target_logits[answer].softmax(-1) * logits[answer].log_softmax(-1)).sum(-1).mean()
                loss = F.smooth_l1_loss(pred[answer], feats[-1][1:][answer]) + W_CLS * cls
            else:
                loss = pred.sum() * 0
            guess = logits.argmax(-1)
        else:  # over the draft vocabulary; positions whose target token it lacks count 0, as the reference's
            logits = head.logits(pred, None)
            used = head.to_target_ids(torch.arange(logits.shape[1]))
            counted = torch.isin(truth, used) & answer
            ce = -(target_logits[:, used].softmax(-1) * logits.log_softmax(-1)).sum(-1)
            loss = (ce * counted).sum() / n
            guess = head.to_target_ids(logits.argmax(-1))
        total = total + TTT_DECAY ** s * loss
        right.append(float((guess == truth)[answer].sum()))
        judged.append(int(answer.sum()))
    return total, right, judged


def unroll(head: EagleHead, x: torch.Tensor, embeds, steps: int) -> Iterator[torch.Tensor]:
    """The head's predicted features per draft step: step 0 over ``x`` [m, H] (features at 0 … m - 1) with the
    embeddings ``embeds(1, m + 1)`` of the tokens that follow, causally; step s over step s-1's outputs at
    t = 0 … m - s - 1 with ``embeds(s + 1, m + 1)``, at positions t + s, each seeing the first entries up to t
    and its own chain's entries of steps 1 … s at t (a depth-(s+1) draft node's view)."""
    m = x.shape[0]
    cache = HeadCache() if steps > 1 else None
    for s in range(steps):
        rows = m - s
        visible = None
        if s > 0:
            visible = torch.zeros(rows, len(cache) + rows, dtype=torch.bool, device=x.device)
            visible[:, :m] = torch.ones(rows, m, dtype=torch.bool, device=x.device).tril()
            base, r = m, torch.arange(rows, device=x.device)
            for i in range(1, s + 1):  # the chain's own entries at t: steps 1 … s
                visible[r, base + r] = True
                base += m - i
        x = head(x[:rows] if s == 0 else head.feed(x[:rows]), embeds(s + 1, s + 1 + rows),
                 torch.arange(s, s + rows, device=x.device), cache, visible)
        yield x


def draft_vocabulary(sequences: list[list[int]], size: int) -> torch.Tensor:
    """EAGLE-3's ``d2t`` for the ``size`` most frequent tokens of ``sequences`` (ascending target ids): the
    reference counts the answers' tokens of the training split, what the caller passes."""
    counts = torch.bincount(torch.tensor([t for s in sequences for t in s]))
    used = torch.sort(counts.topk(min(size, counts.numel())).indices).values
    return used - torch.arange(used.numel())


def answers_vocabulary(train_set, size: int) -> torch.Tensor:
    """EAGLE-3's ``d2t`` as the reference builds it: from the answers' tokens of the training conversations
    (data items, :func:`item`), the prompts and the held-out ones left out."""
    return draft_vocabulary([item(entry)[0][item(entry)[2]:].tolist() for entry in train_set], size)


def evaluate(head, lm_weight, embed, data, steps: int = 1) -> tuple[float, list[float]]:
    """Held-out (loss, α per draft step): the mean loss over sequences, and per step the share of guesses equal
    to the target's token (step 1: a depth-1 guess's acceptance rate; step s, with the training-time test:
    a depth-s guess's given that its ancestors were right)."""
    head.eval()
    total, right, judged = 0.0, [0.0] * steps, [0] * steps
    with torch.no_grad():
        for entry in data:
            ids, feats, start = item(entry)
            loss, r, j = head_loss(head, lm_weight, embed, ids, feats, steps=steps, start=start)
            total += float(loss)
            for s in range(len(r)):
                right[s], judged[s] = right[s] + r[s], judged[s] + j[s]
    head.train()
    return total / max(len(data), 1), [r / j for r, j in zip(right, judged, strict=True) if j]


def fit(module: torch.nn.Module, n_train: int, step_loss, evaluate_now, *, epochs: int, lr: float, seed: int,
        state: dict | None, on_epoch, desc: str, progress: bool) -> dict:
    """The loop every head trainer shares: AdamW (betas 0.9/0.95, gradients clipped at 0.5, the references'),
    ``step_loss(i, rng)`` on each training item in a shuffled order per epoch, ``evaluate_now()`` (a dict with
    ``heldout_loss``) before training and after every epoch; ``state`` resumes an interrupted run and
    ``on_epoch`` receives it after every epoch. The module ends with its best held-out epoch's weights."""
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95))
    if state is None:
        state = {"epoch": 0, "history": [{"epoch": 0, **evaluate_now()}], "best": copy.deepcopy(module.state_dict())}
    else:
        module.load_state_dict(state["head"])
        opt.load_state_dict(state["optimizer"])
    module.train()
    order = list(range(n_train))
    bar = tqdm(range(state["epoch"], epochs), desc=desc, unit="epoch", disable=not progress, file=sys.stderr)
    for epoch in bar:
        rng = random.Random(seed + epoch)
        rng.shuffle(order)
        for i in tqdm(order, desc=f"epoch {epoch + 1}", unit="seq", leave=False, disable=not progress, file=sys.stderr):
            loss = step_loss(i, rng)
            if loss is None:
                continue
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_value_(params, 0.5)
            opt.step()
        module.eval()
        row = {"epoch": epoch + 1, **evaluate_now()}
        module.train()
        state["history"].append(row)
        if row["heldout_loss"] <= min(h["heldout_loss"] for h in state["history"]):
            state["best"] = copy.deepcopy(module.state_dict())
        state.update(epoch=epoch + 1, head=module.state_dict(), optimizer=opt.state_dict())
        bar.set_postfix(heldout=f"{row['heldout_loss']:.4f}")
        if on_epoch:
            on_epoch(state)
    module.load_state_dict(state["best"])
    module.eval()
    return state


def train(head: EagleHead, lm_weight: torch.Tensor, embed, train_set, heldout_set, *, epochs: int, lr: float,
          seed: int = 0, state: dict | None = None, on_epoch=None, progress: bool = True, steps: int = 1) -> dict:
    """Fit ``head`` with EAGLE's loss (:func:`fit`; EAGLE-3 with ``steps`` of training-time test); the state's
    history holds the held-out loss and α (depth 1, and per step) per epoch."""
    gen = torch.Generator().manual_seed(seed)
    noise = NOISE if head.c.kind == "eagle" else 0.0  # EAGLE-3's reference adds none

    def step_loss(i, _rng):
        ids, feats, start = item(train_set[i])
        return head_loss(head, lm_weight, embed, ids, feats, noise, gen, steps=steps, start=start)[0]

    def evaluate_now():
        loss, alphas = evaluate(head, lm_weight, embed, heldout_set, steps=steps)
        return {"heldout_loss": loss, "alpha": alphas[0], "alpha_by_step": alphas}

    return fit(head, len(train_set), step_loss, evaluate_now, epochs=epochs, lr=lr, seed=seed, state=state,
               on_epoch=on_epoch, desc="eagle head", progress=progress)
