"""Throughput and MFU (metrics.py)."""

from __future__ import annotations

import pytest
from llmtrain_trainer.metrics import Throughput


def test_mfu_is_throughput_over_peak() -> None:
    meter = Throughput(peak=1e12, world_size=2)
    meter._seconds, meter._started = 1.0, None  # one second of stepping, measured
    meter.add(400, 400 * 1e9)
    rate, mfu = meter.measure()
    assert rate == pytest.approx(400) and mfu == pytest.approx(400 * 1e9 / 2e12)


class _Clock:
    """time.perf_counter under the test's control."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_only_the_steps_are_timed_and_each_interval_starts_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    from llmtrain_trainer import metrics

    clock = _Clock()
    monkeypatch.setattr(metrics.time, "perf_counter", clock)
    meter = Throughput(peak=1e12, world_size=2)
    assert (meter.train_seconds, meter.train_tokens, meter.interval_seconds, meter.interval_tokens) == (
        0.0,
        0,
        0.0,
        0,
    )
    meter.add(100, 1e12)
    meter.add(300, 3e12)
    clock.now += 2.0  # two seconds of steps
    meter.pause()
    clock.now += 50.0  # a checkpoint: not timed
    meter.pause()  # a second pause changes nothing
    meter.resume()
    meter.resume()  # nor does a second resume restart the clock
    clock.now += 2.0
    rate, mfu = meter.measure()
    assert rate == pytest.approx(100.0) and mfu == pytest.approx(4e12 / 4.0 / 2e12)
    assert (meter.interval_seconds, meter.interval_tokens) == (pytest.approx(4.0), 400)
    clock.now += 1.0  # the next interval: its own tokens, seconds and FLOPs only
    meter.add(50, 1e12)
    rate, mfu = meter.measure()
    assert rate == pytest.approx(50.0) and mfu == pytest.approx(1e12 / 1.0 / 2e12)
    assert (meter.train_seconds, meter.train_tokens) == (pytest.approx(5.0), 450)
    assert meter.average_tokens_per_second == pytest.approx(90.0)


def test_an_interval_without_time_or_flops_has_no_rate_and_no_mfu(monkeypatch: pytest.MonkeyPatch) -> None:
    from llmtrain_trainer import metrics

    clock = _Clock()
    monkeypatch.setattr(metrics.time, "perf_counter", clock)
    meter = Throughput(peak=1e12, world_size=1)
    assert meter.measure() == (0.0, None)  # no time has passed
    clock.now += 1.0
    assert meter.measure() == (0.0, None)  # time, but no FLOPs: no MFU
    clock.now += 1.0
    meter.add(10, 0.5)
    assert meter.measure()[1] == pytest.approx(0.5 / 1e12)  # under one FLOP still counts
    assert Throughput(peak=None, world_size=1).measure()[1] is None


def test_checkpoints_and_eta() -> None:
    from llmtrain_trainer.metrics import checkpoints_from, eta_seconds

    assert checkpoints_from(10, 10, 5, at_end=False) == 1  # the last step is on the grid
    assert checkpoints_from(11, 10, 5, at_end=True) == 0
    assert eta_seconds(10, 2.0) == 20.0
    assert eta_seconds(10, 2.0, 2, 30.0) == 80.0


def test_a_cpu_has_no_peak_and_a_known_gpu_has_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from llmtrain_trainer.metrics import PEAK_BF16_FLOPS, peak_flops

    assert peak_flops(torch.device("cpu")) is None
    asked: list[object] = []

    def name(device: object) -> str:
        asked.append(device)
        return "NVIDIA H100 80GB HBM3"

    monkeypatch.setattr(torch.cuda, "get_device_name", name)
    cuda = torch.device("cuda", 1)
    assert peak_flops(cuda) == dict(PEAK_BF16_FLOPS)["H100"] and asked == [cuda]
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "Some Future Accelerator")
    assert peak_flops(cuda) is None


def test_the_first_interval_counts_only_its_own_flops_and_no_time_means_no_mfu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from llmtrain_trainer import metrics

    clock = _Clock()
    monkeypatch.setattr(metrics.time, "perf_counter", clock)
    meter = Throughput(peak=1e12, world_size=1)
    clock.now += 1.0
    meter.add(10, 0.5)
    assert meter.measure()[1] == pytest.approx(0.5 / 1e12, rel=1e-9)
    meter.add(10, 1e9)  # FLOPs but no time: neither a rate nor an MFU (and no division by zero)
    assert meter.measure() == (0.0, None)


def test_the_eta_counts_only_what_is_left() -> None:
    from llmtrain_trainer.metrics import eta_seconds

    assert eta_seconds(0, 2.0) == 0.0
    assert eta_seconds(10, 2.0, checkpoint_seconds=30.0) == 20.0  # no checkpoint left to write
    assert eta_seconds(10, 2.0, checkpoints_left=2) == 20.0  # their cost not known yet
    assert eta_seconds(10, 2.0, 0, 30.0) == 20.0
