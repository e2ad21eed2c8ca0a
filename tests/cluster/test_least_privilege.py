"""Least privilege, judged from the API server's side: in one job's life (create, run, suspend,
orphaned and applied again: its claim adopted, the rest made anew once the user deleted the earlier
job's leftovers, managed labels patched back, the namespace's reporter rights put back after an
edit by hand; and one that cannot start) a fresh operator process
makes only the calls it declares, needs every call it declares, and never uses a right it holds
only for an admission plugin (`delete`).

The audit log records every request of the platform's ServiceAccounts; the session's operator is
stopped meanwhile, so the requests after the mark are this process's alone.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from llmtrain.api.validation import parse_job
from llmtrain.constants import API_GROUP, JOB_UID_LABEL, REPORTER_NAME
from llmtrain.operator.permissions import OPERATOR_PERMISSIONS
from llmtrain.render import render
from llmtrain.render.rbac import render_reporter_rbac

from tests.support.cluster import audit
from tests.support.cluster.cluster import Cluster
from tests.support.cluster.kueue import kueue_queue_objects
from tests.support.cluster.steps import (
    OperatorProcess,
    apply_doc,
    assert_only_declared_calls,
    cpu_job,
    get,
    job_status,
    start_operator,
    wait_for,
    wait_phase,
)
from tests.support.jobs import with_path

# Declared for clusters and Kopf versions that post Events through events.k8s.io; Kopf 1.45 posts
# them through core/v1.
NOT_CALLED_HERE = {("events.k8s.io", "events", "create")}


@pytest.mark.usefixtures("jobs_deleted_first")
def test_one_jobs_life_uses_every_declared_call_and_nothing_else(
    cluster: Cluster, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    queue = kueue_queue_objects(
        cluster_queue=f"cq-{namespace}"[:63],
        local_queue="lp-queue",
        namespace=namespace,
        flavor=f"flavor-{namespace}"[:63],
        gpus=0,
        cpus="20",
        memory="100Gi",
    )
    operator.stop()
    mark = audit.size(cluster.audit_log)
    fresh = start_operator(cluster, tmp_path, "least-privilege")
    try:
        doc = cpu_job("lp", namespace)
        apply_doc(cluster, doc)
        wait_phase(cluster, namespace, "lp", "Running")
        suspended = cpu_job("lp", namespace, suspend=True)
        apply_doc(cluster, suspended)  # the RayJob's suspend is patched
        wait_phase(cluster, namespace, "lp", "Suspended")
        cluster.kubectl("delete", "llmtj", "lp", "-n", namespace, "--cascade=orphan", "--wait=true")
        wait_for(
            lambda: (
                not (get(cluster, "configmap", "lp-config", namespace) or {})["metadata"].get(
                    "ownerReferences"
                )
            ),
            what="the children orphaned",
        )
        apply_doc(cluster, suspended)  # a new job: it reads every child and names what it cannot reuse
        wait_for(
            lambda: (
                (s := job_status(cluster, namespace, "lp")) and "earlier LLMTrainingJob" in s["message"] and s
            ),
            what="the earlier job's leftovers named",
        )
        command = job_status(cluster, namespace, "lp")["message"].split(
            "Delete them and this job starts: ", 1
        )[1]
        cluster.kubectl(*shlex.split(command)[1:], "--wait=true")  # the user deletes, never the operator
        job = wait_for(lambda: get(cluster, "llmtj", "lp", namespace), what="the job")
        uid = job["metadata"]["uid"]

        def owned(kind: str, name: str) -> bool:
            child = get(cluster, kind, name, namespace) or {}
            return [r["uid"] for r in child["metadata"]["ownerReferences"]] == [uid]

        wait_for(lambda: owned("rayjob", "lp"), what="the job's own RayJob")
        wait_for(
            lambda: owned("pvc", "lp-storage"), what="the claim adopted (get, then its owner patched in)"
        )
        wait_phase(cluster, namespace, "lp", "Suspended")
        # Children without the job's uid label (made before children carried it) get it back at
        # the next reconcile: a patch of each kind.
        unlabelled = [(o["kind"].lower(), o["metadata"]["name"]) for o in render(parse_job(job))]
        for kind, name in unlabelled:
            cluster.kubectl("label", kind, name, "-n", namespace, f"{JOB_UID_LABEL}-")
        apply_doc(cluster, with_path(suspended, "spec.runPolicy.ttlSecondsAfterFinished", 60))
        wait_for(
            lambda: all(
                (get(cluster, kind, name, namespace) or {})["metadata"]["labels"].get(JOB_UID_LABEL) == uid
                for kind, name in unlabelled
            ),
            what="the uid label patched back on every child",
        )
        # The namespace's reporter Role and RoleBinding, edited by hand: read again at the next
        # resync pass and put back (a patch of each).
        rbac = "rbac.authorization.k8s.io"
        hand = {
            "role": {"rules": [{"apiGroups": [API_GROUP], "resources": ["*"], "verbs": ["patch"]}]},
            "rolebinding": {"subjects": [{"kind": "User", "apiGroup": rbac, "name": "someone"}]},
        }
        for kind, patch in hand.items():
            cluster.kubectl(
                "patch", kind, REPORTER_NAME, "-n", namespace, "--type=merge", "-p", json.dumps(patch)
            )
        want_role, want_binding = render_reporter_rbac(namespace)
        wait_for(
            lambda: (
                (get(cluster, "role", REPORTER_NAME, namespace) or {}).get("rules") == want_role["rules"]
                and (get(cluster, "rolebinding", REPORTER_NAME, namespace) or {}).get("subjects")
                == want_binding["subjects"]
            ),
            what="the reporter Role and RoleBinding put back",
        )
        # A queued job that its user suspends: its Kueue Workload is found and deactivated.
        cluster.apply(queue)
        queued = cpu_job("lpq", namespace)
        queued["spec"]["runPolicy"]["queueName"] = "lp-queue"
        apply_doc(cluster, queued)
        wait_phase(cluster, namespace, "lpq", "Running")
        queued["spec"]["runPolicy"]["suspend"] = True
        apply_doc(cluster, queued)
        wait_phase(cluster, namespace, "lpq", "Suspended")
        # A job whose pods no node takes: its pods, Warning Events and the nodes are read to name
        # the cause, and at its start-up deadline its RayJob is stopped (patched, never deleted).
        blocked = cpu_job("lpb", namespace)
        blocked["spec"]["resources"]["nodeSelector"] = {"llmtrain.dev/no-such-pool": "none"}
        blocked["spec"]["runPolicy"]["startupDeadlineSeconds"] = 30
        apply_doc(cluster, blocked)
        wait_phase(cluster, namespace, "lpb", "Failed", timeout=120)
        wait_for(lambda: get(cluster, "rayjob", "lpb", namespace)["spec"].get("suspend"), what="stopped")
    finally:
        fresh.stop()
        operator.start()
        cluster.kubectl(
            "delete",
            "--ignore-not-found",
            "--wait=false",
            *(f"{o['kind']}/{o['metadata']['name']}" for o in queue[:2]),
        )

    made = assert_only_declared_calls(cluster, since=mark)
    used = {c.permission for c in made}
    declared = {(p.api_group, p.resource, verb) for p in OPERATOR_PERMISSIONS for verb in p.verbs}
    assert declared - used == NOT_CALLED_HERE, f"declared but not needed: {sorted(declared - used)}"
    assert not [c for c in made if c.verb == "delete"], "the operator never deletes: GC does"
