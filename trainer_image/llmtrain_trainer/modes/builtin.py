"""trainer.type builtin: the platform's own step loop over its model, data and strategy.

It only sequences the pieces: data (data.py), model and strategy (strategies/), the loss (loss.py),
checkpoint files (checkpoint.py) and the export (export.py); the run lifecycle (lifecycle.py)
does the resume point, records, checkpoint registration and the result. Every collective (a
strategy step, a checkpoint, a report to Ray Train) is reached by all ranks in the same order.
"""

from __future__ import annotations

import logging
import math
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from llmtrain.api.trainer_config import TrainerConfig

from llmtrain_trainer import checkpoint
from llmtrain_trainer.data import DistributedBatches, SequenceData, build_sequences, evaluation_batches
from llmtrain_trainer.distributed import (
    WorkerEnv,
    apply_training_timeout,
    rank_zero_first,
    scalar,
    training_timeout_seconds,
)
from llmtrain_trainer.evaluation import EvalTracker, evaluates_at
from llmtrain_trainer.export import export_model
from llmtrain_trainer.lifecycle import Lifecycle
from llmtrain_trainer.loss import trained_tokens
from llmtrain_trainer.metrics import BatchCounts, MetricsRecord, batch_counts
from llmtrain_trainer.model import (
    TrainingFlops,
    count_parameters,
    model_config,
    packed_row_length,
    training_flops,
)
from llmtrain_trainer.optim import rebase_scheduler
from llmtrain_trainer.rundir import checkpoint_name
from llmtrain_trainer.strategies import make_strategy
from llmtrain_trainer.strategies.base import Strategy
from llmtrain_trainer.tokenizer import load_tokenizer
from llmtrain_trainer.watchdog import WATCHDOG_DIR, ErrorSink, StallReporter, StepWatchdog

log = logging.getLogger(__name__)


def run_builtin(config: TrainerConfig, env: WorkerEnv, run_dir: Path, lifecycle: Lifecycle) -> None:
    """The mode's `run` (modes/__init__.py registers the mode and imports this module then)."""
    TrainingRun(config, env, run_dir, lifecycle).run()


def samples_per_step(config: TrainerConfig, world_size: int) -> int:
    return config.training.micro_batch_size * config.training.gradient_accumulation_steps * world_size


