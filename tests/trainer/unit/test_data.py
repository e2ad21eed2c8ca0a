"""Unit tests of the data pipeline: loss masking, packing and the resumable distributed order."""

from __future__ import annotations

from pathlib import Path

import pytest
from datasets import Dataset
from llmtrain.api.spec import DatasetSpec
from llmtrain_trainer.data import (
    IGNORE_INDEX,
    DataError,
    DataPosition,
    DistributedBatches,
    build_sequences,
    collate,
    encode_chat,
    encode_instruction,
    pack,
)
from llmtrain_trainer.tokenizer import ASSISTANT, byte_level_tokenizer

from tests.support.trainer import TINY_STORIES


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    return byte_level_tokenizer()


def test_instruction_masks_prompt_and_padding(tokenizer) -> None:  # type: ignore[no-untyped-def]
    short = encode_instruction("Hi?", "Yes.", tokenizer, 64, template="Q: {prompt}\nA: ")
    long = encode_instruction(
        "A longer question?", "A longer answer.", tokenizer, 64, template="Q: {prompt}\nA: "
    )
    prompt_len = len(b"Q: Hi?\nA: ")
    assert short.labels[:prompt_len] == [IGNORE_INDEX] * prompt_len
    assert short.labels[prompt_len:] == short.input_ids[prompt_len:]
    assert tokenizer.decode(short.input_ids[prompt_len:]) == "Yes." + tokenizer.eos_token

    batch = collate(
        [{"input_ids": e.input_ids, "labels": e.labels} for e in (short, long)], tokenizer.pad_token_id
    )
    row_len = len(short.input_ids)
    labels, ids, mask = batch["labels"][0], batch["input_ids"][0], batch["attention_mask"][0]
    assert labels.shape[0] % 8 == 0 and labels.shape[0] >= len(long.input_ids)
    # Prompt and padding are -100, the response is learned, padding is not attended to.
    assert (labels[:prompt_len] == IGNORE_INDEX).all()
    assert labels[prompt_len:row_len].tolist() == short.input_ids[prompt_len:]
    assert (labels[row_len:] == IGNORE_INDEX).all()
    assert (ids[row_len:] == tokenizer.pad_token_id).all()
    assert mask[:row_len].all() and not mask[row_len:].any()


def test_instruction_truncates_to_max_length(tokenizer) -> None:  # type: ignore[no-untyped-def]
    example = encode_instruction("p" * 10, "r" * 100, tokenizer, 32)
    assert len(example.input_ids) == len(example.labels) == 32
    assert example.labels[:10] == [IGNORE_INDEX] * 10


def test_chat_learns_assistant_turns_only(tokenizer) -> None:  # type: ignore[no-untyped-def]
    messages = [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there"},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Goodbye"},
    ]
    example = encode_chat(messages, tokenizer, 256)
    learned = [t for t, label in zip(example.input_ids, example.labels, strict=True) if label != IGNORE_INDEX]
    end = tokenizer.convert_tokens_to_ids("<|end|>")
    assert tokenizer.decode(learned, skip_special_tokens=False) == "Hi there<|end|>Goodbye<|end|>"
    assert learned.count(end) == 2
    assert tokenizer.convert_tokens_to_ids(ASSISTANT) not in learned, "the assistant header is prompt"


def test_pack_cuts_full_sequences() -> None:
    assert pack([[1, 2, 3], [4, 5], [6, 7, 8, 9]], 4) == [[1, 2, 3, 4], [5, 6, 7, 8]]


def test_text_dataset_is_packed_and_fully_learned(tokenizer) -> None:  # type: ignore[no-untyped-def]
    data = build_sequences(DatasetSpec(path=str(TINY_STORIES), max_seq_length=64), tokenizer, seed=0)
    assert data.fixed_label_count and data.validation is None
    assert len(data.train) > 2000
    row = data.train[0]
    assert len(row["input_ids"]) == 64 and row["labels"] == row["input_ids"]


def test_validation_split(tokenizer) -> None:  # type: ignore[no-untyped-def]
    data = build_sequences(
        DatasetSpec(path=str(TINY_STORIES), max_seq_length=64, validation_split=0.1), tokenizer, seed=0
    )
    assert data.validation is not None
    total = len(data.train) + len(data.validation)
    assert abs(len(data.validation) - 0.1 * total) <= 1


def test_missing_dataset_path_is_named(tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(DataError, match=r"dataset\.path .*nowhere.* does not exist"):
        build_sequences(DatasetSpec(path=str(tmp_path / "nowhere")), tokenizer, seed=0)


def _walk(
    dataset: Dataset, world: int, batches: int, position: DataPosition | None = None
) -> tuple[list[int], DataPosition]:
    iterators = [
        DistributedBatches(dataset, 2, rank, world, 5, 0, position or DataPosition()) for rank in range(world)
    ]
    seen: list[int] = []
    for _ in range(batches):
        for iterator in iterators:
            seen.extend(iterator.next_batch()["input_ids"][:, 0].tolist())
    return seen, iterators[0].position


def test_distributed_order_covers_epoch_once_and_resumes_exactly() -> None:
    dataset = Dataset.from_dict({"input_ids": [[i] for i in range(20)], "labels": [[i] for i in range(20)]})
    epoch, _ = _walk(dataset, world=2, batches=5)  # 5 global batches of 4 = one epoch of 20
    assert sorted(epoch) == list(range(20))

    straight, _ = _walk(dataset, world=2, batches=8)
    first, position = _walk(dataset, world=2, batches=3)
    rest, _ = _walk(dataset, world=2, batches=5, position=position)
    assert first + rest == straight, "resuming from the saved position neither repeats nor skips"
    assert straight[20:] != straight[:12], "each epoch has its own order"


def test_tiny_stories_match_their_generator() -> None:
    """The shipped demo data is exactly what examples/data/generate_tiny_stories.py writes."""
    import importlib.util

    script = TINY_STORIES.with_name("generate_tiny_stories.py")
    spec = importlib.util.spec_from_file_location("generate_tiny_stories", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert TINY_STORIES.read_text(encoding="utf-8") == module.generate()
    assert TINY_STORIES.stat().st_size < 300_000
