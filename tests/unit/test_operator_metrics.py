"""The operator's metrics say nothing false: a process that does not act (a standby, or one not yet
leading) exports `llmtrain_leader 0` and no job or resync series, and the resync loop's health is
there once it runs. The cluster tier scrapes a real standby (tests/cluster/test_leader_election.py)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from llmtrain.operator.metrics import ResyncStats
from prometheus_client import CollectorRegistry, generate_latest

_SCRAPE = """
from prometheus_client import generate_latest
from llmtrain.operator.metrics import LEADER, PHASE_BOOK
print(generate_latest().decode())
print("----")
LEADER.set(1)
PHASE_BOOK.start()
print(generate_latest().decode())
"""


def _samples(text: str, name: str) -> list[str]:
    return re.findall(rf"^{name}(?:{{.*}})? .*$", text, re.MULTILINE)


def test_before_it_leads_the_operator_exports_no_job_gauge_and_says_it_does_not_lead() -> None:
    out = subprocess.run([sys.executable, "-c", _SCRAPE], check=True, capture_output=True, text=True).stdout
    standby, leader = out.split("----")
    assert _samples(standby, "llmtrain_leader") == ["llmtrain_leader 0.0"]
    assert _samples(standby, "llmtrain_jobs") == [], "a standby's zeros would read as 'no jobs'"
    assert _samples(standby, "llmtrain_resync_[a-z_]+") == []
    assert _samples(leader, "llmtrain_leader") == ["llmtrain_leader 1.0"]
    assert 'llmtrain_jobs{phase="Running"} 0.0' in _samples(leader, "llmtrain_jobs")


def test_resync_passes_are_timed_and_counted_by_result() -> None:
    stats = ResyncStats()
    registry = CollectorRegistry()
    registry.register(stats)
    assert "llmtrain_resync" not in generate_latest(registry).decode()
    with stats.timed():
        pass
    with pytest.raises(RuntimeError), stats.timed():
        raise RuntimeError("the API server is gone")
    text = generate_latest(registry).decode()
    assert 'llmtrain_resync_passes_total{result="success"} 1.0' in text
    assert 'llmtrain_resync_passes_total{result="failure"} 1.0' in text
    assert _samples(text, "llmtrain_resync_last_duration_seconds")
    (stamp,) = _samples(text, "llmtrain_resync_last_success_timestamp_seconds")
    assert float(stamp.split()[1]) > 1.7e9
