"""FSDP2 CPU offload: where parameters are materialised, and the process group it needs.

FSDP2 refuses offloaded parameters found on the GPU at the first forward, so under offload they
must be materialised on the CPU; no GPU is needed to check the decision. The training run with
offload on CPU workers is the "fsdp-offload" case of test_strategies.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from llmtrain_trainer.main import process_group_backend
from llmtrain_trainer.strategies.fsdp import parameter_device

from tests.support.trainer import tiny_config

CUDA, CPU = torch.device("cuda", 3), torch.device("cpu")


@pytest.mark.parametrize(
    ("offload", "device", "expected"),
    [(True, CUDA, CPU), (False, CUDA, CUDA), (True, CPU, CPU), (False, CPU, CPU)],
    ids=["cuda-offload", "cuda", "cpu-offload", "cpu"],
)
def test_parameters_are_materialised_on_the_cpu_when_offloading(
    offload: bool, device: torch.device, expected: torch.device
) -> None:
    assert parameter_device(offload, device) == expected


@pytest.mark.parametrize(
    ("strategy", "use_gpu", "expected"),
    [
        ({"type": "fsdp", "fsdp": {"cpuOffload": True}}, True, "cpu:gloo,cuda:nccl"),
        ({"type": "fsdp", "fsdp": {"cpuOffload": True}}, False, None),
        ({"type": "fsdp"}, True, None),
        ({"type": "deepspeed", "deepspeed": {"offloadOptimizer": True}}, True, None),
    ],
    ids=["gpu-offload", "cpu-offload", "gpu", "deepspeed"],
)
def test_offload_on_gpus_adds_gloo_for_the_cpu_shards(
    tmp_path: Path, strategy: dict[str, object], use_gpu: bool, expected: str | None
) -> None:
    config = tiny_config(tmp_path, "offload", strategy=strategy, scaling={"useGpu": use_gpu})
    assert process_group_backend(config) == expected
