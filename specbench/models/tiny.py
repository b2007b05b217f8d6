"""Randomly initialised test models from a config, with a character-level tokenizer over ASCII."""

from __future__ import annotations

import torch
import transformers

from specbench.errors import ModelLoadError

TINY_SPECIALS = ["<pad>", "<s>", "<|end|>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>"]
TINY_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def build_tiny_tokenizer(vocab_size: int = 128) -> transformers.PreTrainedTokenizerFast:
    """A character-level tokenizer over printable ASCII, padded with ``<extra_i>`` to ``vocab_size``.

    ids: 0 <pad>, 1 <s> (bos), 2 <|end|> (eos), 3 <unk>, then role markers, characters, extras.
    Characters outside ASCII map to <unk>; decoding concatenates characters.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    chars = ["\n", "\t"] + [chr(c) for c in range(32, 127)]
    vocab = TINY_SPECIALS + chars
    if vocab_size < len(vocab):
        raise ModelLoadError(f"tiny tokenizer needs vocab_size >= {len(vocab)}, got {vocab_size}")
    vocab += [f"<extra_{i}>" for i in range(vocab_size - len(vocab))]
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(TINY_SPECIALS)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="<|end|>", unk_token="<unk>", pad_token="<pad>",
        chat_template=TINY_CHAT_TEMPLATE, model_max_length=int(1e30))


def _build_tiny(tiny: dict, dtype: torch.dtype, attn: str):
    kwargs = dict(tiny)
    seed = int(kwargs.pop("seed", 0))
    model_type = kwargs.pop("model_type")
    tokenizer = build_tiny_tokenizer(kwargs.get("vocab_size", 128))
    kwargs.update(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id)
    config = transformers.AutoConfig.for_model(model_type, **kwargs)
    with torch.random.fork_rng(devices=[]):  # seeded init that leaves the caller's RNG alone
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)
    return model, tokenizer
