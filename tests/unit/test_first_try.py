"""Which reconcile creates a job's children without reading them first (`reconcile.first_try`), and
the Kopf setting that keeps its create handler from running twice for one job."""

from __future__ import annotations

import kopf
import pytest
from llmtrain.operator import reconcile
from llmtrain.operator.reconcile import TriedJobs, first_try
from llmtrain.operator.settings import CONSISTENCY_TIMEOUT, configure


def test_only_a_jobs_first_create_try_in_this_process_creates_unread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reconcile, "TRIED", TriedJobs())
    assert first_try("create", 0, {}, "uid-a")
    assert not first_try("create", 0, {}, "uid-a")  # Kopf ran the create handler again
    assert not first_try("resume", 0, {}, "uid-b")  # after a restart: its children exist
    assert not first_try("update", 0, {}, "uid-c")
    assert not first_try("create", 1, {}, "uid-d")  # a retry: an earlier try may have created some
    assert not first_try("create", 0, {"phase": "Pending"}, "uid-e")  # refused before
    assert not first_try("create", 0, {"rayJobName": "x"}, "uid-f")


def test_the_tried_uids_stay_bounded_and_the_oldest_is_forgotten_first() -> None:
    tried = TriedJobs(capacity=2)
    assert tried.first("a") and tried.first("b")
    assert not tried.first("a")  # seen again: the most recent now
    assert tried.first("c")  # "b", the oldest, is forgotten
    assert not tried.first("a") and tried.first("b")


def test_kopf_waits_for_its_own_diff_base_patch_longer_than_a_bursts_watch_lag() -> None:
    settings = kopf.OperatorSettings()
    configure(settings)
    assert settings.persistence.consistency_timeout == CONSISTENCY_TIMEOUT >= 30
