"""The LLMTrainingJob spec: the one definition of the API.

The CRD (`make generate`), the offline validator, the renderer and the trainer's config all derive
from these models. Cross-field rules are CEL expressions attached to the models; they are
evaluated by the Kubernetes API server (from the CRD) and by `llmtrain validate` (from the same
text), so a rule is written once.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator
from pydantic.config import JsonDict

from llmtrain.api.base import (
    DNS1123_SUBDOMAIN,
    ENV_NAME_PATTERN,
    IMAGE_REFERENCE,
    LABEL_VALUE,
    QUALIFIED_NAME,
    ApiModel,
    KubeQuantity,
    SecretKeyRef,
    cel,
    immutable,
    metadata_keys_rule,
)
from llmtrain.api.hub import HubPushSpec
from llmtrain.api.object_storage import OBJECT_URI, OBJECT_URI_CEL, ObjectStorageSpec
from llmtrain.api.pod_template import PodTemplateOverlay
from llmtrain.api.tracking import TrackingSpec
from llmtrain.api.trainer_spec import HF_SEED_UNSUPPORTED, TrainerSpec
from llmtrain.constants import (
    CONFIG_DIR,
    DEFAULT_MOUNT_PATH,
    MIN_RAY_VERSION,
    SUPPORTED_RAY_VERSION_PATTERN,
)
from llmtrain.quantity import parse_quantity

Quantity = Annotated[str, Field(max_length=64)]
ShortString = Annotated[str, Field(min_length=1, max_length=253)]


# The fewest Ray CPUs the trainer reserves for each training process (ResourcesSpec's CPU check).
MIN_CPUS_PER_PROCESS = 0.5

# The largest value a Kubernetes or KubeRay int32 field holds.
INT32_MAX = 2**31 - 1
# 15 minutes: a first pull of a multi-GB CUDA trainer image onto a fresh node takes several
# minutes, and a job whose pods cannot start should not hold the GPUs of the pods that did for
# longer than that (Kueue's waitForPodsReady defaults to 5 minutes for the same purpose).
DEFAULT_STARTUP_DEADLINE_SECONDS = 900
# KubeRay's preRunningDeadlineSeconds is the job's startupDeadlineSeconds plus this. KubeRay retries
# an attempt that passes it (on a new Ray cluster, while backoffLimit lasts: only
# activeDeadlineSeconds is exempt), so the operator's own check, which fails the job and stops its
# RayJob without a retry, has to fire first. The operator judges a starting job at least every
# --startup-look-seconds (15 s) and every job at each resync (--resync-seconds, 120 s); the margin
# exceeds both together, with room for a busy operator's queue and the stop's round trip. KubeRay's
# deadline is then only the backstop for when no operator runs.
STARTUP_BACKSTOP_SECONDS = 180
# checkpoint.everySteps when unset (also in the CEL rule that relates it to training.evalEverySteps).
DEFAULT_CHECKPOINT_EVERY_STEPS = 500

# spec.resumeFrom.run: '<job name>/<run id>' or '<run id>' (a uid, or a local run's job file stem).
RUN_REF_PATTERN = r"^([a-z]([-a-z0-9]*[a-z0-9])?/)?[A-Za-z0-9][-A-Za-z0-9_.]*$"


class ModelSpec(ApiModel):
    """What to train: a pretrained checkpoint, or an architecture from an inline config."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.name) != has(self.config)",
                    "set exactly one of model.name (a hub id or a path on the shared storage) "
                    "or model.config (an inline config to train from scratch)",
                ),
                cel(
                    "!has(self.config) || has(self.tokenizer)",
                    "model.tokenizer is required with model.config: name a hub id, a path, "
                    "or 'byte-level' for the built-in byte tokenizer",
                ),
            ]
        }
    )

    name: ShortString | None = Field(
        default=None,
        description="Hugging Face hub id (e.g. meta-llama/Meta-Llama-3-8B) or a path on the shared "
        "storage (absolute, or relative to storage.mountPath) of a pretrained model.",
    )
    revision: Annotated[str, Field(min_length=1, max_length=128)] | None = Field(
        default=None, description="Hub revision (branch, tag or commit) to load; defaults to main."
    )
    config: dict[str, Any] | None = Field(
        default=None,
        description="Inline Hugging Face model config (must contain model_type) to train from scratch; "
        "meant for tests and demos.",
    )
    tokenizer: ShortString | None = Field(
        default=None,
        description="Tokenizer hub id or path; defaults to model.name. 'byte-level' selects the "
        "built-in byte tokenizer (no download).",
    )
    trust_remote_code: bool = Field(
        default=False,
        description="Allow executing model code from the hub repository. Off by default: it runs "
        "arbitrary code in every training pod.",
    )
    hf_token_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding a Hugging Face token for gated models; injected as HF_TOKEN "
        "through secretKeyRef only.",
    )


