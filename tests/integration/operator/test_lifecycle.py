"""Scenarios 3-7: suspend, restart, injected API errors, invalid spec, trainer-owned progress."""

from __future__ import annotations

import copy

from llmtrain.api.crd import crd
from llmtrain.api.validation import parse_job
from llmtrain.render import render

from tests.integration.operator.conftest import (
    JOB,
    NS,
    RAYJOB,
    conditions_of,
    events_for,
    eventually,
    phase_of,
    running_operator,
    set_rayjob_status,
    stored_job,
    stored_rayjob,
    tiny_job,
)
from tests.support.apiserver.server import ApiServer

CHILD_KINDS = [
    ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("v1", "PersistentVolumeClaim"),
    ("v1", "ConfigMap"),
    RAYJOB,
]


def _counts(apiserver: ApiServer) -> dict[str, int]:
    return {kind: len(apiserver.stored_items(v, kind, NS)) for v, kind in CHILD_KINDS}


async def test_suspend_toggle_reaches_the_rayjob_and_back(apiserver: ApiServer, operator: object) -> None:
    await apiserver.create(tiny_job("toggle"))
    await eventually(lambda: stored_rayjob(apiserver, "toggle"), what="the RayJob")
    await apiserver.patch(
        *JOB, NS, "toggle", {"spec": {"runPolicy": {"suspend": True, "activeDeadlineSeconds": 900}}}
    )
    await eventually(
        lambda: stored_rayjob(apiserver, "toggle")["spec"]["suspend"] is True, what="RayJob suspended"
    )
    assert stored_rayjob(apiserver, "toggle")["spec"]["activeDeadlineSeconds"] == 900  # type: ignore[index]
    await set_rayjob_status(apiserver, "toggle", {"jobDeploymentStatus": "Suspended"})
    await eventually(lambda: phase_of(apiserver, "toggle") == "Suspended", what="phase Suspended")
    await apiserver.patch(*JOB, NS, "toggle", {"spec": {"runPolicy": {"suspend": False}}})
    await eventually(
        lambda: stored_rayjob(apiserver, "toggle")["spec"]["suspend"] is False, what="RayJob resumed"
    )
    # Same RayJob, same run: the trainer resumes from its checkpoints.
    assert stored_rayjob(apiserver, "toggle")["metadata"]["name"] == "toggle"  # type: ignore[index]
    assert stored_job(apiserver, "toggle")["status"]["observedGeneration"] == 3  # type: ignore[index]


async def test_restart_midway_adopts_without_duplicates(apiserver: ApiServer) -> None:
    # First run: RayJob creation keeps failing, so only the first children exist when it stops.
    apiserver.faults.fail("create", "rayjobs", 500, times=None)
    with running_operator():
        await apiserver.create(tiny_job("restart"))
        await eventually(lambda: apiserver.stored("v1", "ConfigMap", NS, "restart-config"), what="ConfigMap")
        assert stored_rayjob(apiserver, "restart") is None
    apiserver.faults.clear()
    before = _counts(apiserver)
    assert before["RayJob"] == 0 and before["ConfigMap"] == 1
    # Second run: resume adopts what exists and creates the rest.
    with running_operator():
        await eventually(lambda: stored_rayjob(apiserver, "restart"), what="the RayJob after restart")
        await eventually(lambda: phase_of(apiserver, "restart") == "Pending", what="status converges")
    assert _counts(apiserver) == dict.fromkeys(before, 1)
    # Third run over a converged object: nothing is written to the children again.
    names = {
        (o["apiVersion"], o["kind"]): o["metadata"]["name"] for o in render(parse_job(tiny_job("restart")))
    }

    def versions() -> dict[tuple[str, str], str]:
        return {
            key: apiserver.stored(*key, NS, name)["metadata"]["resourceVersion"]
            for key, name in names.items()
        }  # type: ignore[index]

    before_third = versions()
    with running_operator():
        await apiserver.create(tiny_job("canary"))  # proves this operator instance is live
        await eventually(lambda: stored_rayjob(apiserver, "canary"), what="canary RayJob")
    assert versions() == before_third


async def test_injected_500_429_409_on_rayjob_create_are_retried(
    apiserver: ApiServer, operator: object
) -> None:
    apiserver.faults.fail("create", "rayjobs", 500, times=1)
    apiserver.faults.fail("create", "rayjobs", 429, times=1, retry_after=1)
    apiserver.faults.fail("create", "rayjobs", 409, times=1)
    await apiserver.create(tiny_job("retry"))
    await eventually(lambda: stored_rayjob(apiserver, "retry"), timeout=30, what="the RayJob despite faults")
    await eventually(lambda: phase_of(apiserver, "retry") == "Pending", what="status converges")
    assert len(apiserver.stored_items(*RAYJOB, NS)) == 1
    assert conditions_of(apiserver, "retry")["Created"]["status"] == "True"


