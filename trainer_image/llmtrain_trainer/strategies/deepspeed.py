"""DeepSpeed ZeRO stage 1/2/3, configured entirely from the spec (no "auto" left for DeepSpeed).

Under ZeRO-3 the model is created inside `zero.Init` (through a live `HfDeepSpeedConfig`), so no
rank ever holds the full model. DeepSpeed reuses the process group Ray Train already initialised
(gloo on CPU, NCCL on GPUs). Every rank calls `save_checkpoint`/`load_checkpoint`.
"""

from __future__ import annotations

import logging
import os
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from llmtrain.api.spec import DeepSpeedSpec, TrainingSpec

from llmtrain_trainer import model as models
from llmtrain_trainer.distributed import WorkerEnv
from llmtrain_trainer.optim import build_optimizer, build_scheduler
from llmtrain_trainer.strategies.base import ExportTensor, Strategy, named_state_tensors
from llmtrain_trainer.weights import fetch_weights

if TYPE_CHECKING:
    from llmtrain.api.trainer_config import TrainerConfig

log = logging.getLogger(__name__)
CHECKPOINT_TAG = "zero"


def deepspeed_config(
    spec: DeepSpeedSpec, training: TrainingSpec, world_size: int, dtype: torch.dtype, hidden_size: int
) -> dict[str, Any]:
    """The DeepSpeed JSON config, every value resolved (bucket sizes from the hidden size)."""
    zero: dict[str, Any] = {
        "stage": spec.zero_stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": max(hidden_size * hidden_size, 1_000_000),
    }
    if spec.zero_stage == 3:
        zero.update(
            {
                "stage3_prefetch_bucket_size": max(int(0.9 * hidden_size * hidden_size), 1_000_000),
                "stage3_param_persistence_threshold": 10 * hidden_size,
                # Needed for the export: gather full 16-bit weights instead of empty placeholders.
                "stage3_gather_16bit_weights_on_model_save": True,
            }
        )
    if spec.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if spec.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    # Under bf16, DeepSpeed would reduce gradients across ranks and accumulate them over
    # micro-batches in bf16 (its defaults follow the model dtype); FSDP2 does both in fp32
    # (MixedPrecisionPolicy reduce_dtype), and so do we here.
    fp32_gradients: dict[str, Any] = (
        {"communication_data_type": "fp32", "data_types": {"grad_accum_dtype": "fp32"}}
        if dtype == torch.bfloat16
        else {}
    )
    return {
        "train_micro_batch_size_per_gpu": training.micro_batch_size,
        "gradient_accumulation_steps": training.gradient_accumulation_steps,
        "train_batch_size": training.micro_batch_size * training.gradient_accumulation_steps * world_size,
        "gradient_clipping": training.max_grad_norm,
        "bf16": {"enabled": dtype == torch.bfloat16},
        "fp16": {"enabled": dtype == torch.float16, "loss_scale": 0, "initial_scale_power": 16},
        "zero_optimization": zero,
        **fp32_gradients,
        # We bring a torch AdamW: allow it with ZeRO and with optimizer offload (no JIT-built
        # DeepSpeedCPUAdam needed).
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def _prepare_cpu_deepspeed() -> None:
    """CPU runs: use DeepSpeed's CPU accelerator, and skip its shared-memory all-reduce op.

    That op serves inference all-reduce only, yet it is JIT-compiled (about 100 s) whenever the
    communication backend starts; training collectives go through torch.distributed (gloo) anyway.
    """
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed.ops
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False


class DeepSpeedStrategy(Strategy):
    name = "deepspeed"
    # ZeRO partitions are cut for the data-parallel size they were saved with.
    reshardable_checkpoints = False

    def __init__(
        self, config: TrainerConfig, env: WorkerEnv, total_steps: int, initial_weights: bool = True
    ) -> None:
        super().__init__(config, env, total_steps, initial_weights)
        if not env.on_gpu:
            _prepare_cpu_deepspeed()
        else:
            torch.cuda.set_device(env.device)
        import deepspeed
        import torch.distributed as dist
        from transformers.integrations.deepspeed import HfDeepSpeedConfig

        # Adopt Ray Train's process group now: zero.Init and the config's batch-size check need
        # DeepSpeed's view of the world size before deepspeed.initialize() would set it up.
        deepspeed.init_distributed(dist_backend=dist.get_backend(), auto_mpi_discovery=False)

        spec = config.strategy.deepspeed or DeepSpeedSpec()
        self.zero_stage = spec.zero_stage
        hf_config = models.model_config(config.model)
        self.ds_config = deepspeed_config(
            spec, config.training, env.world_size, self.dtype, int(getattr(hf_config, "hidden_size", 1024))
        )
        # While this object lives, transformers creates models under zero.Init (stage 3 only); it
        # is dropped once the model exists, so the export can rebuild an ordinary model on rank 0.
        hf_ds_config = HfDeepSpeedConfig(self.ds_config)  # type: ignore[no-untyped-call]

        if models.is_pretrained(config.model) and self.initial_weights:
            folder = fetch_weights(config.model, env)
            # Every rank at once: under ZeRO-3 the load broadcasts and gathers (zero.Init).
            model: torch.nn.Module = models.load_pretrained(folder, config.model, self.dtype)
        else:
            model = models.build_from_config(hf_config, self.dtype, meta=False, seed=config.training.seed)
        del hf_ds_config
        torch.manual_seed(config.training.seed)
        model = models.apply_lora(model, config.method)
        self.attention = models.use_packed_attention(model, config.dataset, env.on_gpu)
        if config.training.gradient_checkpointing:
            models.enable_gradient_checkpointing(model, config.training.checkpoint_every_blocks)

        optimizer = build_optimizer(model, config.training, env.on_gpu)
        engine, _, _, scheduler = deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            lr_scheduler=lambda opt: build_scheduler(opt, config.training, total_steps),
            config=self.ds_config,
            dist_init_required=False,
        )
        self.engine = engine
        self.model = engine
        self.scheduler = scheduler

    def _backward(self, loss: torch.Tensor, last_micro_batch: bool) -> None:
        # The loop already divides by the tokens of the whole step, across micro-batches.
        self.engine.backward(loss, scale_wrt_gas=False)
        # DeepSpeed counts micro-batches itself: the optimizer only steps on the last one.
        self.engine.step()

    def step(self) -> torch.Tensor | float | None:
        """The norm as DeepSpeed left it (a device tensor under ZeRO): the loop reads it only when
        it logs, so stepping costs no host-device sync."""
        norm: torch.Tensor | float | None = self.engine.get_global_grad_norm()
        return norm

    @property
    def learning_rate(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    def save(self, directory: Path) -> None:
        self.engine.save_checkpoint(str(directory), tag=CHECKPOINT_TAG, exclude_frozen_parameters=self.lora)

    def load(self, directory: Path, weights_only: bool = False) -> None:
        # Module only: DeepSpeed then refreshes its fp32 master copy from the loaded weights.
        path, _ = self.engine.load_checkpoint(
            str(directory),
            tag=CHECKPOINT_TAG,
            load_module_strict=not self.lora,
            load_optimizer_states=not weights_only,
            load_lr_scheduler_states=not weights_only,
            load_module_only=weights_only,
        )
        if path is None:
            raise RuntimeError(f"DeepSpeed found no checkpoint in {directory}")

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        module = self.engine.module
        if self.zero_stage < 3:
            if not self.env.is_main:
                return None
            return {name: tensor.detach().cpu().clone() for name, tensor in module.state_dict().items()}
        import deepspeed

        # One parameter at a time, so no rank ever holds more than one full tensor beyond rank 0's copy.
        state: dict[str, torch.Tensor] = {}
        for name, param in module.named_parameters():
            with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
                if self.env.is_main:
                    state[name] = param.detach().cpu().clone()
        if not self.env.is_main:
            return None
        for name, buffer in module.named_buffers():
            state.setdefault(name, buffer.detach().cpu().clone())
        return state

    def export_tensors(self) -> list[ExportTensor]:
        return [
            ExportTensor(
                name,
                tuple(getattr(tensor, "ds_shape", tensor.shape)),  # ZeRO-3 keeps the full shape aside
                tensor.dtype,
                tensor.requires_grad,
                partial(self._gather, tensor),
            )
            for name, tensor in named_state_tensors(self.engine.module)
        ]

    def _gather(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """ZeRO-3: gather this one parameter on every rank; ZeRO-1/2: rank 0 already holds it."""
        if self.zero_stage == 3 and hasattr(tensor, "ds_id"):
            import deepspeed

            with deepspeed.zero.GatheredParameters([tensor], modifier_rank=None):
                return tensor.detach().cpu().clone() if self.env.is_main else None
        return tensor.detach().cpu() if self.env.is_main else None