class DatasetSpec(ApiModel):
    """Training data and how to turn it into token sequences."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.name) != has(self.path)",
                    "set exactly one of dataset.name (a hub dataset id) or dataset.path "
                    "(jsonl, parquet or text files on the shared storage)",
                ),
                cel(
                    "!has(self.path) || !self.path.matches('(^|/)\\\\.\\\\.(/|$)')",
                    "dataset.path cannot contain a '..' segment: a relative path stays under "
                    "storage.mountPath",
                    ".path",
                ),
                cel(
                    "!has(self.validationPath) || !self.validationPath.matches('(^|/)\\\\.\\\\.(/|$)')",
                    "dataset.validationPath cannot contain a '..' segment: a relative path stays under "
                    "storage.mountPath",
                    ".validationPath",
                ),
                cel(
                    "!has(self.validationPath) || !has(self.validationSplit) || self.validationSplit == 0.0",
                    "set only one of dataset.validationPath (a held-out file) and dataset.validationSplit "
                    "(a fraction of dataset.path held out): drop validationSplit, or validationPath",
                    ".validationPath",
                ),
            ]
        }
    )

    name: ShortString | None = Field(default=None, description="Hugging Face hub dataset id.")
    path: Annotated[str, Field(min_length=1, max_length=1024)] | None = Field(
        default=None,
        description="File or directory of .jsonl, .parquet or .txt files: absolute, or relative to "
        "storage.mountPath (relative to the job file's folder with `llmtrain run`).",
    )
    split: Annotated[str, Field(min_length=1, max_length=128)] = Field(
        default="train", description="Dataset split to train on."
    )
    format: Literal["text", "instruction", "chat"] = Field(
        default="text",
        description="text: raw text (packed into fixed-length sequences); instruction: prompt and "
        "response fields, loss on the response only; chat: a list of messages with the tokenizer's "
        "chat template, loss on assistant turns only.",
    )
    text_field: Annotated[str, Field(min_length=1, max_length=128)] = Field(
        default="text", description="Record field holding the text (format text)."
    )
    prompt_field: Annotated[str, Field(min_length=1, max_length=128)] = Field(
        default="prompt", description="Record field holding the prompt (format instruction)."
    )
    response_field: Annotated[str, Field(min_length=1, max_length=128)] = Field(
        default="response", description="Record field holding the response (format instruction)."
    )
    messages_field: Annotated[str, Field(min_length=1, max_length=128)] = Field(
        default="messages", description="Record field holding the message list (format chat)."
    )
    prompt_template: Annotated[str, Field(min_length=1, max_length=4096)] | None = Field(
        default=None,
        description="Template for the prompt in format instruction, with {prompt} as placeholder; "
        "defaults to the prompt as is.",
    )
    max_seq_length: int = Field(default=2048, ge=8, le=1048576, description="Tokens per training sequence.")
    packing: bool | None = Field(
        default=None,
        description="Put several samples in each maxSeqLength sequence instead of padding each "
        "sample to its own. Format text concatenates documents and cuts full sequences; "
        "instruction and chat place whole examples side by side, each with its own positions and "
        "attention that stops at its boundaries (flex_attention's block mask on GPUs for "
        "architectures that have it, else a mask derived from the position restarts), and keep "
        "their loss masks: each example "
        "trains as it would alone, without the compute spent on padding. Defaults to true; false "
        "pads each sample to the longest of its micro-batch.",
    )
    validation_split: float = Field(
        default=0.0,
        ge=0.0,
        le=0.5,
        description="Fraction of the data held out for validation loss; 0 disables it. Exclusive "
        "with validationPath.",
    )
    validation_path: Annotated[str, Field(min_length=1, max_length=1024)] | None = Field(
        default=None,
        description="A held-out file or directory for the validation loss, in the same formats and "
        "location kinds as dataset.path (absolute, relative to storage.mountPath, or an object URI), "
        "tokenised and cached the same way; the training data is then used whole. Exclusive with "
        "validationSplit.",
    )
    tokenize_processes: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="Processes that tokenize the data on rank 0; defaults to the CPUs the worker "
        "may use (its CPU limit), at most one per 10,000 records. The result, cached on the storage, "
        "is the same for any count.",
    )

    @property
    def packs(self) -> bool:
        """Whether samples are packed: dataset.packing, else true for every format."""
        return self.packing is not False

    @property
    def packs_examples(self) -> bool:
        """Whether whole instruction/chat examples share rows (rows carry position_ids, and
        attention must stop at each example's boundary)."""
        return self.packs and self.format != "text"


class LoraSpec(ApiModel):
    """Low-rank adapters (peft)."""

    rank: int = Field(default=16, ge=1, le=1024, description="Rank r of the adapter matrices.")
    alpha: int = Field(default=32, ge=1, le=4096, description="Scaling alpha (the update is alpha/r).")
    dropout: float = Field(default=0.05, ge=0.0, lt=1.0, description="Dropout on the adapter input.")
    target_modules: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=128)]], Field(min_length=1, max_length=64)
    ] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        description="Names of the modules that get adapters.",
    )
    merge_on_export: bool = Field(
        default=False,
        description="Also export the base model with the adapter merged into it.",
    )


class MethodSpec(ApiModel):
    """Full fine-tuning or LoRA."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.lora) || self.type == 'lora'",
                    "method.lora is only valid with method.type: lora; remove it or set type: lora",
                ),
            ]
        }
    )

    type: Literal["full", "lora"] = Field(
        default="full", description="full: train every weight; lora: train low-rank adapters only."
    )
    lora: LoraSpec | None = Field(
        default=None, description="LoRA settings; defaults apply when type is lora and this is unset."
    )


class FsdpSpec(ApiModel):
    """PyTorch FSDP2 (fully_shard) options."""

    reshard_after_forward: bool = Field(
        default=True,
        description="Free gathered parameters after forward (ZeRO-3-like memory); false keeps them "
        "for backward (ZeRO-2-like speed).",
    )
    cpu_offload: bool = Field(
        default=False, description="Keep parameters, gradients and optimizer state in host memory."
    )
    hybrid_shard_size: int | None = Field(
        default=None,
        ge=1,
        le=65536,
        description="HSDP: shard each parameter within groups of this many training processes and "
        "replicate it across the groups. Set it to resources.gpusPerWorker on a slow inter-node "
        "fabric: all-gathers and reduce-scatters then stay on a node's NVLink and only one all-reduce "
        "of each shard per step crosses nodes, at the cost of one shard per group instead of per "
        "process. Must divide the training processes (workers x gpusPerWorker; workers on CPU).",
    )


class DeepSpeedSpec(ApiModel):
    """DeepSpeed ZeRO options."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!self.offloadParams || self.zeroStage == 3",
                    "strategy.deepspeed.offloadParams needs zeroStage: 3",
                ),
            ]
        }
    )

    zero_stage: Literal[1, 2, 3] = Field(
        default=3,
        description="1: shard optimizer state; 2: and gradients; 3: and parameters.",
    )
    offload_optimizer: bool = Field(
        default=False, description="Offload optimizer state and step to the CPU (ZeRO-Offload)."
    )
    offload_params: bool = Field(
        default=False, description="Offload parameters to the CPU (ZeRO-Infinity, stage 3 only)."
    )


