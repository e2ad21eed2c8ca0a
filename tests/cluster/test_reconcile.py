"""The operator's own decisions against the real API server: what it creates (content and owner
references), what it refuses to create (specs only it can judge), what it will and will not take
over under a child's name, which Events it posts, and which status fields it leaves to others
(the trainer's progress, its root cause on failure).
"""

from __future__ import annotations

import copy
import json
import shlex
import time
import urllib.request
from typing import Any

import pytest
from llmtrain.api.validation import parse_job
from llmtrain.render import render

from tests.support.cluster import audit
from tests.support.cluster.cluster import Cluster
from tests.support.cluster.steps import (
    HOLD_FINALIZER,
    OPERATOR_USER,
    RESYNC_SECONDS,
    OperatorProcess,
    apply_doc,
    clear_outcome,
    cpu_job,
    end_ray_job,
    finish_job,
    get,
    items,
    job_status,
    patch_status,
    wait_for,
    wait_phase,
)
from tests.support.jobs import with_path
from tests.unit.test_bad_specs import BAD

pytestmark = pytest.mark.usefixtures("jobs_deleted_first")

# What the operator makes for a job (the namespace's reporter Role and RoleBinding are no job's).
CHILD_KINDS = {
    "ServiceAccount": "serviceaccount",
    "PersistentVolumeClaim": "persistentvolumeclaim",
    "ConfigMap": "configmap",
    "RayJob": "rayjob.ray.io",
}


def _conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status.get("conditions") or []}


