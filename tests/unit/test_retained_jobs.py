"""Finished jobs cost the resync nothing: the operator labels a job `llmtrain.dev/finished` once its
status is terminal (`reporting.report` / `mark_finished`), and the resync lists only jobs without
the label, one page at a time, each page's RayJobs by the page's job names (`mirror.resync_all`)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import kopf
import pytest
from llmtrain.constants import (
    API_GROUP,
    API_VERSION,
    FINISHED_LABEL,
    JOB_LABEL,
    PLURAL,
    RAY_API_GROUP,
    RAY_API_VERSION,
    RAYJOB_PLURAL,
    REPORTER_NAME,
)
from llmtrain.operator import mirror, registration, reporting
from llmtrain.operator.config import OperatorConfig
from llmtrain.operator.kube import ApiError
from llmtrain.operator.status import Failure, Step

from tests.support.jobs import minimal_job, stored_reporter_rbac

SUCCEEDED_RAYJOB = {"status": {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}}


def job(name: str, status: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta = {"name": name, "namespace": "n", "uid": f"u-{name}", "resourceVersion": "1", "generation": 1}
    if labels:
        meta["labels"] = labels
    return {**minimal_job(name, "n"), "metadata": meta, "status": status}


class Kube:
    """Serves `pages` of jobs to the resync's list of unfinished jobs and `labelled` to its count
    of finished ones (the server's filter itself is the real cluster's business), and records, in
    order, every list and every patch."""

    def __init__(
        self, pages: list[list[dict[str, Any]]], labelled: list[list[dict[str, Any]]] | None = None
    ) -> None:
        self.pages = pages
        self.labelled = labelled or []
        self.calls: list[tuple[str, ...]] = []

    def list_pages(
        self, res: Any, namespace: Any, label_selector: str | None = None, page: int = 500, **_: Any
    ) -> Iterator[list[dict[str, Any]]]:
        served = self.labelled if label_selector == FINISHED_LABEL else self.pages
        for number, items in enumerate(served):
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

    def get(self, res: Any, namespace: str, name: str) -> dict[str, Any]:
        """Only the resync's check of the namespace's reporter Role and RoleBinding reads here."""
        self.calls.append(("get", res.plural, name))
        stored = stored_reporter_rbac(res, namespace, name)
        assert stored is not None, (res.plural, name)
        return stored


def test_a_job_whose_status_becomes_terminal_is_labelled_finished_once() -> None:
    kube = Kube([])
    running = job("j", {"phase": "Running", "rayJobName": "j"})
    reporting.report(kube, running, {**SUCCEEDED_RAYJOB, "metadata": {"name": "j"}}, Step.MIRRORED)  # type: ignore[arg-type]
    assert [c for c in kube.calls if c[0] == "patch"] == [
        ("patch", "llmtrainingjobs/status", "j"),
        ("patch", "rayjobs", "j"),  # the RayJob first: a job labelled finished is not listed again
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
        # the namespace's reporter rights, read once per pass (page 1's jobs share the namespace)
        ("get", "roles", REPORTER_NAME),
        ("get", "rolebindings", REPORTER_NAME),
        ("list", "rayjobs", f"{JOB_LABEL} in (a)"),
        ("list-page", "llmtrainingjobs", selector, page, "1"),
        ("list", "rayjobs", f"{JOB_LABEL} in (b,c)"),
        ("list-page", "llmtrainingjobs", selector, page, "2"),
        ("patch", "llmtrainingjobs", "f"),
    ]
    assert all(body == {"metadata": {"labels": {FINISHED_LABEL: "true"}}} for body in kube.bodies)


def test_the_gauge_counts_finished_jobs_out_of_kopfs_view_and_drops_them_when_deleted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Kopf sees unfinished jobs only: a job labelled finished leaves its view as a DELETED event,
    which must not take it off the gauge (it is still stored); the resync's count of labelled jobs
    keeps the finished ones counted after a restart, and drops one deleted while out of view."""
    from llmtrain.operator import metrics, registration

    book = metrics.PhaseBook()
    monkeypatch.setattr(registration, "PHASE_BOOK", book)
    monkeypatch.setattr(mirror, "PHASE_BOOK", book)

    def gauge() -> dict[str, float]:
        return {p: metrics.JOBS.labels(phase=p)._value.get() for p in ("Running", "Succeeded", "Failed")}

    done = job("done", {"phase": "Succeeded"}, {FINISHED_LABEL: "true"})
    stored: dict[str, dict[str, Any]] = {"done": done}

    class Stored(Kube):
        def get(self, res: Any, namespace: str, name: str) -> dict[str, Any]:
            if name not in stored:
                raise ApiError(404, "NotFound", name)
            return stored[name]

    book.set("n/done", "Succeeded")
    book.set("n/live", "Running")
    memo = kopf.Memo(kube=Stored([]))
    leaving = {"type": "DELETED", "object": job("done", {"phase": "Succeeded"})}
    registration.forget_deleted(event=leaving, meta=leaving["object"]["metadata"], memo=memo)
    assert gauge() == {"Running": 1, "Succeeded": 1, "Failed": 0}, "left Kopf's view, still counted"

    # After a restart: Kopf's view holds the unfinished job only; the resync counts the rest.
    fresh = metrics.PhaseBook()
    monkeypatch.setattr(mirror, "PHASE_BOOK", fresh)
    fresh.set("n/live", "Running")
    failed = job("old", {"phase": "Failed", "reason": "BackoffLimitExceeded"}, {FINISHED_LABEL: "true"})
    listing = Kube([[job("live", {"phase": "Running"})]], labelled=[[done, failed]])
    mirror.resync_all(listing, OperatorConfig(), logging.getLogger("test"))  # type: ignore[arg-type]
    assert gauge() == {"Running": 1, "Succeeded": 1, "Failed": 1}

    # A finished job deleted while out of Kopf's view (no event reaches it): the next count.
    listing = Kube([[job("live", {"phase": "Running"})]], labelled=[[failed]])
    mirror.resync_all(listing, OperatorConfig(), logging.getLogger("test"))  # type: ignore[arg-type]
    assert gauge() == {"Running": 1, "Succeeded": 0, "Failed": 1}

    # A real deletion in Kopf's view: gone from the API server, gone from the gauge.
    monkeypatch.setattr(registration, "PHASE_BOOK", fresh)
    gone = {"type": "DELETED", "object": job("live", {"phase": "Running"})}
    registration.forget_deleted(event=gone, meta=gone["object"]["metadata"], memo=memo)
    assert gauge() == {"Running": 0, "Succeeded": 0, "Failed": 1}


