"""Scenario 2: the RayJob's status walk and failure paths mirrored into the LLMTrainingJob."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.operator.conftest import (
    conditions_of,
    events_for,
    eventually,
    phase_of,
    set_rayjob_status,
    stored_job,
    stored_rayjob,
    tiny_job,
)
from tests.support.apiserver.server import ApiServer


async def _started(apiserver: ApiServer, name: str) -> None:
    await apiserver.create(tiny_job(name))
    await eventually(lambda: stored_rayjob(apiserver, name), what="the RayJob")


async def test_walk_initializing_running_complete(apiserver: ApiServer, operator: object) -> None:
    await _started(apiserver, "walk")
    await set_rayjob_status(
        apiserver,
        "walk",
        {
            "jobDeploymentStatus": "Initializing",
            "startTime": "2026-11-23T10:00:00Z",
            "rayClusterName": "walk-x7k2p",
        },
    )
    await eventually(lambda: phase_of(apiserver, "walk") == "Initializing", what="Initializing")
    await set_rayjob_status(
        apiserver,
        "walk",
        {
            "jobDeploymentStatus": "Running",
            "jobStatus": "RUNNING",
            "dashboardURL": "walk-x7k2p-head-svc.default.svc.cluster.local:8265",
        },
    )
    await eventually(lambda: phase_of(apiserver, "walk") == "Running", what="Running")
    running_since = conditions_of(apiserver, "walk")["Running"]["lastTransitionTime"]
    await set_rayjob_status(
        apiserver,
        "walk",
        {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED", "endTime": "2026-11-23T11:00:00Z"},
    )
    await eventually(lambda: phase_of(apiserver, "walk") == "Succeeded", what="Succeeded")
    status = stored_job(apiserver, "walk")["status"]  # type: ignore[index]
    assert status["rayJobName"] == "walk"
    assert status["rayClusterName"] == "walk-x7k2p"
    assert status["dashboardURL"].endswith(":8265")
    assert status["startTime"] == "2026-11-23T10:00:00Z"
    assert status["completionTime"] == "2026-11-23T11:00:00Z"
    assert status["observedGeneration"] == 1
    conds = conditions_of(apiserver, "walk")
    assert conds["Succeeded"]["status"] == "True" and conds["Succeeded"]["reason"] == "Completed"
    assert conds["Running"]["status"] == "False"
    assert conds["Running"]["lastTransitionTime"] >= running_since
    assert conds["Failed"]["status"] == "False"
    reasons = await eventually(
        lambda: (
            {e["reason"] for e in events_for(apiserver, "walk")}
            >= {"RayClusterStarting", "Training", "Completed"}
            and {e["reason"] for e in events_for(apiserver, "walk")}
        ),
        what="transition events",
    )
    assert "Created" in reasons


@pytest.mark.parametrize(
    ("rayjob_status", "reason"),
    [
        (
            {
                "jobDeploymentStatus": "Failed",
                "reason": "AppFailed",
                "jobStatus": "FAILED",
                "message": "exit 1",
            },
            "AppFailed",
        ),
        ({"jobDeploymentStatus": "ValidationFailed", "reason": "ValidationFailed"}, "ValidationFailed"),
        (
            {"jobDeploymentStatus": "Failed", "reason": "DeadlineExceeded", "jobStatus": "RUNNING"},
            "DeadlineExceeded",
        ),
    ],
    ids=["app-failed", "validation-failed", "deadline-exceeded"],
)
async def test_failure_paths(
    apiserver: ApiServer, operator: object, rayjob_status: dict, reason: str
) -> None:
    await _started(apiserver, "broken")
    await set_rayjob_status(apiserver, "broken", rayjob_status)
    await eventually(lambda: phase_of(apiserver, "broken") == "Failed", what="Failed")
    conds = conditions_of(apiserver, "broken")
    assert conds["Failed"]["status"] == "True" and conds["Failed"]["reason"] == reason
    warnings = await eventually(
        lambda: [
            e for e in events_for(apiserver, "broken") if e["type"] == "Warning" and e["reason"] == reason
        ],
        what="a Warning event",
    )
    assert warnings


async def test_retrying_counts_retries(apiserver: ApiServer, operator: object) -> None:
    await _started(apiserver, "flaky")
    await set_rayjob_status(apiserver, "flaky", {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"})
    await eventually(lambda: phase_of(apiserver, "flaky") == "Running", what="Running")
    await set_rayjob_status(apiserver, "flaky", {"jobDeploymentStatus": "Retrying", "failed": 1})
    await eventually(
        lambda: conditions_of(apiserver, "flaky")["Running"]["status"] == "False", what="retrying"
    )
    status = stored_job(apiserver, "flaky")["status"]  # type: ignore[index]
    assert status["phase"] == "Initializing" and status["retries"] == 1
    assert "resumes from the latest checkpoint" in status["message"]
    await set_rayjob_status(apiserver, "flaky", {"jobDeploymentStatus": "Running", "failed": 1})
    await eventually(lambda: phase_of(apiserver, "flaky") == "Running", what="Running again")


async def test_suspended_rayjob_suspends_the_job(apiserver: ApiServer, operator: object) -> None:
    await _started(apiserver, "paused")
    await set_rayjob_status(apiserver, "paused", {"jobDeploymentStatus": "Suspended"})
    await eventually(lambda: phase_of(apiserver, "paused") == "Suspended", what="Suspended")
    assert conditions_of(apiserver, "paused")["Suspended"]["status"] == "True"


async def test_a_status_mirrored_before_the_first_status_write_is_not_overwritten(
    apiserver: ApiServer, operator: object
) -> None:
    """KubeRay may move the RayJob on before the reconciler writes the job's first status; the
    mirrored (newer) state must win over the state of the RayJob as the reconciler created it."""
    apiserver.faults.delay("patch", "llmtrainingjobs/status", 3, times=1)  # the reconciler's write
    await _started(apiserver, "race")
    await set_rayjob_status(apiserver, "race", {"jobDeploymentStatus": "Initializing"})
    await eventually(lambda: phase_of(apiserver, "race") == "Initializing", what="the mirrored phase")

    await asyncio.sleep(4)  # the delayed first write has been answered (409) and retried

    assert phase_of(apiserver, "race") == "Initializing"
    assert [e["reason"] for e in events_for(apiserver, "race")].count("Created") <= 1