def _events(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    return [
        e
        for e in items(cluster, "events", namespace)
        if e["involvedObject"]["kind"] == "LLMTrainingJob" and e["involvedObject"]["name"] == name
    ]


def _children(cluster: Cluster, namespace: str, doc: dict[str, Any]) -> dict[str, dict[str, Any] | None]:
    """Each rendered child of `doc` as stored now (None when absent), by kind."""
    return {
        obj["kind"]: get(cluster, CHILD_KINDS[obj["kind"]], obj["metadata"]["name"], namespace)
        for obj in render(parse_job(doc))
    }


def _as_stored(want: object, got: object) -> object:
    """The API server adds defaults (e.g. a PVC's volumeMode): compare what was rendered."""
    if isinstance(want, dict) and isinstance(got, dict):
        return {k: _as_stored(v, got.get(k)) for k, v in want.items()} | {
            k: v for k, v in got.items() if k not in want
        }
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        return [_as_stored(w, g) for w, g in zip(want, got, strict=True)]
    return want


def test_every_child_is_created_as_rendered_with_a_controller_reference(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    apply_doc(cluster, cpu_job("tiny", namespace, suspend=True))
    status = wait_phase(cluster, namespace, "tiny", "Suspended", "Pending")
    created = get(cluster, "llmtj", "tiny", namespace)
    assert created is not None
    uid = created["metadata"]["uid"]
    children = _children(cluster, namespace, created)
    for want in render(parse_job(created)):
        got = children[want["kind"]]
        assert got is not None, want["kind"]
        (owner,) = got["metadata"]["ownerReferences"]
        assert owner["uid"] == uid and owner["controller"] is True and owner["blockOwnerDeletion"] is True
        assert owner["kind"] == "LLMTrainingJob"
        for field in ("spec", "data", "rules", "subjects", "roleRef"):
            if field in want:
                assert got[field] == _as_stored(want[field], got[field]), (want["kind"], field)
    # The trainer's config is immutable: the real API server refuses to change it, so neither an
    # operator upgrade nor anyone else rewrites the config of a job in flight.
    refused = cluster.kubectl(
        "patch",
        "configmap",
        "tiny-config",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"data":{"x":"y"}}',
        check=False,
    )
    assert refused.returncode != 0 and "immutable" in refused.stderr, refused.stderr
    created_condition = _conditions(status)["Created"]
    assert created_condition["status"] == "True" and created_condition["observedGeneration"] == 1


def test_a_new_jobs_children_are_created_unread_and_after_a_restart_read_never_recreated(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """A job's first try creates each child once, with no read before (its children cannot exist
    yet: a GET per child would only answer 404). Resumed after a restart, the same job's children
    exist: they are read, and nothing is created, so no create is refused with 409 (or, in a
    namespace at its quota, with 403) and no quota is charged for one."""
    mark = audit.size(cluster.audit_log)
    apply_doc(cluster, cpu_job("fresh", namespace, suspend=True))
    wait_phase(cluster, namespace, "fresh", "Suspended", "Pending")
    doc = get(cluster, "llmtj", "fresh", namespace) or {}
    children = {
        (CHILD_KINDS[o["kind"]].split(".")[0] + "s", o["metadata"]["name"]) for o in render(parse_job(doc))
    }

    def on_children(since: int) -> list[audit.Call]:
        return [
            c
            for c in audit.calls(cluster.audit_log, OPERATOR_USER, since)
            if c.namespace == namespace and (c.resource, c.name) in children
        ]

    first = on_children(mark)
    creates = sorted(c.resource for c in first if c.verb == "create")
    assert creates == sorted(r for r, _ in children), first
    assert all(c.code == 201 for c in first if c.verb == "create"), first
    assert not [c for c in first if c.verb == "get"], first

    mark = audit.size(cluster.audit_log)
    operator.restart()
    _wait_live(operator)

    def all_read() -> list[audit.Call] | None:
        calls = on_children(mark)
        return calls if {c.resource for c in calls if c.verb == "get"} == {r for r, _ in children} else None

    reads = wait_for(all_read, what="the resumed job's children read")
    time.sleep(2)
    assert not [c for c in on_children(mark) if c.verb == "create"], reads


def test_only_transitions_and_errors_become_events(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """Kopf posts its info log lines as Events ("Logging") unless told not to; only ours appear."""
    apply_doc(cluster, cpu_job("quiet", namespace, suspend=True))
    wait_phase(cluster, namespace, "quiet", "Suspended")
    # The first phase is announced by whichever writes it first: the reconciler ("Created") or
    # the mirror of the RayJob's events ("RayJobCreated", "Suspended"...).
    wait_for(lambda: _events(cluster, namespace, "quiet"), what="the first transition's Event")
    time.sleep(2)  # Kopf posts Events from a background queue
    reasons = [e["reason"] for e in _events(cluster, namespace, "quiet")]
    assert "Logging" not in reasons, reasons


# ---- what it refuses to create ------------------------------------------------------------------
OPERATOR_ONLY = [b for b in BAD if not b[3]]


def test_specs_only_the_operator_can_judge_fail_the_job_and_create_nothing(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """The API server stores these (the inline model config is opaque to the CRD); the operator
    must refuse each before creating anything, naming the field on the job and in a Warning."""
    assert OPERATOR_ONLY
    names = []
    for case, doc, _field, _ in OPERATOR_ONLY:
        doc = copy.deepcopy(doc)
        doc["metadata"].update(name=case, namespace=namespace)
        apply_doc(cluster, doc)  # accepted: the real API server cannot see the problem
        names.append(case)
    for (case, _doc, field, _), name in zip(OPERATOR_ONLY, names, strict=True):
        status = wait_phase(cluster, namespace, name, "Failed", "Pending", "Initializing", "Suspended")
        assert status["phase"] == "Failed", (case, status)
        invalid = _conditions(status)["InvalidSpec"]
        assert invalid["status"] == "True" and field in invalid["message"], (case, invalid)
        assert field in status["message"], (case, status["message"])
        warnings = wait_for(
            lambda n=name: [
                e
                for e in _events(cluster, namespace, n)
                if e["type"] == "Warning" and e["reason"] == "InvalidSpec"
            ],
            what=f"the InvalidSpec Warning of {name}",
        )
        assert field in warnings[0]["message"], warnings
        for resource in CHILD_KINDS.values():
            assert not items(cluster, resource, namespace, f"llmtrain.dev/job={name}"), (case, resource)
        assert get(cluster, "rayjob", name, namespace) is None, case


# ---- what it takes over -------------------------------------------------------------------------
def test_a_job_applied_again_after_an_orphaning_delete_trains_its_new_spec_never_the_old_childrens(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """`kubectl delete --cascade=orphan` leaves the children of a finished job (our labels, its uid,
    no owner). The job applied again with a changed spec is a new job (a new uid): it must neither
    adopt the old config, run id, identity and finished RayJob (it would read Succeeded without
    training, or train the old config) nor delete them itself (the operator never deletes). It says
    which are left and the command that removes them; once they are gone it trains the new spec,
    on the old claim (the data orphaning keeps), with children stamped with its own uid."""
    doc = cpu_job("again", namespace)
    apply_doc(cluster, doc)
    finish_job(cluster, namespace, "again")
    first_uid = (get(cluster, "llmtj", "again", namespace) or {})["metadata"]["uid"]
    claim_uid = (get(cluster, "pvc", "again-storage", namespace) or {})["metadata"]["uid"]
    cluster.kubectl("delete", "llmtj", "again", "-n", namespace, "--cascade=orphan", "--wait=true")
    wait_for(
        lambda: all(
            c is not None and not c["metadata"].get("ownerReferences")
            for c in _children(cluster, namespace, doc).values()
        ),
        timeout=120,
        what="the children orphaned by the garbage collector",
    )
    apply_doc(cluster, with_path(doc, "spec.training.learningRate", 0.0007))
    job = wait_for(lambda: get(cluster, "llmtj", "again", namespace), what="the job again")
    uid = job["metadata"]["uid"]
    assert uid != first_uid
    waiting = wait_for(
        lambda: (
            (s := job_status(cluster, namespace, "again")) and "earlier LLMTrainingJob" in s["message"] and s
        ),
        what="the job naming what the earlier job left",
    )
    assert waiting["phase"] == "Pending", waiting
    for kind in ("ServiceAccount", "ConfigMap", "RayJob"):
        assert f"{kind}/again" in waiting["message"], (kind, waiting["message"])
    assert "PersistentVolumeClaim" not in waiting["message"]
    time.sleep(3)  # nothing of the earlier job's is taken over meanwhile
    for kind, child in _children(cluster, namespace, doc).items():
        assert child is not None and not child["metadata"].get("ownerReferences"), kind
    assert job_status(cluster, namespace, "again")["phase"] == "Pending"

    command = waiting["message"].split("Delete them and this job starts: ", 1)[1]
    assert command.startswith("kubectl delete "), command
    cluster.kubectl(*shlex.split(command)[1:], "--wait=true")
    running = wait_phase(cluster, namespace, "again", "Running", "Succeeded", timeout=120)
    assert running["phase"] == "Running", running
    children = _children(cluster, namespace, job)
    for kind, child in children.items():
        assert child is not None, kind
        assert [r["uid"] for r in child["metadata"]["ownerReferences"]] == [uid], kind
        assert child["metadata"]["labels"]["llmtrain.dev/job-uid"] == uid, kind
    assert children["PersistentVolumeClaim"]["metadata"]["uid"] == claim_uid  # type: ignore[index]
    config = json.loads(children["ConfigMap"]["data"]["trainer-config.json"])  # type: ignore[index]
    assert config["training"]["learningRate"] == 0.0007 and config["runName"] == uid, config
    for kind in CHILD_KINDS:
        assert len(items(cluster, CHILD_KINDS[kind], namespace, "llmtrain.dev/job=again")) == 1, kind


def test_a_retained_claim_outlives_its_job_and_a_namesake_mounts_it_again(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """`storage.create.reclaim: Retain`, the default: the claim the job created has no owner, so
    the garbage collector deletes every other child with the job and leaves the claim (the model
    on it). The job applied again under its name mounts that same claim, relabelled with the new
    uid and still without an owner; its run goes to a directory of its own (the new uid). A claim
    this job owns, as operators before `reclaim` made every created claim, loses that owner at
    the next reconcile: the spec says Retain."""
    doc = cpu_job("keep", namespace, reclaim="Retain")
    apply_doc(cluster, with_path(doc, "spec.runPolicy.suspend", True))
    job = wait_for(lambda: get(cluster, "llmtj", "keep", namespace), what="the job")
    first_uid = job["metadata"]["uid"]
    claim = wait_for(lambda: get(cluster, "pvc", "keep-storage", namespace), what="the claim")
    assert not claim["metadata"].get("ownerReferences"), claim["metadata"]
    assert claim["metadata"]["labels"]["llmtrain.dev/job-uid"] == first_uid
    owner = {
        "apiVersion": job["apiVersion"],
        "kind": job["kind"],
        "name": "keep",
        "uid": first_uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    cluster.kubectl(
        "patch",
        "pvc",
        "keep-storage",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"metadata": {"ownerReferences": [owner]}}),
    )
    apply_doc(cluster, doc)  # resumed: a reconcile
    wait_for(
        lambda: not (get(cluster, "pvc", "keep-storage", namespace) or {})["metadata"].get("ownerReferences"),
        what="the owner of a claim the spec retains dropped",
    )
    finish_job(cluster, namespace, "keep")
    assert claim["metadata"]["labels"]["llmtrain.dev/job-uid"] == first_uid
    cluster.kubectl("delete", "llmtj", "keep", "-n", namespace, "--wait=true")
    wait_for(
        lambda: all(
            get(cluster, CHILD_KINDS[kind], obj["metadata"]["name"], namespace) is None
            for obj in render(parse_job(doc))
            if (kind := obj["kind"]) != "PersistentVolumeClaim"
        ),
        timeout=120,
        what="every other child garbage-collected",
    )
    kept = get(cluster, "pvc", "keep-storage", namespace) or {}
    assert kept["metadata"]["uid"] == claim["metadata"]["uid"], "the claim went with its job"
    assert not kept["metadata"].get("deletionTimestamp"), kept["metadata"]

    apply_doc(cluster, doc)
    wait_phase(cluster, namespace, "keep", "Running", timeout=120)
    uid = (get(cluster, "llmtj", "keep", namespace) or {})["metadata"]["uid"]
    assert uid != first_uid
    reused = wait_for(
        lambda: (
            (c := get(cluster, "pvc", "keep-storage", namespace))
            and c["metadata"]["labels"]["llmtrain.dev/job-uid"] == uid
            and c
        ),
        what="the claim relabelled with the new job's uid",
    )
    assert reused["metadata"]["uid"] == claim["metadata"]["uid"]
    assert not reused["metadata"].get("ownerReferences"), reused["metadata"]
    config = json.loads(
        (get(cluster, "configmap", "keep-config", namespace) or {})["data"]["trainer-config.json"]
    )
    assert config["runName"] == uid, config


def _earlier_pod(name: str, job: str, uid: str) -> dict[str, Any]:
    """A pod as an earlier job of this name left it: its labels, a restricted-compliant spec, on
    no node (nothing schedules it) and held by a finalizer once deleted."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"llmtrain.dev/job": job, "llmtrain.dev/job-uid": uid},
            "finalizers": [HOLD_FINALIZER],
        },
        "spec": {
            "nodeSelector": {"llmtrain.dev/nowhere": "true"},
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "ray-worker",
                    "image": "example.invalid/trainer:1",
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }


def test_a_namesakes_pods_hold_the_new_ray_cluster_back_until_they_are_gone(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """Ray pods of an earlier job of this name that are still there (terminating within their
    grace period, or orphaned) would hand a new pod the earlier job's immutable config from the
    kubelet's cache (seen with real pods) and share the checkpoints with a trainer still running.
    The new job creates its other children, says which pods it waits for (and, for ones nobody
    deletes, the command), creates no RayJob while any is there, and starts once they are gone."""
    pod = "hold-worker-old"
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(_earlier_pod(pod, "hold", "0ld")))
    try:
        apply_doc(cluster, cpu_job("hold", namespace))
        orphaned = wait_for(
            lambda: (s := job_status(cluster, namespace, "hold")) and pod in s.get("message", "") and s,
            what="the job naming the earlier job's pod",
        )
        assert orphaned["phase"] == "Pending", orphaned
        assert "uid 0ld" in orphaned["message"] and "not being deleted" in orphaned["message"], orphaned
        command = orphaned["message"].split("(orphaned): ", 1)[1]
        assert command.startswith("kubectl delete pods "), command
        assert get(cluster, "configmap", "hold-config", namespace) is not None
        cluster.kubectl(*shlex.split(command)[1:], "--wait=false")
        terminating = wait_for(
            lambda: (
                (s := job_status(cluster, namespace, "hold"))
                and pod in s["message"]
                and "not being deleted" not in s["message"]
                and s
            ),
            what="the job waiting for the terminating pod",
        )
        assert terminating["phase"] == "Pending", terminating
        time.sleep(3)
        assert get(cluster, "rayjob", "hold", namespace) is None
    finally:
        cluster.kubectl(
            "patch",
            "pod",
            pod,
            "-n",
            namespace,
            "--type=json",
            "-p",
            '[{"op": "remove", "path": "/metadata/finalizers"}]',
            check=False,
        )
        cluster.kubectl("delete", "pod", pod, "-n", namespace, "--ignore-not-found", "--wait=false")
    rayjob = wait_for(lambda: get(cluster, "rayjob", "hold", namespace), timeout=60, what="the RayJob")
    uid = (get(cluster, "llmtj", "hold", namespace) or {})["metadata"]["uid"]
    assert [r["uid"] for r in rayjob["metadata"]["ownerReferences"]] == [uid]
    worker = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["metadata"]["labels"]
    assert worker["llmtrain.dev/job-uid"] == uid, worker


@pytest.mark.parametrize("holder", ["hand-made", "another-controller"])
def test_an_object_we_did_not_create_is_never_taken_over(
    cluster: Cluster, operator: OperatorProcess, namespace: str, holder: str
) -> None:
    """A user's own PVC under the child's name (no marks), or a ConfigMap another controller owns:
    the job fails with the conflict named, the object gets no owner reference and outlives the job
    (an owner reference would have let the garbage collector delete the user's data with it)."""
    name = f"taken-{holder.split('-')[0]}"
    doc = cpu_job(name, namespace, suspend=True)
    if holder == "hand-made":
        kind, resource, taken = "PersistentVolumeClaim", "pvc", f"{name}-storage"
        cluster.apply(
            [
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {"name": taken, "namespace": namespace},
                    "spec": {
                        "accessModes": ["ReadWriteMany"],
                        "storageClassName": "shared-rwx",
                        "resources": {"requests": {"storage": "1Gi"}},
                    },
                }
            ]
        )
    else:
        kind, resource, taken = "ConfigMap", "configmap", f"{name}-config"
        cluster.apply(
            [
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": "someone", "namespace": namespace},
                }
            ]
        )
        other = get(cluster, "configmap", "someone", namespace) or {}
        configmap = next(o for o in render(parse_job(doc)) if o["kind"] == "ConfigMap")
        configmap["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "name": "someone",
                "uid": other["metadata"]["uid"],
                "controller": True,
            }
        ]
        cluster.apply([configmap])
    before = get(cluster, resource, taken, namespace) or {}
    apply_doc(cluster, doc)
    status = wait_phase(cluster, namespace, name, "Failed", "Suspended", "Pending")
    failed = _conditions(status).get("Failed") or {}
    assert status["phase"] == "Failed" and failed.get("reason") == "ChildConflict", status
    assert f"{kind}/{taken}" in failed["message"], failed
    assert get(cluster, "rayjob", name, namespace) is None
    after = get(cluster, resource, taken, namespace) or {}
    assert after["metadata"].get("ownerReferences") == before["metadata"].get("ownerReferences")
    assert after["metadata"].get("labels") == before["metadata"].get("labels")
    assert after.get("data") == before.get("data")

    cluster.kubectl("delete", "llmtj", name, "-n", namespace, "--wait=true")
    wait_for(lambda: get(cluster, "serviceaccount", f"{name}-trainer", namespace) is None, what="GC done")
    assert get(cluster, resource, taken, namespace) is not None


# ---- what it leaves to others -------------------------------------------------------------------
def test_the_trainers_progress_survives_the_operators_status_writes(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    apply_doc(cluster, cpu_job("progress", namespace))
    wait_phase(cluster, namespace, "progress", "Initializing", "Running")
    progress = {
        "step": 40,
        "totalSteps": 120,
        "summary": "40/120",
        "loss": 2.5,
        "updatedAt": "2026-11-23T10:00:00Z",
    }
    patch_status(cluster, namespace, "progress", {"progress": progress})
    wait_phase(cluster, namespace, "progress", "Running")
    cluster.kubectl(
        "patch",
        "llmtj",
        "progress",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"runPolicy":{"ttlSecondsAfterFinished":5}}}',
    )
    wait_for(
        lambda: (
            (get(cluster, "rayjob", "progress", namespace) or {})["spec"].get("ttlSecondsAfterFinished") == 5
        ),
        what="the RayJob's TTL changed",
    )
    status = wait_for(
        lambda: (s := job_status(cluster, namespace, "progress")).get("observedGeneration") == 2 and s,
        what="the edit observed",
    )
    assert status["progress"] == progress


def test_a_failure_message_carries_the_trainers_root_cause(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    apply_doc(cluster, with_path(cpu_job("oom", namespace), "spec.runPolicy.maxRetries", 0))
    wait_phase(cluster, namespace, "oom", "Running")
    error = "OutOfMemoryError on rank 3: CUDA out of memory. Tried to allocate 2.00 GiB"
    patch_status(cluster, namespace, "oom", {"progress": {"step": 7, "error": error}})
    try:
        end_ray_job(cluster, namespace, "oom", succeed=False, message="exit code 1")
        status = wait_phase(cluster, namespace, "oom", "Failed", "Succeeded")
    finally:
        clear_outcome(cluster, namespace)
    assert status["phase"] == "Failed", status
    assert status["message"].startswith("the training application failed"), status["message"]
    assert status["message"].endswith(f"; trainer reported: {error}"), status["message"]
    assert _conditions(status)["Failed"]["message"] == status["message"]
    assert status["progress"] == {"step": 7, "error": error}


def test_a_create_refused_by_a_full_quota_is_retried_until_the_quota_allows_it(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """A 403 from a ResourceQuota can pass without the spec changing: the job says why it waits
    (message and one Warning), keeps retrying with backoff, and starts once the quota allows it."""

    cluster.apply([_claims_quota(namespace, 0)])
    wait_for(
        lambda: (get(cluster, "resourcequota", "claims", namespace) or {}).get("status", {}).get("hard"),
        what="the quota controller has counted the namespace",
    )
    apply_doc(cluster, cpu_job("quota", namespace, suspend=True))
    waiting = wait_for(
        lambda: (
            (s := job_status(cluster, namespace, "quota")) and "exceeded quota" in s.get("message", "") and s
        ),
        what="the refusal on the job",
    )
    assert waiting["phase"] == "Pending", waiting
    assert "persistentvolumeclaims" in waiting["message"]
    assert get(cluster, "rayjob", "quota", namespace) is None
    time.sleep(12)  # at least two retries
    refused = [e for e in _events(cluster, namespace, "quota") if e["reason"] == "CreateRefused"]
    assert len(refused) == 1 and refused[0]["type"] == "Warning", refused

    cluster.apply([_claims_quota(namespace, 1)])
    status = wait_phase(cluster, namespace, "quota", "Suspended", "Failed", timeout=120)
    assert status["phase"] == "Suspended", status
    conditions = _conditions(status)
    assert conditions["Created"]["status"] == "True" and conditions["Failed"]["status"] == "False"
    assert get(cluster, "rayjob", "quota", namespace) is not None


def _claims_quota(namespace: str, claims: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "claims", "namespace": namespace},
        "spec": {"hard": {"persistentvolumeclaims": str(claims)}},
    }


def _wait_live(operator: OperatorProcess) -> None:
    """Until the (re)started operator answers its liveness probe: Kopf is up and watching."""
    port = next(a.split("=", 1)[1] for a in operator.argv if a.startswith("--liveness-port="))

    def live() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return bool(response.status == 200)

    wait_for(lambda: _ok(live), timeout=60, what="the operator's liveness probe")


def _ok(check: Any) -> bool:
    try:
        return bool(check())
    except OSError:
        return False


def test_after_a_restart_a_suspend_reaches_the_rayjob_in_a_namespace_at_its_claim_quota(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """A namespace at its ResourceQuota answers a create of a claim that already exists with 403
    "exceeded quota", before it looks at the name. An operator that creates first would, after a
    restart, report a running job as refused and never let its user's suspend through; one that
    reads first creates nothing that exists, so the edit reaches the RayJob at once and the quota's
    usage stays as it was."""
    apply_doc(cluster, cpu_job("atquota", namespace))
    wait_phase(cluster, namespace, "atquota", "Running")
    cluster.apply([_claims_quota(namespace, 1)])
    used = wait_for(
        lambda: (
            (
                (q := get(cluster, "resourcequota", "claims", namespace) or {})
                .get("status", {})
                .get("used", {})
            ).get("persistentvolumeclaims")
            == "1"
            and q["status"]["used"]
        ),
        what="the quota controller counted the job's claim",
    )
    operator.restart()
    _wait_live(operator)
    cluster.kubectl(
        "patch",
        "llmtj",
        "atquota",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"runPolicy":{"suspend":true}}}',
    )
    wait_for(
        lambda: (get(cluster, "rayjob", "atquota", namespace) or {})["spec"].get("suspend") is True,
        timeout=10,
        what="the suspend on the RayJob",
    )
    wait_phase(cluster, namespace, "atquota", "Suspended")
    assert not [e for e in _events(cluster, namespace, "atquota") if e["reason"] == "CreateRefused"]
    assert "exceeded quota" not in job_status(cluster, namespace, "atquota")["message"]
    assert (get(cluster, "resourcequota", "claims", namespace) or {})["status"]["used"] == used


# ---- level-triggered: what it does when a RayJob goes -------------------------------------------
def test_a_rayjob_deleted_under_a_running_job_is_created_again(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    apply_doc(cluster, cpu_job("gone", namespace))
    wait_phase(cluster, namespace, "gone", "Running")
    first = (get(cluster, "rayjob", "gone", namespace) or {})["metadata"]["uid"]
    job_uid = (get(cluster, "llmtj", "gone", namespace) or {})["metadata"]["uid"]
    cluster.kubectl("delete", "rayjob", "gone", "-n", namespace, "--wait=true")
    again = wait_for(
        lambda: (r := get(cluster, "rayjob", "gone", namespace)) and r["metadata"]["uid"] != first and r,
        what="a new RayJob",
    )
    assert [ref["uid"] for ref in again["metadata"]["ownerReferences"]] == [job_uid]
    recreated = wait_for(
        lambda: [e for e in _events(cluster, namespace, "gone") if e["reason"] == "RayJobRecreated"],
        what="the RayJobRecreated Warning",
    )
    assert (
        recreated[0]["type"] == "Warning" and "resumes from the latest checkpoint" in recreated[0]["message"]
    )
    status = wait_phase(cluster, namespace, "gone", "Running")
    now_running = get(cluster, "rayjob", "gone", namespace) or {}
    assert now_running["metadata"]["uid"] == again["metadata"]["uid"]
    assert status["rayClusterName"] == now_running["status"]["rayClusterName"]
    assert len(items(cluster, "rayjobs", namespace)) == 1


@pytest.mark.parametrize("succeed", [True, False], ids=["succeeded", "failed"])
def test_a_finished_job_stays_finished_when_its_rayjob_goes(
    cluster: Cluster, operator: OperatorProcess, namespace: str, succeed: bool
) -> None:
    """KubeRay may delete a finished RayJob (DELETE_RAYJOB_CR_AFTER_JOB_FINISHES), and so may a
    person: neither a resync, nor an operator restart, nor an edit starts the job again — a
    Failed job as much as a Succeeded one (its training must not run again on the GPUs)."""
    phase = "Succeeded" if succeed else "Failed"
    # No retry on a new cluster: the failure ends the job at once.
    apply_doc(cluster, with_path(cpu_job("done", namespace), "spec.runPolicy.maxRetries", 0))
    finish_job(cluster, namespace, "done", succeed=succeed, message="exit code 1")
    cluster.kubectl("delete", "rayjob", "done", "-n", namespace, "--wait=true")
    time.sleep(2 * RESYNC_SECONDS)  # two resyncs
    assert get(cluster, "rayjob", "done", namespace) is None
    operator.restart()  # resume handlers run for every unfinished job
    # An edit of a finished job is acted on only without its finished label (Kopf watches only
    # unlabelled jobs; README): a re-apply that drops the label with the edit, as GitOps may.
    cluster.kubectl(
        "patch",
        "llmtj",
        "done",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"metadata":{"labels":{"llmtrain.dev/finished":null}},'
        '"spec":{"runPolicy":{"ttlSecondsAfterFinished":60}}}',
    )
    status = wait_for(
        lambda: (s := job_status(cluster, namespace, "done")).get("observedGeneration") == 2 and s,
        what="the edit observed",
    )
    time.sleep(RESYNC_SECONDS)
    assert get(cluster, "rayjob", "done", namespace) is None
    assert status["phase"] == phase and job_status(cluster, namespace, "done")["phase"] == phase
    assert not [e for e in _events(cluster, namespace, "done") if e["reason"] == "RayJobRecreated"]


def test_rayjobs_deleted_while_the_operator_is_down_are_handled_on_purpose_at_restart(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """No DELETED event reaches a stopped operator. At restart, the running job's RayJob is created
    again with the same Warning as when the deletion is seen; the finished job stays finished."""
    apply_doc(cluster, cpu_job("finished", namespace))
    finish_job(cluster, namespace, "finished")
    apply_doc(cluster, cpu_job("unfinished", namespace))
    wait_phase(cluster, namespace, "unfinished", "Running")
    first = (get(cluster, "rayjob", "unfinished", namespace) or {})["metadata"]["uid"]
    operator.stop()
    try:
        cluster.kubectl("delete", "rayjob", "finished", "unfinished", "-n", namespace, "--wait=true")
    finally:
        operator.start()
    recreated = wait_for(
        lambda: [e for e in _events(cluster, namespace, "unfinished") if e["reason"] == "RayJobRecreated"],
        what="the RayJobRecreated Warning",
    )
    assert (
        recreated[0]["type"] == "Warning"
        and "was deleted while the job was Running" in recreated[0]["message"]
    )
    again = get(cluster, "rayjob", "unfinished", namespace) or {}
    assert again["metadata"]["uid"] != first
    assert wait_phase(cluster, namespace, "unfinished", "Running")["observedGeneration"] == 1
    time.sleep(RESYNC_SECONDS)  # a resync pass too
    assert get(cluster, "rayjob", "finished", namespace) is None
    assert job_status(cluster, namespace, "finished")["phase"] == "Succeeded"
    assert not [e for e in _events(cluster, namespace, "finished") if e["reason"] == "RayJobRecreated"]
    assert (
        len([e for e in _events(cluster, namespace, "unfinished") if e["reason"] == "RayJobRecreated"]) == 1
    )