def total_steps(config: TrainerConfig, num_sequences: int, world_size: int) -> int:
    """training.maxSteps, or the optimizer steps in training.epochs passes over the data."""
    if config.training.max_steps is not None:
        return config.training.max_steps
    return max(1, config.training.epochs * (num_sequences // samples_per_step(config, world_size)))


def resumed_schedule(
    config: TrainerConfig, num_sequences: int, world_size: int, state: checkpoint.TrainerState
) -> tuple[int, float]:
    """(the step this attempt ends at, the schedule's shift) for a run resumed at `state`.

    An epochs-based run is as long as its data, so its step count depends on the worker count.
    Resumed on another count, it continues the schedule a run on this count has, at the point its
    samples seen give (`optim.rebase_scheduler`), and takes the steps left at this count. A maxSteps
    run, and a run resumed on its own worker count, keep their steps and schedule (shift 0).
    """
    total = total_steps(config, num_sequences, world_size)
    if config.training.max_steps is not None or state.step == 0:
        return total, 0.0
    # A checkpoint written before samples were counted: its steps were all taken on its own count.
    samples = state.samples_seen or state.step * samples_per_step(config, state.world_size)
    equivalent = samples / samples_per_step(config, world_size)
    return state.step + max(0, math.ceil(total - equivalent - 1e-9)), equivalent - state.step


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
    """One attempt of a built-in run on one rank: restore, train to the end, checkpoint, export."""

    def __init__(self, config: TrainerConfig, env: WorkerEnv, run_dir: Path, lifecycle: Lifecycle) -> None:
        self.config = config
        self.env = env
        self.run_dir = run_dir
        self.life = lifecycle
        self.total = 0
        self._compile_failures_told = 0
        self.tracker = EvalTracker()

    # -------------------------------------------------------------------------- set-up

    def run(self) -> None:
        config, env, life = self.config, self.env, self.life
        seed_everything(config.training.seed)
        tokenizer = load_tokenizer(config.model)
        with rank_zero_first(env):
            data = build_sequences(config.dataset, tokenizer, config.training.seed)
        schedule_steps = total_steps(config, len(data.train), env.world_size)
        point = life.resume
        strategy = make_strategy(
            config, env, schedule_steps, initial_weights=point.checkpoint is None and point.seed is None
        )
        state, skipped = self._restore(strategy)
        self.tracker = EvalTracker.from_dict(state.evaluation)
        self.total, shift = resumed_schedule(config, len(data.train), env.world_size, state)
        life.total_steps = self.total
        if shift:
            rebase_scheduler(strategy.scheduler, config.training, schedule_steps, shift)
            if env.is_main:
                log.info(
                    "resumed on %d workers (checkpoint: %d): the schedule continues at step %.1f of %d",
                    env.world_size,
                    state.world_size,
                    state.step + shift,
                    schedule_steps,
                )
        life.stamp(state)
        n_params, n_trainable = count_parameters(strategy.model)
        life.announce(
            f"strategy {strategy.name}, {env.world_size} workers on {env.device.type}, "
            f"{n_params:,} parameters ({n_trainable:,} trainable)",
            resumed_at=state.step if state.step > 0 else None,
            skipped=skipped,
            tokens_seen=state.tokens_seen,
        )
        trained = self._train(strategy, data, state, tokenizer.pad_token_id)
        life.end_training()
        self._load_best(strategy)
        export = self._export(strategy, tokenizer, trained)
        life.finish(state.step, export, trained)

    def _restore(self, strategy: Strategy) -> tuple[checkpoint.TrainerState, list[str]]:
        """The state at the resume point, loaded into the strategy; the checkpoints skipped."""
        point, env = self.life.resume, self.env
        if point.own:
            restored = checkpoint.restore(strategy, env, self.run_dir, point.checkpoint)
            if restored is not None:
                return restored.state, restored.skipped
        elif point.checkpoint is not None:
            return checkpoint.load(strategy, point.checkpoint, env), []
        elif point.seed is not None:
            return checkpoint.load(strategy, point.seed, env, weights_only=True), []
        return checkpoint.TrainerState(), []

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
            data.train,
            training.micro_batch_size,
            env.rank,
            env.world_size,
            training.seed,
            pad_id,
            state.data,
            multiple_of=packed_row_length(config.dataset, strategy.attention),
        )
        flops = training_flops(model_config(config.model), strategy.model)
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
            self._steps(strategy, data, state, pad_id, batches, flops, fixed_local_tokens, watchdog)
        finally:
            watchdog.stop()
        return True

    def _watchdog(self) -> StepWatchdog:
        config = self.config

        def open_sink() -> ErrorSink | None:
            # Rank 0 alone writes the status: it names the stuck rank from every rank's phase.
            if not config.progress.report_to_kubernetes or not self.env.is_main:
                return None
            from llmtrain_trainer.kube_progress import kubernetes_sink

            return kubernetes_sink(config)

        return StepWatchdog(
            self.env.rank,
            config.collective_timeout_seconds,
            StallReporter(open_sink),
            board=self.run_dir / WATCHDOG_DIR,
            world_size=self.env.world_size,
        )

    def _steps(
        self,
        strategy: Strategy,
        data: SequenceData,
        state: checkpoint.TrainerState,
        pad_id: int,
        batches: DistributedBatches,
        flops: TrainingFlops,
        fixed_local_tokens: int | None,
        watchdog: StepWatchdog,
    ) -> None:
        config, env, life = self.config, self.env, self.life
        training = config.training
        losses = torch.zeros(2, dtype=torch.float64, device=env.device)  # loss sum, trained tokens
        # Input tokens and attended pairs since the last flush, summed over ranks when flushed.
        counts = torch.zeros(2, dtype=torch.float64, device=env.device)
        grad_norm: torch.Tensor | float | None = None
        first_step = state.step
        strategy.train()
        while state.step < self.total:
            micro_batches, step_counts = next_step_batches(
                batches, training.gradient_accumulation_steps, env.device
            )
            watchdog.entering_collectives()
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
            state.samples_seen += samples_per_step(config, env.world_size)
            state.data = batches.position
            watchdog.beat(state.step)
            if state.step == first_step + 1 and apply_training_timeout(config, strategy.process_groups()):
                watchdog.set_timeout(training_timeout_seconds(config))
                if env.is_main:
                    log.info("collective timeout now %ds (network.stepTimeoutSeconds)", watchdog.timeout)

            last = state.step == self.total
            if state.step % training.log_every_steps == 0 or state.step == 1 or last:
                self._report_compile_failures(strategy, state.step)
                dist.all_reduce(losses)
                self._flush_counts(counts, state, flops)
                life.step(
                    state.step,
                    float(losses[0] / losses[1].clamp(min=1)),
                    learning_rate=strategy.learning_rate,
                    grad_norm=None if grad_norm is None else scalar(grad_norm),
                    epoch=state.data.epoch,
                    tokens_seen=state.tokens_seen,
                )
                losses.zero_()
            checkpoint_now = state.step % config.checkpoint.every_steps == 0 or (
                last and life.options.checkpoint_at_end
            )
            evaluate_now = data.validation is not None and evaluates_at(
                state.step,
                training.eval_every_steps,
                checkpoint_now,
                config.checkpoint.keep_best or config.checkpoint.export_best,
            )
            if checkpoint_now or evaluate_now:
                self._flush_counts(counts, state, flops)  # tokens_seen goes in the checkpoint
                with life.paused() as started, watchdog.paused():
                    val_loss = self._evaluate(strategy, data, pad_id, state.step) if evaluate_now else None
                    # An early stop between checkpoints still saves the state it ends with.
                    stopping = self.tracker.stopped is not None and life.options.checkpoint_at_end
                    if checkpoint_now or stopping:
                        self._checkpoint(strategy, state, data, val_loss, evaluate_now, started)
                if self.tracker.stopped is not None:
                    # Every rank saw the same all-reduced loss: all stop at this step.
                    life.stopped_early = self.tracker.stopped
                    if env.is_main:
                        log.info("%s", self.tracker.stopped)
                    break
        with life.paused(), watchdog.paused():
            life.complete_pending()

    def _report_compile_failures(self, strategy: Strategy, step: int) -> None:
        """Blocks that failed to compile run eagerly: say so once per new failure (rank 0), in the
        log and in status.progress.notices. Blocks compile at their first call, or again for a new
        shape, so this looks at every report."""
        failures = strategy.compile_failures
        if failures is None or not self.env.is_main or len(failures.failures) <= self._compile_failures_told:
            return
        self._compile_failures_told = len(failures.failures)
        notice = failures.notice()
        log.warning("%s", notice)
        self.life.emit(MetricsRecord("notice", step, self.total, message=notice))

    def _flush_counts(
        self, counts: torch.Tensor, state: checkpoint.TrainerState, flops: TrainingFlops
    ) -> None:
        """Sum the input tokens and attended pairs over ranks (a collective) into tokens_seen and
        the FLOPs spent; a no-op sum after a flush in the same step."""
        dist.all_reduce(counts)
        tokens, pairs = (int(value) for value in counts.tolist())
        counts.zero_()
        state.tokens_seen += tokens
        self.life.add_flops(flops.of(tokens, pairs))

    def _sum_over_ranks(self, value: int) -> int:
        tensor = torch.tensor([value], dtype=torch.float64, device=self.env.device)
        dist.all_reduce(tensor)
        return int(tensor.item())

    def _evaluate(self, strategy: Strategy, data: SequenceData, pad_id: int, step: int) -> float | None:
        """The validation loss at `step`, fed to the tracker (early stopping, the best loss) and
        reported with the best so far (status.progress.evalLoss, bestEvalLoss, bestStep)."""
        val_loss = self._validate(strategy, data, pad_id)
        if val_loss is not None:
            self.tracker.observe(step, val_loss, self.config.training.early_stopping)
            self.life.emit(
                MetricsRecord(
                    "validation",
                    step,
                    self.total,
                    val_loss=val_loss,
                    best_val_loss=self.tracker.best_loss,
                    best_step=self.tracker.best_step,
                )
            )
        return val_loss

    def _checkpoint(
        self,
        strategy: Strategy,
        state: checkpoint.TrainerState,
        data: SequenceData,
        val_loss: float | None,
        evaluated: bool,
        started: float,
    ) -> None:
        """Start a checkpoint once the previous one is registered; it is registered when written:
        at once, or with checkpoint.asyncSave at the next checkpoint or the end of training.
        `val_loss` is this step's evaluation (`evaluated`; None when there was no batch to score)."""
        life = self.life
        life.complete_pending()
        if val_loss is not None:
            self.tracker.checkpointed(state.step, val_loss, self.config.training.early_stopping)
            self._note_best()
        # The tracker's state (best losses, patience used) goes into this checkpoint.
        if data.validation is not None:
            state.evaluation = self.tracker.to_dict()
        pending = checkpoint.start(strategy, state, self.run_dir, self.env)
        pending.metrics = {"step": state.step, "loss": life.last_loss}
        if val_loss is not None:
            pending.metrics["val_loss"] = val_loss
        elif evaluated:
            pending.metrics["val_loss"] = math.inf  # no batch to score: ranked last (keepBest)
        life.pending = pending
        if not self.config.checkpoint.async_save:
            life.complete_pending(paused_since=started)
        life.checkpoint_seconds = time.perf_counter() - started

    @torch.no_grad()
    def _validate(self, strategy: Strategy, data: SequenceData, pad_id: int) -> float | None:
        assert data.validation is not None
        totals = torch.zeros(2, dtype=torch.float64, device=self.env.device)
        strategy.train(False)
        for batch in evaluation_batches(
            data.validation,
            self.config.training.micro_batch_size,
            self.env.rank,
            self.env.world_size,
            pad_id,
            packed_row_length(self.config.dataset, strategy.attention),
        ):
            totals[1] += trained_tokens(batch["labels"])  # on the CPU copy: no sync
            batch = {k: v.to(self.env.device) for k, v in batch.items()}
            totals[0] += strategy.loss_sum(batch).to(torch.float64)
        strategy.train(True)
        dist.all_reduce(totals)
        return float(totals[0] / totals[1]) if totals[1] > 0 else None

    # -------------------------------------------------------------------------- the end

    def _note_best(self) -> None:
        """The best checkpoint so far (result.json; exportBest loads it): among those evaluated at
        their own step, see evaluation.py."""
        if self.tracker.best_checkpoint_step is not None:
            self.life.best_checkpoint = str(self.run_dir / checkpoint_name(self.tracker.best_checkpoint_step))
            self.life.best_val_loss = self.tracker.best_checkpoint_loss

    def _load_best(self, strategy: Strategy) -> None:
        """checkpoint.exportBest: put the best checkpoint's weights in the strategy for the export
        (Ray Train's rotation keeps it: main.py ranks the checkpoints by validation loss)."""
        self._note_best()
        if not self.config.checkpoint.export_best or self.life.best_checkpoint is None:
            return
        if self.env.is_main:
            log.info(
                "exporting the best checkpoint %s (validation loss %.4f)",
                self.life.best_checkpoint,
                self.tracker.best_checkpoint_loss,
            )
        checkpoint.load(strategy, Path(self.life.best_checkpoint), self.env, weights_only=True)

    def _export(self, strategy: Strategy, tokenizer: Any, trained: bool) -> str | None:
        """Export when enabled, unless an export of this very state already exists."""
        export_dir = self.life.export_dir
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
        self.life.exported(str(result.path))
        return str(result.path)
