"""One run lifecycle for every trainer mode: everything on a worker around the training code.

Ray Train (or launch.py, without Ray) starts the same worker function whatever spec.trainer.type
says (loop.py); the mode
(modes/) trains, and this module does the rest the same way for all of them, so `metrics.jsonl`,
`status.progress`, `checkpoint-step-N/trainer_state.json` and `result.json` look alike whichever
code trained, and `llmtrain run`, the operator and resume need no mode switch:

- the resume point: this run's latest checkpoint that the launcher registered (run_context.py:
  Ray Train's, or the run directory's newest without Ray), or on a run's first attempt
  spec.resumeFrom (`ResumePoint`);
- the `started` or `resumed` record;
- step records, with tokens/s, MFU and the ETA measured here, once for every mode;
- checkpoint registration: the one `trainer_state.json` format (`checkpoint.TrainerState`), the
  report to the run context, the `checkpoint` record;
- the one `RunResult` in `result.json` (its type lives in the light rundir.py, which `llmtrain run`
  reads), the `exported` and `finished` records;
- opening rank 0's progress sinks and closing them.

Rank 0 alone writes records and files; registering a checkpoint is a collective.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from llmtrain.api.trainer_config import TrainerConfig
from llmtrain.constants import EXPORT_DIR

from llmtrain_trainer import checkpoint
from llmtrain_trainer.checkpoint import PendingCheckpoint, TrainerState
from llmtrain_trainer.distributed import WorkerEnv
from llmtrain_trainer.loop import LoopOptions
from llmtrain_trainer.metrics import MetricsRecord, Throughput, checkpoints_from, eta_seconds, peak_flops
from llmtrain_trainer.progress import FanOut, open_sinks
from llmtrain_trainer.resume_from import resolve, run_shape
from llmtrain_trainer.run_context import RayRunContext, RunContext
from llmtrain_trainer.rundir import RunResult, latest_checkpoint

if TYPE_CHECKING:
    from llmtrain_trainer.modes import Mode


@dataclass(frozen=True)
class ResumePoint:
    """Where this attempt starts; all None on a run's fresh start."""

    checkpoint: Path | None = None
    """A checkpoint to continue with all of its state: this run's latest one that the launcher
    registered, or, on a first attempt, resumeFrom.run's latest."""
    step: int | None = None
    """The step `checkpoint` was saved at."""
    own: bool = False
    """`checkpoint` is this run's own: restoring may fall back to an older complete one."""
    seed: Path | None = None
    """resumeFrom.checkpoint on a first attempt: a checkpoint whose weights alone to start from."""
    described: str | None = None
    """spec.resumeFrom's target in words, when this attempt starts from it."""


def resume_point(config: TrainerConfig, run_dir: Path, context: RunContext | None = None) -> ResumePoint:
    """The context's latest checkpoint of this run (Ray Train's by default), else spec.resumeFrom
    (which applies only until the run has a checkpoint of its own), else none."""
    directory = (context or RayRunContext()).latest_checkpoint(run_dir)
    if directory is not None:
        return ResumePoint(directory, _step_of(directory), own=True)
    if config.resume_from is None:
        return ResumePoint()
    seed = resolve(config.resume_from, run_dir)
    if seed.full_state:
        return ResumePoint(seed.directory, _step_of(seed.directory), described=seed.described)
    return ResumePoint(seed=seed.directory, described=seed.described)


def _step_of(directory: Path) -> int | None:
    state = TrainerState.read(directory)
    return state.step if state is not None else None


