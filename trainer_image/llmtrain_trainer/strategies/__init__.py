"""Distribution strategies: how the model is sharded, stepped, checkpointed and gathered for export.

The loop asks `make_strategy` for the one `Strategy` (base.py) the config names: FSDP2 (fsdp.py),
DeepSpeed ZeRO (deepspeed.py) or DDP (ddp.py); torch_native.py and sharded_state.py hold what FSDP2
and DDP share.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmtrain.api.trainer_config import TrainerConfig

    from llmtrain_trainer.distributed import WorkerEnv
    from llmtrain_trainer.strategies.base import Strategy


def make_strategy(
    config: TrainerConfig, env: WorkerEnv, total_steps: int, initial_weights: bool = True
) -> Strategy:
    """The strategy named by strategy.type (imported lazily: DeepSpeed is slow to import)."""
    kind = config.strategy.type
    if kind == "fsdp":
        from llmtrain_trainer.strategies.fsdp import FsdpStrategy

        return FsdpStrategy(config, env, total_steps, initial_weights)
    if kind == "deepspeed":
        from llmtrain_trainer.strategies.deepspeed import DeepSpeedStrategy

        return DeepSpeedStrategy(config, env, total_steps, initial_weights)
    from llmtrain_trainer.strategies.ddp import DdpStrategy

    return DdpStrategy(config, env, total_steps, initial_weights)
