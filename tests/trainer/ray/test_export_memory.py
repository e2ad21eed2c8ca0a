"""Peak memory of the end-of-run export on 2 FSDP2 workers, against the model's size.

Each rank samples its own resident set size (/proc/self/statm) while the built-in mode's
`TrainingRun._export` runs; the peak above the level just before is what the export cost. A
gathered full state dict costs at least the model's fp32 size on rank 0 (plus the serialised
bytes); streaming costs about one tensor. The model (about 180 MB) is big enough to stand far
above the noise: gloo and the allocator keep some 20 MB of buffers whatever the model size.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from llmtrain.api.trainer_config import TrainerConfig
from llmtrain_trainer.distributed import WorkerEnv
from llmtrain_trainer.lifecycle import Lifecycle, LoopOptions
from llmtrain_trainer.modes import mode_for
from llmtrain_trainer.modes.builtin import TrainingRun
from llmtrain_trainer.strategies.fsdp import FsdpStrategy
from llmtrain_trainer.tokenizer import load_tokenizer
from transformers import AutoModelForCausalLM

from tests.support.trainer import TINY_LLAMA, run_on_workers, tiny_config

pytestmark = pytest.mark.slow

MODEL = {**TINY_LLAMA, "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 16}
PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


class PeakSampler:
    """Samples this process's resident size every millisecond on a thread."""

    def __init__(self) -> None:
        self.peak = resident_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, resident_bytes())
            time.sleep(0.001)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, resident_bytes())


def export_and_measure(loop_config: dict[str, Any]) -> None:
    config = TrainerConfig.model_validate(loop_config["trainer_config"])
    env = WorkerEnv.from_ray_context()
    strategy = FsdpStrategy(config, env, total_steps=1)
    model_bytes = sum(p.numel() * p.element_size() for p in strategy.model.parameters())
    run_dir = Path(loop_config["run_dir"])
    lifecycle = Lifecycle(config, env, run_dir, LoopOptions(log_lines=False), mode_for("builtin"))
    run = TrainingRun(config, env, run_dir, lifecycle)
    tokenizer = load_tokenizer(config.model)
    gc.collect()
    # Hand the heap's free memory back to the OS, so that reuse of memory freed earlier (rank 0
    # built the whole model to initialise it) cannot hide what the export allocates.
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    before = resident_bytes()
    started = time.monotonic()
    with PeakSampler() as sampler:
        run._export(strategy, tokenizer, trained=True)
    report = {
        "model_bytes": model_bytes,
        "before": before,
        "peak_delta": sampler.peak - before,
        "seconds": time.monotonic() - started,
    }
    Path(loop_config["run_dir"], f"memory-rank{env.rank}.json").write_text(json.dumps(report))


def test_export_peak_memory_is_far_below_the_model_size(ray_address: str, storage: Path) -> None:
    config = tiny_config(storage, "export-memory", model={"config": MODEL}, checkpoint={"export": True})
    run_on_workers(export_and_measure, config, run_dir=str(storage))
    reports = [json.loads((storage / f"memory-rank{rank}.json").read_text()) for rank in range(2)]
    for rank, report in enumerate(reports):
        fraction = report["peak_delta"] / report["model_bytes"]
        print(
            f"rank {rank}: export peak +{report['peak_delta'] / 2**20:.1f} MiB for a "
            f"{report['model_bytes'] / 2**20:.1f} MiB model ({fraction:.2f}×) in {report['seconds']:.1f} s"
        )
        # A full gathered copy would be 1.0× on rank 0; one streamed tensor is about 0.02×.
        assert fraction < 0.2, (rank, report)
    export = storage / "export"
    assert AutoModelForCausalLM.from_pretrained(export).num_parameters() > 0
