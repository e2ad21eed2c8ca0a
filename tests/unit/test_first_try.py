"""Which reconcile creates a job's children without reading them first (`reconcile.first_try`), and
the Kopf setting that keeps its create handler from running twice for one job."""

from __future__ import annotations

from typing import Any

import kopf
import pytest
from llmtrain.api.validation import parse_job
from llmtrain.operator import reconcile
from llmtrain.operator.children import ensure_all
from llmtrain.operator.kube import ApiError, resource_of
from llmtrain.operator.reconcile import TriedJobs, first_try
from llmtrain.operator.settings import CONSISTENCY_TIMEOUT, configure
from llmtrain.render import render

from tests.support.jobs import minimal_job


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


class _Api:
    """Children stored by (kind, name): a create of one that exists answers 409; no pods."""

    def __init__(self, existing: tuple[dict[str, Any], ...] = ()) -> None:
        self.stored = {(o["kind"], o["metadata"]["name"]): o for o in existing}
        self.creates: list[str] = []

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        key = (obj["kind"], obj["metadata"]["name"])
        if key in self.stored:
            raise ApiError(409, "AlreadyExists", f"{key} exists")
        self.creates.append(obj["kind"])
        self.stored[key] = obj
        return obj

    def get(self, resource: object, namespace: str, name: str) -> dict[str, Any]:
        found = [o for (kind, n), o in self.stored.items() if n == name and resource_of(o) == resource]
        if not found:
            raise ApiError(404, "NotFound", name)
        return found[0]

    def list_all(self, resource: object, namespace: str, **_: Any) -> list[dict[str, Any]]:
        return []

    def merge_patch(
        self, resource: object, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        return self.get(resource, namespace, name)


def _children() -> list[dict[str, Any]]:
    doc = minimal_job("j", "n")
    doc["metadata"]["uid"] = "uid-1"
    return render(parse_job(doc))


def test_a_first_try_that_created_every_earlier_child_creates_the_rayjob_without_reading_the_job() -> None:
    """Its children answered 201: no try got to a RayJob before, so nothing can have finished the
    job, and the read of the job before the RayJob (`before_rayjob_create`) is saved. Any child
    that was already there (an interrupted try) brings the read back, as on every later try."""
    asked: list[str] = []
    children = _children()
    fresh = _Api()
    ensure_all(fresh, children, asked.append, create_first=True)  # type: ignore[arg-type]
    assert fresh.creates[-1] == "RayJob" and asked == []
    for already in (children[0], children[-2]):
        api = _Api((already,))
        ensure_all(api, _children(), asked.append, create_first=True)  # type: ignore[arg-type]
        assert api.creates[-1] == "RayJob" and len(asked) == 1, already["kind"]
        asked.clear()
    api = _Api()
    ensure_all(api, _children(), asked.append)  # type: ignore[arg-type]
    assert api.creates[-1] == "RayJob" and len(asked) == 1
