"""Parallel tokenisation gives the one-process rows, and the cache on the shared storage is keyed
by data, tokenizer and settings so that a retry or resume never tokenises again."""

from __future__ import annotations

import gc
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from datasets import Dataset
from llmtrain.api.spec import DatasetSpec
from llmtrain_trainer import data
from llmtrain_trainer.cpus import available_cpus, cgroup_cpu_limit
from llmtrain_trainer.data import cache_key, data_identity, tokenize, tokenize_processes
from llmtrain_trainer.tokenizer import byte_level_tokenizer

from tests.support.trainer import REPO


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    return byte_level_tokenizer()


@pytest.mark.parametrize(
    ("fields", "records"),
    [
        (
            {"format": "text", "max_seq_length": 16},
            {"text": [f"document {i} " * (i % 7 + 1) for i in range(230)]},
        ),
        (
            {"format": "instruction", "max_seq_length": 64, "packing": True},
            {
                "prompt": [f"q{i}?" for i in range(230)],
                "response": [f"a{i}." * (i % 3 + 1) for i in range(230)],
            },
        ),
    ],
)
def test_parallel_rows_equal_one_process(
    tokenizer, monkeypatch: pytest.MonkeyPatch, fields: dict[str, object], records: dict[str, list[str]]
) -> None:  # type: ignore[no-untyped-def]
    # Small record batches so 230 records make 5 batches over 3 processes; packing works per batch,
    # so shards cut anywhere else than at batch boundaries would pack different rows.
    monkeypatch.setattr(data, "_PACK_BATCH_RECORDS", 50)
    dataset = Dataset.from_dict(records)
    spec = DatasetSpec.model_validate({"path": "x", **fields})
    one = tokenize(dataset, tokenizer, spec, procs=1)
    three = tokenize(dataset, tokenizer, spec, procs=3)
    assert len(three.cache_files) == 3  # really three shards, written by three processes
    assert one.to_dict() == three.to_dict()


_TOKENIZE_SHARD = data._tokenize_shard


def _shard_recording_frozen(index: int, start: int, end: int) -> str:
    """Runs in a forked tokeniser: records how many objects it sees frozen, then does the work."""
    folder = Path(os.environ["TEST_FROZEN_DIR"])
    (folder / f"{os.getpid()}-{index}").write_text(str(gc.get_freeze_count()))
    return _TOKENIZE_SHARD(index, start, end)