async def test_invalid_spec_creates_nothing(apiserver: ApiServer) -> None:
    # A cluster whose CRD lacks the CEL rules lets a contradictory spec through.
    permissive = copy.deepcopy(crd())
    _strip_rules(permissive["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    await apiserver.install_crd(permissive)
    bad = tiny_job("contradiction", strategy={"type": "fsdp", "deepspeed": {"zeroStage": 3}})
    with running_operator():
        await apiserver.create(bad)
        await eventually(lambda: phase_of(apiserver, "contradiction") == "Failed", what="phase Failed")
        warning = await eventually(
            lambda: [
                e
                for e in events_for(apiserver, "contradiction")
                if e["type"] == "Warning" and e["reason"] == "InvalidSpec"
            ],
            what="InvalidSpec warning",
        )
    assert "strategy.deepspeed" in warning[0]["message"]
    cond = conditions_of(apiserver, "contradiction")["InvalidSpec"]
    assert cond["status"] == "True" and "strategy.deepspeed" in cond["message"]
    assert all(n == 0 for n in _counts(apiserver).values())


def _strip_rules(schema: dict) -> None:
    schema.pop("x-kubernetes-validations", None)
    for sub in schema.get("properties", {}).values():
        _strip_rules(sub)
    if "items" in schema:
        _strip_rules(schema["items"])


async def test_trainer_progress_survives_operator_status_writes(
    apiserver: ApiServer, operator: object
) -> None:
    await apiserver.create(tiny_job("progress"))
    await eventually(lambda: stored_rayjob(apiserver, "progress"), what="the RayJob")
    progress = {
        "step": 40,
        "totalSteps": 120,
        "summary": "40/120",
        "loss": 2.5,
        "updatedAt": "2026-11-23T10:00:00Z",
    }
    await apiserver.patch_status(*JOB, NS, "progress", {"status": {"progress": progress}})
    for deployment in ("Initializing", "Running"):
        await set_rayjob_status(apiserver, "progress", {"jobDeploymentStatus": deployment})
        await eventually(
            lambda d=deployment: (
                phase_of(apiserver, "progress") == {"Initializing": "Initializing", "Running": "Running"}[d]
            )
        )
    await apiserver.patch(*JOB, NS, "progress", {"spec": {"runPolicy": {"ttlSecondsAfterFinished": 5}}})
    await eventually(lambda: stored_rayjob(apiserver, "progress")["spec"]["ttlSecondsAfterFinished"] == 5)
    await eventually(lambda: stored_job(apiserver, "progress")["status"]["observedGeneration"] == 2)
    assert stored_job(apiserver, "progress")["status"]["progress"] == progress  # type: ignore[index]


async def test_existing_orphan_children_are_adopted_and_resynced(
    apiserver: ApiServer, operator: object
) -> None:
    doc = tiny_job("adopt")
    stale = {o["kind"]: o for o in render(parse_job(doc))}
    for kind in ("ServiceAccount", "ConfigMap", "Role", "RoleBinding"):
        orphan = copy.deepcopy(stale[kind])
        orphan["metadata"].pop("ownerReferences", None)
        orphan["metadata"]["labels"] = {"left": "behind"}
        if kind == "ConfigMap":
            orphan["data"] = {"trainer-config.json": "{}"}
        if kind == "Role":
            orphan["rules"] = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]
        await apiserver.create(orphan)
    created = await apiserver.create(doc)
    await eventually(lambda: stored_rayjob(apiserver, "adopt"), what="the RayJob")
    for kind, want in stale.items():
        if kind in ("RayJob", "PersistentVolumeClaim"):
            continue
        got = apiserver.stored(want["apiVersion"], kind, NS, want["metadata"]["name"])
        assert got is not None
        assert [r["uid"] for r in got["metadata"]["ownerReferences"]] == [created["metadata"]["uid"]], kind
        assert got["metadata"]["labels"]["left"] == "behind"  # adoption does not strip foreign labels
        assert got["metadata"]["labels"]["llmtrain.dev/job"] == "adopt"
        for field in ("data", "rules", "subjects"):
            if field in want:
                assert got[field] == want[field], (kind, field)
        assert len(apiserver.stored_items(want["apiVersion"], kind, NS)) == 1


async def test_child_owned_by_another_controller_fails_clearly(
    apiserver: ApiServer, operator: object
) -> None:
    doc = tiny_job("taken")
    configmap = next(o for o in render(parse_job(doc)) if o["kind"] == "ConfigMap")
    other = await apiserver.create(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "someone", "namespace": NS}}
    )
    configmap["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": "someone",
            "uid": other["metadata"]["uid"],
            "controller": True,
        }
    ]
    await apiserver.create(configmap)
    await apiserver.create(doc)
    await eventually(lambda: phase_of(apiserver, "taken") == "Failed", what="phase Failed")
    failed = conditions_of(apiserver, "taken")["Failed"]
    assert failed["reason"] == "ChildConflict" and "taken-config" in failed["message"]
    assert stored_rayjob(apiserver, "taken") is None


async def test_failure_message_carries_the_trainers_root_cause(
    apiserver: ApiServer, operator: object
) -> None:
    await apiserver.create(tiny_job("oom"))
    await eventually(lambda: stored_rayjob(apiserver, "oom"), what="the RayJob")
    error = "OutOfMemoryError on rank 3: CUDA out of memory. Tried to allocate 2.00 GiB"
    await apiserver.patch_status(*JOB, NS, "oom", {"status": {"progress": {"step": 7, "error": error}}})
    await set_rayjob_status(
        apiserver, "oom", {"jobDeploymentStatus": "Failed", "reason": "AppFailed", "message": "exit code 1"}
    )
    await eventually(lambda: phase_of(apiserver, "oom") == "Failed", what="Failed")
    status = stored_job(apiserver, "oom")["status"]  # type: ignore[index]
    assert status["message"] == f"the training application failed: exit code 1; trainer reported: {error}"
    assert conditions_of(apiserver, "oom")["Failed"]["message"] == status["message"]
    assert status["progress"] == {"step": 7, "error": error}
