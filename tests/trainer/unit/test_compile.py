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


def test_compile_is_on_by_default_on_gpus_only(tmp_path: Path) -> None:
    assert tiny_config(tmp_path, "default").training.compile is None
    assert models.compile_wanted(None, on_gpu=True) is True
    assert models.compile_wanted(None, on_gpu=False) is False
    assert models.compile_wanted(True, on_gpu=False) is True
    assert models.compile_wanted(False, on_gpu=True) is False


@pytest.mark.usefixtures("one_process_group")
def test_a_cpu_strategy_left_at_the_default_compiles_nothing(tmp_path: Path) -> None:
    strategy = make_strategy(tiny_config(tmp_path, "default"), ENV, total_steps=2)
    assert _compiled(strategy.model) == set() and strategy.compile_failures is None


def test_a_block_that_fails_to_compile_runs_eagerly_and_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compiler error must not fail the job: the block runs eagerly, with the eager results,
    and the failure is recorded for the log and status.progress.notices."""
    import torch._dynamo

    monkeypatch.setattr(torch._dynamo.config, "suppress_errors", False)  # compile_blocks sets it

    def broken_backend(graph: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> None:
        raise RuntimeError("inductor cannot compile this block here")

    config = tiny_config(tmp_path, "compiled")
    model = models.build_from_config(models.model_config(config.model), torch.float32, meta=False, seed=3)
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    eager = model(input_ids=ids).logits.detach()
    failures = models.compile_blocks(model, backend=broken_backend)
    try:
        assert failures.notice() is None  # nothing compiled yet: blocks compile at their first call
        compiled = model(input_ids=ids).logits
        compiled.sum().backward()
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(compiled.detach(), eager)
    assert failures.failures, "no compilation failure was recorded"
    notice = failures.notice()
    assert notice is not None and notice.startswith("training.compile: ") and "run eagerly instead" in notice
    assert "inductor cannot compile this block here" in notice, notice


def test_each_decoder_layer_is_compiled_in_place_with_the_eager_results(tmp_path: Path) -> None:
    config = tiny_config(tmp_path, "compiled")
    model = models.build_from_config(models.model_config(config.model), torch.float32, meta=False, seed=3)
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    eager = model(input_ids=ids).logits
    eager.sum().backward()
    eager_grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    names = list(model.state_dict())

    failures = models.compile_blocks(model)

    layers = {f"model.layers.{i}" for i in range(model.config.num_hidden_layers)}
    assert _compiled(model) == layers
    assert list(model.state_dict()) == names, "checkpoints and the export keep their names"
    compiled = model(input_ids=ids).logits
    compiled.sum().backward()
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5)
    for name, p in model.named_parameters():
        assert p.grad is not None
        torch.testing.assert_close(p.grad, eager_grads[name], rtol=1e-3, atol=1e-4)
    assert failures.notice() is None, failures.failures  # inductor compiled every block


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


def test_the_loop_tells_each_new_compile_failure_once_from_rank_zero(tmp_path: Path) -> None:
    from typing import Any

    from llmtrain_trainer.metrics import MetricsRecord
    from llmtrain_trainer.modes.builtin import TrainingRun

    class Life:
        def __init__(self) -> None:
            self.records: list[MetricsRecord] = []

        def emit(self, record: MetricsRecord) -> None:
            self.records.append(record)

    class Strategy:
        compile_failures = models.CompileFailures()

    def told(rank: int, failures: list[list[str]]) -> list[Any]:
        life = Life()
        env = WorkerEnv(rank=rank, world_size=2, local_rank=rank, device=torch.device("cpu"))
        run = TrainingRun(tiny_config(tmp_path, "compiled"), env, tmp_path, life)  # type: ignore[arg-type]
        run.total = 10
        strategy = Strategy()
        for step, seen in enumerate(failures, start=1):
            strategy.compile_failures.failures = seen
            run._report_compile_failures(strategy, step)  # type: ignore[arg-type]
        return [(r.event, r.step, r.message) for r in life.records]

    said = told(0, [[], ["boom"], ["boom"], ["boom", "again"]])
    assert [(event, step) for event, step, _ in said] == [("notice", 2), ("notice", 4)]
    assert all(message and "First error: boom" in message for _, _, message in said)
    assert told(1, [["boom"]]) == []  # rank 0 alone reports