class StrategySpec(ApiModel):
    """How the model is distributed across workers."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.deepspeed) || self.type == 'deepspeed'",
                    "strategy.deepspeed (zeroStage, offload) is only valid with strategy.type: "
                    "deepspeed; remove it or change the type",
                ),
                cel(
                    "!has(self.fsdp) || self.type == 'fsdp'",
                    "strategy.fsdp is only valid with strategy.type: fsdp; remove it or change the type",
                ),
            ]
        }
    )

    type: Literal["fsdp", "deepspeed", "ddp"] = Field(
        default="fsdp",
        description="fsdp: PyTorch FSDP2; deepspeed: DeepSpeed ZeRO; ddp: plain data parallel for "
        "models that fit on one device.",
    )
    fsdp: FsdpSpec | None = Field(default=None, description="FSDP2 options (type fsdp).")
    deepspeed: DeepSpeedSpec | None = Field(default=None, description="ZeRO options (type deepspeed).")


class EarlyStoppingSpec(ApiModel):
    """Stop training once the validation loss has stopped improving."""

    patience: int = Field(
        ge=1,
        le=100_000,
        description="Evaluations in a row (training.evalEverySteps, else one at each checkpoint) without "
        "an improvement after which "
        "the run stops, successfully.",
    )
    min_delta: float = Field(
        default=0.0,
        ge=0.0,
        le=1e6,
        description="How much lower than the best so far a validation loss must be to count as an "
        "improvement.",
    )


class TrainingSpec(ApiModel):
    """Optimisation hyperparameters."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    # has(): the API server also checks this rule on the field's default, {}.
                    "!has(self.checkpointEveryBlocks) || self.checkpointEveryBlocks == 1 || "
                    "(has(self.gradientCheckpointing) && self.gradientCheckpointing)",
                    "training.checkpointEveryBlocks only applies with training.gradientCheckpointing: "
                    "true; set that too, or remove checkpointEveryBlocks",
                )
            ]
        }
    )

    precision: Literal["bf16", "fp16", "fp32"] = Field(
        default="bf16",
        description="Compute precision on GPUs. CPU training always computes in fp32; fp16 is "
        "rejected on CPU.",
    )
    max_steps: int | None = Field(
        default=None,
        ge=1,
        le=100_000_000,
        description="Optimizer steps to train; overrides epochs (the data repeats as needed).",
    )
    epochs: int = Field(default=1, ge=1, le=10_000, description="Passes over the data (without maxSteps).")
    micro_batch_size: int = Field(default=1, ge=1, le=4096, description="Sequences per worker per step.")
    gradient_accumulation_steps: int = Field(
        default=1, ge=1, le=4096, description="Micro-batches accumulated per optimizer step."
    )
    learning_rate: float = Field(default=2e-5, gt=0.0, le=1.0, description="Peak learning rate (AdamW).")
    warmup_ratio: float = Field(
        default=0.03, ge=0.0, le=1.0, description="Fraction of steps with linear warm-up."
    )
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0, description="AdamW weight decay.")
    max_grad_norm: float = Field(
        default=1.0, ge=0.0, le=1e6, description="Gradient clipping norm; 0 disables clipping."
    )
    lr_scheduler: Literal["cosine", "linear", "constant"] = Field(
        default="cosine", description="Learning-rate decay after warm-up."
    )
    gradient_checkpointing: bool = Field(
        default=False, description="Recompute activations in backward to save memory (about +33% compute)."
    )
    checkpoint_every_blocks: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="With gradientCheckpointing: checkpoint one transformer block in this many, the "
        "first, then every N-th. 1 checkpoints every block (least memory); 2 every other block "
        "(selective checkpointing: half the recomputation, the other blocks keep their activations). "
        "The builtin trainer only; the huggingface and custom trainers ignore it.",
    )
    compile: bool | None = Field(
        default=None,
        description="FSDP2 and DDP: compile each transformer block with torch.compile (inductor) before "
        "it is sharded or wrapped. Unset: on for GPU workers (39.7% vs 33.3% MFU at micro-batch 4 and "
        "50.8% vs 37.7% at 8 on an H200, 1.1B Llama), off on CPUs, where compiling costs more than it "
        "saves in a short run. The first steps are slower while the blocks compile. A block that fails "
        "to compile runs eagerly (same results, slower), said in the log and status.progress.notices. "
        "DeepSpeed and the huggingface and custom trainers ignore it.",
    )
    seed: int = Field(default=42, ge=0, le=2**31 - 1, description="Seed for weights, data order and dropout.")
    log_every_steps: int = Field(
        default=10, ge=1, le=100_000, description="Steps between metric reports (loss, tokens/s, MFU)."
    )
    eval_every_steps: int | None = Field(
        default=None,
        ge=1,
        le=10_000_000,
        description="Optimizer steps between evaluations of the validation loss (dataset.validationSplit "
        "or validationPath). Unset: at every checkpoint. Each evaluation counts for earlyStopping and "
        "status.progress.evalLoss/bestEvalLoss; only those at checkpoint steps can rank checkpoints, so "
        "with checkpoint.keepBest or exportBest, checkpoint.everySteps must be a multiple of it. The "
        "huggingface trainer maps it to eval_steps.",
    )
    early_stopping: EarlyStoppingSpec | None = Field(
        default=None,
        description="Stop when the validation loss (dataset.validationSplit or validationPath, evaluated "
        "every evalEverySteps steps or at every checkpoint) has not improved for `patience` "
        "evaluations. The builtin and huggingface trainers apply it; a custom function reads it from "
        "its config.",
    )


class CheckpointSpec(ApiModel):
    """Sharded checkpoints on the shared storage; the run resumes from the latest one."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.exportTo) || !has(self.export) || self.export",
                    "checkpoint.exportTo copies the export: it needs checkpoint.export: true",
                    ".exportTo",
                ),
                cel(
                    "!has(self.pushToHub) || !has(self.export) || self.export",
                    "checkpoint.pushToHub uploads the export: it needs checkpoint.export: true",
                    ".pushToHub",
                ),
            ]
        }
    )

    every_steps: int = Field(
        default=DEFAULT_CHECKPOINT_EVERY_STEPS,
        ge=1,
        le=10_000_000,
        description="Optimizer steps between checkpoints.",
    )
    keep: int = Field(default=3, ge=1, le=1000, description="Checkpoints kept (oldest deleted first).")
    async_save: bool = Field(
        default=False,
        description="FSDP2 and DDP: copy the state to host memory, then write the shards in a background "
        "thread while training goes on (torch.distributed.checkpoint.async_save). A checkpoint counts, and "
        "a restart can resume from it, only once all of its files are written; the next checkpoint, the "
        "export and the end of the run wait for the previous write. Costs host RAM for one copy of each "
        "rank's model and optimizer shards. DeepSpeed and the huggingface and custom trainers always "
        "save synchronously.",
    )
    export: bool = Field(
        default=True,
        description="At the end, write a Hugging Face directory (safetensors, config, tokenizer) next to "
        "the checkpoints.",
    )
    export_to: Annotated[str, Field(pattern=OBJECT_URI, max_length=1024)] | None = Field(
        default=None,
        description="Also copy the export, once it is complete, to this object-store prefix "
        "(s3://, gs:// or az://bucket/prefix; needs that store in spec.objectStorage). Retried a "
        "few times; the result shows in status.progress.exportedTo (or status.progress.error).",
    )
    push_to_hub: HubPushSpec | None = Field(
        default=None,
        description="Also upload the export, once it is complete, to a Hugging Face Hub model "
        "repository (one commit). Retried a few times; the commit's URL shows in "
        "status.progress.pushedToHub. A push that still fails fails the job with the reason in "
        "status.progress.error; the export stays on the shared storage and a retry pushes again "
        "without training again.",
    )
    keep_best: bool = Field(
        default=False,
        description="trainer.type builtin: rotate by validation loss, keeping the `keep` checkpoints "
        "with the lowest one (and always the latest, to resume from) instead of the newest. Needs "
        "dataset.validationSplit or validationPath.",
    )
    export_best: bool = Field(
        default=False,
        description="Export the checkpoint with the lowest validation loss instead of the final weights "
        "(implies keepBest). Needs dataset.validationSplit or validationPath.",
    )


class Toleration(ApiModel):
    """A pod toleration (core/v1 Toleration)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || "
                    "self.value == ''",
                    "resources.tolerations: operator Exists matches any value; drop value or use Equal",
                    ".value",
                ),
            ]
        }
    )

    key: Annotated[str, Field(max_length=316)] | None = Field(default=None, description="Taint key.")
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Exists or Equal.")
    value: Annotated[str, Field(max_length=63, pattern=LABEL_VALUE)] | None = Field(
        default=None, description="Taint value."
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to tolerate; all effects when empty."
    )
    toleration_seconds: int | None = Field(
        default=None, ge=0, description="For NoExecute: how long the pod stays bound after the taint."
    )


