"""`status.operator_status`: the one function that computes the operator's part of a job's status,
for every outcome a handler reports; and `reporting.report`, the one writer, posting its Event."""

from __future__ import annotations

from typing import Any

import pytest
from llmtrain.operator import reporting
from llmtrain.operator.status import (
    Announcement,
    Failure,
    Refused,
    Report,
    Step,
    operator_status,
)

NOW = "2026-11-26T10:00:00Z"
BEFORE = "2026-11-26T09:00:00Z"


def _job(status: dict[str, Any] | None = None, generation: int = 2) -> dict[str, Any]:
    meta = {"name": "j", "namespace": "n", "uid": "u", "generation": generation, "resourceVersion": "7"}
    return {"metadata": meta, "status": status or {}}


def _rayjob(status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "j", "namespace": "n"}, "status": status or {}}


def _condition(ctype: str, status: str, reason: str, message: str = "", time: str = NOW) -> dict[str, Any]:
    return {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": time,
        "observedGeneration": 2,
    }


INVALID = [
    _condition("InvalidSpec", "True", "InvalidSpec", "invalid spec: x", BEFORE),
    _condition("Failed", "True", "InvalidSpec", "invalid spec: x", BEFORE),
]


def test_an_invalid_spec_fails_the_job_with_both_conditions() -> None:
    said = operator_status(_job(), None, Failure("InvalidSpec", "invalid spec: x"), NOW)
    assert said == Report(
        {
            "phase": "Failed",
            "message": "invalid spec: x",
            "observedGeneration": 2,
            "conditions": [
                _condition("InvalidSpec", "True", "InvalidSpec", "invalid spec: x"),
                _condition("Failed", "True", "InvalidSpec", "invalid spec: x"),
            ],
        },
        Announcement("Warning", "InvalidSpec", "invalid spec: x"),
        "write",
    )


def test_another_failure_names_its_reason_and_claims_no_invalid_spec() -> None:
    said = operator_status(_job(), None, Failure("ChildConflict", "ConfigMap/c is another job's"), NOW)
    assert said.update["conditions"] == [
        _condition("Failed", "True", "ChildConflict", "ConfigMap/c is another job's")
    ]
    assert (said.update["phase"], said.update["message"]) == ("Failed", "ConfigMap/c is another job's")
    assert said.event == Announcement("Warning", "ChildConflict", "ConfigMap/c is another job's")


def test_a_refusal_keeps_the_phase_and_warns_once_per_cause() -> None:
    refused = Refused("HTTP 403 Forbidden: exceeded quota", 20.0)
    message = (
        "cannot create the job's objects yet (retrying every 20 s or sooner): "
        "HTTP 403 Forbidden: exceeded quota"
    )
    first = operator_status(_job(), None, refused, NOW)
    assert first == Report(
        {"phase": "Pending", "message": message, "observedGeneration": 2},
        Announcement("Warning", "CreateRefused", message),
        "write",
    )
    again = operator_status(_job({"phase": "Initializing", "message": message}), None, refused, NOW)
    assert again.update["phase"] == "Initializing" and again.announce == "phase"


def test_a_finished_job_only_acknowledges_an_edit() -> None:
    said = operator_status(_job({"phase": "Succeeded"}, generation=5), None, Step.KEPT, NOW)
    assert said == Report({"observedGeneration": 5})


def test_the_first_status_clears_a_fixed_spec_and_mirrors_the_new_rayjob() -> None:
    said = operator_status(_job({"phase": "Failed", "conditions": INVALID}), _rayjob(), Step.CREATED, NOW)
    update = said.update
    assert (update["phase"], update["message"], update["rayJobName"]) == (
        "Pending",
        "RayJob created; waiting for KubeRay",
        "j",
    )
    by_type = {c["type"]: c for c in update["conditions"]}
    assert by_type["InvalidSpec"] == _condition("InvalidSpec", "False", "SpecValid")
    assert by_type["Failed"] == _condition("Failed", "False", "NotFailed", "", NOW)
    assert by_type["Created"]["status"] == "True"
    assert said.event == Announcement("Normal", "Created", "created RayJob j and its objects")
    assert said.announce == "write"


def test_a_synced_job_names_its_rayjob_and_leaves_the_phase_to_the_mirror() -> None:
    said = operator_status(_job({"phase": "Running", "conditions": INVALID}), _rayjob(), Step.SYNCED, NOW)
    assert set(said.update) == {"observedGeneration", "rayJobName", "conditions"}
    assert said.update["rayJobName"] == "j" and said.event is None
    assert next(c for c in said.update["conditions"] if c["type"] == "InvalidSpec")["status"] == "False"


def test_a_recreated_rayjob_is_always_announced() -> None:
    said = operator_status(_job({"phase": "Running", "rayJobName": "j"}), _rayjob(), Step.RECREATED, NOW)
    assert said.update["phase"] == "Initializing" and said.update["message"].startswith("starting a new Ray")
    assert said.event == Announcement(
        "Warning",
        "RayJobRecreated",
        "RayJob j was deleted while the job was Running; created it again: training resumes from the "
        "latest checkpoint",
    )
    assert said.announce == "always"


