"""spec.trainer: which training code runs on the workers.

`builtin` is llmtrain's own loop. `huggingface` keeps the platform's model, tokenizer and data but
steps them with a `transformers.Trainer`. `custom` calls the user's `module:function` on every
worker. The structure around them (RayJob, entrypoint, ConfigMap, run directory, progress, resume)
is the same for all three, so only the code inside the workers differs.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator

from llmtrain.api.base import ApiModel, cel

# `package.module:function`, each part a Python identifier.
FUNCTION_REF_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"

# TrainingArguments the platform derives from the spec (the value comes from the named field).
HF_DERIVED_ARGS: dict[str, str] = {
    "max_steps": "training.maxSteps",
    "num_train_epochs": "training.epochs",
    "per_device_train_batch_size": "training.microBatchSize",
    "per_device_eval_batch_size": "training.microBatchSize",
    "gradient_accumulation_steps": "training.gradientAccumulationSteps",
    "learning_rate": "training.learningRate",
    "warmup_ratio": "training.warmupRatio",
    "warmup_steps": "training.warmupRatio",
    "weight_decay": "training.weightDecay",
    "max_grad_norm": "training.maxGradNorm",
    "lr_scheduler_type": "training.lrScheduler",
    "gradient_checkpointing": "training.gradientCheckpointing",
    "activation_checkpointing": "training.gradientCheckpointing",
    "seed": "training.seed",
    "bf16": "training.precision",
    "fp16": "training.precision",
    "logging_steps": "training.logEverySteps",
    "save_steps": "checkpoint.everySteps",
    "eval_steps": "checkpoint.everySteps",
    "eval_strategy": "dataset.validationSplit",
    "fsdp": "strategy",
    "fsdp_config": "strategy",
    "deepspeed": "strategy",
    # The Trainer's own tracker integrations, joined into spec.tracking's runs.
    "report_to": "tracking",
}
# TrainingArguments whose change would break what the platform guarantees: checkpoints in the run
# directory that a restart resumes from, the device and process group Ray Train set up.
HF_PLATFORM_ARGS: tuple[str, ...] = (
    "output_dir",
    "overwrite_output_dir",
    "save_strategy",
    "save_total_limit",
    "save_only_model",
    "save_on_each_node",
    "resume_from_checkpoint",
    "ignore_data_skip",
    "push_to_hub",
    "hub_model_id",
    "hub_strategy",
    "hub_token",
    "use_cpu",
    "no_cuda",
    "local_rank",
    "ddp_backend",
    "ddp_timeout",
    "logging_dir",
)
HF_RESERVED_ARGS: tuple[str, ...] = (*HF_DERIVED_ARGS, *HF_PLATFORM_ARGS)
# The Hugging Face mode continues a run (resumeFrom.run: the Trainer's own resume_from_checkpoint)
# but has no weights-only start: the CRD's CEL and the trainer's preflight say so in these words.
HF_SEED_UNSUPPORTED = (
    "spec.resumeFrom.checkpoint (weights only) is not supported with trainer.type huggingface: use "
    "resumeFrom.run to continue a Hugging Face Trainer run with all its state, or trainer.type "
    "builtin or custom to start from a checkpoint's weights"
)


class HuggingFaceTrainerSpec(ApiModel):
    """Options of the Hugging Face Trainer mode beyond what the spec already sets."""

    # Free-form values (numbers, booleans, strings, lists), so the map is opaque to the API server's
    # CEL (it cannot type it): the platform's arguments are refused by `llmtrain validate` and by
    # the operator before anything is created, as for the inline model config.
    args: Annotated[dict[str, Any], Field(max_length=64)] | None = Field(
        default=None,
        description="Extra transformers.TrainingArguments (snake_case names, e.g. optim, adam_beta2, "
        "dataloader_num_workers), checked against the installed transformers before workers start. "
        "Arguments the spec derives or the platform needs are refused.",
    )

    @field_validator("args")
    @classmethod
    def _not_the_platforms(cls, args: dict[str, Any] | None) -> dict[str, Any] | None:
        owned = sorted(set(args or {}) & set(HF_RESERVED_ARGS))
        if owned:
            raise ValueError(
                f"trainer.huggingface.args cannot set {', '.join(owned)}: TrainingArguments the "
                "platform owns (hyperparameters, precision, strategy, logging/eval/save steps come "
                "from the spec: training, strategy, checkpoint; output_dir, save_*, resume, hub, "
                "device and process-group settings keep checkpoints, resume and Ray's workers working)"
            )
        return args


class CustomTrainerSpec(ApiModel):
    """The user's own training function, called on every worker."""

    function: Annotated[str, Field(pattern=FUNCTION_REF_PATTERN, max_length=256)] = Field(
        description="The function to call, as module:function (e.g. my_training.sft:train). It "
        "receives one argument, the llmtrain_trainer.modes.custom.TrainContext."
    )
    path: Annotated[str, Field(min_length=1, max_length=1024)] | None = Field(
        default=None,
        description="Directory put first on the module search path: absolute, or relative to "
        "storage.mountPath (to the job file's folder with `llmtrain run`). Unset: the module comes "
        "from the trainer image.",
    )
    args: Annotated[dict[str, Any], Field(max_length=256)] | None = Field(
        default=None, description="Free-form settings handed to the function as context.args."
    )


class TrainerSpec(ApiModel):
    """Which training code the workers run."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.huggingface) || self.type == 'huggingface'",
                    "trainer.huggingface is only valid with trainer.type: huggingface; remove it "
                    "or change the type",
                ),
                cel(
                    # has(): the API server also checks this rule on the field's default, {}.
                    "has(self.custom) == (has(self.type) && self.type == 'custom')",
                    "trainer.custom (the function to call) is required with trainer.type: custom "
                    "and only valid with it",
                ),
            ]
        }
    )

    type: Literal["builtin", "huggingface", "custom"] = Field(
        default="builtin",
        description="builtin: llmtrain's own training loop; huggingface: a transformers.Trainer "
        "built from the spec; custom: your function (trainer.custom.function) on every worker.",
    )
    huggingface: HuggingFaceTrainerSpec | None = Field(
        default=None, description="Hugging Face Trainer options (type huggingface)."
    )
    custom: CustomTrainerSpec | None = Field(default=None, description="The function to run (type custom).")
