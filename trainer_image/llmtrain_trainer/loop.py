"""The per-worker training loop that Ray Train runs on every rank.

It only sequences the pieces: data (data.py), model and strategy (strategies/), the loss (loss.py),
checkpoints (checkpoint.py), metrics and progress (metrics.py, progress.py) and the export (export.py).
Every collective (a strategy step, `ray.train.report`, a checkpoint) is reached by all ranks in
the same order; only the writing of progress records is rank 0's alone.
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
from llmtrain.api.trainer_config import TrainerConfig
from llmtrain.constants import EXPORT_DIR

from llmtrain_trainer import checkpoint
from llmtrain_trainer.data import DistributedBatches, SequenceData, build_sequences, evaluation_batches
from llmtrain_trainer.distributed import (
    WorkerEnv,
    apply_training_timeout,
    rank_zero_first,
    scalar,
    training_timeout_seconds,
)
from llmtrain_trainer.export import export_model
from llmtrain_trainer.fabric_check import check_fabric, should_check
from llmtrain_trainer.loss import token_loss_sum, trained_tokens
from llmtrain_trainer.metrics import (
    BatchCounts,
    MetricsRecord,
    Throughput,
    batch_counts,
    checkpoints_from,
    eta_seconds,
    peak_flops,
)
from llmtrain_trainer.model import TrainingFlops, count_parameters, model_config, training_flops
from llmtrain_trainer.progress import FanOut, open_sinks
from llmtrain_trainer.resume_from import resolve, run_shape
from llmtrain_trainer.rundir import RESULT_FILE, latest_checkpoint
from llmtrain_trainer.strategies import make_strategy
from llmtrain_trainer.strategies.base import Strategy
from llmtrain_trainer.tokenizer import load_tokenizer
from llmtrain_trainer.watchdog import ErrorSink, StallReporter, StepWatchdog

log = logging.getLogger("llmtrain_trainer")


@dataclass(frozen=True)
class LoopOptions:
    """Driver-side choices passed to the workers next to the TrainerConfig."""

    log_lines: bool = True
    """Print a log line per metrics record (off under `llmtrain run`, which draws a progress bar)."""
    checkpoint_at_end: bool = True
    """Checkpoint the final step even off the checkpoint.everySteps grid (throughput benchmarks
    turn it off: they do not need to write a multi-gigabyte optimizer state at the end)."""

    def to_dict(self) -> dict[str, Any]:
        return {"log_lines": self.log_lines, "checkpoint_at_end": self.checkpoint_at_end}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoopOptions:
        return cls(
            log_lines=bool(data.get("log_lines", True)),
            checkpoint_at_end=bool(data.get("checkpoint_at_end", True)),
        )


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Ray Train entry point: `loop_config` holds the TrainerConfig (JSON) and the LoopOptions."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("llmtrain_trainer").setLevel(logging.INFO)
    import datasets

    datasets.disable_progress_bars()
    config = TrainerConfig.model_validate(loop_config["trainer_config"])
    options = LoopOptions.from_dict(loop_config.get("options", {}))
    context = ray.train.get_context()
    device = ray.train.torch.get_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    env = WorkerEnv(
        rank=context.get_world_rank(),
        world_size=context.get_world_size(),
        local_rank=context.get_local_rank(),
        device=device,
    )
    if should_check(config.network.nccl_profile, env.on_gpu):
        check_fabric(config.network, lambda: _first_collective(env))
    run_dir = Path(context.get_storage().experiment_fs_path)
    if config.trainer.type == "custom":
        from llmtrain_trainer.modes.custom import run_custom

        run_custom(config, env, run_dir, options.log_lines)
    elif config.trainer.type == "huggingface":
        from llmtrain_trainer.modes.huggingface import run_huggingface

        run_huggingface(config, env, run_dir, options.log_lines)
    else:
        TrainingRun(config, env, run_dir, options).run()


def _first_collective(env: WorkerEnv) -> None:
    """An all-reduce of one element: NCCL creates its communicator (and logs its transport)."""
    probe = torch.ones(1, device=env.device)
    dist.all_reduce(probe)
    torch.cuda.synchronize(env.device)


def total_steps(config: TrainerConfig, num_sequences: int, world_size: int) -> int:
    """training.maxSteps, or the optimizer steps in training.epochs passes over the data."""
    if config.training.max_steps is not None:
        return config.training.max_steps
    per_step = config.training.micro_batch_size * config.training.gradient_accumulation_steps * world_size
    return max(1, config.training.epochs * (num_sequences // per_step))


def next_step_batches(
    batches: DistributedBatches, count: int, device: torch.device
) -> tuple[list[dict[str, torch.Tensor]], BatchCounts]:
    """A step's micro-batches on the device, and their counts taken on the CPU copies first."""
    host = [batches.next_batch() for _ in range(count)]
    counts = sum((batch_counts(batch) for batch in host), BatchCounts(0, 0, 0))
    on_device = [{k: v.to(device, non_blocking=True) for k, v in batch.items()} for batch in host]
    return on_device, counts


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class TrainingRun:
    """One attempt of a run on one rank: restore, train to the end, checkpoint, export."""

    def __init__(self, config: TrainerConfig, env: WorkerEnv, run_dir: Path, options: LoopOptions) -> None:
        self.config = config
        self.env = env
        self.run_dir = run_dir
        self.options = options
        self.sinks: FanOut | None = None
        self.total = 0
        self.last_loss: float | None = None
        self.train_seconds: float | None = None
        self.tokens_per_second: float | None = None
        self.checkpoint_seconds = 0.0
        """How long the latest checkpoint paused training; the ETA expects each one left to take
        as long (0 until the first)."""
        self.seeded_from: str | None = None
        """spec.resumeFrom's checkpoint, when this attempt started from it."""
        self.skipped_checkpoints: list[str] = []
        """Newer checkpoints that could not be restored (incomplete or corrupt), with the reasons."""
        self.pending: checkpoint.PendingCheckpoint | None = None
        """A checkpoint still being written in the background (checkpoint.asyncSave)."""

    # -------------------------------------------------------------------------- set-up

    def run(self) -> None:
        config, env = self.config, self.env
        seed_everything(config.training.seed)
        tokenizer = load_tokenizer(config.model)
        with rank_zero_first(env):
            data = build_sequences(config.dataset, tokenizer, config.training.seed)
        self.total = total_steps(config, len(data.train), env.world_size)
        resuming = ray.train.get_checkpoint() is not None
        # spec.resumeFrom applies only until the run has a checkpoint of its own.
        seed = None if resuming or config.resume_from is None else resolve(config.resume_from, self.run_dir)
        strategy = make_strategy(config, env, self.total, initial_weights=not resuming and seed is None)
        restored = checkpoint.restore(strategy, env, self.run_dir)
        state = restored.state if restored is not None else None
        self.skipped_checkpoints = restored.skipped if restored is not None else []
        if seed is not None:
            state = checkpoint.load(strategy, seed.directory, env, weights_only=not seed.full_state)
            self.seeded_from = seed.described
        resumed_from = state.step if state is not None and state.step > 0 else None
        state = state or checkpoint.TrainerState(world_size=env.world_size)
        state.world_size = env.world_size
        state.shape = run_shape(config)
        if env.is_main:
            self.sinks = open_sinks(config, self.run_dir, self.options.log_lines)
        try:
            self._announce(strategy, state, resumed_from)
            trained = self._train(strategy, data, state, tokenizer.pad_token_id)
            export = self._export(strategy, tokenizer, trained)
            self._finish(state, resumed_from, export, trained)
        finally:
            if self.sinks is not None:
                self.sinks.close()

    def _emit(self, record: MetricsRecord) -> None:
        if self.sinks is not None:
            self.sinks.emit(record)

    def _announce(self, strategy: Strategy, state: checkpoint.TrainerState, resumed_from: int | None) -> None:
        n_params, n_trainable = count_parameters(strategy.model)
        message = (
            f"strategy {strategy.name}, {self.env.world_size} workers on {self.env.device.type}, "
            f"{n_params:,} parameters ({n_trainable:,} trainable)"
        )
        if self.seeded_from is not None:
            message = f"from {self.seeded_from}; {message}"
        if self.skipped_checkpoints:
            message = f"{message}; skipped unusable checkpoints: {'; '.join(self.skipped_checkpoints)}"
        if resumed_from is not None:
            self._emit(
                MetricsRecord(
                    "resumed", resumed_from, self.total, message=f"resumed at step {resumed_from}; {message}"
                )
            )
        else:
            self._emit(MetricsRecord("started", 0, self.total, message=message))

    # -------------------------------------------------------------------------- training

    def _train(
        self, strategy: Strategy, data: SequenceData, state: checkpoint.TrainerState, pad_id: int
    ) -> bool:
        """Step until the total; returns whether any step ran in this attempt."""
        config, env = self.config, self.env
        training = config.training
        if state.step >= self.total:
            return False
        batches = DistributedBatches(
            data.train, training.micro_batch_size, env.rank, env.world_size, training.seed, pad_id, state.data
        )
        flops = training_flops(model_config(config.model), strategy.model)
        throughput = Throughput(peak_flops(env.device), env.world_size)
        # Packed text has the same number of trained tokens in every micro-batch: no need to count
        # them across ranks before each step.
        fixed_local_tokens = (
            training.micro_batch_size
            * (config.dataset.max_seq_length - 1)
            * training.gradient_accumulation_steps
            if data.fixed_label_count
            else None
        )
        watchdog = self._watchdog()
        watchdog.start(state.step)
        try:
            self._steps(
                strategy, data, state, pad_id, batches, throughput, flops, fixed_local_tokens, watchdog
            )
        finally:
            watchdog.stop()
        throughput.measure()
        self.train_seconds = throughput.train_seconds
        self.tokens_per_second = throughput.average_tokens_per_second
        return True

    def _watchdog(self) -> StepWatchdog:
        config = self.config

        def open_sink() -> ErrorSink | None:
            if not config.progress.report_to_kubernetes:
                return None
            from llmtrain_trainer.kube_progress import kubernetes_sink

            return kubernetes_sink(config)

        return StepWatchdog(self.env.rank, config.collective_timeout_seconds, StallReporter(open_sink))

    def _steps(
        self,
        strategy: Strategy,
        data: SequenceData,
        state: checkpoint.TrainerState,
        pad_id: int,
        batches: DistributedBatches,
        throughput: Throughput,
        flops: TrainingFlops,
        fixed_local_tokens: int | None,
        watchdog: StepWatchdog,
    ) -> None:
        config, env = self.config, self.env
        training = config.training
        losses = torch.zeros(2, dtype=torch.float64, device=env.device)  # loss sum, trained tokens
        # Input tokens and attended pairs since the last flush, summed over ranks when flushed.
        counts = torch.zeros(2, dtype=torch.float64, device=env.device)
        grad_norm: torch.Tensor | float | None = None
        interval_start, interval_step = time.perf_counter(), state.step
        first_step = state.step
        strategy.train()
        while state.step < self.total:
            micro_batches, step_counts = next_step_batches(
                batches, training.gradient_accumulation_steps, env.device
            )
            if fixed_local_tokens is not None:
                step_trained = fixed_local_tokens * env.world_size
            else:
                step_trained = self._sum_over_ranks(step_counts.trained)
            scale = env.world_size / max(step_trained, 1)
            for i, micro_batch in enumerate(micro_batches):
                loss_sum = strategy.forward_backward(
                    micro_batch, scale, last_micro_batch=i == len(micro_batches) - 1
                )
                losses[0] += loss_sum.to(torch.float64)
            losses[1] += step_counts.trained
            counts[0] += step_counts.inputs
            counts[1] += step_counts.attended_pairs
            grad_norm = strategy.step()
            state.step += 1
            state.data = batches.position
            watchdog.beat(state.step)
            if state.step == first_step + 1 and apply_training_timeout(config):
                watchdog.set_timeout(training_timeout_seconds(config))
                if env.is_main:
                    log.info("collective timeout now %ds (network.stepTimeoutSeconds)", watchdog.timeout)

            last = state.step == self.total
            if state.step % training.log_every_steps == 0 or state.step == 1 or last:
                dist.all_reduce(losses)
                self._flush_counts(counts, state, throughput, flops)
                loss = float(losses[0] / losses[1].clamp(min=1))
                rate, mfu = throughput.measure()
                seconds_per_step = (time.perf_counter() - interval_start) / max(1, state.step - interval_step)
                interval_start, interval_step = time.perf_counter(), state.step
                self._emit(
                    MetricsRecord(
                        "step",
                        state.step,
                        self.total,
                        loss=loss,
                        learning_rate=strategy.learning_rate,
                        grad_norm=None if grad_norm is None else scalar(grad_norm),
                        tokens_per_second=rate,
                        mfu=mfu,
                        eta_seconds=eta_seconds(
                            self.total - state.step,
                            seconds_per_step,
                            checkpoints_from(
                                state.step,
                                self.total,
                                config.checkpoint.every_steps,
                                self.options.checkpoint_at_end,
                            ),
                            self.checkpoint_seconds,
                        ),
                        epoch=state.data.epoch,
                        tokens_seen=state.tokens_seen,
                    )
                )
                self.last_loss = loss
                losses.zero_()
            if state.step % config.checkpoint.every_steps == 0 or (last and self.options.checkpoint_at_end):
                self._flush_counts(counts, state, throughput, flops)  # tokens_seen goes in the checkpoint
                throughput.pause()
                self._checkpoint(strategy, state, data, pad_id)
                watchdog.beat(state.step)
                throughput.resume()
                interval_start = time.perf_counter()
        throughput.pause()
        self._complete_checkpoint()
        throughput.resume()

    @staticmethod
    def _flush_counts(
        counts: torch.Tensor, state: checkpoint.TrainerState, throughput: Throughput, flops: TrainingFlops
    ) -> None:
        """Sum the input tokens and attended pairs over ranks (a collective) into tokens_seen and
        the throughput; a no-op sum after a flush in the same step."""
        dist.all_reduce(counts)
        tokens, pairs = (int(value) for value in counts.tolist())
        counts.zero_()
        state.tokens_seen += tokens
        throughput.add(tokens, flops.of(tokens, pairs))

    def _sum_over_ranks(self, value: int) -> int:
        tensor = torch.tensor([value], dtype=torch.float64, device=self.env.device)
        dist.all_reduce(tensor)
        return int(tensor.item())

    def _checkpoint(
        self, strategy: Strategy, state: checkpoint.TrainerState, data: SequenceData, pad_id: int
    ) -> None:
        """Start a checkpoint once the previous one is complete; register it when it is written:
        at once, or with checkpoint.asyncSave at the next checkpoint or the end of training.
        `checkpoint_seconds` is how long training paused for it."""
        started = time.perf_counter()
        self._complete_checkpoint()
        pending = checkpoint.start(strategy, state, self.run_dir, self.env)
        pending.metrics = {"step": state.step, "loss": self.last_loss}
        if data.validation is not None:
            val_loss = self._validate(strategy, data, pad_id)
            if val_loss is not None:
                pending.metrics["val_loss"] = val_loss
                self._emit(MetricsRecord("validation", state.step, self.total, val_loss=val_loss))
        self.pending = pending
        if not self.config.checkpoint.async_save:
            self._complete_checkpoint(paused_since=started)
        self.checkpoint_seconds = time.perf_counter() - started

    def _complete_checkpoint(self, paused_since: float | None = None) -> None:
        """Wait for the pending checkpoint's files on every rank, then make it count: the state
        file, then the report to Ray Train (never for a checkpoint whose write did not finish).
        An asynchronous one is reported with the pause it cost when it started."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        directory = checkpoint.complete(pending, self.env)
        checkpoint.report(directory, pending.metrics, self.env)
        seconds = time.perf_counter() - paused_since if paused_since is not None else self.checkpoint_seconds
        self._emit(
            MetricsRecord(
                "checkpoint", pending.step, self.total, path=str(directory), checkpoint_seconds=seconds
            )
        )

    @torch.no_grad()
    def _validate(self, strategy: Strategy, data: SequenceData, pad_id: int) -> float | None:
        assert data.validation is not None
        totals = torch.zeros(2, dtype=torch.float64, device=self.env.device)
        strategy.train(False)
        for batch in evaluation_batches(
            data.validation, self.config.training.micro_batch_size, self.env.rank, self.env.world_size, pad_id
        ):
            totals[1] += trained_tokens(batch["labels"])  # on the CPU copy: no sync
            batch = {k: v.to(self.env.device) for k, v in batch.items()}
            totals[0] += token_loss_sum(strategy.forward(batch), batch["labels"]).to(torch.float64)
        strategy.train(True)
        dist.all_reduce(totals)
        return float(totals[0] / totals[1]) if totals[1] > 0 else None

    # -------------------------------------------------------------------------- the end

    def _export(self, strategy: Strategy, tokenizer: Any, trained: bool) -> str | None:
        """Export when enabled, unless an export of this very state already exists."""
        export_dir = self.run_dir / EXPORT_DIR
        if not self.config.checkpoint.export:
            return None
        if not trained and export_dir.exists():
            return str(export_dir)
        result = export_model(  # collectives: every rank takes part, rank 0 writes
            strategy.export_tensors(),
            model_config(self.config.model),
            self.config.method,
            tokenizer,
            export_dir,
            strategy.dtype,
            self.config.model.name,
            self.env.is_main,
        )
        if result is None:
            return str(export_dir)
        self._emit(MetricsRecord("exported", self.total, self.total, path=str(result.path)))
        return str(result.path)

    def _finish(
        self, state: checkpoint.TrainerState, resumed_from: int | None, export: str | None, trained: bool
    ) -> None:
        if not self.env.is_main:
            return
        result_file = self.run_dir / RESULT_FILE
        if not trained and result_file.exists():  # restarted after the end: the first result stands
            self._emit(MetricsRecord("finished", state.step, self.total, path=export))
            return
        latest = latest_checkpoint(self.run_dir)
        result = {
            "finished": True,
            "steps": self.total,
            "resumed_from_step": resumed_from,
            "resume_from": self.seeded_from,
            "skipped_checkpoints": self.skipped_checkpoints,
            "checkpoint": str(latest) if latest else None,
            "export": export,
            "train_seconds": self.train_seconds,
            "tokens_per_second": self.tokens_per_second,
            "world_size": self.env.world_size,
            "finished_at": time.time(),
        }
        result_file.write_text(json.dumps(result, indent=2) + "\n")
        self._emit(MetricsRecord("finished", state.step, self.total, path=export))
