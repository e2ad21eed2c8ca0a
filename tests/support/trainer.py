"""What the trainer tests and benchmarks share: tiny TrainerConfigs, readers of a run's files, and
the harnesses written once: start a function on Ray Train workers, kill a worker mid-run."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import yaml
from llmtrain.api.trainer_config import TrainerConfig
from llmtrain_trainer.metrics import MetricsRecord
from llmtrain_trainer.progress import read_records, step_history
from llmtrain_trainer.rundir import METRICS_FILE, RunResult

REPO = Path(__file__).resolve().parents[2]
TINY_STORIES = REPO / "examples" / "data" / "tiny-stories.txt"

# The demo's own model (examples/tiny-cpu.yaml), so tests and benchmarks train what users run.
TINY_LLAMA: dict[str, Any] = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())["spec"][
    "model"
]["config"]


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in overrides.items():
        merged[key] = (
            _merge(merged[key], value)
            if isinstance(value, dict) and isinstance(merged.get(key), dict)
            else value
        )
    return merged


def tiny_config(storage: Path, name: str, **overrides: Any) -> TrainerConfig:
    """2 CPU workers, FSDP2, a 2-layer Llama of hidden size 64 on the shipped tiny stories.

    Overrides are camelCase wire fields, merged recursively (e.g. strategy={"type": "ddp"}).
    """
    document: dict[str, Any] = {
        "job": {"name": name, "namespace": "test"},
        "runName": name,
        "storagePath": str(storage),
        "scaling": {"numWorkers": 2, "useGpu": False, "cpusPerWorker": 1},
        "maxWorkerFailures": 0,
        "collectiveTimeoutSeconds": 300,
        "model": {"config": TINY_LLAMA, "tokenizer": "byte-level"},
        "dataset": {"path": str(TINY_STORIES), "format": "text", "maxSeqLength": 64},
        "strategy": {"type": "fsdp"},
        "training": {
            "precision": "fp32",
            "maxSteps": 30,
            "microBatchSize": 8,
            "learningRate": 0.003,
            "warmupRatio": 0.1,
            "lrScheduler": "cosine",
            "logEverySteps": 1,
        },
        "checkpoint": {"everySteps": 10, "keep": 2, "export": False},
    }
    return TrainerConfig.model_validate(_merge(document, overrides))


def save_tiny_pretrained(path: Path) -> Path:
    """A 'pretrained' checkpoint folder: a seeded tiny Llama (safetensors) and the byte tokenizer."""
    import torch
    from llmtrain.api.spec import ModelSpec
    from llmtrain_trainer.model import build_from_config, model_config
    from llmtrain_trainer.tokenizer import byte_level_tokenizer

    config = model_config(ModelSpec(config=TINY_LLAMA, tokenizer="byte-level"))
    build_from_config(config, torch.float32, meta=False, seed=7).save_pretrained(path)
    byte_level_tokenizer().save_pretrained(path)
    return path


def write_config(config: TrainerConfig, path: Path) -> Path:
    path.write_text(json.dumps(config.model_dump(mode="json", by_alias=True), indent=2))
    return path


def run_dir(config: TrainerConfig) -> Path:
    return Path(config.run_dir)


def records(config: TrainerConfig) -> list[MetricsRecord]:
    return read_records(run_dir(config) / METRICS_FILE)


def losses(config: TrainerConfig) -> dict[int, float]:
    """Step → training loss, the latest attempt winning."""
    return {r.step: r.loss for r in step_history(records(config)) if r.loss is not None}


def result(config: TrainerConfig) -> dict[str, Any]:
    """The run's result.json, read through its one type (so a field the writer lost fails here)."""
    done = RunResult.read(run_dir(config))
    assert done is not None, f"{run_dir(config)} has no readable result"
    return done.to_dict()


def training_workers() -> list[psutil.Process]:
    """This session's Ray Train worker processes (descendants of our own raylet, not anyone else's)."""
    found = []
    for process in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if any("RayTrainWorker" in part for part in process.cmdline()):
                found.append(process)
        except psutil.NoSuchProcess:
            continue
    return found


def kill_a_worker_after_checkpoint(config: TrainerConfig, killed: dict[str, int], timeout: float) -> None:
    """SIGKILL one training worker once the run has registered a checkpoint (run in a thread)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = records(config)
        checkpoints = [r.step for r in events if r.event == "checkpoint"]
        if checkpoints:
            workers = training_workers()
            if workers:
                killed["checkpoint"] = checkpoints[-1]
                killed["pid"] = workers[-1].pid
                os.kill(workers[-1].pid, signal.SIGKILL)
                return
        time.sleep(0.02)


def run_on_workers(function: Callable[[dict[str, Any]], None], config: TrainerConfig, **extra: Any) -> None:
    """Start `function` on Ray Train workers as the trainer would start its loop (the same
    `train_loop_config`, with `extra` added), on `config`'s workers, storing under its run."""
    from llmtrain_trainer.loop import loop_config
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    TorchTrainer(
        function,
        train_loop_config=loop_config(config, **extra),
        scaling_config=ScalingConfig(
            num_workers=config.scaling.num_workers,
            use_gpu=config.scaling.use_gpu,
            resources_per_worker={"CPU": config.scaling.cpus_per_worker},
        ),
        run_config=RunConfig(name=config.run_name, storage_path=config.storage_path),
    ).fit()


def run_killing_a_worker(config: TrainerConfig, killed: dict[str, int] | None = None) -> dict[str, int]:
    """Train `config` while one worker is SIGKILLed after the first registered checkpoint; what
    was killed (`checkpoint`, `pid`), also filled into `killed` for a run expected to raise."""
    from llmtrain_trainer.lifecycle import LoopOptions
    from llmtrain_trainer.main import run_training

    killed = {} if killed is None else killed
    killer = threading.Thread(target=kill_a_worker_after_checkpoint, args=(config, killed, 300), daemon=True)
    killer.start()
    try:
        run_training(config, LoopOptions(log_lines=False))
    finally:
        killer.join()
    assert killed, "no worker was killed"
    return killed


def the_one_restart(config: TrainerConfig, killed: dict[str, int], steps: int, every: int) -> int:
    """The step the run restarted from after the kill: exactly one `resumed` record, at a
    checkpoint no older than the one registered before the kill, and every later step once."""
    events = records(config)
    resumed = [r for r in events if r.event == "resumed"]
    assert len(resumed) == 1, "exactly one restart"
    restart = resumed[0].step
    assert killed["checkpoint"] <= restart < steps and restart % every == 0
    after = [r.step for r in events[events.index(resumed[0]) :] if r.event == "step"]
    assert after == list(range(restart + 1, steps + 1))
    return restart


def reference_gradients(
    config: TrainerConfig, initial: dict[str, Any], batches: list[dict[str, Any]], step_tokens: int
) -> dict[str, Any]:
    """Name → gradient of one unsharded copy of `initial` over every rank's `batches`, with the
    loss averaged over `step_tokens` as a distributed step averages it: what it must match."""
    import torch
    from llmtrain_trainer.loss import token_loss_sum
    from llmtrain_trainer.model import build_from_config, model_config

    reference = build_from_config(model_config(config.model), torch.float32, meta=False, seed=123)
    reference.load_state_dict(initial)
    loss = sum(
        token_loss_sum(
            reference(input_ids=b["input_ids"], attention_mask=b.get("attention_mask")).logits, b["labels"]
        )
        for b in batches
    )
    (loss / step_tokens).backward()
    return {name: parameter.grad for name, parameter in reference.named_parameters()}
