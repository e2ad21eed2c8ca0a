"""A CRD installed after the operator started is served without a restart (operator/settings.py:
cluster-wide, Kopf watches CRDs and re-reads discovery for a group when one of its CRDs changes).

The real API server removes and re-creates llmtrain's own CRD around a fresh operator process; the
session's operator is stopped meanwhile. KubeRay's CRD is left alone (the real KubeRay operator
runs against it), but Kopf's path is the same for any group: a CRD event, a discovery re-scan of
its group, a watch started for each newly resolved resource a handler names.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llmtrain.constants import API_GROUP, PLURAL

from tests.support.cluster import audit
from tests.support.cluster.cluster import Cluster
from tests.support.cluster.steps import (
    OPERATOR_USER,
    OperatorProcess,
    apply_doc,
    cpu_job,
    start_operator,
    wait_for,
    wait_phase,
)

CRD_NAME = f"{PLURAL}.{API_GROUP}"
UNRESOLVED = "Unresolved resources cannot be served"
CRD_WATCH = "Starting the watch-stream for customresourcedefinitions"


@pytest.mark.usefixtures("jobs_deleted_first")
def test_a_job_crd_created_after_the_operator_started_is_served_without_a_restart(
    cluster: Cluster, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    crd = json.loads(cluster.kubectl("get", "crd", CRD_NAME, "-o", "json").stdout)
    for key in ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields"):
        crd["metadata"].pop(key, None)
    crd.pop("status", None)
    operator.stop()
    fresh = None
    try:
        cluster.kubectl("delete", "crd", CRD_NAME, "--wait=true", "--timeout=120s")
        mark = audit.size(cluster.audit_log)
        fresh = start_operator(cluster, tmp_path, "crds-later", log_level="debug")
        wait_for(
            lambda: UNRESOLVED in fresh.output() and CRD_WATCH in fresh.output(),
            timeout=60,
            what="the operator started without the CRD, and watching CRDs",
        )
        # Kopf ignores the first listing of its CRD watch (it scanned discovery just before): a CRD
        # created between that scan and the listing would be missed, so it is created only once
        # the API server has answered that listing (a fixed sleep was too short on a loaded CI).
        wait_for(
            lambda: any(
                c.verb == "list" and c.resource == "customresourcedefinitions"
                for c in audit.calls(cluster.audit_log, OPERATOR_USER, mark)
            ),
            timeout=60,
            what="the operator's first listing of CRDs",
        )
        cluster.kubectl("create", "-f", "-", input=json.dumps(crd))
        cluster.wait_established(CRD_NAME, timeout=60)
        apply_doc(cluster, cpu_job("late", namespace, suspend=True))
        try:
            status = wait_phase(cluster, namespace, "late", "Suspended", timeout=60)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\noperator log:\n{fresh.output()[-6000:]}") from exc
        assert status.get("rayJobName") == "late", status
        assert fresh.proc.poll() is None, "the operator exited instead of serving the new CRD"
    finally:
        if fresh is not None:
            fresh.stop()
        if cluster.kubectl("get", "crd", CRD_NAME, check=False).returncode != 0:
            cluster.kubectl("create", "-f", "-", input=json.dumps(crd))
            cluster.wait_established(CRD_NAME, timeout=60)
        operator.start()
