"""The spec → `transformers.TrainingArguments` for trainer.type huggingface.

Everything the spec already says (hyperparameters, precision, strategy, logging and checkpoint
cadence) is derived here; `trainer.huggingface.args` adds the rest. Pass-through keys the platform
owns (llmtrain.api.trainer_spec.HF_RESERVED_ARGS) are refused by the spec's model, i.e. by
`llmtrain validate` and by the operator (the API server's CEL cannot type the free-form map, so
`kubectl apply` accepts them); preflight refuses keys the installed transformers does not know, so a
typo fails before any worker starts.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from llmtrain.api.trainer_config import TrainerConfig
from transformers import TrainingArguments

# The built-in loop's schedule names → transformers' (a constant rate still warms up).
SCHEDULERS = {"cosine": "cosine", "linear": "linear", "constant": "constant_with_warmup"}


_FIELDS = {f.name for f in dataclasses.fields(TrainingArguments) if f.init}
# transformers 5 renamed gradient_checkpointing (the old name still works, with a warning).
_CHECKPOINTING = (
    "activation_checkpointing" if "activation_checkpointing" in _FIELDS else "gradient_checkpointing"
)


FSDP_CHECKPOINT_STATE_DICT = "SHARDED_STATE_DICT"
FSDP_EXPORT_STATE_DICT = "FULL_STATE_DICT"


def unknown_arguments(args: dict[str, Any]) -> list[str]:
    return sorted(k for k in args if k not in _FIELDS)


def strategy_arguments(config: TrainerConfig) -> dict[str, Any]:
    """FSDP or DeepSpeed as transformers (through accelerate) configures them; DDP needs nothing."""
    strategy = config.strategy
    if strategy.type == "fsdp":
        fsdp = strategy.fsdp
        options = "full_shard auto_wrap" + (" offload" if fsdp is not None and fsdp.cpu_offload else "")
        reshard = fsdp.reshard_after_forward if fsdp is not None else True
        fsdp_config = {
            "version": 2,
            "reshard_after_forward": reshard,
            # accelerate shards rank 0's weights and broadcasts them (fsdp2_load_full_state_dict):
            # the model is moved to meta before fully_shard, so no rank holds a full copy on its GPU.
            "cpu_ram_efficient_loading": True,
            # Checkpoints as one DCP shard per rank: the FULL_STATE_DICT default would gather the
            # whole model on rank 0 at every save. The export switches to a full state dict.
            "state_dict_type": FSDP_CHECKPOINT_STATE_DICT,
            # With FSDP, checkpointing inside the FSDP units saves the extra all-gather of the
            # TrainingArguments' own activation_checkpointing (transformers' fsdp_config docs).
            "activation_checkpointing": config.training.gradient_checkpointing,
        }
        return {"fsdp": options, "fsdp_config": fsdp_config}
    if strategy.type == "deepspeed":
        ds = strategy.deepspeed
        stage = ds.zero_stage if ds is not None else 3
        zero: dict[str, Any] = {"stage": stage}
        if ds is not None and ds.offload_optimizer:
            zero["offload_optimizer"] = {"device": "cpu"}
        if ds is not None and ds.offload_params:
            zero["offload_param"] = {"device": "cpu"}
        if stage == 3:
            zero["stage3_gather_16bit_weights_on_model_save"] = True
        return {
            "deepspeed": {
                "zero_optimization": zero,
                "bf16": {"enabled": "auto"},
                "fp16": {"enabled": "auto"},
                "train_micro_batch_size_per_gpu": "auto",
                "gradient_accumulation_steps": "auto",
                "gradient_clipping": "auto",
            }
        }
    return {}


def best_model_arguments(config: TrainerConfig, evaluate: bool) -> dict[str, Any]:
    """training.earlyStopping and checkpoint.keepBest/exportBest → the Trainer's best-model
    tracking on eval_loss (lower is better); exportBest also loads the best weights at the end,
    which the export then writes."""
    checkpoint = config.checkpoint
    if not evaluate or not (config.training.early_stopping or checkpoint.keep_best or checkpoint.export_best):
        return {}
    return {
        "metric_for_best_model": "eval_loss",
        "greater_is_better": False,
        "load_best_model_at_end": checkpoint.export_best,
    }


def early_stopping_callbacks(config: TrainerConfig, evaluate: bool) -> list[Any]:
    """transformers' EarlyStoppingCallback for training.earlyStopping (patience in evaluations,
    minDelta as its threshold)."""
    rule = config.training.early_stopping
    if rule is None or not evaluate:
        return []
    from transformers import EarlyStoppingCallback

    return [
        EarlyStoppingCallback(early_stopping_patience=rule.patience, early_stopping_threshold=rule.min_delta)
    ]


def training_arguments(config: TrainerConfig, output_dir: Path, evaluate: bool) -> TrainingArguments:
    training, on_gpu = config.training, config.scaling.use_gpu
    passed = dict(config.trainer.huggingface.args or {}) if config.trainer.huggingface else {}
    derived: dict[str, Any] = {
        "output_dir": str(output_dir),
        "max_steps": training.max_steps or -1,
        "num_train_epochs": training.epochs,
        "per_device_train_batch_size": training.micro_batch_size,
        "per_device_eval_batch_size": training.micro_batch_size,
        "gradient_accumulation_steps": training.gradient_accumulation_steps,
        "learning_rate": training.learning_rate,
        # A float below 1 is a fraction of the total steps.
        "warmup_steps": min(training.warmup_ratio, 0.999),
        "weight_decay": training.weight_decay,
        "max_grad_norm": training.max_grad_norm,
        "lr_scheduler_type": SCHEDULERS[training.lr_scheduler],
        # Under FSDP it is fsdp_config's activation_checkpointing instead (strategy_arguments).
        _CHECKPOINTING: training.gradient_checkpointing and config.strategy.type != "fsdp",
        "seed": training.seed,
        "bf16": on_gpu and training.precision == "bf16",
        "fp16": on_gpu and training.precision == "fp16",
        "use_cpu": not on_gpu,
        "logging_strategy": "steps",
        "logging_steps": training.log_every_steps,
        "logging_first_step": True,
        "save_strategy": "steps",
        "save_steps": config.checkpoint.every_steps,
        "eval_strategy": "steps" if evaluate else "no",
        # training.evalEverySteps, else at each checkpoint; with keepBest/exportBest the API keeps
        # save_steps a multiple of it, as load_best_model_at_end requires.
        "eval_steps": (training.eval_every_steps or config.checkpoint.every_steps) if evaluate else None,
        **strategy_arguments(config),
        **best_model_arguments(config, evaluate),
    }
    derived["report_to"] = config.tracking.backends() if config.tracking is not None else "none"
    defaults = {
        "disable_tqdm": True,
        # num_input_tokens_seen in the logs: tokens/s in the progress records (ProgressToSinks).
        # Padded rows are counted by their attention mask. Packed rows have none (it would switch
        # off the document mask), and the Trainer has no tokenizer to find their padding by, so
        # they count whole: text has no padding, packed examples only their row's short tail.
        "include_num_input_tokens_seen": "all" if config.dataset.packs else "non_padding",
    }
    return TrainingArguments(**{**defaults, **passed, **derived})
