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