def test_a_job_labelled_finished_that_has_not_finished_gets_its_label_taken_off() -> None:
    """Out of Kopf's view and the resync's, nothing would ever run it."""
    kube = Kube([], labelled=[[job("r", {"phase": "Running", "rayJobName": "r"}, {FINISHED_LABEL: "true"})]])
    mirror.resync_all(kube, OperatorConfig(), logging.getLogger("test"))  # type: ignore[arg-type]
    assert ("patch", "llmtrainingjobs", "r") in kube.calls
    assert kube.bodies == [{"metadata": {"labels": {FINISHED_LABEL: None}}}]


def test_kopf_lists_in_pages_and_watches_only_unfinished_jobs_and_their_rayjobs() -> None:
    """The selectors Kopf sends with its LIST and WATCH of each resource, through its own lookup."""
    from kopf._cogs.structs.references import Resource
    from llmtrain.operator.settings import configure

    settings = kopf.OperatorSettings()
    configure(settings)
    jobs = Resource(API_GROUP, API_VERSION, PLURAL, preferred=True)
    rayjobs = Resource(RAY_API_GROUP, RAY_API_VERSION, RAYJOB_PLURAL, preferred=True)
    assert settings.watching.label_selectors.collect(jobs) == [f"!{FINISHED_LABEL}"]
    assert settings.watching.label_selectors.collect(rayjobs) == [f"{JOB_LABEL},!{FINISHED_LABEL}"]
    assert settings.watching.chunk_size == 500


