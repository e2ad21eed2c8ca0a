"""Overhead of llmtrain's training loop over a minimal hand-written FSDP2 loop (CPU, 2 workers).

Two workloads, measured side by side in the same run:

- text: packed tiny-stories sequences (every row full, no attention mask, no counting needed);
- sft: padded instruction data (tiny-instructions, each row padded to its batch's longest, with
  an attention mask and the prompt masked out of the loss): the loop counts tokens each step.

Both loops train the tiny Llama of examples/tiny-cpu.yaml on the same sequences, with the same
micro-batch, sequence length, optimizer and schedule, under Ray Train on a local Ray instance. Only
the stepping is timed: worker start-up, data preparation, checkpoint writes and the export are
excluded from both; the minimal loop even builds its batches before the clock starts. Each timed
loop runs in freshly started workers; the loops alternate `--repeats` times and the fastest run of
each counts, which filters out load from other processes on a shared machine.

On a CPU this measures Python-side overhead only: a host-device sync costs nothing here, so the
ratio is a lower bound of what a GPU would show.

    python benchmarks/trainer_overhead.py   # one overhead_ratio_<workload>=<ours/minimal> line each
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
from llmtrain.api.trainer_config import TrainerConfig
from llmtrain_trainer.data import IGNORE_INDEX, build_sequences, collate
from llmtrain_trainer.distributed import WorkerEnv
from llmtrain_trainer.lifecycle import LoopOptions
from llmtrain_trainer.main import run_training
from llmtrain_trainer.model import build_from_config, model_config
from llmtrain_trainer.optim import lr_factor, warmup_steps
from llmtrain_trainer.rundir import RunResult
from llmtrain_trainer.tokenizer import load_tokenizer
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.support

from tests.support.trainer import REPO, TINY_LLAMA, run_on_workers

WORKLOADS: dict[str, dict[str, Any]] = {
    "text": {"path": str(REPO / "examples/data/tiny-stories.txt"), "format": "text", "maxSeqLength": 128},
    "sft": {
        "path": str(REPO / "examples/data/tiny-instructions.jsonl"),
        "format": "instruction",
        "maxSeqLength": 128,
        "packing": False,  # padded rows, as the minimal loop builds them (packed_sft.py compares)
    },
}


def benchmark_config(storage: Path, name: str, steps: int, workload: str) -> TrainerConfig:
    return TrainerConfig.model_validate(
        {
            "job": {"name": name},
            "runName": name,
            "storagePath": str(storage),
            "scaling": {"numWorkers": 2, "useGpu": False, "cpusPerWorker": 1},
            "model": {"config": TINY_LLAMA, "tokenizer": "byte-level"},
            "dataset": WORKLOADS[workload],
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
    env = WorkerEnv.from_ray_context()
    rank, world = env.rank, env.world_size
    training = config.training
    steps = training.max_steps or 1
    tokenizer = load_tokenizer(config.model)
    sequences = build_sequences(config.dataset, tokenizer, training.seed).train
    batch_size = training.micro_batch_size
    batches = []  # every step's micro-batch, tensorised before the clock starts
    for step in range(steps):
        first = ((step * world + rank) * batch_size) % (len(sequences) - batch_size)
        rows = sequences[first : first + batch_size]
        examples = [
            {"input_ids": ids, "labels": labels}
            for ids, labels in zip(rows["input_ids"], rows["labels"], strict=True)
        ]
        batches.append(collate(examples, tokenizer.pad_token_id))
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
    started = time.perf_counter()
    for batch in batches:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask")).logits
        loss = F.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]),
            batch["labels"][:, 1:].reshape(-1),
            ignore_index=IGNORE_INDEX,
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), training.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    loss.item()
    seconds = time.perf_counter() - started
    if rank == 0:
        Path(loop_config["report"]).write_text(json.dumps(seconds))


def time_minimal(storage: Path, steps: int, name: str, workload: str) -> float:
    config = benchmark_config(storage, name, steps, workload)
    report = storage / f"{name}.json"
    run_on_workers(minimal_fsdp_loop, config, report=str(report))
    return float(json.loads(report.read_text()))


def time_ours(storage: Path, steps: int, name: str, workload: str) -> float:
    config = benchmark_config(storage, name, steps, workload)
    run_training(config, LoopOptions(log_lines=False))
    result = RunResult.read(Path(config.run_dir))
    assert result is not None and result.train_seconds is not None, "the run left no result"
    return result.train_seconds


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    args = parser.parse_args()
    os.environ.pop("RAY_ADDRESS", None)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory(prefix="llmtrain-bench-") as tmp:
            storage = Path(tmp)
            runs: dict[str, dict[str, list[float]]] = {w: {"minimal": [], "ours": []} for w in args.workloads}
            for repeat in range(args.repeats):
                for workload in args.workloads:
                    run = runs[workload]
                    run["minimal"].append(
                        time_minimal(storage, args.steps, f"minimal-{workload}-{repeat}", workload)
                    )
                    run["ours"].append(time_ours(storage, args.steps, f"ours-{workload}-{repeat}", workload))
                    print(
                        f"repeat {repeat} {workload}: minimal {run['minimal'][-1]:.3f}s, "
                        f"llmtrain {run['ours'][-1]:.3f}s",
                        flush=True,
                    )
    finally:
        ray.shutdown()
    print(f"steps={args.steps} repeats={args.repeats} workers=2 device=cpu")
    for workload, run in runs.items():
        minimal, ours = min(run["minimal"]), min(run["ours"])
        print(f"minimal_fsdp_seconds_{workload}={minimal:.3f}")
        print(f"llmtrain_loop_seconds_{workload}={ours:.3f}")
        print(f"overhead_ratio_{workload}={ours / minimal:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
