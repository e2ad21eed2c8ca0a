"""training.compile: which modules are compiled, that names and results stay those of the eager
model, and that FSDP2 and DDP compile their blocks before sharding or wrapping and train through
them (inductor on the CPU, one process in a gloo group). Compiling takes tens of seconds on a CPU
(less once inductor's cache is warm), hence the slow mark."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from llmtrain_trainer import model as models
from llmtrain_trainer.distributed import WorkerEnv
from llmtrain_trainer.strategies import make_strategy
from torch import nn

from tests.support.trainer import tiny_config

pytestmark = pytest.mark.slow

ENV = WorkerEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def _compiled(model: nn.Module) -> set[str]:
    return {name for name, module in model.named_modules() if module._compiled_call_impl is not None}


def test_compile_is_off_by_default(tmp_path: Path) -> None:
    assert tiny_config(tmp_path, "default").training.compile is False


def test_each_decoder_layer_is_compiled_in_place_with_the_eager_results(tmp_path: Path) -> None:
    config = tiny_config(tmp_path, "compiled")
    model = models.build_from_config(models.model_config(config.model), torch.float32, meta=False, seed=3)
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    eager = model(input_ids=ids).logits
    eager.sum().backward()
    eager_grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    names = list(model.state_dict())

    blocks = models.compile_blocks(model)

    layers = {f"model.layers.{i}" for i in range(model.config.num_hidden_layers)}
    assert _compiled(model) == layers and len(blocks) == len(layers)
    assert list(model.state_dict()) == names, "checkpoints and the export keep their names"
    compiled = model(input_ids=ids).logits
    compiled.sum().backward()
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5)
    for name, p in model.named_parameters():
        assert p.grad is not None
        torch.testing.assert_close(p.grad, eager_grads[name], rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("strategy_type", ["fsdp", "ddp"])
@pytest.mark.usefixtures("one_process_group")
def test_the_strategy_compiles_its_blocks_and_trains_through_them(tmp_path: Path, strategy_type: str) -> None:
    config = tiny_config(tmp_path, "compiled", strategy={"type": strategy_type}, training={"compile": True})
    strategy = make_strategy(config, ENV, total_steps=2)
    unwrapped = getattr(strategy.model, "module", strategy.model)  # inside DDP's wrapper
    blocks = {id(block) for block in models.transformer_blocks(unwrapped)}
    layers = {name for name, module in strategy.model.named_modules() if id(module) in blocks}
    assert len(layers) == config.model.config["num_hidden_layers"]
    assert _compiled(strategy.model) == layers
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "labels": ids}
    first = strategy.forward_backward(batch, loss_scale=1.0 / ids.numel(), last_micro_batch=True)
    strategy.step()
    second = strategy.forward_backward(batch, loss_scale=1.0 / ids.numel(), last_micro_batch=True)
    assert torch.isfinite(first) and float(second) < float(first)
