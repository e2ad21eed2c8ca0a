"""Metric records and throughput: tokens read, tokens/s, MFU against the device's dense bf16 peak, ETA."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

Event = Literal["started", "resumed", "step", "validation", "checkpoint", "exported", "finished", "notice"]

# Dense bf16 tensor-core peaks in FLOP/s (not the 2:4-sparse figures), matched against
# torch.cuda.get_device_name(); the first matching substring wins, so order matters.
PEAK_BF16_FLOPS: list[tuple[str, float]] = [
    ("H200", 989e12),
    ("GH200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),
    ("H800", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10G", 70e12),
    ("A10", 125e12),
    ("RTX 4090", 165e12),
    ("MI300X", 1307e12),
]


def peak_flops(device: torch.device) -> float | None:
    """The device's dense bf16 peak, or None when unknown (always None on CPUs)."""
    if device.type != "cuda":
        return None
    import torch

    name = torch.cuda.get_device_name(device)
    for key, flops in PEAK_BF16_FLOPS:
        if key in name:
            return flops
    return None


@dataclass
class MetricsRecord:
    """One line of progress, emitted by rank 0: a step's metrics or a run event."""

    event: Event
    step: int
    total_steps: int
    time: float = field(default_factory=time.time)
    loss: float | None = None
    learning_rate: float | None = None
    grad_norm: float | None = None
    tokens_per_second: float | None = None
    mfu: float | None = None
    eta_seconds: float | None = None
    epoch: int | None = None
    tokens_seen: int | None = None
    val_loss: float | None = None
    best_val_loss: float | None = None
    """On a validation record: the lowest validation loss so far (the trainer's own rule)."""
    best_step: int | None = None
    path: str | None = None
    checkpoint_seconds: float | None = None
    """On a checkpoint record: how long training paused for it (save and validation)."""
    message: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {key: value for key, value in asdict(self).items() if value is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MetricsRecord:
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})


class Throughput:
    """Tokens per second and MFU over the interval since the last `measure()`.

    Times only the steps themselves: checkpoint saves and evaluations between measurements are
    excluded with `pause()`/`resume()`, so a checkpoint does not look like a slow step. The run's
    lifecycle (lifecycle.py) keeps one per attempt for every mode, and its ETA divides the same
    measured seconds by the steps they covered.
    """

    def __init__(self, peak: float | None, world_size: int) -> None:
        self.peak = peak
        self.world_size = world_size
        self.train_seconds = 0.0
        self.train_tokens = 0
        self._tokens = 0
        self._flops = 0.0
        self._seconds = 0.0
        self._started: float | None = time.perf_counter()
        self.interval_seconds = 0.0
        """Training seconds between the last two `measure()` calls."""
        self.interval_tokens = 0
        """Tokens added between the last two `measure()` calls."""

    def add(self, tokens: int, flops: float) -> None:
        """Real input tokens of all ranks (padding excluded, see `BatchCounts`) and the model FLOPs
        spent on them (`model.TrainingFlops`)."""
        self._tokens += tokens
        self._flops += flops

    def pause(self) -> None:
        if self._started is not None:
            self._seconds += time.perf_counter() - self._started
            self._started = None

    def resume(self) -> None:
        if self._started is None:
            self._started = time.perf_counter()

    def measure(self) -> tuple[float, float | None]:
        """(tokens/s across all ranks, MFU or None) since the previous call."""
        self.pause()
        seconds, tokens, flops = self._seconds, self._tokens, self._flops
        self.train_seconds += seconds
        self.train_tokens += tokens
        self._seconds, self._tokens, self._flops = 0.0, 0, 0.0
        self.interval_seconds, self.interval_tokens = seconds, tokens
        self.resume()
        rate = tokens / seconds if seconds > 0 else 0.0
        mfu = None
        if self.peak and seconds > 0 and flops > 0:
            mfu = flops / seconds / (self.peak * self.world_size)
        return rate, mfu

    @property
    def average_tokens_per_second(self) -> float:
        return self.train_tokens / self.train_seconds if self.train_seconds > 0 else 0.0


@dataclass(frozen=True)
class BatchCounts:
    """What a micro-batch holds, counted on its CPU copy before it is sent to the device: reading a
    count off a device tensor would be a host-device sync on every micro-batch."""

    trained: int
    """Tokens that contribute to the loss (`loss.trained_tokens`)."""
    inputs: int
    """Real tokens the model reads (padding excluded)."""
    attended_pairs: int
    """Σ over rows of the real length squared: the (query, key) pairs attention is credited for."""

    def __add__(self, other: BatchCounts) -> BatchCounts:
        return BatchCounts(
            self.trained + other.trained,
            self.inputs + other.inputs,
            self.attended_pairs + other.attended_pairs,
        )


def batch_counts(batch: dict[str, torch.Tensor]) -> BatchCounts:
    """Counts of a micro-batch still on the CPU (refuses device tensors, which would sync)."""
    import torch

    from llmtrain_trainer.loss import trained_tokens

    ids = batch["input_ids"]
    if ids.device.type != "cpu":
        raise ValueError(f"count micro-batches on their CPU copy, not on {ids.device}")
    mask = batch.get("attention_mask")
    lengths = mask.sum(dim=1) if mask is not None else torch.full((ids.shape[0],), ids.shape[1])
    positions = batch.get("position_ids")
    if positions is not None and mask is None:
        # Packed examples: attention is block-diagonal, one block per run of positions from 0.
        starts = torch.nonzero(positions.reshape(-1) == 0).flatten()
        segments = torch.diff(torch.cat([starts, torch.tensor([positions.numel()])]))
        return BatchCounts(
            trained=trained_tokens(batch["labels"]),
            inputs=int(segments.sum()),
            attended_pairs=int((segments * segments).sum()),
        )
    return BatchCounts(
        trained=trained_tokens(batch["labels"]),
        inputs=int(lengths.sum()),
        attended_pairs=int((lengths * lengths).sum()),
    )


def checkpoints_from(step: int, total: int, every: int, at_end: bool) -> int:
    """How many checkpoints the steps `step`..`total` will write (every `every` steps, plus the
    last step's when `at_end` and it is off that grid)."""
    if step > total:
        return 0
    grid = total // every - (step - 1) // every
    return grid + (1 if at_end and total % every else 0)


def eta_seconds(
    steps_left: int, seconds_per_step: float, checkpoints_left: int = 0, checkpoint_seconds: float = 0.0
) -> float:
    """Time to the end: the steps left, and the checkpoints still to write at the last one's cost."""
    return max(0, steps_left) * seconds_per_step + max(0, checkpoints_left) * checkpoint_seconds
