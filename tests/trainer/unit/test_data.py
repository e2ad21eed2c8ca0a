"""Unit tests of the data pipeline: loss masking, packing and the resumable distributed order."""

from __future__ import annotations

import re
from pathlib import Path

import datasets
import pytest
import torch
from datasets import Dataset
from llmtrain.api.spec import DatasetSpec
from llmtrain_trainer import data
from llmtrain_trainer.data import (
    IGNORE_INDEX,
    DataError,
    DataPosition,
    DistributedBatches,
    Example,
    build_sequences,
    collate,
    encode_chat,
    encode_instruction,
    evaluation_batches,
    pack,
    tokenize,
)
from llmtrain_trainer.tokenizer import ASSISTANT, byte_level_tokenizer

from tests.support.trainer import TINY_STORIES, tiny_config


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
    text = tokenizer.decode(example.input_ids, skip_special_tokens=False)
    assert text.endswith("Goodbye<|end|>"), "no generation prompt dangles after the last reply"


def test_chat_needs_a_template_that_renders_prefix_by_prefix() -> None:
    """Assistant turns are located by rendering each conversation prefix; a tokenizer with no
    template, or one that renders a prefix differently inside the whole conversation, is refused
    with the remedy rather than masking the wrong tokens."""
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    bare = byte_level_tokenizer()
    bare.chat_template = None
    with pytest.raises(DataError, match=r"^dataset\.format chat needs a tokenizer with a chat template$"):
        encode_chat(messages, bare, 64)
    marks_last = byte_level_tokenizer()
    marks_last.chat_template = (
        "{% for m in messages %}{% if loop.last %}LAST:{% endif %}{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}A:{% endif %}"
    )
    with pytest.raises(
        DataError, match=r"^the tokenizer's chat template does not render conversations prefix by"
    ):
        encode_chat(messages, marks_last, 64)
    with pytest.raises(DataError, match=r"use format instruction instead$"):
        encode_chat(messages, marks_last, 64)


def test_empty_conversation_encodes_to_nothing(tokenizer) -> None:  # type: ignore[no-untyped-def]
    """A record with no messages is dropped like one with no assistant turn, not a crash (chat
    templates refuse to render an empty conversation)."""
    assert encode_chat([], tokenizer, 64) == Example([], [])


