"""`deepspeed_config` is fully resolved, and DeepSpeed takes its precision settings as meant: under
bf16 it reduces and accumulates gradients in fp32 (as FSDP2 does), under fp16 it scales the loss
dynamically.

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
import torch
from llmtrain.api.spec import DeepSpeedSpec, TrainingSpec
from llmtrain_trainer.strategies.deepspeed import deepspeed_config

from tests.support.trainer import REPO

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


pytestmark = pytest.mark.thorough  # DeepSpeed's import and engine start: 17 s


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


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_config_is_fully_resolved(stage: int) -> None:
    spec = DeepSpeedSpec(zero_stage=stage, offload_optimizer=True, offload_params=stage == 3)
    training = TrainingSpec(micro_batch_size=4, gradient_accumulation_steps=8, max_grad_norm=0.5)
    config = deepspeed_config(spec, training, world_size=16, dtype=torch.bfloat16, hidden_size=4096)
    assert "auto" not in json.dumps(config)
    assert config["train_batch_size"] == 4 * 8 * 16
    assert config["gradient_clipping"] == 0.5
    assert config["bf16"]["enabled"] and not config["fp16"]["enabled"]
    zero = config["zero_optimization"]
    assert zero["stage"] == stage and zero["offload_optimizer"]["device"] == "cpu"
    assert config["zero_force_ds_cpu_optimizer"] is False  # we bring a torch AdamW
    assert ("offload_param" in zero) == (stage == 3)
    assert zero.get("stage3_gather_16bit_weights_on_model_save", stage != 3) is True
    # bf16 reduces and accumulates gradients in fp32, as FSDP2's reduce_dtype does.
    assert config["communication_data_type"] == "fp32"
    assert config["data_types"] == {"grad_accum_dtype": "fp32"}


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_deepspeed_keeps_its_gradient_dtypes_outside_bf16(dtype: torch.dtype) -> None:
    """fp16 keeps DeepSpeed's own loss-scaled path; fp32 is fp32 throughout anyway."""
    config = deepspeed_config(DeepSpeedSpec(zero_stage=2), TrainingSpec(), 1, dtype, 64)
    assert "communication_data_type" not in config and "data_types" not in config
    assert config["fp16"]["enabled"] == (dtype == torch.float16) and config["fp16"]["loss_scale"] == 0
