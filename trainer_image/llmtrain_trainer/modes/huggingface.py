"""trainer.type huggingface: a `transformers.Trainer` over the platform's model, tokenizer and data.

The platform builds what the built-in loop would train (pretrained or inline model, LoRA, the
tokenized sequences) and derives the TrainingArguments from the spec (hf_args.py). Ray Train's
`prepare_trainer` adapts the Trainer, and `CheckpointToRunDir` (a `RayTrainReportCallback`) moves
each Hugging Face checkpoint into `checkpoint-step-N/checkpoint/` in the run directory and registers
it with Ray Train, so a restart resumes the Trainer from it (`resume_from_checkpoint`), optimizer,
schedule, RNG and data position included. `ProgressToSinks` feeds the Trainer's logs into the same
progress records as the built-in loop, tokens/s from the Trainer's `num_input_tokens_seen`; with
spec.tracking, the Trainer's own `report_to` integrations log into the tracker runs that rank 0's
tracking sinks opened (tracking.py). The
export is `Trainer.save_model` plus the tokenizer; with LoRA and `mergeOnExport` also the merged
model in `export/merged/`, as the built-in export lays it out.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from llmtrain.api.spec import LoraSpec
from llmtrain.api.trainer_config import TrainerConfig
from peft import PeftModel
from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer
from transformers import EarlyStoppingCallback, PreTrainedModel, Trainer, TrainerCallback
from transformers.trainer_utils import get_last_checkpoint

from llmtrain_trainer import model as models
from llmtrain_trainer.data import build_sequences, collate
from llmtrain_trainer.distributed import WorkerEnv, rank_zero_first
from llmtrain_trainer.export import MERGED_DIR, meta_skeleton
from llmtrain_trainer.lifecycle import Lifecycle
from llmtrain_trainer.metrics import MetricsRecord
from llmtrain_trainer.modes.hf_args import (
    FSDP_EXPORT_STATE_DICT,
    early_stopping_callbacks,
    training_arguments,
)
from llmtrain_trainer.tokenizer import load_tokenizer
from llmtrain_trainer.tracking import tensorboard_dir
from llmtrain_trainer.weights import fetch_weights

HF_CHECKPOINT = "checkpoint"
STAGING_DIR = ".hf-output"


class CheckpointToRunDir(RayTrainReportCallback):  # type: ignore[misc]
    """On every save: each rank moves its files of the Trainer's newest checkpoint into the run's
    `checkpoint-step-N/checkpoint/` (a rename on the shared storage, no copy), then the directory
    is registered with Ray Train like the built-in loop's checkpoints."""

    def __init__(self, run: Lifecycle, output_dir: Path) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.run = run
        self.output_dir = output_dir

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        source = get_last_checkpoint(str(self.output_dir))  # type: ignore[no-untyped-call]
        metrics = {k: v for k, v in _latest_logs(state).items() if isinstance(v, int | float)}
        with self.run.checkpoint_dir(state.global_step, metrics) as directory:
            target = directory / HF_CHECKPOINT
            target.mkdir(exist_ok=True)
            if source is not None:
                merge_move(Path(source), target)
                shutil.rmtree(source, ignore_errors=True)
                # load_best_model_at_end (checkpoint.exportBest) reads the best one from here now.
                if state.best_model_checkpoint and Path(state.best_model_checkpoint) == Path(source):
                    state.best_model_checkpoint = str(target)


def merge_move(source: Path, target: Path) -> None:
    """Move `source`'s files into `target`, merging folders that several ranks write (DeepSpeed's
    `global_stepN/` holds every rank's shards); a file written by several ranks is the same file."""
    for item in source.iterdir():
        if item.is_dir():
            (target / item.name).mkdir(exist_ok=True)
            merge_move(item, target / item.name)
        else:
            item.replace(target / item.name)


class ProgressToSinks(TrainerCallback):  # type: ignore[misc]
    """The Trainer's log and evaluation records → llmtrain progress records (rank 0 writes)."""

    def __init__(self, run: Lifecycle) -> None:
        self.run = run

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.run.total_steps = int(state.max_steps)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        logs = logs or {}
        if "eval_loss" in logs:
            self.run.emit(
                MetricsRecord(
                    "validation", state.global_step, self.run.total_steps, val_loss=logs["eval_loss"]
                )
            )
        if "loss" in logs:
            epoch, tokens = logs.get("epoch"), logs.get("num_input_tokens_seen")
            self.run.step(
                state.global_step,
                float(logs["loss"]),
                learning_rate=logs.get("learning_rate"),
                grad_norm=logs.get("grad_norm"),
                epoch=None if epoch is None else int(epoch),
                tokens_seen=None if tokens is None else int(tokens),
            )


def _latest_logs(state: Any) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for entry in state.log_history:
        merged.update(entry)
    return merged


def build_model(config: TrainerConfig, env: WorkerEnv) -> torch.nn.Module:
    """The model the built-in loop would start from, in fp32 (the Trainer handles precision)."""
    if models.is_pretrained(config.model):
        folder = fetch_weights(config.model, env)
        model: torch.nn.Module = models.load_pretrained(folder, config.model, torch.float32)
    else:
        model = models.build_from_config(
            models.model_config(config.model), torch.float32, meta=False, seed=config.training.seed
        )
    return models.apply_lora(model, config.method)