def test_a_mirrored_transition_is_its_event() -> None:
    failed = _rayjob({"jobDeploymentStatus": "Failed", "reason": "AppFailed", "message": "exit 1"})
    said = operator_status(
        _job({"phase": "Running", "progress": {"error": "OOM on rank 1"}}), failed, Step.MIRRORED, NOW
    )
    message = "the training application failed: exit 1; trainer reported: OOM on rank 1"
    assert (said.update["phase"], said.update["message"]) == ("Failed", message)
    assert said.event == Announcement("Warning", "AppFailed", f"phase Running → Failed: {message}")
    assert said.announce == "phase"
    running = operator_status(_job(), _rayjob({"jobDeploymentStatus": "Running"}), Step.MIRRORED, NOW)
    assert running.event == Announcement("Normal", "Training", "phase None → Running: training")


def test_an_invalid_job_mirrors_nothing() -> None:
    said = operator_status(_job({"phase": "Failed", "conditions": INVALID}), _rayjob(), Step.MIRRORED, NOW)
    assert said == Report({})


@pytest.mark.parametrize("outcome", [Step.MIRRORED, Step.CREATED, Step.RECREATED, Step.SYNCED])
def test_outcomes_about_the_rayjob_need_it(outcome: Any) -> None:
    with pytest.raises(ValueError, match="needs the job's RayJob"):
        operator_status(_job(), None, outcome, NOW)


class _Kube:
    """Records status patches (not the finished label, a patch of the job itself) and Events."""

    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []
        self.events: list[str] = []

    def merge_patch(
        self, resource: object, namespace: str, name: str, body: dict[str, Any], subresource: Any = None
    ) -> dict:
        if subresource == "status":
            self.patches.append(body)
        return {}

    def create(self, body: dict[str, Any]) -> dict:
        self.events.append(body["reason"])
        return body


@pytest.mark.parametrize(
    ("status", "outcome", "patched", "events"),
    [
        # A phase change is written and announced; the same status again is neither.
        ({}, Step.MIRRORED, True, ["Training"]),
        ({"phase": "Running"}, Step.SYNCED, True, []),
        # A recreated RayJob is said even when the status already reads so.
        (None, Step.RECREATED, False, ["RayJobRecreated"]),
        # A failure is announced when written, not on every retry that changes nothing.
        (None, Failure("CreateFailed", "boom"), False, []),
    ],
)
def test_the_writer_writes_changes_and_posts_what_the_report_asks(
    status: dict[str, Any] | None, outcome: Any, patched: bool, events: list[str]
) -> None:
    rayjob = _rayjob({"jobDeploymentStatus": "Running"})
    job = _job(status)
    if status is None:  # the status the outcome gives, already written
        job = _job(operator_status(_job({"phase": "Running"}), rayjob, outcome, NOW).update)
    kube = _Kube()
    reporting.report(kube, job, rayjob, outcome)  # type: ignore[arg-type]
    assert (bool(kube.patches), kube.events) == (patched, events)
    if isinstance(outcome, Failure):
        kube = _Kube()
        reporting.report(kube, _job({"phase": "Running"}), None, outcome)  # type: ignore[arg-type]
        assert kube.events == ["CreateFailed"]


def test_the_first_write_is_conditional_on_the_version_read() -> None:
    kube = _Kube()
    reporting.report(kube, _job(), _rayjob(), Step.CREATED, precondition=True)  # type: ignore[arg-type]
    assert kube.patches[0]["metadata"] == {"resourceVersion": "7"}


def test_another_failure_renames_only_the_failed_condition() -> None:
    """The other conditions keep their own reasons (Running stays NotRunning)."""
    before = [_condition("Running", "False", "NotRunning", time=BEFORE)]
    said = operator_status(_job({"conditions": before}), None, Failure("ChildConflict", "m"), NOW)
    by_type = {c["type"]: c for c in said.update["conditions"]}
    assert by_type["Running"] == before[0]
    assert by_type["Failed"]["reason"] == "ChildConflict" and "InvalidSpec" not in by_type


@pytest.mark.parametrize("outcome", [Step.SYNCED, Step.CREATED, Step.RECREATED, Step.MIRRORED])
def test_the_conditions_an_outcome_writes_carry_its_generation_and_time(outcome: Step) -> None:
    invalid = outcome in (Step.SYNCED, Step.CREATED)
    job = _job({"phase": "Running", "conditions": INVALID if invalid else []}, generation=3)
    said = operator_status(job, _rayjob({"jobDeploymentStatus": "Running"}), outcome, NOW)
    written = said.update["conditions"]
    if outcome is Step.SYNCED:  # only InvalidSpec is the sync's to write
        written = [c for c in written if c["type"] == "InvalidSpec"]
    assert written and all(c["observedGeneration"] == 3 and c["lastTransitionTime"] == NOW for c in written)