def test_a_job_that_failed_to_start_is_labelled_only_once_its_rayjob_is_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Labelled, a job leaves Kopf's view and the resync's: nothing would stop its Ray cluster
    (its GPUs) after that. So the report that fails it leaves the label off; the resync stops its
    RayJob, then labels it; a failed stop leaves it unlabelled for the next pass."""
    from llmtrain.constants import JOB_UID_LABEL
    from llmtrain.operator.status import STARTUP_EXPIRED

    condition = {"type": "Failed", "status": "True", "reason": STARTUP_EXPIRED}
    failed = job("s", {"phase": "Failed", "rayJobName": "s", "conditions": [condition]})
    rayjob = {"metadata": {"name": "s", "namespace": "n", "labels": {JOB_UID_LABEL: "u-s"}}, "spec": {}}

    class Stopping(Kube):
        refuse = False

        def get(self, res: Any, namespace: str, name: str) -> dict[str, Any]:
            return rayjob

        def merge_patch(self, res: Any, namespace: str, name: str, body: dict[str, Any], **kw: Any) -> dict:
            if self.refuse and "spec" in body:
                raise ApiError(500, "InternalError", "no")
            return super().merge_patch(res, namespace, name, body, **kw)

    kube = Stopping([])
    reporting.report(
        kube, job("s", {"phase": "Running", "rayJobName": "s"}), None, Failure(STARTUP_EXPIRED, "x")
    )  # type: ignore[arg-type]
    assert [c for c in kube.calls if c[0] == "patch"] == [("patch", "llmtrainingjobs/status", "s")]

    kube = Stopping([[failed]])
    kube.refuse = True
    mirror.resync_all(kube, OperatorConfig(), logging.getLogger("test"))  # type: ignore[arg-type]
    assert not [c for c in kube.calls if c[0] == "patch"], "not labelled while its RayJob runs"

    kube = Stopping([[failed]])
    mirror.resync_all(kube, OperatorConfig(), logging.getLogger("test"))  # type: ignore[arg-type]
    assert [c for c in kube.calls if c[0] == "patch"] == [
        ("patch", "rayjobs", "s"),  # the stop
        ("patch", "rayjobs", "s"),  # the label
        ("patch", "llmtrainingjobs", "s"),
    ]
    assert kube.bodies[0] == {"spec": {"ttlSecondsAfterFinished": 0, "suspend": True}}


def test_finished_jobs_left_unlabelled_are_labelled_before_kopf_lists_them() -> None:
    """After an upgrade every kept job is unlabelled; Kopf would hand each one its LIST returns to
    a worker at once. The start-up handler labels the finished ones first, a page at a time, and
    leaves unfinished and deleting jobs alone."""
    deleting = job("d", {"phase": "Succeeded"})
    deleting["metadata"]["deletionTimestamp"] = "2026-11-26T10:00:00Z"
    edited = job("edited", {"phase": "Succeeded", "observedGeneration": 1})  # its label removed with
    edited["metadata"]["generation"] = 2  # an edit: left to Kopf, which sees it, and `report` labels it
    pages = [
        [job("old", {"phase": "Succeeded", "rayJobName": "old"}), job("live", {"phase": "Running"})],
        [deleting, job("bad", {"phase": "Failed", "reason": "BackoffLimitExceeded"}), edited],
    ]
    kube = Kube(pages)
    mirror.label_finished_jobs(kube, OperatorConfig(), logging.getLogger("test"))  # type: ignore[arg-type]
    page = str(mirror.RESYNC_PAGE)
    assert kube.calls == [
        ("list-page", "llmtrainingjobs", f"!{FINISHED_LABEL}", page, "0"),
        ("patch", "rayjobs", "old"),
        ("patch", "llmtrainingjobs", "old"),
        ("list-page", "llmtrainingjobs", f"!{FINISHED_LABEL}", page, "1"),
        ("patch", "llmtrainingjobs", "bad"),
    ]


def test_start_up_labels_a_page_several_patches_at_a_time_and_pages_in_turn() -> None:
    """One patch after the other, 5,000 kept jobs took minutes after an upgrade, and Kopf served
    no job meanwhile: the patches of a page run `LABEL_CONCURRENCY` at a time, never more, each
    job's RayJob still labelled before the job, and a page done before the next is listed."""
    import threading
    import time

    class Slow(Kube):
        def __init__(self, pages: list[list[dict[str, Any]]]) -> None:
            super().__init__(pages)
            self.lock = threading.Lock()
            self.in_flight = self.most = 0
            self.order: list[tuple[str, str]] = []

        def list_pages(self, *args: Any, **kw: Any) -> Iterator[list[dict[str, Any]]]:
            for items in super().list_pages(*args, **kw):
                with self.lock:
                    assert self.in_flight == 0, "the next page listed while the last one's patches ran"
                    self.order.append(("list", ""))
                yield items

        def merge_patch(self, res: Any, namespace: str, name: str, body: dict[str, Any], **kw: Any) -> dict:
            with self.lock:
                self.in_flight += 1
                self.most = max(self.most, self.in_flight)
                self.order.append((res.plural, name))
            time.sleep(0.02)
            with self.lock:
                self.in_flight -= 1
            return {}

    pages = [
        [job(f"j{p}-{i}", {"phase": "Succeeded", "rayJobName": f"j{p}-{i}"}) for i in range(24)]
        for p in range(2)
    ]
    kube = Slow(pages)
    mirror.label_finished_jobs(kube, OperatorConfig(), logging.getLogger("test"))  # type: ignore[arg-type]
    assert kube.most == mirror.LABEL_CONCURRENCY > 1
    patched = [name for plural, name in kube.order if plural == "llmtrainingjobs"]
    assert sorted(patched) == sorted(j["metadata"]["name"] for page in pages for j in page)
    for name in patched:
        assert kube.order.index(("rayjobs", name)) < kube.order.index(("llmtrainingjobs", name))
    assert kube.order.index(("list", "")) == 0 and [k for k, _ in kube.order].count("list") == 2
    assert all(
        name.startswith("j0-") for p, name in kube.order[: kube.order.index(("list", ""), 1)] if p != "list"
    )


