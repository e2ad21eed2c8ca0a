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
from llmtrain_trainer.metrics import MetricsRecord, eta_seconds
from llmtrain_trainer.progress import FanOut, open_sinks
from llmtrain_trainer.resume_from import resolve as resolve_resume_source
from llmtrain_trainer.resume_from import run_shape
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
        self.seed_checkpoint: Path | None = None
        self.seeded_from: str | None = None
        self.resume_checkpoint, self.resume_step = self._resume_point()
        self._throughput_mark: tuple[int, float] | None = None  # (tokens seen, time) at the last record
        self._step_mark: tuple[int, float] | None = None  # (step, time) at the last step record

    def _resume_point(self) -> tuple[Path | None, int | None]:
        """The latest reported checkpoint (a directory on the shared storage) and its step; on a
        run's first attempt, spec.resumeFrom: `run` continues that run's latest checkpoint,
        `checkpoint` only sets `seed_checkpoint` (its weights, for the code to load; step 0)."""
        reported = ray.train.get_checkpoint()
        if reported is not None:
            with reported.as_directory() as path:  # on mounted storage: the stored directory itself
                return Path(path), _step_of(Path(path))
        if self.config.resume_from is None:
            return None, None
        seed = resolve_resume_source(self.config.resume_from, self.run_dir)
        self.seeded_from = seed.described
        if not seed.full_state:
            self.seed_checkpoint = seed.directory
            return None, None
        return seed.directory, _step_of(seed.directory)

    def emit(self, record: MetricsRecord) -> None:
        if self.sinks is not None:
            self.sinks.emit(record)

    def announce(self, message: str) -> None:
        if self.seeded_from is not None:
            message = f"{message}; resumeFrom {self.seeded_from}"
        if self.resume_step is not None:
            text = f"resumed at step {self.resume_step}; {message}"
            self.emit(MetricsRecord("resumed", self.resume_step, self.total_steps, message=text))
        else:
            self.emit(MetricsRecord("started", 0, self.total_steps, message=message))

    def step(self, step: int, loss: float | None, **metrics: Any) -> None:
        """A step record; tokens/s (from `tokens_seen`, when not given) and the ETA are measured
        between consecutive records, as the built-in loop measures them between its log steps."""
        self.last_step = step
        if loss is not None:
            self.last_loss = loss
        now = time.perf_counter()
        tokens_seen = metrics.get("tokens_seen")
        if tokens_seen is not None:
            if metrics.get("tokens_per_second") is None and self._throughput_mark is not None:
                tokens, since = self._throughput_mark
                if now > since and tokens_seen >= tokens:
                    metrics["tokens_per_second"] = (tokens_seen - tokens) / (now - since)
            self._throughput_mark = (int(tokens_seen), now)
        total = max(self.total_steps, step)
        if self._step_mark is not None and step > self._step_mark[0] and "eta_seconds" not in metrics:
            seconds_per_step = (now - self._step_mark[1]) / (step - self._step_mark[0])
            metrics["eta_seconds"] = eta_seconds(total - step, seconds_per_step)
        self._step_mark = (step, now)
        self.emit(MetricsRecord("step", step, total, loss=loss, **metrics))

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
            marker: dict[str, Any] = {
                "step": step,
                "world_size": self.env.world_size,
                "trainer": self.config.trainer.type,
            }
            if self.config.trainer.type == "huggingface":  # its files depend on strategy and method
                marker["shape"] = run_shape(self.config)
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
            "resume_from": self.seeded_from,
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


def _step_of(directory: Path) -> int | None:
    state_file = directory / STATE_FILE
    return int(json.loads(state_file.read_text())["step"]) if state_file.exists() else None
