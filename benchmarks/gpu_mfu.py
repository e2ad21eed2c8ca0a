"""GPU throughput, MFU and peak memory of the llmtrain trainer, without Ray: a ~1.1B Llama, bf16.

Trains a model built from config (the TinyLlama-1.1B shape: 22 layers, hidden 2048, GQA with 4
KV heads, vocab 32000) from scratch on one GPU, through the trainer's launch without Ray
(`llmtrain_trainer.launch`: the builtin loop, lifecycle and strategies of a cluster run), one child
process per case so each case's peak memory is its own, and prints a table:

    case | micro-batch | tokens/s | MFU | peak GiB allocated | preflight estimate GiB

The cases: FSDP2 with the defaults (training.compile unset: on for GPUs), FSDP2 eager (compile
false), FSDP2 at micro-batch 8, DDP, LoRA r16 on FSDP2, FSDP2 with gradientCheckpointing, and
DeepSpeed ZeRO-2/3 only where `deepspeed` imports. tokens/s and MFU are the trainer's own step
metrics (`model.TrainingFlops` over the GPU's dense bf16 peak), the median over the steps after
`--warmup`; peak memory is `torch.cuda.max_memory_allocated` of the case's process; the estimate
is the preflight's (`llmtrain.memory`). Without a CUDA device it prints why and exits 2.

It needs torch, transformers and peft, not Ray or DeepSpeed: copy the
repository's `operator/`, `trainer_image/`, `benchmarks/` and `examples/data/` (a few MiB) and run

    python benchmarks/gpu_mfu.py [--steps 30] [--cases fsdp ddp]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "operator"), str(REPO / "trainer_image")]  # this checkout's, installed or not
STORIES = REPO / "examples" / "data" / "tiny-stories.txt"
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
GIB = 1024**3


@dataclass(frozen=True)
class Case:
    label: str
    strategy: dict[str, Any] = field(default_factory=lambda: {"type": "fsdp"})
    micro_batch: int = 4
    training: dict[str, Any] = field(default_factory=dict)
    method: dict[str, Any] | None = None
    needs_deepspeed: bool = False


CASES = {
    "fsdp": Case("FSDP2 (defaults)"),
    "fsdp-eager": Case("FSDP2 eager (compile false)", training={"compile": False}),
    "fsdp-mb8": Case("FSDP2", micro_batch=8),
    "ddp": Case("DDP", strategy={"type": "ddp"}),
    "lora": Case("LoRA r16 on FSDP2", method={"type": "lora", "lora": {"rank": 16}}),
    "checkpointing": Case("FSDP2 + gradientCheckpointing", training={"gradientCheckpointing": True}),
    "zero2": Case(
        "DeepSpeed ZeRO-2", {"type": "deepspeed", "deepspeed": {"zeroStage": 2}}, needs_deepspeed=True
    ),
    "zero3": Case(
        "DeepSpeed ZeRO-3", {"type": "deepspeed", "deepspeed": {"zeroStage": 3}}, needs_deepspeed=True
    ),
}


def case_config(name: str, storage: Path, data: Path, args: argparse.Namespace) -> Any:
    from llmtrain.api.trainer_config import TrainerConfig

    case = CASES[name]
    document: dict[str, Any] = {
        "job": {"name": f"bench-{name}"},
        "runName": f"bench-{name}",
        "storagePath": str(storage),
        "scaling": {"numWorkers": 1, "useGpu": not args.cpu, "cpusPerWorker": 1},
        "model": {"config": args.model, "tokenizer": "byte-level"},
        "dataset": {"path": str(data), "format": "text", "maxSeqLength": args.seq},
        "strategy": case.strategy,
        "training": {
            "precision": "fp32" if args.cpu else "bf16",
            "maxSteps": args.steps,
            "microBatchSize": case.micro_batch,
            "learningRate": 3e-4,
            "warmupRatio": 0.1,
            "logEverySteps": 1,
            **case.training,
        },
        "checkpoint": {"everySteps": 1_000_000, "keep": 1, "export": False},
    }
    if case.method is not None:
        document["method"] = case.method
    return TrainerConfig.model_validate(document)


def stories(folder: Path, bytes_needed: int) -> Path:
    """The shipped stories, repeated until the run never wraps around its data (throughput only)."""
    text = STORIES.read_text()
    path = folder / "stories.txt"
    path.write_text(text * (bytes_needed // len(text) + 2))
    return path


def run_case(config_file: Path, peak_file: Path) -> int:
    """In the case's own process: train through the launch, then record the peak allocation."""
    import torch
    from llmtrain_trainer.config import load_config
    from llmtrain_trainer.launch import launch
    from llmtrain_trainer.lifecycle import LoopOptions
    from llmtrain_trainer.preflight import check

    config = load_config(config_file)
    check(config)
    launch(config, LoopOptions(log_lines=False, checkpoint_at_end=False))
    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
    peak_file.write_text(json.dumps({"peak_bytes": peak}))
    return 0


