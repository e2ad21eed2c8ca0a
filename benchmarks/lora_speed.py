"""LoRA against full training: tokens/s of each on the same model, side by side in one run (CPU).

Both are built through the trainer's own FSDP2 strategy (`make_strategy`, one gloo process, no Ray)
on the same model, batches, micro-batch and sequence length; LoRA is r16 on the default target
modules, as benchmarks/gpu_mfu.py runs it on a GPU. Only `forward_backward` + `step` is timed,
after warm-up steps; the two alternate step by step and the fastest step of each counts, which
filters out load from other processes on a shared machine. One torch thread by default: on a busy
2-core machine more threads made every step 20x slower and noisier.

LoRA skips the weight-gradient matmuls of its frozen base (4 instead of 6 FLOPs per weight and
token), so a matmul-bound step gains up to 1.5x, less the adapters' own work. Two precisions:

- fp32: what a CPU worker runs (the trainer computes in fp32 on CPUs);
- bf16: the compute dtype a GPU gets, forced here: FSDP2's mixed precision and a frozen base held
  in bf16, as on a GPU. A CPU's bf16 matmuls are not a GPU's (their speed relative to the
  elementwise work, and to fp32, differs), so this shows the direction, not the GPU's ratio.

    python benchmarks/lora_speed.py   # one lora_speedup_<precision>=<LoRA/full tokens/s> line each
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.support

from llmtrain_trainer.distributed import WorkerEnv
from llmtrain_trainer.strategies import make_strategy
from llmtrain_trainer.strategies.base import Strategy

from tests.support.trainer import tiny_config

# Wide enough that matmuls dominate a step, small enough for a loaded 2-core machine.
MODEL: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 256,
    "hidden_size": 192,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 512,
}
PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build(storage: Path, method: str, dtype: torch.dtype, args: argparse.Namespace) -> Strategy:
    config = tiny_config(
        storage,
        f"{method}-{dtype}",
        scaling={"numWorkers": 1},
        model={"config": MODEL, "tokenizer": "byte-level"},
        dataset={"maxSeqLength": args.seq},
        method={"type": "lora", "lora": {"rank": 16}} if method == "lora" else {"type": "full"},
        training={"microBatchSize": args.micro_batch, "compile": False, "precision": "bf16"},
    )
    env = WorkerEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    with mock.patch("llmtrain_trainer.strategies.base.compute_dtype", lambda *_: dtype):
        strategy = make_strategy(config, env, total_steps=1 << 20)
    strategy.train()
    return strategy


def step_seconds(strategy: Strategy, batch: dict[str, torch.Tensor]) -> float:
    """One optimizer step of one micro-batch, timed."""
    start = time.perf_counter()
    strategy.forward_backward(batch, loss_scale=1.0 / batch["input_ids"].numel(), last_micro_batch=True)
    strategy.step()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=8, help="timed steps of each, alternating")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: steadier on a busy machine)"
    )
    parser.add_argument("--precision", choices=sorted(PRECISIONS), action="append")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ids = torch.randint(
        0, MODEL["vocab_size"], (args.micro_batch, args.seq), generator=torch.Generator().manual_seed(0)
    )
    batch = {"input_ids": ids, "labels": ids.clone()}
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            for name in args.precision or ["fp32", "bf16"]:
                dtype = PRECISIONS[name]
                strategies = {method: build(Path(tmp), method, dtype, args) for method in ("full", "lora")}
                times: dict[str, list[float]] = {method: [] for method in strategies}
                for round_ in range(args.warmup + args.steps):
                    for method, strategy in strategies.items():  # alternating, step by step
                        seconds = step_seconds(strategy, batch)
                        if round_ >= args.warmup:
                            times[method].append(seconds)
                # Other processes only ever add time: the fastest step is the least disturbed.
                best = {method: batch["input_ids"].numel() / min(values) for method, values in times.items()}
                print(
                    f"{name}: full {best['full']:.0f} tokens/s, LoRA r16 {best['lora']:.0f} tokens/s "
                    f"({args.micro_batch}x{args.seq} tokens a step, fastest of {args.steps} alternate steps)"
                )
                print(f"lora_speedup_{name}={best['lora'] / best['full']:.2f}", flush=True)
        finally:
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
