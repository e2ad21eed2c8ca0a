"""Builders shared by the trainer tests: tiny TrainerConfigs and readers of a run's files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmtrain.api.trainer_config import TrainerConfig
from llmtrain_trainer.metrics import MetricsRecord
from llmtrain_trainer.progress import read_records, step_history
from llmtrain_trainer.rundir import METRICS_FILE, RESULT_FILE

REPO = Path(__file__).resolve().parents[2]
TINY_STORIES = REPO / "examples" / "data" / "tiny-stories.txt"

TINY_LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 384,
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
}


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
    data: dict[str, Any] = json.loads((run_dir(config) / RESULT_FILE).read_text())
    return data
