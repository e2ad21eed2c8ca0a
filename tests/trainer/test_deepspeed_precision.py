"""DeepSpeed takes the precision settings of `deepspeed_config` as meant: under bf16 it reduces
and accumulates gradients in fp32 (as FSDP2 does), under fp16 it scales the loss dynamically.

The engines are built for real, on one CPU rank, in a child process: DeepSpeed keeps process-wide
communication state that must not leak into other tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.trainer.helpers import REPO

# Prints, per ZeRO stage, the dtypes the engine reduces and accumulates gradients in under bf16,
# after two micro-batches and a step; then how the fp16 config scales the loss.
PROBE = textwrap.dedent(
    """
    import json, sys
    import torch, torch.distributed as dist
    from llmtrain.api.spec import DeepSpeedSpec, TrainingSpec
    from llmtrain_trainer.strategies.deepspeed import _prepare_cpu_deepspeed, deepspeed_config

    _prepare_cpu_deepspeed()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    import deepspeed
    from deepspeed.runtime.config import DeepSpeedConfig

    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    training = TrainingSpec(micro_batch_size=2, gradient_accumulation_steps=2)
    found = {}
    for stage in (1, 2, 3):
        config = deepspeed_config(DeepSpeedSpec(zero_stage=stage), training, 1, torch.bfloat16, 8)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)).to(torch.bfloat16)
        engine, *_ = deepspeed.initialize(
            model=model, optimizer=torch.optim.AdamW(model.parameters()), config=config,
            dist_init_required=False,
        )
        for _ in range(2):
            engine.backward(engine(torch.randn(2, 8, dtype=torch.bfloat16)).float().sum())
            engine.step()
        optimizer = engine.optimizer
        accumulate = getattr(optimizer, "gradient_accumulation_dtype", None) or optimizer.grad_acc_dtype
        found[stage] = {"reduce": str(engine.communication_data_type), "accumulate": str(accumulate)}
    fp16 = DeepSpeedConfig(deepspeed_config(DeepSpeedSpec(zero_stage=2), training, 1, torch.float16, 8))
    found["fp16"] = {
        "enabled": fp16.float16_config.enabled,
        "dynamic": fp16.float16_config.loss_scale == 0,
        "initial_scale": fp16.float16_config.initial_dynamic_scale(),
    }
    print("PROBE" + json.dumps(found))
    """
)


@pytest.fixture(scope="module")
def probe() -> dict[str, dict[str, object]]:
    env = {
        **os.environ,
        "LOCAL_RANK": "0",
        "RANK": "0",
        "WORLD_SIZE": "1",
        "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("operator", "trainer_image")),
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("PROBE")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    found: dict[str, dict[str, object]] = json.loads(lines[-1].removeprefix("PROBE"))
    return found


@pytest.mark.parametrize("stage", ["1", "2", "3"])
def test_bf16_gradients_are_reduced_and_accumulated_in_fp32(
    probe: dict[str, dict[str, object]], stage: str
) -> None:
    assert probe[stage] == {"reduce": "torch.float32", "accumulate": "torch.float32"}


def test_fp16_scales_the_loss_dynamically(probe: dict[str, dict[str, object]]) -> None:
    assert probe["fp16"] == {"enabled": True, "dynamic": True, "initial_scale": 2**16}
