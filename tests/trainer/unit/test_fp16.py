"""fp16 as far as a CPU goes: which loss scaler each strategy takes, and the torch-native step with
a real (CPU) GradScaler: gradients unscaled before clipping, an overflowed step skipped and the
scale backed off. fp16 compute itself needs a GPU (preflight refuses it on CPUs).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from llmtrain_trainer.distributed import WorkerEnv
from llmtrain_trainer.optim import build_scheduler
from llmtrain_trainer.strategies.torch_native import TorchNativeStrategy, loss_scaler
from torch import nn
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from tests.support.trainer import tiny_config

CPU = torch.device("cpu")


@pytest.mark.parametrize("sharded", [True, False])
def test_only_fp16_gets_a_loss_scaler(sharded: bool) -> None:
    scaler = loss_scaler(torch.float16, CPU, sharded=sharded)
    assert type(scaler) is (ShardedGradScaler if sharded else torch.amp.GradScaler)
    assert loss_scaler(torch.bfloat16, CPU, sharded=sharded) is None
    assert loss_scaler(torch.float32, CPU, sharded=sharded) is None


class _OneProcess(TorchNativeStrategy):
    """The torch-native step on a plain module: no process group, no wrapping."""

    name = "one-process"

    def __init__(self, tmp_path: Path, max_grad_norm: float) -> None:
        config = tiny_config(tmp_path, "fp16", training={"maxGradNorm": max_grad_norm})
        super().__init__(config, WorkerEnv(rank=0, world_size=1, local_rank=0, device=CPU), total_steps=10)
        torch.manual_seed(0)
        self.model = nn.Linear(4, 1, bias=False)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.scheduler = build_scheduler(self.optimizer, config.training, 10)
        self.scaler = loss_scaler(torch.float16, CPU, sharded=False)

    def _backward(self, loss: torch.Tensor, last_micro_batch: bool) -> None:
        self._scaled_backward(loss)


def test_a_scaled_step_unscales_before_clipping_and_skips_an_overflow(tmp_path: Path) -> None:
    strategy = _OneProcess(tmp_path, max_grad_norm=1.0)
    assert strategy.scaler is not None
    scale = strategy.scaler.get_scale()
    inputs = torch.full((1, 4), 10.0)
    true_norm = float(torch.linalg.vector_norm(inputs))  # d(w·x)/dw = x

    before = strategy.model.weight.detach().clone()
    strategy._backward(strategy.model(inputs).sum(), last_micro_batch=True)
    norm = strategy.step()
    assert isinstance(norm, torch.Tensor) and float(norm) == pytest.approx(true_norm)  # unscaled
    step = strategy.model.weight.detach() - before
    # lr × the clipped norm 1: clipping the still-scaled gradient would give a step 65536× smaller
    assert float(torch.linalg.vector_norm(step)) == pytest.approx(0.1 * 1.0)
    assert strategy.scaler.get_scale() == scale

    before = strategy.model.weight.detach().clone()
    strategy._backward(strategy.model(inputs).sum() * float("inf"), last_micro_batch=True)
    strategy.step()
    assert torch.equal(strategy.model.weight.detach(), before)  # the overflowed step is skipped
    assert strategy.scaler.get_scale() == scale / 2
    assert all(p.grad is None for p in strategy.model.parameters())


@pytest.mark.usefixtures("one_process_group")
def test_the_loss_scale_survives_a_checkpoint(tmp_path: Path) -> None:
    """A resumed fp16 run keeps its backed-off scale: restarting at 2**16 would skip its first
    steps as overflows while the LR schedule advances."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    saved = _OneProcess(tmp_path, max_grad_norm=1.0)
    saved._options = StateDictOptions()
    assert saved.scaler is not None
    for _ in range(3):  # three overflows: the scale backs off to 2**13
        saved._backward(saved.model(torch.ones(1, 4)).sum() * float("inf"), last_micro_batch=True)
        saved.step()
    scale = saved.scaler.get_scale()
    assert scale == 2.0**13
    saved.save(tmp_path / "checkpoint")

    resumed = _OneProcess(tmp_path, max_grad_norm=1.0)
    resumed._options = StateDictOptions()
    assert resumed.scaler is not None and resumed.scaler.get_scale() == 2.0**16
    resumed.load(tmp_path / "checkpoint")
    assert resumed.scaler.get_scale() == scale
    assert resumed.scaler.state_dict() == saved.scaler.state_dict()