class HeadResources(ApiModel):
    """The Ray head pod runs the driver and the dashboard; it gets no GPU."""

    cpu: Annotated[Quantity, KubeQuantity("resources.head.cpu", "2")] = Field(
        default="2",
        description="CPU request and limit of the Ray head.",
    )
    memory: Annotated[Quantity, KubeQuantity("resources.head.memory", "8Gi")] = Field(
        default="8Gi",
        description="Memory request and limit of the Ray head.",
    )


class TopologySpec(ApiModel):
    """Kueue topology-aware scheduling of the worker pods: the topology level (a node label key,
    as named in the cluster's Kueue Topology, e.g. cloud.provider.com/topology-block) they must
    or should share."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.required) != has(self.preferred)",
                    "resources.topology takes exactly one of required and preferred",
                )
            ]
        }
    )

    required: Annotated[str, Field(pattern=QUALIFIED_NAME, max_length=317)] | None = Field(
        default=None,
        description="Every worker pod in one domain of this topology level, or the job is not admitted "
        "(Kueue's podset-required-topology annotation).",
    )
    preferred: Annotated[str, Field(pattern=QUALIFIED_NAME, max_length=317)] | None = Field(
        default=None,
        description="The worker pods in one domain of this topology level if Kueue can, else in as "
        "few as it can (Kueue's podset-preferred-topology annotation).",
    )


class ResourcesSpec(ApiModel):
    """Workers, accelerators and placement."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.gpusPerWorker == 0 || !has(self.gpuResourceName) || "
                    "self.gpuResourceName.endsWith('gpu') || "
                    "self.gpuResourceName.matches('^nvidia\\\\.com/mig-[0-9]+g\\\\.[0-9]+gb$')",
                    "resources.gpuResourceName must end in 'gpu' (e.g. nvidia.com/gpu, amd.com/gpu) or be an "
                    "NVIDIA MIG resource (nvidia.com/mig-<n>g.<m>gb): KubeRay gives Ray no GPUs otherwise "
                    "and training waits forever",
                    ".gpuResourceName",
                ),
                cel(
                    "!has(self.rayVersion) || has(self.image)",
                    "resources.rayVersion is the Ray version of resources.image: set the image too, or "
                    "drop rayVersion (the operator's default image has its own, --trainer-ray-version)",
                    ".rayVersion",
                ),
                cel(
                    f"!has(self.rayVersion) || self.rayVersion.matches('{SUPPORTED_RAY_VERSION_PATTERN}')",
                    "resources.rayVersion must be the image's Ray release as X.Y.Z, "
                    f"{'.'.join(map(str, MIN_RAY_VERSION))} or later: older Ray ignores the token "
                    "authentication every job's Ray cluster runs with, and KubeRay refuses it",
                    ".rayVersion",
                ),
            ]
        }
    )

    @model_validator(mode="after")
    def _shared_memory_fits(self) -> ResourcesSpec:
        """/dev/shm is memory-backed and counts against the worker's memory limit: a larger one
        gets the pod OOM-killed as soon as NCCL or the object store fills it. (Quantities are
        compared here, by `llmtrain validate` and the operator; the product's CEL engine has no
        Kubernetes quantity library.) A zero or negative quantity is the CEL rule's to name."""
        memory, shm = parse_quantity(self.memory), parse_quantity(self.shared_memory)
        if memory > 0 and shm > 0 and shm > memory:
            raise ValueError(
                f"resources.sharedMemory ({self.shared_memory}) is larger than resources.memory "
                f"({self.memory}): /dev/shm counts against the worker's memory; lower sharedMemory "
                "or raise memory"
            )
        return self

    @model_validator(mode="after")
    def _cpu_for_every_gpu_process(self) -> ResourcesSpec:
        """A worker pod runs one training process per GPU, and Ray Train reserves
        `cpus_per_worker` = cpu / gpusPerWorker Ray CPUs for each, but never less than
        MIN_CPUS_PER_PROCESS (render/trainer_config.py). KubeRay starts the worker's Ray node
        with ceil(cpu) CPUs, so below MIN_CPUS_PER_PROCESS x gpusPerWorker (`cpu: 1` with 8 GPUs:
        8 x 0.5 = 4 Ray CPUs against 1) the processes never fit and the run waits forever.
        Refused rather than shrinking the reservation: a GPU's process below half a core starves
        its GPU (kernel launches, data loading, NCCL's progress threads), so such a spec is a
        mistake. At or above the minimum, the reservations add up to cpu <= ceil(cpu) and always
        fit. (Compared here, by `llmtrain validate` and the operator: the product's CEL engine has
        no quantity library.)"""
        cores = parse_quantity(self.cpu)
        need = Decimal(str(MIN_CPUS_PER_PROCESS)) * self.gpus_per_worker
        if cores > 0 and cores < need:
            raise ValueError(
                f"resources.cpu ({self.cpu}) is too small for {self.gpus_per_worker} GPUs per worker: "
                f"each GPU's training process reserves at least {MIN_CPUS_PER_PROCESS} Ray CPU, so Ray "
                f"could never place them and the job would wait forever; set resources.cpu to at "
                f"least {need.normalize():f} (or lower resources.gpusPerWorker)"
            )
        return self

    workers: int = Field(
        default=1, ge=1, le=1024, description="Ray worker pods (one training process per GPU)."
    )
    gpus_per_worker: int = Field(
        default=1, ge=0, le=16, description="GPUs per worker pod; 0 trains on CPU (gloo)."
    )
    gpu_resource_name: Annotated[str, Field(pattern=QUALIFIED_NAME, max_length=253)] = Field(
        default="nvidia.com/gpu", description="Extended resource name of the accelerator."
    )
    accelerator_type: Annotated[str, Field(min_length=1, max_length=63, pattern=LABEL_VALUE)] | None = Field(
        default=None,
        description="Node label value selecting the accelerator model (e.g. NVIDIA-H100-80GB-HBM3).",
    )
    accelerator_label_key: Annotated[str, Field(pattern=QUALIFIED_NAME, max_length=316)] = Field(
        default="nvidia.com/gpu.product", description="Node label key that acceleratorType matches."
    )
    cpu: Annotated[Quantity, KubeQuantity("resources.cpu", "8")] = Field(
        default="8",
        description="CPU request and limit of each worker pod; with GPUs at least half a core per GPU "
        "(each GPU's training process reserves that much Ray CPU).",
    )
    memory: Annotated[Quantity, KubeQuantity("resources.memory", "64Gi")] = Field(
        default="64Gi",
        description="Memory request and limit of each worker pod.",
    )
    shared_memory: Annotated[Quantity, KubeQuantity("resources.sharedMemory", "16Gi")] = Field(
        default="16Gi",
        description="Size of the memory-backed /dev/shm of every Ray pod (NCCL and the object store "
        "need more than the 64Mi default); counts against the pod's memory.",
    )
    head: HeadResources = Field(default_factory=HeadResources, description="Ray head pod resources.")
    node_selector: Annotated[
        dict[str, Annotated[str, Field(max_length=63, pattern=LABEL_VALUE)]], Field(max_length=64)
    ] = Field(
        default_factory=dict,
        description="Extra node labels the worker pods require.",
        json_schema_extra=metadata_keys_rule("resources.nodeSelector"),
    )
    tolerations: Annotated[list[Toleration], Field(max_length=32)] = Field(
        default_factory=list,
        description="Extra tolerations of the worker pods (a toleration of the GPU resource taint is "
        "always added).",
    )
    priority_class_name: Annotated[str, Field(pattern=DNS1123_SUBDOMAIN, max_length=253)] | None = Field(
        default=None, description="PriorityClass of every Ray pod."
    )
    topology: TopologySpec | None = Field(
        default=None,
        description="Topology-aware scheduling of the worker pods by Kueue (needs runPolicy.queueName "
        "and a ClusterQueue whose ResourceFlavor has a topology).",
    )
    image: Annotated[str, Field(min_length=1, max_length=512, pattern=IMAGE_REFERENCE)] | None = Field(
        default=None,
        description="Trainer image override ([registry/]path[:tag][@digest]); defaults to the operator's "
        "configured image.",
    )
    ray_version: Annotated[str, Field(max_length=32)] | None = Field(
        default=None,
        description="The Ray version `image` installs (X.Y.Z, at least "
        f"{'.'.join(map(str, MIN_RAY_VERSION))}): the RayJob's rayVersion, which KubeRay gates features "
        "on, and what the trainer checks its Ray against. Unset: the operator's default image's "
        "(--trainer-ray-version).",
    )

    @property
    def processes_per_worker(self) -> int:
        """Training processes in one worker pod: one per GPU; a CPU pod runs one on all its cores."""
        return max(self.gpus_per_worker, 1)

    @property
    def processes(self) -> int:
        """The job's training processes (Ray Train's workers, the world size). The one formula: render,
        the memory estimate and `llmtrain run` read it here; the hybridShardSize CEL rule spells the
        same count in CEL (tests/unit/test_cel_rules.py pins that the two agree)."""
        return self.workers * self.processes_per_worker


