"""Per-device memory estimate of a training job, before any accelerator is allocated.

A spec that cannot fit (a 70B full fine-tune with DDP on 80 GB GPUs) otherwise fails only after the
Ray cluster is up, the weights are downloaded and every worker has run out of memory, once per
retry. The estimate follows how the trainer stores things (`trainer_image/.../strategies`):

- FSDP2 and DDP keep fp32 trainable parameters (FSDP2 gathers them in the compute dtype), fp32
  gradients for them and two fp32 AdamW moments; a frozen LoRA base is held in the compute dtype
  (`model.hold_frozen_in`: no fp32 master). FSDP2 shards all of it over every device.
- DeepSpeed holds the parameters and gradients in the compute dtype plus an fp32 master copy and the
  two moments (12 bytes) in the optimizer; ZeRO 1/2/3 shard optimizer / +gradients / +parameters.
- Offloading moves the named states to host memory.

Two figures come out. `states` (parameters, gradients, optimizer: exact arithmetic once the
parameter count is known) is a lower bound: above the device's memory the spec *cannot* fit, and
that is an error. `peak` adds activations, logits, the gathered working set and a fixed runtime
overhead: an estimate, so exceeding it is a warning. The parameter count comes from the model's
config (inline `model.config`, or config.json in the trainer's preflight); for a hub model known only
by name, from the size in its name (`Meta-Llama-3-70B`), which yields `states` only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from llmtrain.accelerators import DEVICE_GIB_BY_PRODUCT, KNOWN_ACCELERATORS
from llmtrain.api.spec import (
    DeepSpeedSpec,
    FsdpSpec,
    LLMTrainingJobSpec,
    LoraSpec,
    MethodSpec,
    ModelSpec,
    ResourcesSpec,
    StrategySpec,
    TrainingSpec,
)
from llmtrain.api.trainer_config import TrainerConfig
from llmtrain.quantity import parse_quantity

GIB = 2**30
# Per device: the CUDA context, NCCL buffers and the caching allocator's slack on a GPU; the Python,
# torch and Ray worker process on a CPU worker.
GPU_RUNTIME_BYTES = 2 * GIB
CPU_RUNTIME_BYTES = 1 * GIB
_SIZE_IN_LABEL = re.compile(r"(\d+)\s*GB?(?![a-z])", re.IGNORECASE)
_SIZE_IN_NAME = re.compile(r"(?<![A-Za-z0-9.])(?:(\d+)x)?(\d+(?:\.\d+)?)([BM])(?![A-Za-z0-9])", re.IGNORECASE)


@dataclass(frozen=True)
class Shape:
    """The sizes of a decoder-only transformer that memory depends on."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tied_embeddings: bool
    qkv_bias: bool = False
    output_bias: bool = False
    mlp_bias: bool = False

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Shape | None:
        """The shape of a Hugging Face config; None when a size key is missing."""
        try:
            hidden = int(config["hidden_size"])
            heads = int(config["num_attention_heads"])
            return cls(
                vocab_size=int(config["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(config["intermediate_size"]),
                num_layers=int(config["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=int(config.get("head_dim") or 0) or hidden // heads,
                tied_embeddings=bool(config.get("tie_word_embeddings")),
                # Llama-style configs bias all four projections with attention_bias; Qwen2 always
                # biases q, k and v and never o.
                qkv_bias=bool(config.get("attention_bias")) or config.get("model_type") == "qwen2",
                output_bias=bool(config.get("attention_bias")),
                mlp_bias=bool(config.get("mlp_bias")),
            )
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            return None

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each projection in one block, by its module name."""
        d, ff = self.hidden_size, self.intermediate_size
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return {
            "q_proj": (d, q),
            "k_proj": (d, kv),
            "v_proj": (d, kv),
            "o_proj": (q, d),
            "gate_proj": (d, ff),
            "up_proj": (d, ff),
            "down_proj": (ff, d),
        }

    def parameters(self) -> int:
        """Parameters of a Llama-style block stack with gated MLP, RMSNorms and an LM head."""
        embeddings = self.vocab_size * self.hidden_size
        head = 0 if self.tied_embeddings else embeddings
        return self.num_layers * self.block_parameters() + embeddings + head + self.hidden_size

    def block_parameters(self) -> int:
        """One block: its projections (and their biases) and two norms."""
        shapes = self.linear_shapes()
        biased = [
            *(("q_proj", "k_proj", "v_proj") if self.qkv_bias else ()),
            *(("o_proj",) if self.output_bias else ()),
            *(("gate_proj", "up_proj", "down_proj") if self.mlp_bias else ()),
        ]
        biases = sum(shapes[name][1] for name in biased)
        return sum(i * o for i, o in shapes.values()) + biases + 2 * self.hidden_size

    def lora_parameters(self, rank: int, target_modules: list[str]) -> int:
        """Adapter parameters: r x (in + out) per targeted projection per block."""
        shapes = self.linear_shapes()
        per_block = sum(rank * sum(shapes[name]) for name in target_modules if name in shapes)
        return self.num_layers * per_block


LOSS_CHUNK_TOKENS = 1024
"""Positions whose logits the builtin loop computes at once (trainer loss.py): the loss is taken a
chunk at a time from the final hidden states, so a 128k vocabulary's logits never exist whole."""


@dataclass(frozen=True)
class Plan:
    """What memory depends on, from a job's spec or from the trainer's config."""

    model: ModelSpec
    method: MethodSpec
    strategy: StrategySpec
    training: TrainingSpec
    max_seq_length: int
    devices: int  # training processes, one device each (ResourcesSpec.processes)
    devices_per_worker: int
    on_gpu: bool
    capacity: int | None
    chunked_loss: bool = True
    """The builtin loop's chunked cross-entropy; Hugging Face and custom trainers hold whole logits."""

    @classmethod
    def of_job(cls, spec: LLMTrainingJobSpec) -> Plan:
        resources = spec.resources
        on_gpu = resources.gpus_per_worker > 0
        return cls._of(
            spec, resources.processes, resources.processes_per_worker, on_gpu, device_memory_bytes(resources)
        )

    @classmethod
    def of_trainer(cls, config: TrainerConfig) -> Plan:
        scaling = config.scaling
        return cls._of(
            config,
            scaling.num_workers,
            scaling.devices_per_worker,
            scaling.use_gpu,
            scaling.device_memory_bytes,
        )

    @classmethod
    def _of(
        cls,
        source: LLMTrainingJobSpec | TrainerConfig,
        devices: int,
        per_worker: int,
        on_gpu: bool,
        capacity: int | None,
    ) -> Plan:
        """The job's spec and the trainer's config name the same sections alike."""
        return cls(
            model=source.model,
            method=source.method,
            strategy=source.strategy,
            training=source.training,
            max_seq_length=source.dataset.max_seq_length,
            devices=devices,
            devices_per_worker=per_worker,
            on_gpu=on_gpu,
            capacity=capacity,
            chunked_loss=source.trainer.type == "builtin",
        )

    @property
    def workers(self) -> int:
        """Worker pods, for advice in resources.workers' terms."""
        return max(self.devices // self.devices_per_worker, 1)

    def with_workers(self, workers: int) -> Plan:
        """The same plan on `workers` pods of as many devices each."""
        return replace(self, devices=workers * self.devices_per_worker)


@dataclass(frozen=True)
class Estimate:
    """Bytes per device; `activations` is None when the model's shape is unknown."""

    params: int
    grads: int
    optimizer: int
    working_set: int
    activations: int | None
    runtime: int
    total_parameters: int
    trainable_parameters: int
    devices: int
    source: str
    grad_buffers: int = 0
    """Gradient copies held across steps: DDP's reducer buckets (fp32, one per trained parameter,
    as `gradient_as_bucket_view` is off) and DeepSpeed's BF16_Optimizer's unsharded fp32 buffer."""

    @property
    def states(self) -> int:
        return self.params + self.grads + self.grad_buffers + self.optimizer

    @property
    def allocated(self) -> int | None:
        """What `torch.cuda.max_memory_allocated` should read: the states held across steps, and
        the larger of the activations (alive from forward to the start of backward) and the
        gradients (they grow as backward frees the activations; freed after the step)."""
        if self.activations is None:
            return None
        held = self.params + self.grad_buffers + self.optimizer + self.working_set
        return held + max(self.activations, self.grads)

    @property
    def peak(self) -> int | None:
        """The device memory the plan needs: `allocated` plus the runtime's own (CUDA context,
        NCCL buffers, the allocator's slack), which no tensor accounts for."""
        allocated = self.allocated
        return None if allocated is None else allocated + self.runtime

    def breakdown(self) -> str:
        parts = [
            f"parameters {human_bytes(self.params)}",
            f"gradients {human_bytes(self.grads)}",
        ]
        if self.grad_buffers:
            parts.append(f"gradient buffers {human_bytes(self.grad_buffers)}")
        parts.append(f"optimizer {human_bytes(self.optimizer)}")
        if self.activations is not None:
            parts.append(f"gathered {human_bytes(self.working_set)}")
            parts.append(
                f"activations+logits {human_bytes(self.activations)}, which the gradients replace "
                "in backward (the larger counts)"
            )
            parts.append(f"runtime {human_bytes(self.runtime)}")
        return ", ".join(parts)


@dataclass(frozen=True)
class Finding:
    """`error`: cannot fit; otherwise a warning that it probably does not."""

    error: bool
    message: str


def human_count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 10**9 else f"{n / 1e6:.2f}M"


def human_bytes(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 2**20:.1f} MiB"


def device_memory_bytes(resources: ResourcesSpec) -> int | None:
    """One device's memory: from the accelerator label or MIG profile, the pod's memory on CPU."""
    if resources.gpus_per_worker == 0:
        return int(parse_quantity(resources.memory))
    mig = re.fullmatch(r"nvidia\.com/mig-\d+g\.(\d+)gb", resources.gpu_resource_name)
    if mig:
        return int(mig.group(1)) * GIB
    label = resources.accelerator_type
    if label is None:
        return None
    known = KNOWN_ACCELERATORS.get(resources.accelerator_label_key, {})
    if label in known:
        return known[label] * GIB
    sized = _SIZE_IN_LABEL.search(label)
    if sized:
        return int(sized.group(1)) * GIB
    for name, size in DEVICE_GIB_BY_PRODUCT.items():
        if re.search(rf"(?<![A-Za-z0-9]){name}(?![A-Za-z0-9])", label, re.IGNORECASE):
            return size * GIB
    return None


def parameters_from_name(name: str) -> int | None:
    """The parameter count a hub model states in its name (`Llama-3.1-70B`, `Mixtral-8x7B`)."""
    matches = list(_SIZE_IN_NAME.finditer(name.rpartition("/")[2]))  # the organisation says nothing
    if not matches:
        return None
    match = matches[-1]
    experts = int(match.group(1) or 1)
    scale = 10**9 if match.group(3).upper() == "B" else 10**6
    return int(experts * float(match.group(2)) * scale)


def estimate(
    plan: Plan, config: Mapping[str, Any] | None = None, counted: int | None = None
) -> Estimate | None:
    """Per-device bytes of `plan`. `config` (a Hugging Face config) overrides `model.config`;
    `counted` is the parameter count of the model built on the meta device, where one was built."""
    config = config if config is not None else plan.model.config
    shape = Shape.from_config(config or {})  # an empty config has no shape
    if counted is not None:
        total, source = counted, "the model built on the meta device"
    elif shape is not None:
        total, source = shape.parameters(), "the model config"
    else:
        named = parameters_from_name(plan.model.name) if plan.model.name else None
        if named is None:
            return None
        total, source = named, f"the size in the name {plan.model.name!r}"
    lora = plan.method.lora if plan.method.type == "lora" else None
    if lora is None:
        trainable, frozen = total, 0
    else:
        # The base is frozen and the adapters come on top; without the shape they are unknown,
        # and leaving them out keeps a lower bound a lower bound.
        adapters = shape.lora_parameters(lora.rank, lora.target_modules) if shape is not None else 0
        trainable, frozen = adapters, total
    devices, on_gpu = plan.devices, plan.on_gpu
    compute = 2 if on_gpu and plan.training.precision in ("bf16", "fp16") else 4
    strategy = plan.strategy

    working_set = grad_buffers = 0
    if strategy.type == "deepspeed":
        ds = strategy.deepspeed
        stage = (ds or DeepSpeedSpec()).zero_stage
        params = compute * (trainable + frozen)
        grads = compute * trainable
        optimizer = 12 * trainable
        optimizer = 0 if ds is not None and ds.offload_optimizer else optimizer // devices
        if on_gpu and plan.training.precision == "bf16":
            # The trainer has DeepSpeed accumulate gradients in fp32 (grad_accum_dtype): below
            # ZeRO-2 its BF16_Optimizer keeps an unsharded fp32 copy of every gradient and frees
            # each bf16 one at once (an 8B ZeRO-1 job on 8 H100s needed about 84 GiB where 69.5
            # had been estimated); ZeRO-2 and 3 keep fp32 partitions.
            grads = 0 if stage <= 1 else 4 * trainable
            grad_buffers = 4 * trainable if stage <= 1 else 0
        if stage >= 2:
            grads //= devices
        if stage == 3:
            params = 0 if ds is not None and ds.offload_params else params // devices
            working_set = 2 * compute * shape.block_parameters() if shape else 0
    else:
        params, grads, optimizer = 4 * trainable + compute * frozen, 4 * trainable, 8 * trainable
        if strategy.type == "ddp":
            grad_buffers = 4 * trainable  # the reducer's buckets
        if strategy.type == "fsdp":
            fsdp = strategy.fsdp or FsdpSpec()
            shards = min(fsdp.hybrid_shard_size or devices, devices)  # HSDP shards within a group
            params, grads, optimizer = (
                (0, 0, 0) if fsdp.cpu_offload else (params // shards, grads // shards, optimizer // shards)
            )
            # The block being computed and the next one (prefetch), gathered in the compute dtype.
            working_set = 2 * compute * shape.block_parameters() if shape else 0

    activations = _activations(plan, shape, compute) if shape is not None else None
    runtime = GPU_RUNTIME_BYTES if on_gpu else CPU_RUNTIME_BYTES
    return Estimate(
        params,
        grads,
        optimizer,
        working_set,
        activations,
        runtime,
        frozen + trainable,
        trainable,
        devices,
        source,
        grad_buffers,
    )


# Share of a block's saved activations left when torch.compile fuses its elementwise ops (norms,
# SiLU x up): on an H200, 1.1B Llama, seq 2048, FSDP2 peaks fell from 30.3 to 25.6 GiB at
# micro-batch 4 and from 48.0 to 38.7 at 8, i.e. about 35% of the block activations.
COMPILED_ACTIVATIONS = 0.65


def compiles(plan: Plan) -> bool:
    """Whether the trainer compiles the blocks (training.compile; unset: on GPUs, FSDP2 and DDP)."""
    wanted = plan.on_gpu if plan.training.compile is None else plan.training.compile
    return wanted and plan.strategy.type in ("fsdp", "ddp")


def _activations(plan: Plan, shape: Shape, compute: int) -> int:
    """Saved activations and the logits of one micro-batch (fused attention: no s x s scores)."""
    tokens = plan.training.micro_batch_size * plan.max_seq_length
    d, ff = shape.hidden_size, shape.intermediate_size
    kv = shape.num_kv_heads * shape.head_dim
    # DDP computes under autocast over fp32 weights: the residual stream and the norms' inputs stay
    # fp32, and autocast keeps a compute-dtype copy of every weight until backward has used it.
    autocast = plan.strategy.type == "ddp" and compute < 4
    residual = 4 if autocast else compute
    # Per token and block: norms, attention output, residuals (~8d), q, k, v, gate, up, act, product.
    per_block = tokens * (residual * 8 * d + compute * (2 * kv + 4 * ff))
    if compiles(plan):
        per_block = int(per_block * COMPILED_ACTIVATIONS)
    if plan.training.gradient_checkpointing:
        # Checkpointed blocks (0, N, 2N, ...) keep their input only, the others everything; one
        # block's activations exist again while it is recomputed.
        checkpointed = -(-shape.num_layers // plan.training.checkpoint_every_blocks)
        kept = shape.num_layers - checkpointed
        saved = checkpointed * tokens * residual * d + kept * per_block + per_block
    else:
        saved = shape.num_layers * per_block
    weight_copies = compute * shape.parameters() if autocast else 0
    # Logits in the compute dtype, their fp32 copy for the loss and its gradient: for the builtin
    # loop those of one chunk of positions only.
    at_once = min(tokens, LOSS_CHUNK_TOKENS) if plan.chunked_loss else tokens
    logits = at_once * shape.vocab_size * (compute + 8)
    return saved + weight_copies + logits


def check(plan: Plan, config: Mapping[str, Any] | None = None, counted: int | None = None) -> list[Finding]:
    """What the estimate says about `plan` on its devices, with what to change."""
    model = Model(config, counted)
    est = model.estimate(plan)
    capacity = plan.capacity
    if est is None or capacity is None:
        return []
    unit, basis = _unit(plan), _basis(est)
    if est.states > capacity:
        return [
            Finding(
                True,
                "cannot fit: parameters, gradients and optimizer states alone need "
                f"{human_bytes(est.states)} per {unit} of {human_bytes(capacity)} "
                f"({est.breakdown()}; {basis}). " + _fixes(plan, model, capacity),
            )
        ]
    peak = est.peak
    if peak is not None and peak > capacity:
        return [
            Finding(
                False,
                f"probably does not fit: estimated peak {human_bytes(peak)} per {unit} of "
                f"{human_bytes(capacity)} ({est.breakdown()}; {basis}). " + _fixes(plan, model, capacity),
            )
        ]
    return []


def _unit(plan: Plan) -> str:
    return "GPU" if plan.on_gpu else "worker (resources.memory)"


def _basis(est: Estimate) -> str:
    basis = (
        f"{human_count(est.total_parameters)} parameters from {est.source}, "
        f"{human_count(est.trainable_parameters)} trained, {est.devices} device(s)"
    )
    if est.activations is None:
        basis += "; activations not counted until the model's config.json is read at start-up"
    return basis


def summary(plan: Plan) -> str:
    """One line on what the estimate says, whatever it says: `llmtrain validate` prints it for
    every valid job, so a job that fits shows its margin too (`check` speaks only when it does not)."""
    est = estimate(plan)
    if est is None:
        return (
            "not estimated before start-up: the model's size is unknown until the trainer reads its "
            "config.json (name the size in model.name, e.g. '-8B', or give model.config)"
        )
    unit, capacity = _unit(plan), plan.capacity
    need = (
        f"estimated peak {human_bytes(est.peak)}"
        if est.peak is not None
        else f"parameters, gradients and optimizer states {human_bytes(est.states)}"
    )
    if capacity is None:
        return (
            f"{need} per {unit}; the fit is not checked: the device's memory is unknown (neither "
            "resources.acceleratorType nor a MIG gpuResourceName names a known size) "
            f"({est.breakdown()}; {_basis(est)})"
        )
    needed = est.states if est.peak is None else est.peak  # the peak counts the states too
    verdict = "fits" if needed <= capacity else "does not fit"
    return f"{verdict}: {need} per {unit} of {human_bytes(capacity)} ({est.breakdown()}; {_basis(est)})"


@dataclass(frozen=True)
class Model:
    """What is known of the model besides the plan: its config and its counted parameters."""

    config: Mapping[str, Any] | None
    counted: int | None

    def estimate(self, plan: Plan) -> Estimate | None:
        return estimate(plan, self.config, self.counted)


Change = tuple[str, Callable[[Plan], Plan]]


def _changes(plan: Plan) -> list[Change]:
    """The changes that lower memory and `plan` does not make yet, the least disruptive first."""
    changes: list[Change] = []
    training = plan.training
    if not training.gradient_checkpointing:
        checkpointed = training.model_copy(update={"gradient_checkpointing": True})
        changes.append(
            ("set training.gradientCheckpointing: true", lambda p: replace(p, training=checkpointed))
        )
    if training.micro_batch_size > 1:
        changes.append(
            (
                "lower training.microBatchSize to 1 (raise gradientAccumulationSteps to keep the batch)",
                lambda p: replace(p, training=p.training.model_copy(update={"micro_batch_size": 1})),
            )
        )
    deepspeed = plan.strategy.deepspeed or DeepSpeedSpec()
    if plan.strategy.type == "ddp":
        changes.append(("use strategy.type: fsdp", lambda p: replace(p, strategy=StrategySpec(type="fsdp"))))
    elif plan.strategy.type == "deepspeed" and deepspeed.zero_stage != 3:
        zero3 = StrategySpec(type="deepspeed", deepspeed=deepspeed.model_copy(update={"zero_stage": 3}))
        changes.append(("set strategy.deepspeed.zeroStage: 3", lambda p: replace(p, strategy=zero3)))
    if plan.method.type == "full":
        lora = MethodSpec(type="lora", lora=LoraSpec())
        changes.append(("train LoRA adapters (method.type: lora)", lambda p: replace(p, method=lora)))
    return changes


def _fixes(plan: Plan, model: Model, capacity: int) -> str:
    """What to change so the estimate fits: one change, else the changes together, with workers."""
    changes = _changes(plan)
    fixes = [text for text, change in changes if _fits(change(plan), model, capacity)]
    workers = _workers_needed(plan, model, capacity)
    if workers is not None:
        fixes.append(f"raise resources.workers to {workers}")
    if not fixes:
        texts: list[str] = []
        combined = plan
        for text, change in changes:
            combined, texts = change(combined), [*texts, text]
            if _fits(combined, model, capacity):
                fixes.append(" and ".join(texts))
                break
        else:
            workers = _workers_needed(combined, model, capacity)
            if workers is not None:
                fixes.append(" and ".join([*texts, f"raise resources.workers to {workers}"]))
    if not fixes:
        return "No change of strategy, method or worker count fits: use accelerators with more memory."
    return "To fit: " + "; or ".join(fixes) + "."


def _fits(plan: Plan, model: Model, capacity: int) -> bool:
    est = model.estimate(plan)
    if est is None:
        return False
    peak = est.peak
    return est.states <= capacity and (peak is None or peak <= capacity)


def _workers_needed(plan: Plan, model: Model, capacity: int) -> int | None:
    """The fewest workers (up to the spec's bound) that fit, when sharding makes more workers help."""
    if plan.strategy.type == "ddp":  # a shortcut: DDP's per-device memory ignores the worker count
        return None

    def fits(workers: int) -> bool:
        return _fits(plan.with_workers(workers), model, capacity)

    low, high = plan.workers, _max_workers()
    if not fits(high):
        return None
    while high - low > 1:  # fits(high) and not fits(low): more workers only lower the estimate
        middle = (low + high) // 2
        low, high = (low, middle) if fits(middle) else (middle, high)
    return high


def _max_workers() -> int:
    """resources.workers' upper bound, as the spec declares it."""
    bounds = [getattr(m, "le", None) for m in ResourcesSpec.model_fields["workers"].metadata]
    return int(next(b for b in bounds if b is not None))
