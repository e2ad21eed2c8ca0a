"""Least privilege, judged from the API server's side: in one job's life (create, run, suspend,
orphaned and adopted again, and one that cannot start) a fresh operator process makes only the
calls it declares, needs every call it declares, and never uses a right it holds only for an
admission plugin (`delete`).

The audit log records every request of the platform's ServiceAccounts; the session's operator is
stopped meanwhile, so the requests after the mark are this process's alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from llmtrain.operator.permissions import OPERATOR_PERMISSIONS

from tests.support.cluster import audit
from tests.support.cluster.cluster import Cluster
from tests.support.cluster.kueue import kueue_queue_objects
from tests.support.cluster.steps import (
    OperatorProcess,
    apply_doc,
    assert_only_declared_calls,
    cpu_job,
    get,
    start_operator,
    wait_for,
    wait_phase,
)

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
        apply_doc(cluster, suspended)  # adopts every child: get, then patch in the owner reference
        uid = wait_for(lambda: get(cluster, "llmtj", "lp", namespace), what="the job")["metadata"]["uid"]
        wait_for(
            lambda: (
                [r["uid"] for r in get(cluster, "rayjob", "lp", namespace)["metadata"]["ownerReferences"]]
                == [uid]
            ),
            what="the RayJob adopted",
        )
        wait_phase(cluster, namespace, "lp", "Suspended")
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