AccessMode = Literal["ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod", "ReadOnlyMany"]


def _default_access_modes() -> list[AccessMode]:
    return ["ReadWriteMany"]


class StorageCreateSpec(ApiModel):
    """A PersistentVolumeClaim created for the job; `reclaim` says whether it goes with the job."""

    size: Annotated[Quantity, KubeQuantity("storage.create.size", "500Gi")] = Field(
        description="Requested capacity, e.g. 500Gi.",
    )
    storage_class_name: Annotated[str, Field(pattern=DNS1123_SUBDOMAIN, max_length=253)] | None = Field(
        default=None, description="StorageClass; the cluster default when unset."
    )
    access_modes: Annotated[
        list[AccessMode],
        Field(min_length=1, max_length=4),
    ] = Field(
        default_factory=_default_access_modes,
        description="Access modes; several nodes write checkpoints, so ReadWriteMany is the default.",
    )
    reclaim: Literal["Retain", "Delete"] = Field(
        default="Retain",
        description="What deleting the job does to the claim, its checkpoints and exported model: Retain "
        "(default) keeps the claim (a job applied again under the same name uses it again; delete it with "
        "kubectl delete pvc <name>-storage); Delete lets the garbage collector delete it with the job.",
    )


class StorageSpec(ApiModel):
    """Shared storage mounted at the same path on the head and every worker."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.claimName) != has(self.create)",
                    "set exactly one of storage.claimName (an existing ReadWriteMany PVC) or "
                    "storage.create (a PVC made for this job)",
                ),
                cel(
                    "!has(self.mountPath) || !(self.mountPath in ['/', '/dev/shm', '"
                    + CONFIG_DIR
                    + "'] || self.mountPath.startsWith('/dev/shm/') || self.mountPath.startsWith('"
                    + CONFIG_DIR
                    + "/'))",
                    f"storage.mountPath cannot be /, /dev/shm or {CONFIG_DIR}: the platform mounts shared "
                    "memory and the trainer config there",
                    ".mountPath",
                ),
                cel(
                    "!has(self.create) || !has(self.create.accessModes) || "
                    "self.create.accessModes.exists(m, m == 'ReadWriteMany')",
                    "storage.create.accessModes must include ReadWriteMany: the Ray head and every worker "
                    "mount the storage, on different nodes (use storage.claimName for an existing claim)",
                    ".create.accessModes",
                ),
            ]
        }
    )

    claim_name: Annotated[str, Field(pattern=DNS1123_SUBDOMAIN, max_length=253)] | None = Field(
        default=None, description="Existing PersistentVolumeClaim (ReadWriteMany) in the job's namespace."
    )
    create: StorageCreateSpec | None = Field(default=None, description="Create a PVC for this job.")
    mount_path: Annotated[str, Field(pattern=r"^/[^:]*$", max_length=256)] = Field(
        default=DEFAULT_MOUNT_PATH,
        description="Where the storage is mounted; a run lives in <mountPath>/runs/<namespace>/<name>/<uid>.",
    )


# Names of variables that hold credentials (HF_TOKEN, WANDB_API_KEY, AWS_SECRET_ACCESS_KEY,
# MLFLOW_TRACKING_PASSWORD ...): a whole `_`-separated word, so TOKENIZERS_PARALLELISM is not one.
CREDENTIAL_NAME = (
    "(?i)(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIALS?)(_|$)"
)


class EnvVarSource(ApiModel):
    """Where a variable's value comes from instead of the spec: a Secret's key."""

    secret_key_ref: SecretKeyRef = Field(
        description="The Secret key whose value the kubelet puts into the variable; the value is "
        "never copied into the job, its RayJob or the trainer's config."
    )


class EnvVar(ApiModel):
    """A variable of every Ray container: a literal value, or a Secret's key (valueFrom). A name
    that looks like a credential (TOKEN, SECRET, PASSWORD, API_KEY ... as a word) takes its value
    from a Secret only: a literal one would be readable by anyone who may read the job."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!self.name.startsWith('LLMTRAIN_')",
                    "network.env names starting with LLMTRAIN_ are reserved for the trainer; rename it",
                    ".name",
                ),
                cel(
                    "!(self.name in ['RAY_REDIS_ADDRESS', 'REDIS_PASSWORD', 'REDIS_USERNAME'])",
                    "network.env cannot set RAY_REDIS_ADDRESS, REDIS_PASSWORD or REDIS_USERNAME: KubeRay "
                    "refuses them outside its GCS fault-tolerance options",
                    ".name",
                ),
                cel(
                    "!(has(self.value) && has(self.valueFrom))",
                    "network.env takes value or valueFrom, not both: keep one",
                    ".valueFrom",
                ),
                cel(
                    f"!has(self.value) || self.value == '' || !self.name.matches('{CREDENTIAL_NAME}')",
                    "network.env names that look like a credential (TOKEN, SECRET, PASSWORD, API_KEY, "
                    "ACCESS_KEY ... as a word) take their value from a Secret: use "
                    "valueFrom.secretKeyRef {name, key} instead of value",
                    ".value",
                ),
                cel(
                    "self.name != 'RAY_enable_autoscaler_v2' || !has(self.value) || "
                    "!(self.value in ['1', 'true'])",
                    "network.env cannot turn on RAY_enable_autoscaler_v2: the workers are a fixed gang "
                    "and KubeRay refuses it without in-tree autoscaling",
                    ".value",
                ),
            ]
        }
    )

    name: Annotated[str, Field(pattern=ENV_NAME_PATTERN, max_length=128)] = Field(
        description="Variable name (letters, digits, underscore; not starting with a digit)."
    )
    value: Annotated[str, Field(max_length=4096)] | None = Field(
        default=None, description="Literal value (empty when neither value nor valueFrom is set)."
    )
    value_from: EnvVarSource | None = Field(
        default=None, description="Take the value from a Secret's key instead (secretKeyRef)."
    )