def test_tokenize_honours_tokenize_processes_and_names_an_empty_result(
    tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """dataset.tokenizeProcesses bounds the processes (and their memory) when the caller names no
    count; a dataset that yields no sequence is refused with its name, not as an empty run."""
    monkeypatch.setattr(data, "_PACK_BATCH_RECORDS", 2)
    records = Dataset.from_dict({"text": [f"Story {i}." for i in range(6)]})  # three record batches
    one = DatasetSpec.model_validate({"path": "stories.txt", "maxSeqLength": 8, "tokenizeProcesses": 1})
    assert len(tokenize(records, tokenizer, one).cache_files) == 1
    chat = DatasetSpec.model_validate({"path": "greetings.jsonl", "format": "chat"})
    unanswered = Dataset.from_dict({"messages": [[{"role": "user", "content": "Hi"}]]})
    with pytest.raises(DataError, match=r"greetings\.jsonl.*no training sequences"):
        tokenize(unanswered, tokenizer, chat)


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


def test_a_validation_file_is_tokenised_and_cached_as_a_dataset_of_its_own(  # type: ignore[no-untyped-def]
    tokenizer, tmp_path: Path
) -> None:
    """dataset.validationPath: the training data stays whole, the file is encoded with the same
    settings and cached under its own key; a second build reads both from the cache."""
    stories = TINY_STORIES.read_text().split("\n\n")
    held_out = tmp_path / "val" / "held-out.txt"
    held_out.parent.mkdir()
    held_out.write_text("\n\n".join(stories[:40]))
    spec = DatasetSpec(path=str(TINY_STORIES), max_seq_length=64, validation_path=str(held_out.parent))
    cache = tmp_path / "cache"
    built = build_sequences(spec, tokenizer, seed=0, cache_root=cache)
    whole = build_sequences(DatasetSpec(path=str(TINY_STORIES), max_seq_length=64), tokenizer, seed=0)
    assert built.validation is not None
    assert len(built.train) == len(whole.train)
    expected = tokenize(data.load_records(data.validation_spec(spec)), tokenizer, data.validation_spec(spec))
    assert built.validation["input_ids"] == expected["input_ids"]
    assert 0 < len(built.validation) < len(built.train)
    assert len([p for p in cache.iterdir() if not p.name.startswith(".")]) == 2
    again = build_sequences(spec, tokenizer, seed=0, cache_root=cache)
    assert again.validation is not None and again.validation["input_ids"] == expected["input_ids"]


def test_a_missing_validation_file_is_named_before_training(tmp_path: Path) -> None:
    from llmtrain_trainer.preflight import _check_dataset

    config = tiny_config(tmp_path, "val", dataset={"validationPath": str(tmp_path / "nowhere.jsonl")})
    with pytest.raises(DataError, match=r"dataset\.validationPath .*nowhere.* does not exist"):
        _check_dataset(config)


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


def test_validation_batches_are_disjoint_and_as_many_on_every_rank() -> None:
    """Every rank evaluates as many batches (one more on a rank would leave the others waiting in
    the loss all-reduce), each from its own contiguous share of the rows; a micro-batch larger than
    a share shrinks to it rather than leaving the ranks without batches."""
    rows = [[i] * (1 + i % 3) for i in range(11)]
    dataset = Dataset.from_dict({"input_ids": rows, "labels": rows})

    def first_tokens(micro_batch: int, world: int) -> list[list[list[int]]]:
        return [
            [
                batch["input_ids"][:, 0].tolist()
                for batch in evaluation_batches(dataset, micro_batch, rank, world, 99)
            ]
            for rank in range(world)
        ]

    assert first_tokens(2, 3) == [[[0, 1]], [[3, 4]], [[6, 7]]]
    assert first_tokens(1, 3) == [[[0], [1], [2]], [[3], [4], [5]], [[6], [7], [8]]]
    assert first_tokens(8, 2) == [[[0, 1, 2, 3, 4]], [[5, 6, 7, 8, 9]]]
    assert first_tokens(2, 12) == [[]] * 12
    batch = next(evaluation_batches(dataset, 3, 0, 1, 99))
    assert batch["input_ids"][0].tolist() == [0] + [99] * 7
    assert batch["labels"][0].tolist() == [0] + [IGNORE_INDEX] * 7


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


def test_a_hub_dataset_loads_its_split_with_the_hf_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """A private dataset needs the Secret's HF_TOKEN; an empty or absent one is no token at all."""
    calls: list[tuple[tuple[object, ...], dict[str, object]]] = []

    def load(*args: object, **kwargs: object) -> Dataset:
        calls.append((args, kwargs))
        return Dataset.from_dict({"text": ["a"]})

    monkeypatch.setattr(datasets, "load_dataset", load)
    spec = DatasetSpec.model_validate({"name": "org/set", "split": "train[:10]"})
    for token in ("hf_secret", "", None):
        if token is None:
            monkeypatch.delenv("HF_TOKEN", raising=False)
        else:
            monkeypatch.setenv("HF_TOKEN", token)
        data.load_records(spec)
    assert calls == [
        (("org/set",), {"split": "train[:10]", "token": "hf_secret"}),
        (("org/set",), {"split": "train[:10]", "token": None}),
        (("org/set",), {"split": "train[:10]", "token": None}),
    ]
    monkeypatch.setattr(
        datasets, "load_dataset", lambda *a, **k: {"train": Dataset.from_dict({"text": ["a"]})}
    )
    with pytest.raises(DataError, match=r"^dataset 'org/set' did not load as a single split$"):
        data.load_records(spec)


def test_a_text_file_is_one_record_per_paragraph_with_its_line_breaks(tmp_path: Path) -> None:
    (tmp_path / "book.txt").write_text("Once upon\na time.\n\nThe end.\n")
    records = data.load_records(DatasetSpec.model_validate({"path": str(tmp_path / "book.txt")}))
    assert [r["text"].strip() for r in records] == ["Once upon\na time.", "The end."]


def test_shards_are_whole_record_batches_spread_evenly_and_never_empty(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each process tokenises whole record batches (packing works per batch); the first ones take
    one more batch when they do not divide evenly; no process gets an empty range."""
    monkeypatch.setattr(data, "_PACK_BATCH_RECORDS", 10)
    assert data._shard_bounds(60, 4) == [(0, 20), (20, 40), (40, 50), (50, 60)]
    assert data._shard_bounds(65, 4) == [(0, 20), (20, 40), (40, 60), (60, 65)]
    assert data._shard_bounds(10, 2) == [(0, 10)]
    assert data._shard_bounds(0, 2) == [(0, 0)]


def test_record_helpers_on_edge_cases() -> None:
    assert list(data._records({})) == []
    assert list(data._records({"a": [1, 2], "b": [3, 4]})) == [{"a": 1, "b": 3}, {"a": 2, "b": 4}]
    no_eos = byte_level_tokenizer()
    no_eos.eos_token = None
    assert data._eos(no_eos) == []
    with pytest.raises(
        DataError, match=r"^record has no field 'prompt' \(the question\); fields are \['a', 'b'\]$"
    ):
        data._require_field({"b": 1, "a": 2}, "prompt", "the question")


@pytest.mark.parametrize(
    ("fields", "record", "named"),
    [
        ({"format": "instruction"}, {"response": "r"}, "'prompt' (dataset.promptField)"),
        ({"format": "instruction"}, {"prompt": "p"}, "'response' (dataset.responseField)"),
        ({"format": "chat"}, {"text": "t"}, "'messages' (dataset.messagesField)"),
    ],
)
def test_a_record_without_its_field_names_the_spec_field_to_set(
    fields: dict[str, str], record: dict[str, str], named: str
) -> None:
    spec = DatasetSpec.model_validate({"path": "x", **fields})
    batch = {key: [value] for key, value in record.items()}
    with pytest.raises(DataError, match=re.escape(f"record has no field {named}")):
        data._supervised_batch(batch, byte_level_tokenizer(), spec)


def test_the_data_position_round_trips_through_the_checkpoint() -> None:
    position = DataPosition(epoch=2, offset=5)
    assert position.to_dict() == {"epoch": 2, "offset": 5}
    assert DataPosition.from_dict({"epoch": "2", "offset": 5}) == position


def test_a_validation_file_is_a_dataset_of_its_own_with_the_same_encoding() -> None:
    spec = DatasetSpec.model_validate(
        {"path": "train.jsonl", "validationPath": "val.jsonl", "format": "instruction", "maxSeqLength": 32}
    )
    held_out = data.validation_spec(spec)
    assert (held_out.path, held_out.validation_path, held_out.name) == ("val.jsonl", None, None)
    assert (held_out.format, held_out.max_seq_length) == ("instruction", 32)


def test_each_epoch_visits_the_samples_in_its_seeded_order() -> None:
    """Epoch e is randperm(n, seed + e), cut in global batches of micro_batch x world; the tail
    that makes no whole global batch waits for no one (22 rows: 5 batches of 4, 2 rows dropped)."""
    dataset = Dataset.from_dict({"input_ids": [[i] for i in range(22)], "labels": [[i] for i in range(22)]})

    def order(epoch: int) -> list[int]:
        return torch.randperm(22, generator=torch.Generator().manual_seed(5 + epoch)).tolist()

    seen, position = _walk(dataset, world=2, batches=8)
    assert seen == order(0)[:20] + order(1)[:12]
    assert position == DataPosition(1, 12)
    # Resumed in epoch 1 (a fresh iterator), and from an offset inside a global batch (another
    # world size saved it): rounded down to the batch, so samples repeat rather than being skipped.
    resumed, _ = _walk(dataset, world=2, batches=1, position=DataPosition(1, 6))
    assert resumed == order(1)[4:8]


def test_a_batch_is_padded_with_the_pad_id_to_a_multiple_of_8_and_one_batch_is_enough() -> None:
    dataset = Dataset.from_dict({"input_ids": [[i] for i in range(4)], "labels": [[i] for i in range(4)]})
    batch = DistributedBatches(dataset, 2, 0, 2, 5, 99).next_batch()
    assert batch["input_ids"].shape == (2, 8)
    assert batch["input_ids"][:, 1:].eq(99).all() and batch["labels"][:, 1:].eq(IGNORE_INDEX).all()
    with pytest.raises(DataError, match="the dataset has 4 sequences, fewer than one global micro-batch"):
        DistributedBatches(dataset, 3, 0, 2, 5, 99)
    # multiple_of as the trainer passes it (models.packed_row_length: flex attention's block size)
    assert DistributedBatches(dataset, 2, 0, 2, 5, 99, multiple_of=4).next_batch()["input_ids"].shape == (
        2,
        4,
    )
    assert next(evaluation_batches(dataset, 2, 0, 2, 99, multiple_of=2))["input_ids"].shape == (2, 2)


def test_a_data_folder_takes_one_type_of_visible_data_files(tmp_path: Path) -> None:
    """Hidden files (an editor's .swp, a .DS_Store) and other suffixes are not data; no file left,
    or two types mixed, is an error that names the setting and the folder."""
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.jsonl").write_text("{}\n")
    (folder / "sub" / "a.jsonl").write_text("{}\n")
    (folder / ".hidden.jsonl").write_text("{}\n")
    (folder / "notes.md").write_text("x")
    assert data.data_files(folder) == ("json", [str(folder / "b.jsonl"), str(folder / "sub" / "a.jsonl")])
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "readme.md").write_text("x")
    with pytest.raises(DataError, match=re.escape(f"dataset.validationPath {str(empty)!r} holds no .jsonl")):
        data.data_files(empty, "dataset.validationPath")
    (folder / "c.parquet").write_bytes(b"")
    with pytest.raises(DataError, match=re.escape("mixes file types ['json', 'parquet']; use one type")):
        data.data_files(folder)
    (folder / "d.txt").write_text("x")
    with pytest.raises(
        DataError,
        match=re.escape(f"dataset.path {str(folder)!r} mixes file types ['json', 'parquet', 'text']"),
    ):
        data.data_files(folder)


def test_small_datasets_tokenise_in_one_process_large_ones_in_one_per_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(data, "_PACK_BATCH_RECORDS", 10)
    assert [data.tokenize_processes(n, 4) for n in (0, 1, 10, 11, 25, 1000)] == [1, 1, 1, 2, 3, 4]


def test_pack_keeps_only_whole_sequences() -> None:
    assert pack([[1, 2, 3], [4, 5]], 2) == [[1, 2], [3, 4]]
    assert pack([[1, 2, 3], [4]], 2) == [[1, 2], [3, 4]]
    assert pack([[1]], 2) == []


def test_the_tokenised_data_cache_lies_beside_the_datasets_cache() -> None:
    import datasets

    assert data.default_cache_root() == Path(datasets.config.HF_DATASETS_CACHE) / "llmtrain-tokenized"


def test_the_validation_split_is_a_seeded_shuffle_down_to_two_sequences(tmp_path: Path) -> None:
    """The held-out rows are drawn at random with the run's seed (the same on every rank and every
    restart, else training rows would leak into validation), and two sequences still split."""
    tokenizer = byte_level_tokenizer()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"story {i} " * 6 for i in range(40)))
    spec = DatasetSpec(path=str(corpus), max_seq_length=16, validation_split=0.25, packing=False)

    def held_out(seed: int) -> list[list[int]]:
        built = build_sequences(spec, tokenizer, seed=seed, cache_root=tmp_path / "cache")
        assert built.validation is not None
        return list(built.validation["input_ids"])

    first = held_out(3)
    assert held_out(3) == first
    rows = list(
        build_sequences(
            spec.model_copy(update={"validation_split": 0.0}),
            tokenizer,
            seed=3,
            cache_root=tmp_path / "cache",
        ).train["input_ids"]
    )
    assert first != rows[-len(first) :], "the last rows, not a shuffled draw"
    two = tmp_path / "two.txt"
    two.write_text("a\n\nb")
    pair = build_sequences(
        DatasetSpec(path=str(two), max_seq_length=16, validation_split=0.5, packing=False),
        tokenizer,
        seed=0,
        cache_root=tmp_path / "cache",
    )
    assert pair.validation is not None and (len(pair.train), len(pair.validation)) == (1, 1)
    assert not pair.fixed_label_count  # unpacked rows: each its own count of labels


def test_two_shards_give_the_one_process_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both shards are read back, in order (three are in test_tokenize_cache)."""
    monkeypatch.setattr(data, "_PACK_BATCH_RECORDS", 4)
    records = Dataset.from_dict({"text": [f"document {i} " * (i % 3 + 1) for i in range(8)]})
    spec = DatasetSpec.model_validate({"path": "x", "maxSeqLength": 16, "packing": False})
    one = tokenize(records, byte_level_tokenizer(), spec, procs=1)
    two = tokenize(records, byte_level_tokenizer(), spec, procs=2)
    assert len(two.cache_files) == 2
    assert two.to_dict() == one.to_dict()


def test_collated_tensors_are_integers_where_the_model_indexes_with_them() -> None:
    """Positions index the rotary table and the mask is the padding's: both integer tensors, never
    the float zeros `torch.zeros` gives by default."""
    padded = collate(
        [{"input_ids": [5, 6, 7], "labels": [5, 6, 7]}, {"input_ids": [5], "labels": [5]}], pad_id=0
    )
    assert {k: v.dtype for k, v in padded.items()} == {
        "input_ids": torch.long,
        "labels": torch.long,
        "attention_mask": torch.long,
    }
    packed = collate(
        [{"input_ids": [5, 6, 7], "labels": [5, 6, 7], "position_ids": [0, 1, 0]}], pad_id=0, multiple_of=4
    )
    assert {k: v.dtype for k, v in packed.items()} == dict.fromkeys(
        ("input_ids", "labels", "position_ids"), torch.long
    )
    assert packed["position_ids"].tolist() == [[0, 1, 0, 0]]
