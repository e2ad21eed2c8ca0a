"""Upgrades as GitOps tools run them: the CRD first, the operator after. The live CRD is changed the
way a newer release would change it, and jobs the running operator already handles keep running.

- A new defaulted field (`spec.elasticity`, unknown to this operator) appears in every stored job
  once the CRD declares it: the API server applies schema defaults on read. The operator ignores
  fields it does not declare, so no running job turns Failed/InvalidSpec.
- A second served version (`v1beta1`, same schema, no conversion webhook: `strategy: None`) made
  the storage version: the operator, pinned to `v1alpha1`, still reads jobs written before
  and jobs written through `v1beta1`, across a restart. This is step 1-2 of the README's version
  plan.

Each test puts the CRD back as the chart installed it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.cluster.cluster import Cluster
from tests.support.cluster.steps import (
    OperatorProcess,
    apply_doc,
    cpu_job,
    delete_jobs,
    get,
    job_status,
    wait_for,
    wait_phase,
)

CRD = "llmtrainingjobs.llmtrain.dev"
NEW_FIELD = {
    "type": "object",
    "default": {},
    "description": "A later release's section (here: only to be defaulted into stored jobs).",
    "properties": {"mode": {"type": "string", "default": "none"}},
}


def _crd(cluster: Cluster) -> dict[str, Any]:
    found = get(cluster, "crd", CRD)
    assert found is not None
    return found


def _set_versions(cluster: Cluster, versions: list[dict[str, Any]]) -> None:
    """Change the CRD's versions and wait until the API server's discovery serves them; then
    refresh kubectl's discovery cache (`api-resources` rereads it), or a later `kubectl get llmtj`
    in this session would still ask for a version no longer served."""
    patch = [{"op": "replace", "path": "/spec/versions", "value": versions}]
    # On stdin: the versions carry the whole schema, past the kernel's limit on one argument (128 KiB).
    cluster.kubectl("patch", "crd", CRD, "--type=json", "--patch-file=/dev/stdin", input=json.dumps(patch))
    served = sorted(v["name"] for v in versions if v.get("served"))

    def discovered() -> bool:
        group = json.loads(cluster.kubectl("get", "--raw", "/apis/llmtrain.dev").stdout)
        return sorted(v["version"] for v in group["versions"]) == served

    wait_for(discovered, what=f"{CRD} served at {served}")
    cluster.kubectl("api-resources", "--api-group=llmtrain.dev")


@pytest.fixture
def original_crd(cluster: Cluster, platform: str) -> Iterator[dict[str, Any]]:
    original = _crd(cluster)
    yield original
    _set_versions(cluster, original["spec"]["versions"])


def _kopf_handled(cluster: Cluster, namespace: str, name: str, text: str) -> bool:
    """Kopf's diff base (status.kopf.lastHandled) holds `text`: the handler for that spec ran."""
    return text in json.dumps((job_status(cluster, namespace, name).get("kopf") or {}).get("lastHandled"))


