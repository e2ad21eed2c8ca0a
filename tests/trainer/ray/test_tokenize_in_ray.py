"""Parallel tokenisation forks from inside a Ray worker, as it does in every training run.

A Ray worker process runs threads of its own (gRPC, the core worker's event loops) when the trainer
calls `cached_tokenize`; `fork` copies only the calling thread, so a lock another thread held at
the fork would hang the child forever. The unit tests fork from a plain pytest process; this one
forks where production does, under a deadline, and compares the rows with one process's."""

from __future__ import annotations

from typing import Any

import pytest
import ray
from datasets import Dataset
from llmtrain.api.spec import DatasetSpec

pytestmark = pytest.mark.slow  # starts the session's Ray instance: half a minute for this test alone

RECORDS = {"text": [f"document {i} " * (i % 7 + 1) for i in range(230)]}
SPEC = {"path": "x", "format": "text", "max_seq_length": 16}
BATCH = 50  # small record batches, so 230 records make 5 batches and the shards really fork


def _tokenized(procs: int) -> tuple[int, int, dict[str, Any]]:
    """(threads of this process before tokenising, shard files, rows) of the records tokenised
    with `procs` processes."""
    import threading

    from llmtrain_trainer import data
    from llmtrain_trainer.tokenizer import byte_level_tokenizer

    data._PACK_BATCH_RECORDS = BATCH
    threads = threading.active_count()
    rows = data.tokenize(Dataset.from_dict(RECORDS), byte_level_tokenizer(), DatasetSpec(**SPEC), procs=procs)
    return threads, len(rows.cache_files), rows.to_dict()


def test_tokenizer_processes_fork_from_a_threaded_ray_worker(ray_address: str) -> None:
    threads, shards, in_ray = ray.get(ray.remote(_tokenized).options(num_cpus=1).remote(2), timeout=180)
    assert threads > 1, "the Ray worker ran no other thread: this test would prove nothing"
    assert shards == 2, shards  # two forked processes wrote a shard each
    _, _, here = _tokenized(1)
    assert in_ray == here