# The profiles that use an RDMA fabric; their workers get the fabric devices (FabricSpec).
FABRIC_PROFILES = ("infiniband", "efa")
_FABRIC_LIST = "['" + "', '".join(FABRIC_PROFILES) + "']"
# An extended resource name: a domain prefix is required (vpc.amazonaws.com/efa, rdma/...).
EXTENDED_RESOURCE = (
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


class FabricSpec(ApiModel):
    """RDMA devices of each worker for the infiniband and efa profiles, and the start-up check.

    Setting the NCCL variables alone is not enough: without the devices (from a device plugin)
    and locked-memory rights, NCCL silently falls back to TCP sockets."""

    resource_name: Annotated[str, Field(pattern=EXTENDED_RESOURCE, max_length=253)] | None = Field(
        default=None,
        description="Extended resource of the fabric device each worker requests (request = limit); "
        "defaults to rdma/rdma_shared_device_a (infiniband: the NVIDIA network operator's RDMA "
        "shared device plugin) or vpc.amazonaws.com/efa (efa: the AWS EFA device plugin).",
    )
    per_worker: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Devices per worker pod: 1 for an RDMA shared device pool; for EFA, the "
        "instance's interfaces (e.g. 4 on p4d.24xlarge, 32 on p5.48xlarge).",
    )
    ipc_lock: bool = Field(
        default=False,
        description="Add the IPC_LOCK capability to the worker container for RDMA memory "
        "registration. Off by default: the trainer runs as UID 1000, where an added capability "
        "is not effective (kubernetes#56374), and it forces the privileged Pod Security level; "
        "registration relies on the memlock limit the nodes' container runtime gives pods.",
    )
    on_socket_fallback: Literal["fail", "warn"] = Field(
        default="fail",
        description="What the trainer does when NCCL chose TCP sockets instead of the fabric at "
        "start-up: fail the run, or log a warning and go on.",
    )


class NetworkSpec(ApiModel):
    """NCCL settings for multi-GPU and multi-node communication."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.stepTimeoutSeconds) || !has(self.collectiveTimeoutSeconds) "
                    "|| self.stepTimeoutSeconds <= self.collectiveTimeoutSeconds",
                    "network.stepTimeoutSeconds must not exceed network.collectiveTimeoutSeconds: it "
                    "shortens the timeout once training runs",
                    ".stepTimeoutSeconds",
                ),
                # The list-map key already makes the API server refuse a repeated name, with a bare
                # "Duplicate value"; this rule says what to do, and `llmtrain validate` runs it too.
                cel(
                    "!has(self.env) || self.env.all(e, self.env.exists_one(f, f.name == e.name))",
                    "network.env names must be unique: keep one entry per variable name",
                    ".env",
                ),
                cel(
                    f"!has(self.fabric) || self.ncclProfile in {_FABRIC_LIST}",
                    "network.fabric (RDMA devices, IPC_LOCK, the start-up check) is only valid with "
                    "ncclProfile infiniband or efa",
                    ".fabric",
                ),
            ]
        }
    )

    nccl_profile: Literal["auto", "nvlink", "infiniband", "efa", "ethernet"] = Field(
        default="auto",
        description="Fabric preset for NCCL variables: auto (NCCL's own detection), nvlink (single "
        "node), infiniband, efa (AWS) or ethernet (TCP sockets).",
    )
    nccl_debug: Literal["VERSION", "WARN", "INFO", "TRACE"] = Field(
        default="WARN", description="NCCL_DEBUG level."
    )
    collective_timeout_seconds: int = Field(
        default=1800,
        ge=60,
        le=86400,
        description="Timeout of a collective before the process group aborts (torch timeout_s).",
    )
    step_timeout_seconds: int | None = Field(
        default=None,
        ge=60,
        le=86400,
        description="A shorter collective timeout applied once the first training step has "
        "completed, so a hang during training ends the attempt (and a retry resumes) sooner; "
        "downloads, tokenisation and loading keep collectiveTimeoutSeconds. Unset: "
        "collectiveTimeoutSeconds throughout.",
    )
    fabric: FabricSpec | None = Field(
        default=None,
        description="Fabric devices and start-up check of the infiniband and efa profiles; their "
        "defaults apply when unset.",
    )
    env: Annotated[list[EnvVar], Field(max_length=64)] = Field(
        default_factory=list,
        description="Extra variables for every Ray container; they override the profile's.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )


class RunPolicySpec(ApiModel):
    """Retries, deadlines, clean-up and queueing."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.queueName) == has(oldSelf.queueName)",
                    "spec.runPolicy.queueName cannot be added or removed after creation",
                ),
                cel(
                    "has(self.workloadPriorityClass) == has(oldSelf.workloadPriorityClass)",
                    "spec.runPolicy.workloadPriorityClass cannot be added or removed after creation",
                ),
            ]
        }
    )

    max_retries: int = Field(
        default=2,
        ge=0,
        le=100,
        description="Whole-run retries on a new Ray cluster (RayJob backoffLimit); each resumes from "
        "the latest checkpoint.",
        json_schema_extra=immutable("runPolicy.maxRetries"),
    )
    max_worker_failures: int = Field(
        default=3,
        ge=-1,
        le=1000,
        description="Worker failures tolerated inside one Ray cluster (Ray Train FailureConfig); "
        "every one restarts all workers from the latest checkpoint; -1 is unlimited.",
        json_schema_extra=immutable("runPolicy.maxWorkerFailures"),
    )
    # KubeRay stores both as int32: a larger value would be refused in the RayJob (or, stored,
    # break KubeRay's decoding of every RayJob), so the CRD bounds them.
    active_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        le=INT32_MAX,
        description="Fail the attempt when it has run this long, counted by KubeRay from the start "
        "of each attempt (a retry or a resume starts the clock again); the job then fails without "
        "a retry.",
    )
    startup_deadline_seconds: int = Field(
        default=DEFAULT_STARTUP_DEADLINE_SECONDS,
        ge=1,
        le=INT32_MAX,
        description="Fail the job when its Ray cluster has not started (every pod running, the job "
        "submitted) this long after each attempt began (the operator's check; KubeRay's "
        f"preRunningDeadlineSeconds, {STARTUP_BACKSTOP_SECONDS} s later, is the backstop while no "
        "operator runs); the job then fails without a retry, its Ray cluster is stopped, and the "
        "status names what kept it from starting (unschedulable, image pull, a missing Secret or "
        "ConfigMap, quota). Time spent queued in Kueue does not count.",
    )
    ttl_seconds_after_finished: int = Field(
        default=300,
        ge=0,
        le=INT32_MAX,
        description="Keep the finished Ray cluster (its workers' GPUs too) this long for logs, then "
        "delete it; the checkpoints and export stay on the shared storage.",
    )
    suspend: bool = Field(
        default=False,
        description="Stop the Ray cluster and keep the checkpoints; setting it back to false resumes.",
    )
    queue_name: Annotated[str, Field(pattern=DNS1123_SUBDOMAIN, max_length=253)] | None = Field(
        default=None,
        description="Kueue LocalQueue; the job then waits for admission.",
        json_schema_extra=immutable("runPolicy.queueName"),
    )
    workload_priority_class: Annotated[str, Field(pattern=DNS1123_SUBDOMAIN, max_length=253)] | None = Field(
        default=None,
        description="Kueue WorkloadPriorityClass of the job (the kueue.x-k8s.io/priority-class label of "
        "its RayJob): its priority in Kueue's admission and preemption, apart from the pods' "
        "PriorityClass (resources.priorityClassName). Takes effect when Kueue manages the job.",
        json_schema_extra=immutable("runPolicy.workloadPriorityClass"),
    )