def measured(run_dir: Path, warmup: int) -> tuple[float | None, float | None]:
    """Median tokens/s and MFU over the steps after the warm-up."""
    from llmtrain_trainer.progress import read_records, step_history
    from llmtrain_trainer.rundir import METRICS_FILE

    steps = [r for r in step_history(read_records(run_dir / METRICS_FILE)) if r.step > warmup]
    rates = [r.tokens_per_second for r in steps if r.tokens_per_second is not None]
    mfus = [r.mfu for r in steps if r.mfu is not None]
    return (median(rates) if rates else None), (median(mfus) if mfus else None)


def estimate_gib(config: Any) -> float | None:
    """The preflight's per-device memory estimate for the case."""
    from llmtrain import memory

    found = memory.estimate(memory.Plan.of_trainer(config), config.model.config)
    return found.peak / GIB if found is not None and found.peak is not None else None


def cell(value: float | None, form: str) -> str:
    return "—" if value is None else format(value, form)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the medians")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument(
        "--cpu", action="store_true", help="check the harness on the CPU with --tiny-model (no MFU)"
    )
    parser.add_argument("--tiny-model", action="store_true", help="examples/tiny-cpu.yaml's model")
    parser.add_argument("--run-case", nargs=2, type=Path, help=argparse.SUPPRESS)  # config, peak file
    args = parser.parse_args()
    if args.run_case:
        return run_case(*args.run_case)
    args.model = MODEL_1B
    if args.tiny_model:
        import yaml

        args.model = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())["spec"]["model"][
            "config"
        ]

    import torch

    if not args.cpu and not torch.cuda.is_available():
        print(
            "gpu_mfu: no GPU present (torch.cuda.is_available() is False); this benchmark measures "
            "CUDA devices only, so nothing was measured",
            file=sys.stderr,
        )
        return 2
    try:
        import deepspeed  # noqa: F401

        has_deepspeed = True
    except ImportError:
        has_deepspeed = False
    device = "cpu" if args.cpu else torch.cuda.get_device_name(0)
    print(
        f"device: {device}; {args.steps} steps, the first {args.warmup} left out; seq {args.seq}", flush=True
    )
    rows: list[str] = [
        "| case | micro-batch | tokens/s | MFU | peak GiB allocated | preflight estimate GiB |",
        "|---|---|---|---|---|---|",
    ]
    failures = 0
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "operator"), str(REPO / "trainer_image"), env.get("PYTHONPATH", "")]
    )
    with tempfile.TemporaryDirectory(prefix="llmtrain-gpu-bench-") as scratch:
        storage = Path(scratch)
        biggest = max(CASES[name].micro_batch for name in args.cases)
        data = stories(storage, (args.steps + 2) * biggest * args.seq)
        for name in args.cases:
            case = CASES[name]
            if case.needs_deepspeed and not has_deepspeed:
                print(f"{name}: skipped (deepspeed does not import here)", flush=True)
                continue
            config = case_config(name, storage, data, args)
            config_file = storage / f"{name}.json"
            config_file.write_text(json.dumps(config.model_dump(mode="json", by_alias=True)))
            peak_file = storage / f"{name}.peak.json"
            log_file = storage / f"{name}.log"
            with log_file.open("w") as log:
                code = subprocess.call(
                    [sys.executable, __file__, "--run-case", str(config_file), str(peak_file)],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            if code != 0:
                failures += 1
                tail = log_file.read_text(errors="replace").strip().splitlines()[-3:]
                print(f"{name}: failed (exit code {code}): {' / '.join(tail)}", flush=True)
                continue
            rate, mfu = measured(Path(config.run_dir), args.warmup)
            peak = json.loads(peak_file.read_text())["peak_bytes"]
            row = (
                f"| {case.label} | {case.micro_batch} | {cell(rate, ',.0f')} | "
                f"{cell(None if mfu is None else mfu * 100, '.1f')}{'%' if mfu is not None else ''} | "
                f"{cell(None if peak is None else peak / GIB, '.1f')} | {cell(estimate_gib(config), '.1f')} |"
            )
            rows.append(row)
            print(row, flush=True)
    print("\n" + "\n".join(rows))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
