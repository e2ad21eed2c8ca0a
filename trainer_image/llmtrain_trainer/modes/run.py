"""What every training mode shares on a worker: progress records, checkpoint registration, result.

The built-in loop writes these itself (loop.py); the Hugging Face and custom modes go through
`ModeRun` so that `metrics.jsonl`, `status.progress`, `checkpoint-step-N/` and `result.json` look
the same whichever code trained, and `llmtrain run`, the operator and resume need no mode switch.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray.train
import torch.distributed as dist
from llmtrain.api.trainer_config import TrainerConfig
from llmtrain.constants import EXPORT_DIR

from llmtrain_trainer import checkpoint
from llmtrain_trainer.distributed import WorkerEnv
from llmtrain_trainer.metrics import MetricsRecord
from llmtrain_trainer.progress import FanOut, open_sinks
from llmtrain_trainer.rundir import RESULT_FILE, STATE_FILE, checkpoint_name, latest_checkpoint


class ModeRun:
    """One attempt of a non-builtin run on one rank; rank 0 alone writes records and the result."""

    def __init__(self, config: TrainerConfig, env: WorkerEnv, run_dir: Path, log_lines: bool) -> None:
        self.config = config
        self.env = env
        self.run_dir = run_dir
        self.export_dir = run_dir / EXPORT_DIR
        self.total_steps = config.training.max_steps or 0
        self.last_step = 0
        self.last_loss: float | None = None
        self.sinks: FanOut | None = open_sinks(config, run_dir, log_lines) if env.is_main else None
        self.resume_checkpoint, self.resume_step = self._resume_point()

    @staticmethod
    def _resume_point() -> tuple[Path | None, int | None]:
        """The latest reported checkpoint (a directory on the shared storage) and its step."""
        reported = ray.train.get_checkpoint()
        if reported is None:
            return None, None
        with reported.as_directory() as path:  # on mounted storage: the stored directory itself
            directory = Path(path)
        state_file = directory / STATE_FILE
        step = int(json.loads(state_file.read_text())["step"]) if state_file.exists() else None
        return directory, step

    def emit(self, record: MetricsRecord) -> None:
        if self.sinks is not None:
            self.sinks.emit(record)

    def announce(self, message: str) -> None:
        if self.resume_step is not None:
            text = f"resumed at step {self.resume_step}; {message}"
            self.emit(MetricsRecord("resumed", self.resume_step, self.total_steps, message=text))
        else:
            self.emit(MetricsRecord("started", 0, self.total_steps, message=message))

    def step(self, step: int, loss: float | None, **metrics: Any) -> None:
        self.last_step = step
        if loss is not None:
            self.last_loss = loss
        self.emit(MetricsRecord("step", step, max(self.total_steps, step), loss=loss, **metrics))

    @contextmanager
    def checkpoint(self, step: int, metrics: dict[str, Any] | None = None) -> Iterator[Path]:
        """`checkpoint-step-N/` in the run directory for every rank to write into; on exit it is
        marked complete and registered with Ray Train. A collective: every rank enters it."""
        directory = self.run_dir / checkpoint_name(step)
        if self.env.is_main:
            if directory.exists():  # left by an attempt that died before registering it
                shutil.rmtree(directory)
            directory.mkdir(parents=True)
        dist.barrier()
        yield directory
        dist.barrier()
        if self.env.is_main:
            marker = {"step": step, "world_size": self.env.world_size, "trainer": self.config.trainer.type}
            (directory / STATE_FILE).write_text(json.dumps(marker) + "\n")
        checkpoint.report(directory, {"step": step, "loss": self.last_loss, **(metrics or {})}, self.env)
        self.emit(MetricsRecord("checkpoint", step, max(self.total_steps, step), path=str(directory)))

    def finish(self, steps: int | None = None) -> None:
        """Rank 0: result.json and the `finished` record (plus `exported` if an export exists)."""
        if self.sinks is None:
            return
        steps = steps if steps is not None else self.last_step
        total = max(self.total_steps, steps)
        export = str(self.export_dir) if self.export_dir.exists() else None
        if export is not None:
            self.emit(MetricsRecord("exported", steps, total, path=export))
        latest = latest_checkpoint(self.run_dir)
        result = {
            "finished": True,
            "trainer": self.config.trainer.type,
            "steps": steps,
            "resumed_from_step": self.resume_step,
            "checkpoint": str(latest) if latest else None,
            "export": export,
            "world_size": self.env.world_size,
            "finished_at": time.time(),
        }
        (self.run_dir / RESULT_FILE).write_text(json.dumps(result, indent=2) + "\n")
        self.emit(MetricsRecord("finished", steps, total, path=export))

    def close(self) -> None:
        if self.sinks is not None:
            self.sinks.close()
