"""Shared checks that a method is lossless, for every method's tests.

* :func:`assert_greedy_lossless`: greedy output equals autoregressive output
  token for token.
* :func:`assert_sampling_preserves_distribution`: over an 8-token vocabulary,
  the joint distribution of the first three generated tokens matches the exact
  one (computed by enumerating every prefix) under a chi-square test at
  significance 1e-3 (cells expected below 5 are pooled, :func:`chi_square_pvalue`).
  With ``extra=K`` each trial generates 3 + K tokens and the first three are
  compared, so drafters that honour ``DecodeState.max_depth`` may draft deep
  trees inside the compared steps (with 3 tokens in all, every draft after
  the prefill is one token deep); ``min_depth=d`` asserts that drafts of depth
  ≥ d were verified there. The default target is a bigram table behind the
  :class:`Target` interface (thousands of trials in seconds);
  :func:`small_vocab_target` is a real tiny transformer for the same test
  through the real forward, mask and cache.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import torch
from scipy.stats import chisquare
from transformers import AutoModelForCausalLM, LlamaConfig

from specbench.core.acceptance import SamplingParams, target_probs
from specbench.core.decode import Request, decode_batch, generate
from specbench.core.draft import DecodeState, Drafter
from specbench.core.forward import Target

SMALL_VOCAB = 8
HIDDEN = 16  # width of the Markov target's hidden states
ALPHA = 1e-3


_AR_CACHE: dict[tuple, tuple[object, list[int]]] = {}  # values keep the model alive, so ids stay unique


def autoregressive_output(target: Target, prompt: list[int], max_new_tokens: int, eos=()) -> list[int]:
    """Greedy autoregressive output, computed once per (model, prompt, length, eos) in a test session."""
    key = (id(target.model), getattr(target, "mode", "eager"), getattr(target, "graphed", False), tuple(prompt),
           max_new_tokens, tuple(eos))
    if key not in _AR_CACHE:
        rec = generate(
            target, Drafter(vocab_size=0), prompt, max_new_tokens=max_new_tokens, eos_token_ids=eos
        )
        _AR_CACHE[key] = (target.model, rec.output_ids)
    return list(_AR_CACHE[key][1])


def assert_greedy_lossless(
    target: Target,
    make_drafter: Callable[[], Drafter],
    prompts: list[list[int]],
    max_new_tokens: int,
    eos=(),
    budget=None,
) -> list:
    """Each prompt's greedy output with the method equals autoregressive output. Returns the records.
    ``budget``: a :class:`specbench.budget.planner.AutoBudget` that trims every draft (budget=auto)."""
    records = []
    for prompt in prompts:
        expected = autoregressive_output(target, prompt, max_new_tokens, eos)
        rec = generate(target, make_drafter(), prompt, max_new_tokens=max_new_tokens, eos_token_ids=eos,
                       planner=budget)
        assert rec.output_ids == expected, f"diverged at token {_first_diff(rec.output_ids, expected)}"
        records.append(rec)
    return records


def _first_diff(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def small_vocab_target(seed: int = 0) -> Target:
    """A tiny Llama over 8 tokens with peaked distributions (so drafts are sometimes right)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=SMALL_VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(12.0)
    return Target(model)


class _Length:
    """Stands in for a KV cache: only its rows' lengths matter to a bigram target."""

    def __init__(self, slots: int = 1) -> None:
        self.slots, self.lengths = slots, [0] * slots

    def get_seq_length(self) -> int:
        return max(self.lengths)

    def commit(self, lo, keeps):
        for r, keep in enumerate(keeps):
            self.lengths[lo + r] += len(keep)

    def clear(self, slot):
        self.lengths[slot] = 0

    def reserve(self, need):
        pass

    def move(self, src, dst):
        self.lengths[dst], self.lengths[src] = self.lengths[src], 0


