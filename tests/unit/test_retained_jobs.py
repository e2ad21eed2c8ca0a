"""Finished jobs cost the resync nothing: the operator labels a job `llmtrain.dev/finished` once its
status is terminal (`reporting.report` / `mark_finished`), and the resync lists only jobs without
the label, one page at a time, each page's RayJobs by the page's job names (`mirror.resync_all`)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from llmtrain.constants import FINISHED_LABEL, JOB_LABEL
from llmtrain.operator import mirror, reporting
from llmtrain.operator.config import OperatorConfig
from llmtrain.operator.status import Failure, Step

from tests.support.jobs import minimal_job

SUCCEEDED_RAYJOB = {"status": {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}}


def job(name: str, status: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta = {"name": name, "namespace": "n", "uid": f"u-{name}", "resourceVersion": "1", "generation": 1}
    if labels:
        meta["labels"] = labels
    return {**minimal_job(name, "n"), "metadata": meta, "status": status}


class Kube:
    """Serves `pages` of jobs (whatever the selector: the server's filter is the real cluster's
    business) and records, in order, every list and every patch."""

    def __init__(self, pages: list[list[dict[str, Any]]]) -> None:
        self.pages = pages
        self.calls: list[tuple[str, ...]] = []

    def list_pages(
        self, res: Any, namespace: Any, label_selector: str | None = None, page: int = 500, **_: Any
    ) -> Iterator[list[dict[str, Any]]]:
        for number, items in enumerate(self.pages):
            self.calls.append(("list-page", res.plural, str(label_selector), str(page), str(number)))
            yield items

    def list_all(self, res: Any, namespace: Any, label_selector: str | None = None, **_: Any) -> list[Any]:
        self.calls.append(("list", res.plural, str(label_selector)))
        return []

    def merge_patch(
        self, res: Any, namespace: str, name: str, body: dict[str, Any], subresource: str | None = None
    ) -> dict[str, Any]:
        self.calls.append(("patch", f"{res.plural}/{subresource}" if subresource else res.plural, name))
        self.bodies = [*getattr(self, "bodies", []), body]
        return {}

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        return obj


def test_a_job_whose_status_becomes_terminal_is_labelled_finished_once() -> None:
    kube = Kube([])
    running = job("j", {"phase": "Running", "rayJobName": "j"})
    reporting.report(kube, running, {**SUCCEEDED_RAYJOB, "metadata": {"name": "j"}}, Step.MIRRORED)  # type: ignore[arg-type]
    assert [c for c in kube.calls if c[0] == "patch"] == [
        ("patch", "llmtrainingjobs/status", "j"),
        ("patch", "llmtrainingjobs", "j"),
    ]
    assert kube.bodies[-1] == {"metadata": {"labels": {FINISHED_LABEL: "true"}}}
    kube.calls.clear()
    labelled = job("j", {"phase": "Succeeded", "rayJobName": "j"}, {FINISHED_LABEL: "true"})
    reporting.report(kube, labelled, None, Step.KEPT)  # type: ignore[arg-type]
    assert not [c for c in kube.calls if c == ("patch", "llmtrainingjobs", "j")], "labelled once"


def test_an_unfinished_job_and_an_invalid_spec_failure_are_not_labelled() -> None:
    """A Failed for an invalid spec is judged again on the next edit: it must stay listed."""
    kube = Kube([])
    reporting.report(kube, job("a", {"phase": "Running", "rayJobName": "a"}), None, Step.KEPT)  # type: ignore[arg-type]
    running = job("b", {"phase": "Running", "rayJobName": "b"})
    reporting.report(kube, running, None, Failure("InvalidSpec", "invalid spec: x"))  # type: ignore[arg-type]
    assert ("patch", "llmtrainingjobs/status", "b") in kube.calls
    assert ("patch", "llmtrainingjobs", "a") not in kube.calls
    assert ("patch", "llmtrainingjobs", "b") not in kube.calls


def test_the_resync_lists_unfinished_jobs_a_page_at_a_time_and_labels_finished_ones_it_still_sees(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The job list carries `!llmtrain.dev/finished`; each page's RayJobs are listed (by that
    page's unfinished job names only) before the next page is asked for; a page of finished jobs
    (left unlabelled by an older operator) is labelled and lists no RayJobs."""
    pages = [
        [job("a", {"phase": "Running", "rayJobName": "a"}), job("old", {"phase": "Succeeded"})],
        [
            job("b", {"phase": "Pending", "rayJobName": "b"}),
            job("c", {"phase": "Running", "rayJobName": "c"}),
        ],
        [job("f", {"phase": "Failed", "reason": "BackoffLimitExceeded"})],
    ]
    kube = Kube(pages)
    monkeypatch.setattr(mirror, "rayjob_gone", lambda *args: None)
    mirror.resync_all(kube, OperatorConfig(), logging.getLogger("test"))  # type: ignore[arg-type]
    selector = f"!{FINISHED_LABEL}"
    page = str(mirror.RESYNC_PAGE)
    assert kube.calls == [
        ("list-page", "llmtrainingjobs", selector, page, "0"),
        ("patch", "llmtrainingjobs", "old"),
        ("list", "rayjobs", f"{JOB_LABEL} in (a)"),
        ("list-page", "llmtrainingjobs", selector, page, "1"),
        ("list", "rayjobs", f"{JOB_LABEL} in (b,c)"),
        ("list-page", "llmtrainingjobs", selector, page, "2"),
        ("patch", "llmtrainingjobs", "f"),
    ]
    assert all(body == {"metadata": {"labels": {FINISHED_LABEL: "true"}}} for body in kube.bodies)
