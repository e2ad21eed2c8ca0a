"""The namespace's reporter rights on a real API server, RBAC authorizer and admission chain: the
operator (as the chart's ServiceAccount, under the containment policy) makes one reporter Role and
RoleBinding per namespace; a trainer's token then patches its own job's status and is refused on
another job of the namespace by the reporter policy (charts/llmtrain/templates/reporter-policy.yaml)
with its message; the operator and people are not held by it; a reporter Role deleted or edited by
hand is made again or put back by the operator."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any

import pytest
from llmtrain.constants import REPORTER_NAME
from llmtrain.render.names import trainer_account_name
from llmtrain.render.rbac import render_reporter_rbac

from tests.support.cluster.cluster import Cluster
from tests.support.cluster.steps import (
    RELEASE,
    RESYNC_SECONDS,
    OperatorProcess,
    apply_doc,
    cpu_job,
    get,
    job_status,
    wait_for,
)

STATUS = "/apis/llmtrain.dev/v1alpha1/namespaces/{namespace}/llmtrainingjobs/{name}/status"
POLICY = f"ValidatingAdmissionPolicy '{RELEASE}-reporter'"
LONG = "reporter-job-whose-name-is-long-enough-to-hash"  # its trainer account's name is hashed

pytestmark = pytest.mark.usefixtures("jobs_deleted_first")


def patch_status(cluster: Cluster, token: str, namespace: str, job: str, summary: str) -> tuple[int, str]:
    """The HTTP status and body of a status merge patch made as the trainer's reporter makes it."""
    request = urllib.request.Request(
        cluster.server + STATUS.format(namespace=namespace, name=job),
        data=json.dumps({"status": {"progress": {"summary": summary}}}).encode(),
        method="PATCH",
    )
    request.add_header("Authorization", f"Bearer {token}")
    request.add_header("Content-Type", "application/merge-patch+json")
    context = ssl.create_default_context(cafile=str(cluster.directory / "pki" / "ca.crt"))
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def reporter_objects(cluster: Cluster, namespace: str) -> tuple[dict[str, Any], dict[str, Any]]:
    role = wait_for(lambda: get(cluster, "role", REPORTER_NAME, namespace), what="the reporter Role")
    binding = wait_for(
        lambda: get(cluster, "rolebinding", REPORTER_NAME, namespace), what="the reporter binding"
    )
    return role, binding


def token_of(cluster: Cluster, namespace: str, job: str) -> str:
    account = trainer_account_name(job)
    wait_for(lambda: get(cluster, "serviceaccount", account, namespace), what=f"ServiceAccount {account}")
    return cluster.token(account, namespace)


def test_a_trainer_reports_its_own_job_only(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    for name in ("mine", "other", LONG):
        apply_doc(cluster, cpu_job(name, namespace, suspend=True))
    role, binding = reporter_objects(cluster, namespace)
    # Made by the operator's ServiceAccount (the containment policy admitted it), as rendered, and
    # owned by no job: it serves them all.
    want_role, want_binding = render_reporter_rbac(namespace)
    assert role["rules"] == want_role["rules"] and "ownerReferences" not in role["metadata"]
    assert binding["subjects"] == want_binding["subjects"] and binding["roleRef"] == want_binding["roleRef"]
    # No per-job Role any more.
    assert get(cluster, "role", trainer_account_name("mine"), namespace) is None

    mine, hashed = token_of(cluster, namespace, "mine"), token_of(cluster, namespace, LONG)
    wait_for(lambda: patch_status(cluster, mine, namespace, "mine", "1/10")[0] == 200, what="its own status")
    assert patch_status(cluster, hashed, namespace, LONG, "2/10")[0] == 200
    assert job_status(cluster, namespace, "mine")["progress"] == {"summary": "1/10"}
    assert job_status(cluster, namespace, LONG)["progress"] == {"summary": "2/10"}

    for token, account in ((mine, "mine-trainer"), (hashed, trainer_account_name(LONG))):
        code, body = patch_status(cluster, token, namespace, "other", "9/10")
        assert code == 403, (code, body)
        message = json.loads(body)["message"]
        assert POLICY in message, message
        assert (
            f"llmtrain reporter: ServiceAccount {account} may report the status of its own "
            f"LLMTrainingJob only (the job it is the trainer account of), not of {namespace}/other"
        ) in message, message
    # The namespace's other accounts hold the Role too (the group); the policy refuses them all.
    default = cluster.token("default", namespace)
    assert patch_status(cluster, default, namespace, "mine", "9/10")[0] == 403
    assert "progress" not in job_status(cluster, namespace, "other")
    # People are not held by it (RBAC decides: the admin may).
    cluster.kubectl(
        "patch", "llmtj", "other", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"progress": {"summary": "by hand"}}}),
    )  # fmt: skip
    assert job_status(cluster, namespace, "other")["progress"] == {"summary": "by hand"}
    # The operator's own status writes go on (the suspended jobs were reported as such).
    assert job_status(cluster, namespace, "other").get("phase"), job_status(cluster, namespace, "other")


def test_the_operator_makes_the_reporter_rights_again(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """Level-triggered: deleted by hand, made again by the resync pass; its rules edited by hand,
    put back."""
    apply_doc(cluster, cpu_job("mine", namespace, suspend=True))
    role, _ = reporter_objects(cluster, namespace)
    wait_for(lambda: job_status(cluster, namespace, "mine").get("rayJobName"), what="the job's RayJob")
    cluster.kubectl("delete", "role,rolebinding", REPORTER_NAME, "-n", namespace)
    again, _ = reporter_objects(cluster, namespace)  # wait_for: within a resync period or two
    assert again["metadata"]["uid"] != role["metadata"]["uid"]
    wide = [
        {"apiGroups": ["llmtrain.dev"], "resources": ["llmtrainingjobs/status"], "verbs": ["patch", "update"]}
    ]
    cluster.kubectl(
        "patch", "role", REPORTER_NAME, "-n", namespace, "--type=merge", "-p", json.dumps({"rules": wide})
    )
    wait_for(
        lambda: (
            (get(cluster, "role", REPORTER_NAME, namespace) or {}).get("rules")
            == render_reporter_rbac(namespace)[0]["rules"]
        ),
        timeout=3 * RESYNC_SECONDS + 30,
        what="the reporter Role's rules put back",
    )
    token = token_of(cluster, namespace, "mine")
    wait_for(lambda: patch_status(cluster, token, namespace, "mine", "3/10")[0] == 200, what="its own status")
