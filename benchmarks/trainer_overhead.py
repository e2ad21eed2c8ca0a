"""Overhead of llmtrain's training loop over a minimal hand-written FSDP2 loop (CPU, 2 workers).

Both loops train the tiny Llama of examples/tiny-cpu.yaml on the same packed tiny-stories
sequences, with the same micro-batch, sequence length, optimizer and schedule, under Ray Train on
a local Ray instance. Only the stepping is timed: worker start-up, data preparation, checkpoint
writes and the export are excluded from both. Each timed loop runs in freshly started workers;
the two loops alternate `--repeats` times and the fastest run of each counts, which filters out
load from other processes on a shared machine.

    python benchmarks/trainer_overhead.py            # last line: overhead_ratio=<ours/minimal>
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
import ray.train
import torch
import torch.nn.functional as F
import yaml
from llmtrain.api.trainer_config import TrainerConfig
from llmtrain_trainer.data import build_sequences
from llmtrain_trainer.loop import LoopOptions
from llmtrain_trainer.main import run_training
from llmtrain_trainer.model import build_from_config, model_config
from llmtrain_trainer.optim import lr_factor, warmup_steps
from llmtrain_trainer.rundir import RESULT_FILE
from llmtrain_trainer.tokenizer import load_tokenizer
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

REPO = Path(__file__).resolve().parents[1]
# The demo's own model (examples/tiny-cpu.yaml), so tests and benchmarks train what users run.
TINY_LLAMA: dict[str, Any] = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())["spec"][
    "model"
]["config"]


def benchmark_config(storage: Path, name: str, steps: int) -> TrainerConfig:
    return TrainerConfig.model_validate(
        {
            "job": {"name": name},
            "runName": name,
            "storagePath": str(storage),
            "scaling": {"numWorkers": 2, "useGpu": False, "cpusPerWorker": 1},
            "model": {"config": TINY_LLAMA, "tokenizer": "byte-level"},
            "dataset": {"path": str(REPO / "examples/data/tiny-stories.txt"), "maxSeqLength": 128},
            "strategy": {"type": "fsdp"},
            "training": {
                "precision": "fp32",
                "maxSteps": steps,
                "microBatchSize": 8,
                "learningRate": 0.003,
                "warmupRatio": 0.05,
                "logEverySteps": 10,
            },
            "checkpoint": {"everySteps": 1_000_000, "keep": 1, "export": False},
        }
    )


def minimal_fsdp_loop(loop_config: dict[str, Any]) -> None:
    """The baseline: fully_shard per block and root, AdamW, warm-up + cosine, nothing else."""
    config = TrainerConfig.model_validate(loop_config["trainer_config"])
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    training = config.training
    steps = training.max_steps or 1
    tokenizer = load_tokenizer(config.model)
    sequences = build_sequences(config.dataset, tokenizer, training.seed).train
    rows = torch.tensor(sequences["input_ids"], dtype=torch.long)
    model = build_from_config(model_config(config.model), torch.float32, meta=False, seed=training.seed)
    mesh = init_device_mesh("cpu", (world,))
    for block in model.model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh, reshard_after_forward=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=training.learning_rate, betas=(0.9, 0.95))
    warmup = warmup_steps(training, steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, warmup=warmup, total=steps, kind=training.lr_scheduler)
    )
    batch_size = training.micro_batch_size
    started = time.perf_counter()
    for step in range(steps):
        first = ((step * world + rank) * batch_size) % (len(rows) - batch_size)
        batch = rows[first : first + batch_size]
        logits = model(input_ids=batch).logits
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), training.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    loss.item()
    seconds = time.perf_counter() - started
    if rank == 0:
        Path(loop_config["report"]).write_text(json.dumps(seconds))


def time_minimal(storage: Path, steps: int, name: str) -> float:
    config = benchmark_config(storage, name, steps)
    report = storage / f"{name}.json"
    TorchTrainer(
        minimal_fsdp_loop,
        train_loop_config={
            "trainer_config": config.model_dump(mode="json", by_alias=True),
            "report": str(report),
        },
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(name=name, storage_path=str(storage)),
    ).fit()
    return float(json.loads(report.read_text()))


def time_ours(storage: Path, steps: int, name: str) -> float:
    config = benchmark_config(storage, name, steps)
    run_training(config, LoopOptions(log_lines=False))
    result = json.loads((Path(config.run_dir) / RESULT_FILE).read_text())
    return float(result["train_seconds"])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ.pop("RAY_ADDRESS", None)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory(prefix="llmtrain-bench-") as tmp:
            storage = Path(tmp)
            minimal_runs, our_runs = [], []
            for repeat in range(args.repeats):
                minimal_runs.append(time_minimal(storage, args.steps, f"minimal-{repeat}"))
                our_runs.append(time_ours(storage, args.steps, f"ours-{repeat}"))
                print(
                    f"repeat {repeat}: minimal {minimal_runs[-1]:.3f}s, llmtrain {our_runs[-1]:.3f}s",
                    flush=True,
                )
            minimal, ours = min(minimal_runs), min(our_runs)
    finally:
        ray.shutdown()
    print(f"steps={args.steps} repeats={args.repeats} workers=2 device=cpu")
    print(f"minimal_fsdp_seconds={minimal:.3f}")
    print(f"llmtrain_loop_seconds={ours:.3f}")
    print(f"overhead_ratio={ours / minimal:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
