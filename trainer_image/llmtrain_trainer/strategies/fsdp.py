"""FSDP2: `fully_shard` per transformer block and at the root, built on the meta device.

No rank holds the full model for a pretrained checkpoint: parameters are created on meta, sharded,
then each rank reads only its slices from the safetensors files (DCP's Hugging Face reader). A model
from an inline config is initialised once on rank 0 from the seed and broadcast shard by shard, so
its weights do not depend on the world size. Checkpoints are sharded `torch.distributed.checkpoint`
directories, which reshard on load when the world size changes.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from llmtrain.api.spec import FsdpSpec
from torch import nn
from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.checkpoint.state_dict_loader import load
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)

from llmtrain_trainer import model as models
from llmtrain_trainer.distributed import WorkerEnv, set_group_timeouts
from llmtrain_trainer.optim import build_optimizer, build_scheduler
from llmtrain_trainer.strategies.torch_native import TorchNativeStrategy, loss_scaler
from llmtrain_trainer.weights import fetch_weights, has_safetensors

if TYPE_CHECKING:
    from llmtrain.api.trainer_config import TrainerConfig

log = logging.getLogger(__name__)


class FsdpStrategy(TorchNativeStrategy):
    name = "fsdp"

    def __init__(
        self, config: TrainerConfig, env: WorkerEnv, total_steps: int, initial_weights: bool = True
    ) -> None:
        super().__init__(config, env, total_steps, initial_weights)
        spec = config.strategy.fsdp or FsdpSpec()
        hf_config = models.model_config(config.model)

        model: nn.Module = models.build_from_config(
            hf_config, torch.float32, meta=True, seed=config.training.seed
        )
        model = models.apply_lora(model, config.method)
        # A LoRA base has no fp32 master: sharded and gathered in the compute dtype (no cast).
        models.hold_frozen_in(model, self.dtype)
        self.attention = models.use_packed_attention(model, config.dataset, env.on_gpu)
        if config.training.gradient_checkpointing:
            models.enable_gradient_checkpointing(model, config.training.checkpoint_every_blocks)
        if models.compile_wanted(config.training.compile, env.on_gpu):
            self.compile_failures = models.compile_blocks(model)
        buffers = {name: buf.detach().clone() for name, buf in model.named_buffers(remove_duplicate=False)}

        self.mesh = device_mesh(env, spec, config.collective_timeout_seconds)
        self.sharded = shard(model, env, spec, self.dtype, self.mesh)
        model.to_empty(device=parameter_device(spec.cpu_offload, env.device))
        _restore_buffers(model, buffers, env.device)
        if self.initial_weights:
            self._load_initial_weights(model, hf_config)

        self.model = model
        self.optimizer = build_optimizer(model, config.training, env.on_gpu)
        self.scheduler = build_scheduler(self.optimizer, config.training, total_steps)
        self.scaler = loss_scaler(self.dtype, env.device, sharded=True)
        # LoRA checkpoints hold the adapters only: the frozen base comes from the pretrained weights.
        self._options = StateDictOptions(ignore_frozen_params=self.lora, strict=not self.lora)

    # -------------------------------------------------------------------------- initial weights

    def process_groups(self) -> list[dist.ProcessGroup]:
        return self.mesh.get_all_groups()

    def _load_initial_weights(self, model: nn.Module, hf_config: Any) -> None:
        spec = self.config.model
        folder = fetch_weights(spec, self.env) if models.is_pretrained(spec) else None
        if folder is not None and self._load_pretrained_shards(model, folder):
            if self.lora:
                torch.manual_seed(self.config.training.seed)
                models.reset_lora_parameters(model)
            return
        full: dict[str, Any] = {}
        if self.env.is_main:
            if folder is not None:
                log.warning("loading all of %s in fp32 on rank 0 and broadcasting it", spec.name)
                reference: nn.Module = models.load_pretrained(folder, spec, torch.float32)
            else:
                reference = models.build_from_config(
                    hf_config, torch.float32, meta=False, seed=self.config.training.seed
                )
            torch.manual_seed(self.config.training.seed)
            reference = models.apply_lora(reference, self.config.method)
            full = reference.state_dict()
        set_model_state_dict(
            model,
            full,
            options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False),
        )

    def _load_pretrained_shards(self, model: nn.Module, folder: Path) -> bool:
        """Each rank reads its own slices straight from the safetensors files, if names match."""
        if not has_safetensors(folder):
            log.warning("%s has no safetensors files; loading it on rank 0 instead", folder)
            return False
        reader = HuggingFaceStorageReader(str(folder))
        available = set(reader.read_metadata().state_dict_metadata)
        wanted = {
            models.hf_parameter_name(name): param
            for name, param in model.named_parameters()
            if "lora_" not in name
        }
        missing = set(wanted) - available
        tied = (
            {"lm_head.weight"}
            if getattr(models.unwrap_peft(model).config, "tie_word_embeddings", False)
            else set()
        )
        if missing - tied:
            log.warning(
                "checkpoint names differ from the model's (%s...); loading on rank 0 instead",
                sorted(missing)[:3],
            )
            return False
        state = {key: value for key, value in wanted.items() if key in available}
        log.info("reading %d tensors of %s into local shards", len(state), folder)
        load(state, storage_reader=HuggingFaceStorageReader(str(folder)))
        return True

    # -------------------------------------------------------------------------- stepping

    def _backward(self, loss: torch.Tensor, last_micro_batch: bool) -> None:
        """Reduce-scatter the gradients of every micro-batch, the last one or not.

        Skipping the sync on the non-final micro-batches (`set_requires_gradient_sync(False)`,
        FSDP1's `no_sync`) saves those reduce-scatters, but FSDP2 then keeps each parameter's
        *unsharded* gradient (upcast to `reduce_dtype`, fp32) until the sync: 4 bytes per parameter
        of the whole model on every rank, whatever the world size (32 GB at 8B, 280 GB at 70B).
        Syncing every time, the gradients accumulate in the sharded `.grad` (4 bytes / world size
        per parameter), and parameters still reshard after backward, as without accumulation. The
        extra reduce-scatters overlap with backward; at scale that costs far less than the memory.
        """
        self._scaled_backward(loss)


def shard(
    model: nn.Module, env: WorkerEnv, spec: FsdpSpec, dtype: torch.dtype, mesh: DeviceMesh
) -> list[FSDPModule]:
    """`fully_shard` every transformer block, then the root, on an explicit device mesh.

    The mesh is built for the worker's own device type: FSDP2's default mesh picks CUDA whenever it
    is visible, which crashes a gloo (CPU) process group. On gloo, reductions are forced to SUM then
    divided, because gloo's AVG gives wrong gradients (pytorch#162338).
    """
    mixed = (
        MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        if dtype != torch.float32
        else MixedPrecisionPolicy()
    )
    # On CPU workers offloading changes nothing, but it runs the same code as on GPUs (tests).
    offload = CPUOffloadPolicy(pin_memory=env.on_gpu) if spec.cpu_offload else OffloadPolicy()
    sharded: list[FSDPModule] = []
    for block in models.transformer_blocks(model):
        fully_shard(
            block,
            mesh=mesh,
            reshard_after_forward=spec.reshard_after_forward,
            mp_policy=mixed,
            offload_policy=offload,
        )
        sharded.append(block)  # type: ignore[arg-type]
    # The root's parameters (embeddings, head) are needed again right away by backward.
    fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=mixed, offload_policy=offload)
    sharded.append(model)  # type: ignore[arg-type]
    if dist.get_backend() == "gloo":
        for module in sharded:
            module.set_force_sum_reduction_for_comms(True)
    return sharded


def device_mesh(env: WorkerEnv, spec: FsdpSpec, timeout_seconds: int) -> DeviceMesh:
    """1-D (shard over every process), or 2-D for HSDP: ranks [g*size, (g+1)*size) form shard
    group g, so with size = GPUs per node the shard groups are the nodes (Ray Train numbers ranks
    node by node) and the replicate dimension crosses them.

    The mesh's own groups (HSDP's) are created with the backend's default timeout (NCCL's 10
    minutes): they take the process group's, `timeout_seconds` (collectiveTimeoutSeconds), and
    later the step timeout with it (`distributed.apply_training_timeout`)."""
    size = spec.hybrid_shard_size
    if size is None or size == env.world_size:
        return init_device_mesh(env.device.type, (env.world_size,))
    if env.world_size % size:
        raise ValueError(
            f"strategy.fsdp.hybridShardSize {size} does not divide the {env.world_size} training processes"
        )
    mesh = init_device_mesh(
        env.device.type, (env.world_size // size, size), mesh_dim_names=("replicate", "shard")
    )
    set_group_timeouts(timeout_seconds, mesh.get_all_groups(), default_group=False)
    return mesh


def parameter_device(cpu_offload: bool, device: torch.device) -> torch.device:
    """Where the sharded parameters are materialised.

    Under CPU offload FSDP2 keeps them on the CPU and copies each group to the GPU for its
    all-gather; it refuses parameters found on the GPU at the first forward.
    """
    return torch.device("cpu") if cpu_offload else device


def _restore_buffers(model: nn.Module, saved: dict[str, torch.Tensor], device: torch.device) -> None:
    """Put back the buffers `to_empty` left uninitialised, on the worker's device (never offloaded)."""
    for prefix, module in model.named_modules():
        for name, buffer in module._buffers.items():
            if buffer is not None:
                module._buffers[name] = saved[f"{prefix}.{name}" if prefix else name].to(device)
