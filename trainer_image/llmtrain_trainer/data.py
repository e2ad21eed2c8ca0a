"""Training data: records → token sequences with loss masks → a deterministic, resumable order.

Every rank builds the same sequence dataset (rank 0 first, so the tokenised cache on the shared
storage is written once, by every CPU of the pod, and the other ranks, retries and resumes load it)
and walks the same seeded global order; each global micro-batch is cut
into one slice per rank. The position in that order (epoch, samples consumed) is saved in every
checkpoint, so a resumed run neither repeats nor skips samples, even with a different world size.
"""

from __future__ import annotations

import bisect
import gc
import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from llmtrain.api.spec import DatasetSpec
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from llmtrain_trainer.cpus import available_cpus

if TYPE_CHECKING:  # `datasets` (with pyarrow and pandas) is imported where records are loaded: the
    # driver's preflight imports this module for `data_files` alone.
    from datasets import Dataset

log = logging.getLogger(__name__)

IGNORE_INDEX = -100
"""Label value that cross-entropy ignores: prompts, non-assistant turns and padding."""

_BUILDER_BY_SUFFIX = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}
_PACK_BATCH_RECORDS = 10_000


class DataError(ValueError):
    """The dataset cannot be loaded or turned into training sequences; the message says why."""


@dataclass(frozen=True)
class Example:
    """One training sequence: token ids and their labels (IGNORE_INDEX where no loss is taken)."""

    input_ids: list[int]
    labels: list[int]


# ----------------------------------------------------------------------------- loading records


def data_files(path: Path, field: str = "dataset.path") -> tuple[str, list[str]]:
    """The `datasets` builder and file list for a file or a folder of .jsonl/.parquet/.txt files;
    `field` names the setting in the errors."""
    if not path.exists():
        raise DataError(f"{field} {str(path)!r} does not exist")
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    files = [p for p in files if p.suffix in _BUILDER_BY_SUFFIX and not p.name.startswith(".")]
    if not files:
        raise DataError(f"{field} {str(path)!r} holds no .jsonl, .json, .parquet or .txt files")
    builders = {_BUILDER_BY_SUFFIX[p.suffix] for p in files}
    if len(builders) > 1:
        raise DataError(f"{field} {str(path)!r} mixes file types {sorted(builders)}; use one type")
    return builders.pop(), [str(p) for p in files]


def load_records(spec: DatasetSpec) -> Dataset:
    """Raw records from the hub (dataset.name, dataset.split) or from files (dataset.path).

    Text files become one record per paragraph (blank-line separated), in a `text` column.
    """
    from datasets import Dataset, load_dataset

    if spec.name:
        dataset = load_dataset(spec.name, split=spec.split, token=os.environ.get("HF_TOKEN") or None)
    else:
        assert spec.path is not None
        builder, files = data_files(Path(spec.path))
        extra: dict[str, Any] = (
            {"sample_by": "paragraph", "keep_linebreaks": True} if builder == "text" else {}
        )
        dataset = load_dataset(builder, data_files=files, split="train", **extra)
    if not isinstance(dataset, Dataset):
        raise DataError(f"dataset {spec.name or spec.path!r} did not load as a single split")
    return dataset


# ----------------------------------------------------------------------------- encoding


def _require_field(record: dict[str, Any], field: str, what: str) -> Any:
    if field not in record:
        raise DataError(f"record has no field {field!r} ({what}); fields are {sorted(record)}")
    return record[field]


def _eos(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    return [] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)]


def encode_text(text: str, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """A document's tokens followed by EOS, so packed documents stay separated."""
    ids: list[int] = tokenizer(text, add_special_tokens=True)["input_ids"]
    return ids + _eos(tokenizer)


def encode_instruction(
    prompt: str,
    response: str,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    template: str | None = None,
) -> Example:
    """Prompt tokens are masked; the loss is on the response and its EOS only."""
    prompt_text = template.format(prompt=prompt) if template else prompt
    prompt_ids: list[int] = tokenizer(prompt_text, add_special_tokens=True)["input_ids"]
    response_ids: list[int] = tokenizer(response, add_special_tokens=False)["input_ids"] + _eos(tokenizer)
    input_ids = (prompt_ids + response_ids)[:max_length]
    labels = ([IGNORE_INDEX] * len(prompt_ids) + response_ids)[:max_length]
    return Example(input_ids, labels)


def _render(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, Any]], generation: bool) -> str:
    if not messages and not generation:
        return ""
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=generation)
    assert isinstance(text, str)
    return text