@pytest.mark.parametrize(("event_type", "runs"), [("ADDED", False), ("MODIFIED", False), ("DELETED", True)])
def test_kopf_runs_forget_deleted_for_a_deleted_event_only(event_type: str, runs: bool) -> None:
    """Through Kopf's own handler lookup: every other event of a job (~6 a job in a burst) would be
    a hop to a handler thread and a log line for nothing."""
    from kopf._cogs.structs.bodies import Body
    from kopf._cogs.structs.ephemera import Memo
    from kopf._cogs.structs.patches import Patch
    from kopf._cogs.structs.references import Resource
    from kopf._core.intents.causes import WatchingCause

    registry = kopf.OperatorRegistry()
    registration.register(registry)
    raw = {"type": event_type, "object": job("j", {"phase": "Running"})}
    cause = WatchingCause(
        logger=logging.getLogger("test"),
        indices={},  # type: ignore[arg-type]
        memo=Memo(),
        resource=Resource(API_GROUP, API_VERSION, PLURAL),
        patch=Patch(),
        body=Body(raw["object"]),
        type=event_type,  # type: ignore[arg-type]
        event=raw,  # type: ignore[arg-type]
    )
    found = [h.fn for h in registry._watching.get_handlers(cause)]
    assert (registration.forget_deleted in found) is runs