def _staging(run_dir: Path, env: WorkerEnv) -> Path:
    """This rank's Trainer output_dir, emptied: checkpoints pass through it on their way to the run."""
    path = run_dir / STAGING_DIR / f"rank-{env.rank}"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def export(trainer: Trainer, tokenizer: Any, run: Lifecycle) -> None:
    """save_model into a staging folder (a collective under FSDP/DeepSpeed), renamed into place.
    LoRA: `export/` holds the adapters and, with method.lora.mergeOnExport, `export/merged/` the base
    model with them merged in, the layout of the built-in loop's export."""
    staging = run.run_dir / ".export-staging"
    if run.env.is_main:
        shutil.rmtree(staging, ignore_errors=True)
    dist.barrier()
    if trainer.is_fsdp_enabled:  # checkpoints are sharded; Trainer.save_model writes none of those
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type(FSDP_EXPORT_STATE_DICT)
    trainer.save_model(str(staging))
    merged = merged_model(trainer, run.config, run.env.is_main)
    dist.barrier()
    if run.env.is_main:
        tokenizer.save_pretrained(str(staging))
        if merged is not None:
            merged.save_pretrained(str(staging / MERGED_DIR))
            tokenizer.save_pretrained(str(staging / MERGED_DIR))
        shutil.rmtree(run.export_dir, ignore_errors=True)
        staging.rename(run.export_dir)
    dist.barrier()


def merged_model(trainer: Trainer, config: TrainerConfig, is_main: bool) -> PreTrainedModel | None:
    """With method.lora.mergeOnExport, rank 0's plain model: the base with the trained adapters
    merged in. Every rank calls it (gathering the full state dict is a collective under FSDP and
    DeepSpeed); the weights are loaded into a meta skeleton, so rank 0 holds one copy."""
    if config.method.type != "lora" or not (config.method.lora or LoraSpec()).merge_on_export:
        return None
    state = trainer.accelerator.get_state_dict(trainer.model)
    if not is_main:
        return None
    skeleton = meta_skeleton(models.model_config(config.model), config.method)
    assert isinstance(skeleton, PeftModel)
    skeleton.load_state_dict(state, assign=True)
    merged = skeleton.merge_and_unload()
    merged.tie_weights()  # assign=True loaded tied weights as two tensors
    assert isinstance(merged, PreTrainedModel)
    return merged


def _note_evaluation(trainer: Any, run: Lifecycle, step: int) -> None:
    """The Trainer's best eval_loss and its checkpoint, and whether its EarlyStoppingCallback
    ended training, for result.json and the finished record."""
    state = trainer.state
    if state.best_metric is not None:
        run.best_val_loss = float(state.best_metric)
        run.best_checkpoint = state.best_model_checkpoint
    rule = run.config.training.early_stopping
    stoppers = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, EarlyStoppingCallback)]
    if rule is not None and any(
        cb.early_stopping_patience_counter >= cb.early_stopping_patience for cb in stoppers
    ):
        run.stopped_early = (
            f"early stopping at step {step}: eval_loss has not improved by more than {rule.min_delta:g} "
            f"for {rule.patience} evaluations (training.earlyStopping.patience)"
        )
        if run.env.is_main:
            logging.getLogger(__name__).info("%s", run.stopped_early)


def run_huggingface(config: TrainerConfig, env: WorkerEnv, run_dir: Path, run: Lifecycle) -> None:
    torch.manual_seed(config.training.seed)
    tokenizer = load_tokenizer(config.model)
    with rank_zero_first(env):
        data = build_sequences(config.dataset, tokenizer, config.training.seed)
    output_dir = _staging(run_dir, env)
    evaluate = data.validation is not None
    args = training_arguments(config, output_dir, evaluate=evaluate)
    model = build_model(config, env)
    n_params, n_trainable = models.count_parameters(model)
    run.announce(
        f"Hugging Face Trainer, strategy {config.strategy.type}, {env.world_size} workers on "
        f"{env.device.type}, {n_params:,} parameters ({n_trainable:,} trainable)",
        resumed_at=run.resume.step,
    )
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    attention = models.use_packed_attention(model, config.dataset, env.on_gpu)
    multiple_of = models.packed_row_length(config.dataset, attention)
    if config.tracking is not None and config.tracking.tensorboard is not None:
        # transformers' TensorBoard integration (report_to) takes its folder from here only.
        os.environ["TENSORBOARD_LOGGING_DIR"] = str(tensorboard_dir(run_dir))
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=data.train,
        eval_dataset=data.validation,
        data_collator=lambda examples: collate(examples, pad_id, multiple_of),
        callbacks=[
            ProgressToSinks(run),
            CheckpointToRunDir(run, output_dir),
            *early_stopping_callbacks(config, evaluate),
        ],
    )
    trainer = prepare_trainer(trainer)
    resume = run.resume.checkpoint / HF_CHECKPOINT if run.resume.checkpoint is not None else None
    outcome = trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    run.end_training()
    _note_evaluation(trainer, run, int(outcome.global_step))
    if config.checkpoint.export:
        export(trainer, tokenizer, run)
    run.finish(int(outcome.global_step), run.existing_export())