def test_the_forked_tokenisers_never_collect_what_they_inherited(
    tokenizer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """A child collecting the parent's objects runs their finalisers where their state is not
    theirs (threads, locks): the children of a long test run segfaulted so. Each child must see
    the parent's objects frozen, and the parent must end unfrozen."""
    monkeypatch.setenv("TEST_FROZEN_DIR", str(tmp_path))
    monkeypatch.setattr(data, "_PACK_BATCH_RECORDS", 50)
    monkeypatch.setattr(data, "_tokenize_shard", _shard_recording_frozen)
    dataset = Dataset.from_dict({"text": [f"document {i} " * (i % 7 + 1) for i in range(230)]})
    spec = DatasetSpec.model_validate({"path": "x", "format": "text", "max_seq_length": 16})
    tokenize(dataset, tokenizer, spec, procs=2)
    counts = {f.name: int(f.read_text()) for f in tmp_path.iterdir()}
    assert len(counts) == 2, counts
    assert all(name.split("-")[0] != str(os.getpid()) for name in counts)  # really forked
    assert all(count > 1000 for count in counts.values()), counts
    assert gc.get_freeze_count() == 0


def _corpus(path: Path, text: str = "Once upon a time.\n\nThe end.\n") -> Path:
    path.write_text(text)
    return path


def test_cache_key_follows_data_tokenizer_and_settings(tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    corpus = _corpus(tmp_path / "corpus.txt")
    spec = DatasetSpec(path=str(corpus), max_seq_length=64)

    def key(spec: DatasetSpec = spec, tok=tokenizer) -> str:  # type: ignore[no-untyped-def]
        return cache_key(spec, tok, data_identity(spec))

    base = key()
    # Unchanged inputs, recomputed: same key; fields that do not change the rows: same key.
    assert key() == base
    assert key(spec.model_copy(update={"validation_split": 0.1})) == base
    assert key(spec.model_copy(update={"tokenize_processes": 3})) == base
    assert (
        key(DatasetSpec(path=str(corpus), max_seq_length=64, packing=True)) == base
    )  # text packs by default
    # Settings that change the rows.
    assert key(spec.model_copy(update={"max_seq_length": 128})) != base
    assert key(spec.model_copy(update={"packing": False})) != base
    assert key(spec.model_copy(update={"text_field": "body"})) != base
    assert key(spec.model_copy(update={"format": "instruction"})) != base
    # Another tokenizer.
    other = byte_level_tokenizer()
    other.add_special_tokens({"additional_special_tokens": ["<|extra|>"]})
    assert key(tok=other) != base
    templated = byte_level_tokenizer()
    templated.chat_template = "{{ messages }}"
    assert key(tok=templated) != base
    # Changed data: new content (size), a touched file (mtime), another file.
    _corpus(corpus, "Once upon a time, longer.\n")
    assert key() != base
    changed = key()
    os.utime(corpus, ns=(1, 1))
    assert key() != changed
    _corpus(tmp_path / "more.txt")
    assert key(DatasetSpec(path=str(tmp_path), max_seq_length=64)) != key()


_BUILD = textwrap.dedent(
    """
    import json, logging, sys
    from pathlib import Path
    from llmtrain.api.spec import DatasetSpec
    from llmtrain_trainer import data
    from llmtrain_trainer.tokenizer import byte_level_tokenizer

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    calls = 0
    encode = data._text_batch

    def counted(*args, **kwargs):
        global calls
        calls += 1
        return encode(*args, **kwargs)

    data._text_batch = counted
    spec = DatasetSpec(path=sys.argv[1], max_seq_length=32)
    rows = data.build_sequences(spec, byte_level_tokenizer(), 0, cache_root=Path(sys.argv[2])).train
    print(json.dumps({"calls": calls, "rows": rows.to_dict()["input_ids"]}))
    """
)


def _build_in_new_process(corpus: Path, cache: Path) -> tuple[dict[str, object], str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "trainer_image"), str(REPO / "operator")])}
    done = subprocess.run(
        [sys.executable, "-c", _BUILD, str(corpus), str(cache)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=300,
    )
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.mark.thorough  # two fresh processes import datasets
def test_second_build_in_a_new_process_loads_the_cache(tmp_path: Path) -> None:
    corpus = _corpus(
        tmp_path / "corpus.txt", "".join(f"Story {i}: once upon a time.\n\n" for i in range(300))
    )
    cache = tmp_path / "cache"
    first, first_log = _build_in_new_process(corpus, cache)
    assert first["calls"] == 1 and "tokenising 300 records" in first_log
    second, second_log = _build_in_new_process(corpus, cache)
    assert second["calls"] == 0, second_log
    assert "tokenised dataset cache hit" in second_log
    assert second["rows"] == first["rows"]
    # One published entry, no staging folder left behind.
    assert [p.name.startswith(".") for p in cache.iterdir()] == [False]


def test_a_concurrent_writer_that_published_first_wins(
    tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    spec = DatasetSpec(path=str(_corpus(tmp_path / "corpus.txt")), max_seq_length=8)
    cache = tmp_path / "cache"
    real = data.tokenize_into
    rival: list[Dataset] = []

    def racing(*args, **kwargs):  # type: ignore[no-untyped-def]
        # Another rank publishes the same key while this one is still writing its shards.
        monkeypatch.setattr(data, "tokenize_into", real)
        rival.append(data.cached_tokenize(spec, tokenizer, cache))
        return real(*args, **kwargs)

    monkeypatch.setattr(data, "tokenize_into", racing)
    ours = data.cached_tokenize(spec, tokenizer, cache)
    assert ours.to_dict() == rival[0].to_dict()
    (entry,) = cache.iterdir()  # one published entry, our staging folder removed
    assert not entry.name.startswith(".") and ours.cache_files[0]["filename"].startswith(str(entry))


@pytest.mark.parametrize(
    ("files", "limit"),
    [
        ({"cpu.max": "400000 100000\n"}, 4),
        ({"cpu.max": "150000 100000\n"}, 2),  # 1.5 CPUs: two processes share them
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu,cpuacct/cpu.cfs_quota_us": "300000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, 3),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),
    ],
)
def test_cgroup_quota_parser(tmp_path: Path, files: dict[str, str], limit: int | None) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_cpu_limit(tmp_path) == limit