def _never_invalid(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    status = job_status(cluster, namespace, name)
    conditions = {c["type"]: c for c in status.get("conditions") or []}
    assert status.get("phase") != "Failed" and "InvalidSpec" not in conditions, status
    return status


@pytest.mark.usefixtures("jobs_deleted_first")
def test_a_defaulted_field_added_to_the_crd_leaves_running_jobs_untouched(
    cluster: Cluster, operator: OperatorProcess, namespace: str, original_crd: dict[str, Any]
) -> None:
    apply_doc(cluster, cpu_job("running", namespace))
    apply_doc(cluster, cpu_job("waiting", namespace, suspend=True))
    wait_phase(cluster, namespace, "running", "Running", timeout=120)
    wait_phase(cluster, namespace, "waiting", "Suspended")

    newer = copy.deepcopy(original_crd["spec"]["versions"])
    newer[0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["elasticity"] = NEW_FIELD
    _set_versions(cluster, newer)
    # The next event of each job carries the default (the trainer's progress patches do this soon in
    # a real run; here a label does it at once).
    wait_for(
        lambda: (
            cluster.kubectl("label", "llmtj", "--all", "-n", namespace, "touched=yes", "--overwrite")
            and (get(cluster, "llmtj", "running", namespace) or {})["spec"].get("elasticity")
        ),
        what="the API server defaulting the new field",
    )
    for name in ("running", "waiting"):
        wait_for(lambda n=name: _kopf_handled(cluster, namespace, n, "elasticity"), what=f"{name} handled")
        _never_invalid(cluster, namespace, name)
    assert job_status(cluster, namespace, "running")["phase"] == "Running"
    assert job_status(cluster, namespace, "waiting")["phase"] == "Suspended"

    # A job that sets the field, and an edit that sets it on a handled job.
    apply_doc(cluster, cpu_job("new", namespace, suspend=True, elasticity={"mode": "none"}))
    wait_phase(cluster, namespace, "new", "Suspended")
    patch = {"spec": {"elasticity": {"mode": "later"}}}
    cluster.kubectl("patch", "llmtj", "waiting", "-n", namespace, "--type=merge", "-p", json.dumps(patch))
    wait_for(lambda: _kopf_handled(cluster, namespace, "waiting", "later"), what="the edit handled")
    for name in ("running", "waiting", "new"):
        _never_invalid(cluster, namespace, name)


def _release_storage(cluster: Cluster, namespace: str, versions: list[dict[str, Any]]) -> None:
    """Back to the chart's CRD from one that stored at v1beta1: no object left stored there, storage
    at v1alpha1, storedVersions trimmed (the API server refuses to drop a version still listed)."""
    delete_jobs(cluster, namespace)
    _set_versions(cluster, versions)
    status = {"status": {"storedVersions": ["v1alpha1"]}}
    cluster.kubectl("patch", "crd", CRD, "--subresource=status", "--type=merge", "-p", json.dumps(status))


@pytest.mark.usefixtures("jobs_deleted_first")
def test_a_v1alpha1_job_is_still_read_after_the_crd_serves_and_stores_v1beta1(
    cluster: Cluster, operator: OperatorProcess, namespace: str, original_crd: dict[str, Any]
) -> None:
    apply_doc(cluster, cpu_job("before", namespace, suspend=True))
    wait_phase(cluster, namespace, "before", "Suspended")

    (alpha,) = original_crd["spec"]["versions"]
    beta = {**copy.deepcopy(alpha), "name": "v1beta1", "served": True, "storage": True}
    both = [{**copy.deepcopy(alpha), "storage": False}, beta]
    try:
        _set_versions(cluster, both)
        crd = _crd(cluster)
        assert crd["spec"].get("conversion", {"strategy": "None"})["strategy"] == "None"
        operator.restart()  # the upgraded operator, still speaking v1alpha1

        # Written before (stored as v1alpha1), edited through v1beta1: the operator acts on it.
        resume = {"spec": {"runPolicy": {"suspend": False}}}
        cluster.kubectl(
            "patch",
            "llmtrainingjobs.v1beta1.llmtrain.dev",
            "before",
            "-n",
            namespace,
            "--type=merge",
            "-p",
            json.dumps(resume),
        )
        wait_for(
            lambda: (
                (get(cluster, "rayjob", "before", namespace) or {}).get("spec", {}).get("suspend") is False
            ),
            what="the resumed job's RayJob unsuspended",
        )
        # Written through v1beta1 (stored as v1beta1), read by the operator as v1alpha1.
        newer = cpu_job("after", namespace, suspend=True)
        newer["apiVersion"] = "llmtrain.dev/v1beta1"
        apply_doc(cluster, newer)
        status = wait_phase(cluster, namespace, "after", "Suspended")
        assert status.get("rayJobName") == "after"
        for name in ("before", "after"):
            _never_invalid(cluster, namespace, name)
        assert crd["status"]["storedVersions"] == ["v1alpha1", "v1beta1"]
    finally:
        _release_storage(
            cluster, namespace, [{**copy.deepcopy(alpha), "storage": True}, {**beta, "storage": False}]
        )
