"""Tokenizers: the built-in byte-level one (no download) or any Hugging Face tokenizer.

The byte tokenizer maps byte b to id b, then adds a few special tokens (ids 256..), so it fits any
model whose vocab_size is at least 256 + len(SPECIAL_TOKENS). It is a real `PreTrainedTokenizerFast`:
it saves with the export and loads back with `AutoTokenizer.from_pretrained`.
"""

from __future__ import annotations

import os
from functools import cache

from llmtrain.api.spec import ModelSpec
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

BYTE_LEVEL = "byte-level"
PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|eos|>"
SYSTEM, USER, ASSISTANT, END = "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"
SPECIAL_TOKENS = [PAD, BOS, EOS, SYSTEM, USER, ASSISTANT, END]

# Each message is <|role|>content<|end|>; the generation prompt is the bare assistant header, so the
# loss masking in data.py can tell the header (prompt) from the reply (trained).
BYTE_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


@cache
def _byte_to_unicode() -> dict[int, str]:
    """The printable-character alias of every byte that the ByteLevel pre-tokenizer emits."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """A 256-byte vocabulary (id == byte value) plus SPECIAL_TOKENS; lossless for any UTF-8 text."""
    vocab = {char: byte for byte, char in _byte_to_unicode().items()}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(SPECIAL_TOKENS)
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[SYSTEM, USER, ASSISTANT, END],
        chat_template=BYTE_CHAT_TEMPLATE,
        model_max_length=1 << 30,
    )
    return tokenizer


def tokenizer_source(spec: ModelSpec) -> str:
    """What the tokenizer is loaded from: model.tokenizer, else model.name."""
    source = spec.tokenizer or spec.name
    if source is None:
        raise ValueError("model.tokenizer is required with model.config (a hub id, a path or 'byte-level')")
    return source


def load_tokenizer(spec: ModelSpec) -> PreTrainedTokenizerBase:
    """The tokenizer named by the spec, with a pad token (eos when the tokenizer has none)."""
    source = tokenizer_source(spec)
    if source == BYTE_LEVEL:
        return byte_level_tokenizer()
    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(
        source,
        revision=spec.revision if source == spec.name else None,
        trust_remote_code=spec.trust_remote_code,
        token=os.environ.get("HF_TOKEN") or None,
    )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