class BigramTarget(Target):
    """A target whose next-token logits depend only on the current token."""

    def __init__(self, seed: int = 0, sharpness: float = 2.0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(SMALL_VOCAB, SMALL_VOCAB, generator=g) * sharpness
        # "hidden states" for drafters that read them: a fixed vector per token (they carry the current token)
        self.hidden = torch.randn(SMALL_VOCAB, HIDDEN, generator=g)
        self.features = {}
        self.device, self.dtype, self.is_cuda = torch.device("cpu"), torch.float32, False
        self.model = self

    def __call__(self, input_ids: torch.Tensor):
        class Out:
            logits = self.table[input_ids]

        return Out

    def new_cache(self, slots=1, limit=None):
        return _Length(slots)

    def prefill(self, prompt_ids, cache, features=(), slot=0):
        cache.lengths[slot] += len(prompt_ids)
        self.features = {layer: self.hidden[list(prompt_ids)] for layer in features}
        return self.table[prompt_ids[-1]]

    def forward_draft(self, root, draft, cache, features=(), slot=0):
        tokens = [root] + list(draft.tokens) + list(draft.aux_tokens)
        self.features = {layer: self.hidden[tokens] for layer in features}
        if draft.aux_logit_rows is not None:  # as the real target: logits only where they are read
            tokens = tokens[: 1 + len(draft.tokens)] + [draft.aux_tokens[j] for j in draft.aux_logit_rows]
        return self.table[tokens]

    def prefill_rows(self, prompts, cache, lo, features=()):
        logits, self.row_features = [], []
        for r, prompt in enumerate(prompts):
            logits.append(self.prefill(prompt, cache, features, slot=lo + r))
            self.row_features.append(self.features)
        return torch.stack(logits)

    def forward_rows(self, roots, drafts, cache, lo=0, features=()):
        logits, self.row_features = [], []
        for r, (root, draft) in enumerate(zip(roots, drafts, strict=True)):
            logits.append(self.forward_draft(root, draft, cache, features, slot=lo + r))
            self.row_features.append(self.features)
        self.rows_logits = torch.cat(logits)
        return logits

    @staticmethod
    def compact(cache, past_len, accepted_nodes, slot=0):
        cache.lengths[slot] = past_len + 1 + len(accepted_nodes)


class BigramModel(torch.nn.Module):
    """What a head drafter reads of a target besides its features: embeddings, an LM head and a config
    shaped like the :class:`BigramTarget`'s hidden states (random: only verification decides the output)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(SMALL_VOCAB, HIDDEN)
        self.head = torch.nn.Linear(HIDDEN, SMALL_VOCAB, bias=False)
        self.config = SimpleNamespace(hidden_size=HIDDEN, vocab_size=SMALL_VOCAB, num_hidden_layers=6,
                                      intermediate_size=32, num_attention_heads=4, num_key_value_heads=2)

    def get_input_embeddings(self):
        return self.emb

    def get_output_embeddings(self):
        return self.head


@torch.no_grad()
def exact_joint(target: Target, prompt: list[int], params: SamplingParams, length: int = 3) -> dict:
    """P(first ``length`` tokens) under the target's sampling distribution, by enumeration."""
    prefixes = [()]
    probs = {(): 1.0}
    for _ in range(length):
        batch = torch.tensor([prompt + list(p) for p in prefixes])
        dist = target_probs(target.model(input_ids=batch).logits[:, -1], params)
        nxt = {}
        for p, row in zip(prefixes, dist, strict=True):
            for tok in range(SMALL_VOCAB):
                nxt[p + (tok,)] = probs[p] * float(row[tok])
        prefixes, probs = list(nxt), nxt
    return probs


def chi_square_pvalue(counts: Counter, exact: dict, trials: int | None = None) -> float:
    """Chi-square p-value of observed ``counts`` against ``exact`` probabilities; cells whose expected
    count is below 5 are pooled into one, which takes the smallest other cells until it reaches 5 (the
    test's approximation needs it). A sample of probability 0 fails at once."""
    assert not [s for s, p in exact.items() if p == 0 and counts[s]], "sampled a sequence of probability 0"
    trials = trials if trials is not None else sum(counts.values())
    cells = sorted(exact, key=exact.get, reverse=True)
    observed, expected, pool_o, pool_e = [], [], 0.0, 0.0
    for s in cells:
        if exact[s] * trials >= 5:
            observed.append(counts[s])
            expected.append(exact[s] * trials)
        else:
            pool_o += counts[s]
            pool_e += exact[s] * trials
    while 0 < pool_e < 5 and expected:  # the pool itself too small: it takes the smallest kept cells
        pool_o += observed.pop()
        pool_e += expected.pop()
    if pool_e > 0:
        observed.append(pool_o)
        expected.append(pool_e)
    expected_arr = np.array(expected) * (sum(observed) / sum(expected))
    return float(chisquare(np.array(observed, dtype=float), expected_arr).pvalue)


def compared_depth(rec, length: int) -> int:
    """The deepest draft verified by a step that began before the first ``length`` tokens were complete."""
    done, deepest = rec.step_tokens[0], 0
    for kept, depth in zip(rec.step_tokens[1:], rec.step_depth[1:], strict=True):
        if done >= length:
            break
        deepest = max(deepest, depth)
        done += kept
    return deepest


def assert_sampling_preserves_distribution(
    make_drafter: Callable[[], Drafter],
    params: SamplingParams,
    prompt: list[int] | None = None,
    trials: int = 4000,
    seed: int = 0,
    target: Target | None = None,
    make_budget: Callable[[], object] | None = None,
    extra: int = 0,
    min_depth: int = 0,
    length: int = 3,
    batch_size: int = 1,
) -> float:
    """Chi-square test of the method's first ``length`` sampled tokens against the exact joint, each trial
    generating ``length + extra`` tokens (``make_budget``: a budget=auto trimmer per trial). ``min_depth``:
    some draft of at least that depth must have been verified while the compared tokens were decided.
    ``batch_size`` > 1: the trials are requests decoded together, each with its own sampling stream."""
    target = target or BigramTarget()
    prompt = prompt or [1, 2, 3, 1, 2, 3, 4, 1, 2]
    exact = exact_joint(target, prompt, params, length)
    gen = torch.Generator().manual_seed(seed)
    counts: Counter = Counter()
    depths: Counter = Counter()
    if batch_size == 1:
        records = (generate(target, make_drafter(), prompt, max_new_tokens=length + extra, sampling=params,
                            generator=gen, planner=make_budget() if make_budget else None) for _ in range(trials))
    else:
        queue = [Request(prompt, length + extra, make_drafter(), torch.Generator().manual_seed(seed * 100_003 + i),
                         make_budget() if make_budget else None) for i in range(trials)]
        records = (rec for _, rec in decode_batch(target, lambda: queue.pop() if queue else None,
                                                  batch_size=batch_size, sampling=params))
    for rec in records:
        counts[tuple(rec.output_ids[:length])] += 1
        depths[compared_depth(rec, length)] += 1
    deepest = max(depths)
    assert deepest >= min_depth, f"no draft of depth {min_depth} was verified in the compared steps: {depths}"
    pvalue = chi_square_pvalue(counts, exact, trials)
    assert pvalue > ALPHA, f"sampled distribution differs from the target's (chi-square p = {pvalue:.2e})"
    return pvalue


def assert_eos_inside_accepted_run(
    target: Target, make_drafter: Callable[[], Drafter], text: list[int]
) -> None:
    """EOS landing inside a run of accepted guesses ends the output right after it.

    The prompt is ``text`` plus the model's own continuation, so copying drafters find the next tokens in it.
    """
    prompt = text + autoregressive_output(target, text, 30)
    free = autoregressive_output(target, prompt, 60)
    inside = 0
    for eos in list(dict.fromkeys(free[3:50]))[:6]:
        rec = assert_greedy_lossless(target, make_drafter, [prompt], 60, eos=(eos,))[0]
        assert rec.finish_reason == "eos" and rec.output_ids == free[: free.index(eos) + 1]
        inside += rec.step_tokens[-1] > 1  # the last step accepted guesses and stopped at EOS
    assert inside > 0


def ignoring_max_depth(make_drafter: Callable[[], Drafter], beyond: int = 64) -> Callable[[], Drafter]:
    """The drafter made to believe ``beyond`` more tokens remain: it drafts past ``max_new_tokens``, as a
    method that ignores ``DecodeState.max_depth`` would, so the core's cut is what keeps the count."""

    def make() -> Drafter:
        drafter = make_drafter()
        propose = drafter.propose

        def unbounded(state: DecodeState):
            return propose(DecodeState(state.tokens, state.prompt_len, state.max_new_tokens + beyond, state.step))

        drafter.propose = unbounded
        return drafter

    return make


def assert_max_new_tokens_cuts_accepted_runs(
    target: Target, make_drafter: Callable[[], Drafter], prompt: list[int]
) -> None:
    """Generations of every length are prefixes of the longest, also when the drafter drafts past the
    limit; then some are cut inside an accepted run (the last step accepted guesses and the cut dropped at
    least one of them besides the target's own token), and what was cut is neither kept nor counted."""
    free = autoregressive_output(target, prompt, 32)
    cut_runs = 0
    for make in (make_drafter, ignoring_max_depth(make_drafter)):
        for max_new in range(1, 33, 2):
            rec = generate(target, make(), prompt, max_new_tokens=max_new)
            assert rec.output_ids == free[:max_new] and rec.finish_reason == "length"
            assert sum(rec.step_tokens) == max_new and rec.step_accepted[-1] <= rec.step_tokens[-1]
            assert sum(rec.accepted_per_step) == sum(rec.accepted_by_position.values())  # one record
            cut_runs += rec.dropped >= 2 and rec.step_accepted[-1] >= 1
    assert cut_runs > 0, "no generation was cut inside an accepted run"


def counting_proposals(make_drafter: Callable[[], Drafter], proposed: list[int]) -> Callable[[], Drafter]:
    """Wrap a drafter factory so that every proposal's guess count is appended to ``proposed``."""

    def make() -> Drafter:
        drafter = make_drafter()
        propose = drafter.propose

        def counted(state):
            draft = propose(state)
            proposed.append(len(draft.tokens) if draft is not None else 0)
            return draft

        drafter.propose = counted
        return drafter

    return make


# Prompts for the real model's lossless tests: a code edit (output copies input), a long list.
CODE_EDIT = (
    "Rewrite this function to use a list comprehension:\n\n"
    "def even_squares(numbers):\n    result = []\n    for n in numbers:\n"
    "        if n % 2 == 0:\n            result.append(n * n)\n    return result\n"
)
LONG = "Write the numbers from 1 to 120, separated by commas."
MORE = [
    "Fix the typo in this sentence and repeat it: 'The quick brown fox jumsp over the lazy dog.'",
    "Summarize: The cat sat on the mat. The cat was happy on the mat. Then the cat left the mat.",
    "Add type hints to this function:\n\ndef add(a, b):\n    return a + b\n",
]


def chat(lm, text: str) -> list[int]:
    """``text`` as a user turn through the model's chat template."""
    return lm.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, return_dict=False
    )
