"""No host-device sync per micro-batch: counts come from the CPU copies, norms stay tensors.

The device here is `meta`: any attempt to read a value off it raises, where a GPU would quietly
wait for every queued kernel.
"""

from __future__ import annotations

import torch
from datasets import Dataset
from llmtrain_trainer.data import DistributedBatches
from llmtrain_trainer.metrics import BatchCounts
from llmtrain_trainer.modes.builtin import next_step_batches
from llmtrain_trainer.strategies.deepspeed import DeepSpeedStrategy

META = torch.device("meta")


def test_a_steps_micro_batches_are_counted_before_they_reach_the_device() -> None:
    examples = [{"input_ids": [1] * n, "labels": [1] * n} for n in (5, 9, 16, 3)]
    batches = DistributedBatches(Dataset.from_list(examples), 2, rank=0, world_size=1, seed=0, pad_id=0)
    on_device, counts = next_step_batches(batches, 2, META)

    assert all(t.device == META for batch in on_device for t in batch.values())
    # Whatever order the sampler took, the step holds all four examples: (n - 1) labels each.
    assert counts == BatchCounts(trained=4 + 8 + 15 + 2, inputs=33, attended_pairs=25 + 81 + 256 + 9)


class _Engine:
    def get_global_grad_norm(self) -> torch.Tensor:
        return torch.ones((), device=META)


def test_deepspeed_returns_its_norm_without_reading_it() -> None:
    strategy = DeepSpeedStrategy.__new__(DeepSpeedStrategy)
    strategy.engine = _Engine()
    norm = strategy.step()
    assert isinstance(norm, torch.Tensor) and norm.device == META