def encode_chat(
    messages: Sequence[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, max_length: int
) -> Example:
    """Render with the tokenizer's chat template; the loss is on assistant replies only.

    Each assistant reply spans from the end of the rendered conversation before it (with the
    generation prompt, i.e. the assistant header, which stays masked) to the end of the rendered
    conversation including it (so the end-of-turn token is learned).
    """
    if tokenizer.chat_template is None:
        raise DataError("dataset.format chat needs a tokenizer with a chat template")
    full = _render(tokenizer, messages, generation=False)
    spans: list[tuple[int, int]] = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        before = _render(tokenizer, messages[:i], generation=True)
        through = _render(tokenizer, messages[: i + 1], generation=False)
        if not (through.startswith(before) and full.startswith(through)):
            raise DataError(
                "the tokenizer's chat template does not render conversations prefix by prefix, so "
                "assistant turns cannot be located for loss masking; use format instruction instead"
            )
        spans.append((len(before), len(through)))
    encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    input_ids: list[int] = encoded["input_ids"]
    labels = [
        token if any(start <= begin < end for start, end in spans) else IGNORE_INDEX
        for token, (begin, _) in zip(input_ids, encoded["offset_mapping"], strict=True)
    ]
    return Example(input_ids[:max_length], labels[:max_length])


def pack(token_lists: Sequence[Sequence[int]], seq_length: int) -> list[list[int]]:
    """Concatenate documents and cut full sequences of seq_length tokens; the tail is dropped."""
    flat = [token for tokens in token_lists for token in tokens]
    return [flat[i : i + seq_length] for i in range(0, len(flat) - seq_length + 1, seq_length)]


def best_fit_rows(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Group item indices into rows of at most `capacity` tokens, best fit decreasing.

    Placing items in data order (next fit) closes a row as soon as the next item overflows it,
    which leaves about a fifth of each row empty on instruction data; taking the longest items
    first and putting each into the open row it fills most tightly leaves only a few percent.
    The result depends on the lengths alone (ties keep data order), so a re-run, a retry or a
    resume builds the same rows. An item longer than `capacity` gets a row of its own, as with
    next fit. Each row lists its indices in data order; rows come in order of their first index.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable: ties in data order
    rows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (tokens left, row), ascending: bisect finds the best fit
    for item in order:
        need = lengths[item]
        at = bisect.bisect_left(free, (need, -1))
        if at < len(free):
            left, row = free.pop(at)
        else:
            left, row = capacity, len(rows)
            rows.append([])
        rows[row].append(item)
        if left - need > 0:
            bisect.insort(free, (left - need, row))
    for indices in rows:
        indices.sort()
    rows.sort(key=lambda indices: indices[0])
    return rows


def pack_examples(examples: Sequence[Example], seq_length: int) -> dict[str, list[list[int]]]:
    """Place whole examples side by side in rows of at most seq_length tokens (`best_fit_rows`).

    Each example keeps its labels except its first, which becomes IGNORE_INDEX: in a row that
    label would be predicted from the previous example's last token, and alone it is never
    predicted. `position_ids` restart at 0 with every example; the model reads those restarts as
    document boundaries, so attention never crosses them (see `collate`).
    """
    rows: dict[str, list[list[int]]] = {"input_ids": [], "labels": [], "position_ids": []}
    for indices in best_fit_rows([len(e.input_ids) for e in examples], seq_length):
        for column in rows.values():
            column.append([])
        for example in (examples[i] for i in indices):
            rows["input_ids"][-1].extend(example.input_ids)
            rows["labels"][-1].extend([IGNORE_INDEX, *example.labels[1:]])
            rows["position_ids"][-1].extend(range(len(example.input_ids)))
    return rows


def _text_batch(
    batch: dict[str, list[Any]], tokenizer: PreTrainedTokenizerBase, spec: DatasetSpec
) -> dict[str, list[list[int]]]:
    if spec.text_field not in batch:
        raise DataError(
            f"records have no field {spec.text_field!r} (dataset.textField); fields are {sorted(batch)}"
        )
    docs = [encode_text(str(text), tokenizer) for text in batch[spec.text_field]]
    if spec.packs:
        sequences = pack(docs, spec.max_seq_length)
        return {"input_ids": sequences, "labels": sequences}
    truncated = [doc[: spec.max_seq_length] for doc in docs]
    return {"input_ids": truncated, "labels": truncated}


def _records(batch: dict[str, list[Any]]) -> Iterator[dict[str, Any]]:
    keys = list(batch)
    for i in range(len(batch[keys[0]]) if keys else 0):
        yield {key: batch[key][i] for key in keys}


def _supervised_batch(
    batch: dict[str, list[Any]], tokenizer: PreTrainedTokenizerBase, spec: DatasetSpec
) -> dict[str, list[list[int]]]:
    examples = []
    for record in _records(batch):
        if spec.format == "instruction":
            prompt = _require_field(record, spec.prompt_field, "dataset.promptField")
            response = _require_field(record, spec.response_field, "dataset.responseField")
            example = encode_instruction(
                str(prompt), str(response), tokenizer, spec.max_seq_length, spec.prompt_template
            )
        else:
            messages = _require_field(record, spec.messages_field, "dataset.messagesField")
            example = encode_chat(messages, tokenizer, spec.max_seq_length)
        if any(label != IGNORE_INDEX for label in example.labels[1:]):  # nothing to learn otherwise
            examples.append(example)
    if spec.packs:
        return pack_examples(examples, spec.max_seq_length)
    return {"input_ids": [e.input_ids for e in examples], "labels": [e.labels for e in examples]}


_CACHE_FORMAT = 2
"""Bumped whenever the encoding code changes its output, so older caches are not reused."""

_SPEC_FIELDS_NOT_IN_KEY = {
    "name",
    "path",
    "split",
    "validation_split",
    "validation_path",
    "packing",
    "tokenize_processes",
}
"""DatasetSpec fields that do not change the tokenised rows (the data itself is keyed separately,
the validation split is cut after loading, a validation file is tokenised as a dataset of its own,
packing is keyed as resolved). Any other field, present
or future, is in the key."""


def tokenize_processes(n_records: int, wanted: int | None = None) -> int:
    """Processes to tokenise with: dataset.tokenizeProcesses, else the CPUs available; at most one
    per record batch, so a small dataset is tokenised in this process without forking."""
    procs = wanted or available_cpus()
    return max(1, min(procs, -(-n_records // _PACK_BATCH_RECORDS)))


def _encoder(spec: DatasetSpec) -> Any:
    return _text_batch if spec.format == "text" else _supervised_batch


_FORK_STATE: tuple[Dataset, PreTrainedTokenizerBase, DatasetSpec, Path] | None = None
"""What forked tokenizer processes inherit instead of receiving it pickled."""


def _tokenize_shard(index: int, start: int, end: int) -> str:
    """Tokenise records[start:end] into `<folder>/shard-<index>.arrow`; returns the file name."""
    assert _FORK_STATE is not None
    records, tokenizer, spec, folder = _FORK_STATE
    name = f"shard-{index:05d}.arrow"
    records.select(range(start, end)).map(
        _encoder(spec),
        batched=True,
        batch_size=_PACK_BATCH_RECORDS,
        remove_columns=records.column_names,
        fn_kwargs={"tokenizer": tokenizer, "spec": spec},
        cache_file_name=str(folder / name),
        load_from_cache_file=False,
        desc=f"tokenizing ({spec.format}, shard {index})",
    )
    return name


def _shard_bounds(n_records: int, procs: int) -> list[tuple[int, int]]:
    """Contiguous record ranges, one per process, cut at record-batch boundaries: packing works
    per batch, so the rows are then the same as one process would produce."""
    n_batches = -(-n_records // _PACK_BATCH_RECORDS)
    bounds, batch = [], 0
    for i in range(procs):
        count = n_batches // procs + (1 if i < n_batches % procs else 0)
        start, batch = batch * _PACK_BATCH_RECORDS, batch + count
        bounds.append((start, min(batch * _PACK_BATCH_RECORDS, n_records)))
    return [(a, b) for a, b in bounds if b > a] or [(0, 0)]


def tokenize_into(
    folder: Path, records: Dataset, tokenizer: PreTrainedTokenizerBase, spec: DatasetSpec, procs: int
) -> list[str]:
    """Tokenise records into arrow shard files under folder, with `procs` forked processes."""
    global _FORK_STATE
    bounds = _shard_bounds(len(records), procs)
    _FORK_STATE = (records, tokenizer, spec, folder)
    try:
        if len(bounds) == 1:
            return [_tokenize_shard(0, *bounds[0])]
        # Each process runs the Rust tokenizer on one thread: N processes already use N CPUs, and
        # a tokenizer that ran threads before the fork would warn and fall back in every child.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        context = multiprocessing.get_context("fork")
        # The parent's garbage is freed here, and what the children inherit is frozen: a child
        # never collects it. Collecting inherited objects in a child (finalisers of torch,
        # tokenizer or thread state that only the parent owns) segfaulted the children now and
        # then (a BrokenProcessPool in a test run after many others had left threads behind).
        gc.collect()
        gc.freeze()
        try:
            with ProcessPoolExecutor(len(bounds), mp_context=context) as pool:
                futures = [pool.submit(_tokenize_shard, i, a, b) for i, (a, b) in enumerate(bounds)]
                return [f.result() for f in futures]
        finally:
            gc.unfreeze()
    finally:
        _FORK_STATE = None


def tokenizer_identity(tokenizer: PreTrainedTokenizerBase) -> str:
    """A hash of everything in the tokenizer that decides the ids it produces."""
    state: dict[str, Any] = {
        "class": type(tokenizer).__name__,
        "chat_template": tokenizer.chat_template,
        "special": {k: str(v) for k, v in sorted(tokenizer.special_tokens_map.items())},
        "eos": tokenizer.eos_token_id,
    }
    if isinstance(tokenizer, PreTrainedTokenizerFast):
        state["backend"] = tokenizer.backend_tokenizer.to_str()
    else:
        state["vocab"] = sorted(tokenizer.get_vocab().items())
        state["name"] = tokenizer.name_or_path
    return hashlib.sha256(json.dumps(state, sort_keys=True, default=str).encode()).hexdigest()


def data_identity(spec: DatasetSpec) -> dict[str, Any]:
    """The data's identity without reading it: each file's path, size and mtime, or the hub id."""
    if spec.name:
        return {"hub": spec.name, "split": spec.split}
    assert spec.path is not None
    _, files = data_files(Path(spec.path))
    stats = [(f, os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in files]
    return {
        "files": [{"path": os.path.abspath(f), "size": size, "mtime_ns": mtime} for f, size, mtime in stats]
    }


def cache_key(spec: DatasetSpec, tokenizer: PreTrainedTokenizerBase, data: dict[str, Any]) -> str:
    """Key of a tokenised dataset: data identity, tokenizer identity and the encoding settings."""
    settings = spec.model_dump(exclude=_SPEC_FIELDS_NOT_IN_KEY)
    settings["packs"] = spec.packs
    payload = {
        "format": _CACHE_FORMAT,
        "batch": _PACK_BATCH_RECORDS,
        "data": data,
        "tokenizer": tokenizer_identity(tokenizer),
        "settings": settings,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:32]


def default_cache_root() -> Path:
    """Next to the `datasets` cache, which the operator puts on the shared storage (HF_HOME)."""
    import datasets

    return Path(datasets.config.HF_DATASETS_CACHE) / "llmtrain-tokenized"


def _require_rows(sequences: Dataset, spec: DatasetSpec) -> Dataset:
    if len(sequences) == 0:
        raise DataError(
            f"dataset {spec.name or spec.path!r} produced no training sequences "
            f"(format {spec.format}, maxSeqLength {spec.max_seq_length}): is it empty or too short?"
        )
    return sequences


def tokenize(
    records: Dataset, tokenizer: PreTrainedTokenizerBase, spec: DatasetSpec, procs: int | None = None
) -> Dataset:
    """Records → a dataset of `input_ids` and `labels` columns, per dataset.format, uncached (in
    `datasets`' temporary folder); `procs` defaults to tokenize_processes()."""
    from datasets.fingerprint import get_temporary_cache_files_directory

    folder = Path(get_temporary_cache_files_directory()) / uuid.uuid4().hex
    folder.mkdir()
    shards = tokenize_into(
        folder, records, tokenizer, spec, procs or tokenize_processes(len(records), spec.tokenize_processes)
    )
    return _require_rows(_open_shards(folder, shards), spec)


def _open_shards(folder: Path, names: Sequence[str]) -> Dataset:
    from datasets import Dataset, concatenate_datasets

    shards = [Dataset.from_file(str(folder / name)) for name in names]
    return shards[0] if len(shards) == 1 else concatenate_datasets(shards)


def _load_cached(folder: Path) -> Dataset | None:
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    return _open_shards(folder, manifest["shards"])


def cached_tokenize(
    spec: DatasetSpec, tokenizer: PreTrainedTokenizerBase, cache_root: Path | None = None
) -> Dataset:
    """The dataset's tokenised rows, from the cache when a run already tokenised the same data
    with the same tokenizer and settings (so retries and resumes skip the work).

    A miss tokenises with every available CPU into a private folder and renames it into place, so
    a concurrent rank or retry never reads a half-written cache (the first rename wins).
    """
    root = cache_root or default_cache_root()
    records = None
    data = data_identity(spec)
    if spec.name:  # a hub dataset: its local copy's fingerprint says which revision was fetched
        records = load_records(spec)
        data["fingerprint"] = records._fingerprint
    key = cache_key(spec, tokenizer, data)
    final = root / key
    sequences = _load_cached(final)
    if sequences is not None:
        log.info("tokenised dataset cache hit: %s (%d sequences)", key, len(sequences))
        return _require_rows(sequences, spec)
    records = load_records(spec) if records is None else records
    procs = tokenize_processes(len(records), spec.tokenize_processes)
    log.info("tokenising %d records with %d processes into cache %s", len(records), procs, key)
    started = time.monotonic()
    root.mkdir(parents=True, exist_ok=True)
    staging = root / f".{key}.{uuid.uuid4().hex}.tmp"
    staging.mkdir()
    try:
        shards = tokenize_into(staging, records, tokenizer, spec, procs)
        (staging / "manifest.json").write_text(json.dumps({"shards": shards}))
        try:
            os.rename(staging, final)
        except OSError:  # another rank or attempt published the same key first: use theirs
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    sequences = _load_cached(final)
    assert sequences is not None
    log.info("tokenised %d sequences in %.1f s", len(sequences), time.monotonic() - started)
    return _require_rows(sequences, spec)


@dataclass(frozen=True)
class SequenceData:
    """The tokenized training (and optional validation) sequences."""

    train: Dataset
    validation: Dataset | None
    fixed_label_count: bool
    """True when every sequence has the same number of trained tokens (packed text): the loop then
    skips counting them across ranks at every step."""


def validation_spec(spec: DatasetSpec) -> DatasetSpec:
    """dataset.validationPath as a dataset of its own: the same format and encoding settings, so it
    is tokenised like the training data and cached under a key of its own files."""
    assert spec.validation_path is not None
    return spec.model_copy(update={"name": None, "path": spec.validation_path, "validation_path": None})


def build_sequences(
    spec: DatasetSpec, tokenizer: PreTrainedTokenizerBase, seed: int, cache_root: Path | None = None
) -> SequenceData:
    sequences = cached_tokenize(spec, tokenizer, cache_root)
    validation = None
    if spec.validation_path is not None:
        validation = cached_tokenize(validation_spec(spec), tokenizer, cache_root)
    elif spec.validation_split > 0 and len(sequences) >= 2:
        parts = sequences.train_test_split(test_size=spec.validation_split, seed=seed, shuffle=True)
        sequences, validation = parts["train"], parts["test"]
    return SequenceData(sequences, validation, fixed_label_count=spec.format == "text" and spec.packs)


# ----------------------------------------------------------------------------- batching


def collate(
    examples: Sequence[dict[str, list[int]]], pad_id: int, multiple_of: int = 8
) -> dict[str, torch.Tensor]:
    """Right-pad to the longest sequence (rounded up to `multiple_of`); padding gets label -100.

    Without padding (packed text) there is no attention mask: the model's plain causal mask is
    cheaper than an all-ones padding mask. Packed examples (rows with `position_ids`) get no
    attention mask either: Hugging Face models derive a block-diagonal causal mask from the
    position restarts when the mask is absent (`masking_utils.find_packed_sequence_indices`, for
    the default sdpa attention and eager; flash-attention only with one row per micro-batch), and
    a mask would switch that off; flex_attention (`model.packed_attention`, on GPUs) turns the
    same restarts into a BlockMask. Their padding is one more segment of its own, with its own
    positions, that no real token attends to (and that `input_token_count` still counts).
    """
    longest = max(len(e["input_ids"]) for e in examples)
    length = -(-longest // multiple_of) * multiple_of
    packed = "position_ids" in examples[0]
    if all(len(e["input_ids"]) == length for e in examples):  # no padding: one tensor per field
        return {
            key: torch.tensor([e[key] for e in examples], dtype=torch.long)
            for key in ("input_ids", "labels", "position_ids")
            if key in examples[0]
        }
    input_ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), length), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), length), dtype=torch.long)
    position_ids = torch.zeros((len(examples), length), dtype=torch.long)
    for row, example in enumerate(examples):
        n = len(example["input_ids"])
        input_ids[row, :n] = torch.tensor(example["input_ids"], dtype=torch.long)
        labels[row, :n] = torch.tensor(example["labels"], dtype=torch.long)
        attention_mask[row, :n] = 1
        if packed:
            position_ids[row, :n] = torch.tensor(example["position_ids"], dtype=torch.long)
            position_ids[row, n:] = torch.arange(length - n)
    if packed:
        return {"input_ids": input_ids, "labels": labels, "position_ids": position_ids}
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}


def _row_examples(rows: dict[str, list[list[int]]]) -> list[dict[str, list[int]]]:
    """Column slices of the sequence dataset → one dict per row, for `collate`."""
    keys = [key for key in ("input_ids", "labels", "position_ids") if key in rows]
    return [dict(zip(keys, values, strict=True)) for values in zip(*(rows[k] for k in keys), strict=True)]


@dataclass(frozen=True)
class DataPosition:
    """Where the run is in the global sample order: samples of `epoch` consumed by all ranks."""

    epoch: int = 0
    offset: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DataPosition:
        return cls(epoch=int(data["epoch"]), offset=int(data["offset"]))


class DistributedBatches:
    """This rank's micro-batches in a seeded global order (a distributed sampler that resumes).

    Epoch e visits the samples in `randperm(n, seed + e)`; every global micro-batch of
    micro_batch × world_size samples is cut into world_size contiguous slices, one per rank.
    The incomplete global batch at the end of an epoch is dropped, so all ranks take the same
    number of steps.
    """

    def __init__(
        self,
        dataset: Dataset,
        micro_batch: int,
        rank: int,
        world_size: int,
        seed: int,
        pad_id: int,
        position: DataPosition = DataPosition(),
        multiple_of: int = 8,
    ) -> None:
        self.dataset = dataset
        self.multiple_of = multiple_of
        self.micro_batch = micro_batch
        self.rank = rank
        self.seed = seed
        self.pad_id = pad_id
        self.global_batch = micro_batch * world_size
        self.batches_per_epoch = len(dataset) // self.global_batch
        if self.batches_per_epoch == 0:
            raise DataError(
                f"the dataset has {len(dataset)} sequences, fewer than one global micro-batch "
                f"(microBatchSize {micro_batch} × {world_size} workers); add data or lower the batch size"
            )
        # A position saved with another world size may fall inside a global batch: round down, so
        # a few samples repeat rather than being skipped.
        offset = min(position.offset, self.batches_per_epoch * self.global_batch)
        self.position = DataPosition(position.epoch, offset - offset % self.global_batch)
        self._order: list[int] = []
        self._order_epoch = -1

    def _epoch_order(self, epoch: int) -> list[int]:
        if self._order_epoch != epoch:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            self._order = torch.randperm(len(self.dataset), generator=generator).tolist()
            self._order_epoch = epoch
        return self._order

    def next_batch(self) -> dict[str, torch.Tensor]:
        """The next micro-batch for this rank, advancing the shared position."""
        epoch, offset = self.position.epoch, self.position.offset
        if offset >= self.batches_per_epoch * self.global_batch:
            epoch, offset = epoch + 1, 0
        start = offset + self.rank * self.micro_batch
        indices = self._epoch_order(epoch)[start : start + self.micro_batch]
        rows = self.dataset[indices]
        self.position = DataPosition(epoch, offset + self.global_batch)
        return collate(_row_examples(rows), self.pad_id, self.multiple_of)


def evaluation_batches(
    dataset: Dataset, micro_batch: int, rank: int, world_size: int, pad_id: int, multiple_of: int = 8
) -> Iterator[dict[str, torch.Tensor]]:
    """This rank's share of the validation set, the same number of batches on every rank."""
    per_rank = len(dataset) // world_size
    micro_batch = max(1, min(micro_batch, per_rank))
    for start in range(0, per_rank - micro_batch + 1, micro_batch):
        first = rank * per_rank + start
        rows = dataset[first : first + micro_batch]
        yield collate(_row_examples(rows), pad_id, multiple_of)