class Lifecycle:
    """One attempt of a run on one rank, whatever the mode; a context manager that opens rank 0's
    progress sinks and closes them."""

    def __init__(
        self,
        config: TrainerConfig,
        env: WorkerEnv,
        run_dir: Path,
        options: LoopOptions,
        mode: Mode,
        context: RunContext | None = None,
    ) -> None:
        self.config = config
        self.context: RunContext = context or RayRunContext()
        """Who registers checkpoints and names the latest: Ray Train, or the local launch."""
        self.env = env
        self.run_dir = run_dir
        self.options = options
        self.mode = mode
        self.export_dir = run_dir / EXPORT_DIR
        self.total_steps = config.training.max_steps or 0
        """The run's length: training.maxSteps until the mode knows better (and sets it)."""
        self.resume = resume_point(config, run_dir, self.context)
        self.resumed_from: int | None = None
        self.skipped_checkpoints: list[str] = []
        self.last_step = 0
        self.last_loss: float | None = None
        self.sinks: FanOut | None = None
        self.throughput = Throughput(peak_flops(env.device), env.world_size)
        self.checkpoint_seconds = 0.0
        """How long the latest checkpoint paused training; the ETA expects each one left to take
        as long (0 until the first)."""
        self.pending: PendingCheckpoint | None = None
        """A checkpoint still being written in the background (checkpoint.asyncSave)."""
        self.best_checkpoint: str | None = None
        self.best_val_loss: float | None = None
        self.stopped_early: str | None = None
        """Set by the mode when training.earlyStopping ended training (result.json, finished record)."""
        self._tokens_mark: int | None = None
        self._trained: tuple[float, float | None] | None = None

    def __enter__(self) -> Lifecycle:
        if self.env.is_main:
            self.sinks = open_sinks(self.config, self.run_dir, self.options.log_lines)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self.sinks is not None:
            self.sinks.close()

    def emit(self, record: MetricsRecord) -> None:
        if self.sinks is not None:
            self.sinks.emit(record)

    def _total(self, step: int) -> int:
        return max(self.total_steps, step)

    # ------------------------------------------------------------------------------ start

    def announce(
        self,
        message: str,
        resumed_at: int | None,
        skipped: Sequence[str] = (),
        tokens_seen: int | None = None,
    ) -> None:
        """The `started` or `resumed` record; training is timed from here. `tokens_seen` (what the
        resumed state already counted) lets the first step record carry tokens/s."""
        self.resumed_from = resumed_at
        self.skipped_checkpoints = list(skipped)
        if self.resume.described is not None:
            message = f"from {self.resume.described}; {message}"
        if self.skipped_checkpoints:
            message = f"{message}; skipped unusable checkpoints: {'; '.join(self.skipped_checkpoints)}"
        if resumed_at is not None:
            text = f"resumed at step {resumed_at}; {message}"
            self.emit(MetricsRecord("resumed", resumed_at, self._total(resumed_at), message=text))
        else:
            self.emit(MetricsRecord("started", 0, self.total_steps, message=message))
        self.last_step = resumed_at or 0
        self._tokens_mark = tokens_seen
        self.throughput = Throughput(peak_flops(self.env.device), self.env.world_size)

    # ------------------------------------------------------------------------------ steps

    def add_flops(self, flops: float) -> None:
        """Model FLOPs the steps since the last record spent (for MFU; the built-in loop counts them)."""
        self.throughput.add(0, flops)

    def step(self, step: int, loss: float | None, **metrics: Any) -> None:
        """A step record. tokens/s comes from `tokens_seen` (all ranks' input tokens so far) and the
        ETA from the time per step, both over the training time since the previous record (see
        `paused`); a mode may pass either itself."""
        tokens_seen = metrics.get("tokens_seen")
        if tokens_seen is not None:
            if self._tokens_mark is not None and tokens_seen >= self._tokens_mark:
                self.throughput.add(int(tokens_seen) - self._tokens_mark, 0.0)
            self._tokens_mark = int(tokens_seen)
        rate, mfu = self.throughput.measure()
        if metrics.get("tokens_per_second") is None and self.throughput.interval_tokens > 0:
            metrics["tokens_per_second"] = rate
        if metrics.get("mfu") is None and mfu is not None:
            metrics["mfu"] = mfu
        total = self._total(step)
        if metrics.get("eta_seconds") is None and step > self.last_step:
            every = self.config.checkpoint.every_steps
            metrics["eta_seconds"] = eta_seconds(
                total - step,
                self.throughput.interval_seconds / (step - self.last_step),
                checkpoints_from(step, total, every, self.options.checkpoint_at_end),
                self.checkpoint_seconds,
            )
        self.last_step = step
        if loss is not None:
            self.last_loss = loss
        self.emit(MetricsRecord("step", step, total, loss=loss, **metrics))

    @contextmanager
    def paused(self) -> Iterator[float]:
        """Stop the training clock while a checkpoint or evaluation runs, so it does not look like a
        slow step in tokens/s or the ETA; yields when the pause began."""
        started = time.perf_counter()
        self.throughput.pause()
        try:
            yield started
        finally:
            self.throughput.resume()

    # ------------------------------------------------------------------------------ checkpoints

    def stamp(self, state: TrainerState) -> TrainerState:
        """`state` with what every checkpoint records about the run writing it."""
        state.world_size = self.env.world_size
        state.trainer = self.mode.name
        state.shape = run_shape(self.config) if self.mode.shaped_checkpoints else {}
        return state

    def complete_pending(self, paused_since: float | None = None) -> None:
        """Wait for the pending checkpoint's files on every rank, then make it count: the state
        file, then the report to the run context (never for a checkpoint whose write did not finish),
        then the record, with the pause it cost (`paused_since`, else that of the latest)."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        directory = checkpoint.complete(pending, self.env)
        self.context.report_checkpoint(directory, pending.metrics, self.env)
        seconds = time.perf_counter() - paused_since if paused_since is not None else self.checkpoint_seconds
        self.emit(
            MetricsRecord(
                "checkpoint",
                pending.step,
                self._total(pending.step),
                path=str(directory),
                checkpoint_seconds=seconds,
            )
        )

    @contextmanager
    def checkpoint_dir(self, step: int, metrics: dict[str, Any] | None = None) -> Iterator[Path]:
        """An empty `checkpoint-step-N/` for every rank to write its files into (the modes that
        save their own); on exit it is registered as the built-in loop's are. A collective."""
        with self.paused() as started:
            self.complete_pending()
            directory = checkpoint.prepare(self.run_dir, step, self.env)
            yield directory
            self.pending = checkpoint.written(directory, step, self.stamp(TrainerState(step=step)))
            self.pending.metrics = {"step": step, "loss": self.last_loss, **(metrics or {})}
            self.complete_pending(paused_since=started)
            self.checkpoint_seconds = time.perf_counter() - started

    # ------------------------------------------------------------------------------ the end

    def end_training(self) -> None:
        """Stop the training clock (before an export): the result's seconds and tokens/s."""
        if self._trained is None:
            self.throughput.measure()
            tokens = self.throughput.train_tokens
            self._trained = (
                self.throughput.train_seconds,
                self.throughput.average_tokens_per_second if tokens else None,
            )

    def exported(self, path: str) -> None:
        self.emit(MetricsRecord("exported", self.last_step, self._total(self.last_step), path=path))

    def existing_export(self) -> str | None:
        """The export the mode's code left in `export/`, recorded; None when there is none."""
        if not self.export_dir.exists():
            return None
        self.exported(str(self.export_dir))
        return str(self.export_dir)

    def finish(self, steps: int | None = None, export: str | None = None, trained: bool = True) -> None:
        """Rank 0: `result.json` and the `finished` record. An attempt that trained nothing (a
        restart after the end) leaves the first result standing."""
        self.end_training()
        if not self.env.is_main:
            return
        steps = steps if steps is not None else self.last_step
        total = self._total(steps)
        if trained or RunResult.read(self.run_dir) is None:
            latest = latest_checkpoint(self.run_dir)
            seconds, rate = self._trained or (None, None)
            RunResult(
                steps=steps,
                trainer=self.mode.name,
                resumed_from_step=self.resumed_from,
                resume_from=self.resume.described,
                skipped_checkpoints=tuple(self.skipped_checkpoints),
                checkpoint=str(latest) if latest else None,
                export=export,
                world_size=self.env.world_size,
                train_seconds=seconds if trained else None,
                tokens_per_second=rate if trained else None,
                best_checkpoint=self.best_checkpoint,
                best_val_loss=self.best_val_loss,
                stopped_early=self.stopped_early,
            ).write(self.run_dir)
        self.emit(MetricsRecord("finished", steps, total, path=export, message=self.stopped_early))