class ResumeFromSpec(ApiModel):
    """Where a new job's run starts instead of from scratch. Without it, a job (a new uid) always
    starts a new run, even under a name an earlier job used; with it, `run` continues an earlier run
    (weights, optimizer, LR schedule, step and data position) and `checkpoint` seeds the weights only
    (fresh optimizer and schedule, step 0). Only a run's first attempt reads it: retries of the same
    job resume the job's own checkpoints."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.run) != has(self.checkpoint)",
                    "set exactly one of resumeFrom.run (an earlier run to continue) or "
                    "resumeFrom.checkpoint (a checkpoint directory whose weights seed this run)",
                ),
                cel(
                    "!has(self.checkpoint) || !self.checkpoint.matches('(^|/)[.][.](/|$)')",
                    "resumeFrom.checkpoint cannot contain '..': name a directory on the shared storage",
                ),
            ]
        }
    )

    run: Annotated[str, Field(pattern=RUN_REF_PATTERN, max_length=253)] | None = Field(
        default=None,
        description="An earlier run of a job in this namespace: '<job name>/<run id>' (its directory "
        "under <mountPath>/runs/<namespace>/) or just the run id (the old job's metadata.uid). Its "
        "latest complete checkpoint is continued with all its state; meant for the same spec.",
    )
    checkpoint: Annotated[str, Field(min_length=1, max_length=1024)] | None = Field(
        default=None,
        description="A checkpoint directory (checkpoint-step-NNNNNNNN) relative to storage.mountPath, "
        "or absolute under it (relative to the job file's folder with `llmtrain run`). Its weights "
        "only: the optimizer, LR schedule, step and data order start fresh.",
    )


# An evaluation is configured: a held-out fraction or a held-out file.
_EVALUATES = (
    "(has(self.dataset.validationPath) || "
    "(has(self.dataset.validationSplit) && self.dataset.validationSplit > 0.0))"
)
_RANKS_CHECKPOINTS = (
    "((has(self.checkpoint.keepBest) && self.checkpoint.keepBest) || "
    "(has(self.checkpoint.exportBest) && self.checkpoint.exportBest))"
)

# The fields that take a path on the shared storage or an object URI: (CEL presence test, CEL value).
_URI_FIELDS = {
    "dataset.path": ("has(self.dataset.path)", "self.dataset.path"),
    "dataset.validationPath": ("has(self.dataset.validationPath)", "self.dataset.validationPath"),
    "model.name": ("has(self.model.name)", "self.model.name"),
    "resumeFrom.checkpoint": (
        "has(self.resumeFrom) && has(self.resumeFrom.checkpoint)",
        "self.resumeFrom.checkpoint",
    ),
    "checkpoint.exportTo": ("has(self.checkpoint.exportTo)", "self.checkpoint.exportTo"),
}


# Per scheme: what a URI of it needs in spec.objectStorage (CEL test) and how to fix its absence.
_STORE_NEEDS = {
    "s3": (
        "has(self.objectStorage.accessKeySecretRef)",
        "is an s3:// URI: set spec.objectStorage with the endpoint and the Secret holding the access "
        "keys (accessKeySecretRef, secretKeySecretRef; listed in the namespace's "
        "llmtrain.dev/allowed-secrets)",
    ),
    "gs": (
        "has(self.objectStorage.gcs)",
        "is a gs:// URI: set spec.objectStorage.gcs.credentialsSecretRef to the Secret key holding a "
        "service-account key (listed in the namespace's llmtrain.dev/allowed-secrets)",
    ),
    "az": (
        "has(self.objectStorage.azure)",
        "is an az:// URI: set spec.objectStorage.azure with accountName and accountKeySecretRef, the "
        "Secret key holding the account key (listed in the namespace's llmtrain.dev/allowed-secrets)",
    ),
}


def _object_uri_rules() -> list[JsonDict]:
    """Per field: a '://' value must be a well-formed object URI, and an s3://, gs:// or az:// one
    needs that store's credentials in spec.objectStorage (a Secret reference; keys are never inline)."""
    rules = []
    for field, (present, value) in _URI_FIELDS.items():
        if field != "checkpoint.exportTo":  # its own pattern admits object URIs only
            rules.append(
                cel(
                    f"!({present}) || !{value}.contains('://') || {value}.matches('{OBJECT_URI_CEL}')",
                    f"{field}: an object URI is s3://bucket/key (or gs://, az://) with a lower-case "
                    "bucket name of 3-63 characters",
                    "." + field,
                )
            )
        for scheme, (needs, fix) in _STORE_NEEDS.items():
            rules.append(
                cel(
                    f"!({present}) || !{value}.startsWith('{scheme}://') || "
                    f"(has(self.objectStorage) && {needs})",
                    f"{field} {fix}",
                    "." + field,
                )
            )
    return rules


