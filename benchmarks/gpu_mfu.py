"""GPU throughput and MFU of the llmtrain trainer: a ~1.1B Llama-style model, bf16, sequence 2048.

Trains a model built from config (the TinyLlama-1.1B shape: 22 layers, hidden 2048, GQA with 4
KV heads, vocab 32000) from scratch on every visible GPU of this machine (one is enough), once with
FSDP2 and once with DeepSpeed ZeRO-3, through the same Ray Train entrypoint as a cluster run, and
prints one line per strategy:

    device=<GPU name> gpus=<n> strategy=<fsdp|zero3> tokens_per_s=<all GPUs> mfu=<fraction>

tokens/s and MFU are the trainer's own metrics (`model.TrainingFlops`: 6 FLOPs per trainable and
4 per frozen matmul weight per token, plus 12·L·d per attended pair, over the GPU's dense bf16
peak; packed text here, so 6·N + 12·L·d·T), averaged over the steps after `--warmup` steps.
Without a CUDA device it prints why and exits 2: there is nothing to measure.

    python benchmarks/gpu_mfu.py [--steps 40] [--micro-batch 4] [--strategies fsdp zero3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from statistics import mean
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MODEL_1B = {
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}
STRATEGIES = {
    "fsdp": {"type": "fsdp", "fsdp": {"reshardAfterForward": True}},
    "zero3": {"type": "deepspeed", "deepspeed": {"zeroStage": 3}},
}


def bench_config(storage: str, name: str, gpus: int, cpus: int, args: argparse.Namespace) -> Any:
    from llmtrain.api.trainer_config import TrainerConfig

    return TrainerConfig.model_validate(
        {
            "job": {"name": f"bench-{name}"},
            "runName": f"bench-{name}",
            "storagePath": storage,
            "scaling": {"numWorkers": gpus, "useGpu": True, "cpusPerWorker": max(1, cpus // gpus - 1)},
            "model": {"config": MODEL_1B, "tokenizer": "byte-level"},
            "dataset": {"path": str(REPO / "examples/data/tiny-stories.txt"), "maxSeqLength": args.seq},
            "strategy": STRATEGIES[name],
            "training": {
                "precision": "bf16",
                "maxSteps": args.steps,
                "microBatchSize": args.micro_batch,
                "learningRate": 3e-4,
                "warmupRatio": 0.1,
                "gradientCheckpointing": args.gradient_checkpointing,
                "logEverySteps": 1,
            },
            "checkpoint": {"everySteps": 1_000_000, "keep": 1, "export": False},
        }
    )


def measured(run_dir: Path, warmup: int) -> tuple[float, float | None]:
    """Mean tokens/s (all GPUs) and MFU over the steps after the warm-up."""
    from llmtrain_trainer.progress import read_records, step_history
    from llmtrain_trainer.rundir import METRICS_FILE

    steps = [r for r in step_history(read_records(run_dir / METRICS_FILE)) if r.step > warmup]
    rate = mean(r.tokens_per_second or 0.0 for r in steps)
    mfus = [r.mfu for r in steps if r.mfu is not None]
    return rate, (mean(mfus) if mfus else None)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=10, help="steps left out of the averages")
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--strategies", nargs="+", choices=list(STRATEGIES), default=list(STRATEGIES))
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print(
            "gpu_mfu: no GPU present (torch.cuda.is_available() is False); this benchmark measures "
            "CUDA devices only, so nothing was measured",
            file=sys.stderr,
        )
        return 2

    import ray
    from llmtrain_trainer.lifecycle import LoopOptions
    from llmtrain_trainer.main import run_training

    gpus, device = torch.cuda.device_count(), torch.cuda.get_device_name(0)
    cpus = os.cpu_count() or gpus
    os.environ.pop("RAY_ADDRESS", None)
    ray.init(num_gpus=gpus, num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    failures = 0
    try:
        with tempfile.TemporaryDirectory(prefix="llmtrain-gpu-bench-") as storage:
            for name in args.strategies:
                config = bench_config(storage, name, gpus, cpus, args)
                prefix = f"device={device.replace(' ', '_')} gpus={gpus} strategy={name}"
                try:
                    run_training(config, LoopOptions(log_lines=False, checkpoint_at_end=False))
                except Exception as exc:  # report it and measure the other strategy
                    failures += 1
                    print(f"{prefix} error={exc}", flush=True)
                    continue
                rate, mfu = measured(Path(config.run_dir), args.warmup)
                print(
                    f"{prefix} tokens_per_s={rate:.0f} mfu={'unknown' if mfu is None else f'{mfu:.3f}'}",
                    flush=True,
                )
    finally:
        ray.shutdown()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