def test_a_4_cpu_pod_on_a_64_core_node_uses_4(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(64)))
    (tmp_path / "cpu.max").write_text("400000 100000\n")
    assert available_cpus(tmp_path) == 4
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert available_cpus(tmp_path) == 64
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})  # taskset / cpuset
    assert available_cpus(tmp_path) == 2


def test_process_count_is_capped_by_batches_and_overridable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data, "available_cpus", lambda: 16)
    assert tokenize_processes(5) == 1  # a tiny dataset does not fork
    assert tokenize_processes(3 * data._PACK_BATCH_RECORDS) == 3
    assert tokenize_processes(100 * data._PACK_BATCH_RECORDS) == 16
    assert tokenize_processes(100 * data._PACK_BATCH_RECORDS, wanted=2) == 2  # dataset.tokenizeProcesses


def test_a_second_build_reads_the_cache_and_the_log_says_which(
    tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    """The log tells a user whether the rows were tokenised (how many records, with how many
    processes, under which key) or read from the cache; a hit tokenises nothing."""
    text = "".join(f"paragraph {i}.\n\n" for i in range(3 * data._PACK_BATCH_RECORDS))
    spec = DatasetSpec(
        path=str(_corpus(tmp_path / "corpus.txt", text)), max_seq_length=16, tokenize_processes=2
    )
    cache = tmp_path / "shared" / "llmtrain" / "cache"  # its parents do not exist yet
    key = cache_key(spec, tokenizer, data_identity(spec))
    records = len(data.load_records(spec))
    with caplog.at_level(logging.INFO, logger=data.log.name):
        first = data.cached_tokenize(spec, tokenizer, cache)
    tokenising, tokenised = (r.getMessage() for r in caplog.records if r.name == data.log.name)
    assert tokenising == f"tokenising {records} records with 2 processes into cache {key}"
    assert re.fullmatch(rf"tokenised {len(first)} sequences in \d+\.\d s", tokenised), tokenised
    assert [p.name for p in cache.iterdir()] == [key]  # published; no staging folder left

    def no_tokenising(*args: object, **kwargs: object) -> list[str]:
        raise AssertionError("a cache hit tokenised again")

    monkeypatch.setattr(data, "tokenize_into", no_tokenising)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=data.log.name):
        second = data.cached_tokenize(spec, tokenizer, cache)
    assert [r.getMessage() for r in caplog.records if r.name == data.log.name] == [
        f"tokenised dataset cache hit: {key} ({len(first)} sequences)"
    ]
    assert second.to_dict() == first.to_dict()


def test_a_failed_tokenisation_leaves_no_staging_folder_and_an_empty_cache_still_names_the_data(
    tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    spec = DatasetSpec(path=str(_corpus(tmp_path / "corpus.txt")), max_seq_length=16)
    cache = tmp_path / "cache"
    real = data.tokenize_into

    def failing(*args: object, **kwargs: object) -> list[str]:
        raise RuntimeError("out of disk")

    monkeypatch.setattr(data, "tokenize_into", failing)
    with pytest.raises(RuntimeError, match="out of disk"):
        data.cached_tokenize(spec, tokenizer, cache)
    assert list(cache.iterdir()) == []
    monkeypatch.setattr(data, "tokenize_into", real)
    # A prompt that fills every position leaves nothing to learn: no rows, refused when tokenised
    # and again when read from the cache, naming the data.
    record = json.dumps({"prompt": "q" * 64, "response": "a"})
    empty = DatasetSpec(
        path=str(_corpus(tmp_path / "long.jsonl", record + "\n")), format="instruction", max_seq_length=16
    )
    for _ in range(2):
        with pytest.raises(data.DataError, match=f"dataset '{empty.path}' produced no training sequences"):
            data.cached_tokenize(empty, tokenizer, cache)