class LLMTrainingJobSpec(ApiModel):
    """Desired state: what to train, how, on what, and under which policy."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                *_object_uri_rules(),
                cel(
                    "self.training.precision != 'fp16' || self.resources.gpusPerWorker > 0",
                    "training.precision fp16 needs GPUs: use fp32 (or bf16) with resources.gpusPerWorker: 0",
                    ".training.precision",
                ),
                cel(
                    "self.strategy.type != 'deepspeed' || !has(self.strategy.deepspeed) || "
                    "!self.strategy.deepspeed.offloadOptimizer || self.resources.gpusPerWorker > 0",
                    "strategy.deepspeed.offloadOptimizer needs GPUs; CPU training already keeps "
                    "everything in host memory",
                    ".strategy.deepspeed.offloadOptimizer",
                ),
                cel(
                    "!has(self.trainer.type) || self.trainer.type != 'huggingface' || "
                    "!has(self.strategy.type) || self.strategy.type != 'fsdp' || "
                    "self.resources.gpusPerWorker > 0",
                    "trainer.type huggingface with strategy.type fsdp needs GPUs; use strategy.type "
                    "ddp on CPU workers",
                    ".strategy.type",
                ),
                cel(
                    "!has(self.strategy.fsdp) || !has(self.strategy.fsdp.hybridShardSize) || "
                    "(self.resources.gpusPerWorker > 0 ? self.resources.workers * "
                    "self.resources.gpusPerWorker : self.resources.workers) % "
                    "self.strategy.fsdp.hybridShardSize == 0",
                    "strategy.fsdp.hybridShardSize must divide the training processes (resources.workers "
                    "x resources.gpusPerWorker, or resources.workers on CPU): set it to "
                    "resources.gpusPerWorker to shard within each node",
                    ".strategy.fsdp.hybridShardSize",
                ),
                cel(
                    "!has(self.resumeFrom) || !has(self.resumeFrom.checkpoint) || "
                    "!has(self.trainer.type) || self.trainer.type != 'huggingface'",
                    HF_SEED_UNSUPPORTED,
                    ".resumeFrom.checkpoint",
                ),
                cel(
                    f"!(self.network.ncclProfile in {_FABRIC_LIST}) || self.resources.gpusPerWorker > 0",
                    "network.ncclProfile infiniband and efa need GPUs (resources.gpusPerWorker > 0): "
                    "CPU jobs use gloo over TCP and never the fabric; use auto or ethernet",
                    ".network.ncclProfile",
                ),
                cel(
                    "!has(self.podTemplate) || !has(self.podTemplate.volumeMounts) || "
                    "!has(self.storage.mountPath) || self.podTemplate.volumeMounts.all(m, "
                    "m.mountPath != self.storage.mountPath && "
                    "!m.mountPath.startsWith(self.storage.mountPath + '/'))",
                    "podTemplate.volumeMounts cannot mount at or under storage.mountPath: the shared "
                    "storage is mounted there",
                    ".podTemplate.volumeMounts",
                ),
                cel(
                    f"!has(self.training.earlyStopping) || {_EVALUATES}",
                    "training.earlyStopping needs an evaluation: set dataset.validationSplit (e.g. 0.05) "
                    "or dataset.validationPath, or drop earlyStopping",
                    ".training.earlyStopping",
                ),
                cel(
                    f"!has(self.training.evalEverySteps) || {_EVALUATES}",
                    "training.evalEverySteps needs an evaluation: set dataset.validationSplit (e.g. 0.05) "
                    "or dataset.validationPath, or drop evalEverySteps",
                    ".training.evalEverySteps",
                ),
                cel(
                    f"!{_RANKS_CHECKPOINTS} || {_EVALUATES}",
                    "checkpoint.keepBest and checkpoint.exportBest rank checkpoints by validation loss: "
                    "set dataset.validationSplit (e.g. 0.05) or dataset.validationPath, or drop them",
                    ".checkpoint",
                ),
                cel(
                    f"!{_RANKS_CHECKPOINTS} || !has(self.training.evalEverySteps) || "
                    "(has(self.checkpoint.everySteps) ? self.checkpoint.everySteps : "
                    f"{DEFAULT_CHECKPOINT_EVERY_STEPS}) % self.training.evalEverySteps == 0",
                    "checkpoint.keepBest and checkpoint.exportBest rank checkpoints by the evaluation at "
                    "their step: make checkpoint.everySteps a multiple of training.evalEverySteps",
                    ".training.evalEverySteps",
                ),
                cel(
                    "has(self.resumeFrom) == has(oldSelf.resumeFrom)",
                    "spec.resumeFrom cannot be added or removed after creation: create a new job",
                ),
                cel(
                    "!has(self.resumeFrom) || !has(self.resumeFrom.checkpoint) || "
                    "!self.resumeFrom.checkpoint.startsWith('/') || self.resumeFrom.checkpoint.startsWith("
                    f"(has(self.storage.mountPath) ? self.storage.mountPath : '{DEFAULT_MOUNT_PATH}') + '/')",
                    "resumeFrom.checkpoint must lie on the shared storage: relative to storage.mountPath, "
                    "or absolute under it",
                    ".resumeFrom.checkpoint",
                ),
            ]
        }
    )

    model: ModelSpec = Field(description="The model to train.", json_schema_extra=immutable("model"))
    dataset: DatasetSpec = Field(description="The training data.", json_schema_extra=immutable("dataset"))
    method: MethodSpec = Field(
        default_factory=MethodSpec,
        description="Full fine-tune or LoRA.",
        json_schema_extra=immutable("method"),
    )
    strategy: StrategySpec = Field(
        default_factory=StrategySpec,
        description="Distribution strategy.",
        json_schema_extra=immutable("strategy"),
    )
    training: TrainingSpec = Field(
        default_factory=TrainingSpec,
        description="Hyperparameters.",
        json_schema_extra=immutable("training"),
    )
    checkpoint: CheckpointSpec = Field(
        default_factory=CheckpointSpec,
        description="Checkpointing and export.",
        json_schema_extra=immutable("checkpoint"),
    )
    resume_from: ResumeFromSpec | None = Field(
        default=None,
        description="Start from an earlier run or a seed checkpoint instead of from scratch.",
        json_schema_extra=immutable("resumeFrom"),
    )
    trainer: TrainerSpec = Field(
        default_factory=TrainerSpec,
        description="The training code: llmtrain's own loop, a Hugging Face Trainer, or your function.",
        json_schema_extra=immutable("trainer"),
    )
    resources: ResourcesSpec = Field(
        default_factory=ResourcesSpec,
        description="Workers, GPUs and placement.",
        json_schema_extra=immutable("resources"),
    )
    storage: StorageSpec = Field(
        description="Shared storage for checkpoints, exports and data.",
        json_schema_extra=immutable("storage"),
    )
    network: NetworkSpec = Field(
        default_factory=NetworkSpec,
        description="NCCL settings.",
        json_schema_extra=immutable("network"),
    )
    object_storage: ObjectStorageSpec | None = Field(
        default=None,
        description="The object stores that s3://, gs:// and az:// URIs in dataset.path, "
        "model.name, resumeFrom.checkpoint and checkpoint.exportTo are read from and written to, "
        "and the Secrets with their keys.",
    )
    tracking: TrackingSpec | None = Field(
        default=None,
        description="Experiment tracking: MLflow, Weights & Biases and/or TensorBoard.",
        json_schema_extra=immutable("tracking"),
    )
    run_policy: RunPolicySpec = Field(
        default_factory=RunPolicySpec, description="Retries, deadlines, suspension and queueing."
    )
    pod_template: PodTemplateOverlay = Field(
        default_factory=PodTemplateOverlay,
        description="Pull secrets, labels, annotations and extra volumes of the trainer's pods.",
        json_schema_extra=immutable("podTemplate"),
    )
