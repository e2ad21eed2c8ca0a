"""The trainer's progress reporter against the real API server and RBAC authorizer, authenticated as
it is in a Ray pod: by a token of the job's own ServiceAccount. That identity may patch its own job's
status and nothing else (the namespace's reporter Role, narrowed to its own job by the chart's
reporter policy), so a compromised or confused trainer cannot touch other jobs or its spec.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any

import pytest
from llmtrain.render.names import trainer_account_name
from llmtrain_trainer.kube_progress import ApiTarget, KubernetesProgressSink
from llmtrain_trainer.metrics import MetricsRecord

from tests.support.cluster.cluster import Cluster
from tests.support.cluster.steps import (
    OperatorProcess,
    apply_doc,
    cpu_job,
    get,
    items,
    job_status,
    table,
    wait_for,
    wait_phase,
)

JOBS = "/apis/llmtrain.dev/v1alpha1/namespaces/{namespace}/llmtrainingjobs/{name}"


def trainer_token(cluster: Cluster, namespace: str, job: str) -> str:
    """A TokenRequest token of the job's ServiceAccount once the operator has created it."""
    account = trainer_account_name(job)
    wait_for(lambda: get(cluster, "serviceaccount", account, namespace), what=f"ServiceAccount {account}")
    # The namespace's reporter Role and RoleBinding may come after the account; wait until the
    # authorizer sees them too.
    user = f"system:serviceaccount:{namespace}:{account}"
    wait_for(
        lambda: (
            cluster.kubectl(
                "auth",
                "can-i",
                "patch",
                f"llmtrainingjobs.llmtrain.dev/{job}",
                "--subresource=status",
                "-n",
                namespace,
                f"--as={user}",
                check=False,
            ).stdout.strip()
            == "yes"
        ),
        what=f"{user} allowed to patch its job's status",
    )
    return cluster.token(account, namespace)


def target(cluster: Cluster, token: str) -> ApiTarget:
    return ApiTarget(cluster.server, token, str(cluster.directory / "pki" / "ca.crt"))


def send(cluster: Cluster, token: str, method: str, path: str, body: dict[str, Any] | None = None) -> int:
    """The HTTP status of one request made as the reporter makes its own (bearer token, merge patch)."""
    request = urllib.request.Request(
        cluster.server + path, data=json.dumps(body).encode() if body else None, method=method
    )
    request.add_header("Authorization", f"Bearer {token}")
    request.add_header("Content-Type", "application/merge-patch+json")
    context = ssl.create_default_context(cafile=str(cluster.directory / "pki" / "ca.crt"))
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code


def progress_patch(summary: str) -> dict[str, Any]:
    return {"status": {"progress": {"summary": summary}}}


pytestmark = pytest.mark.usefixtures("jobs_deleted_first")


def test_reporter_with_the_job_token_patches_its_own_status_shown_by_kubectl(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    apply_doc(cluster, cpu_job("tiny", namespace))
    wait_phase(cluster, namespace, "tiny", "Running")
    # The Ray pods run as the job's ServiceAccount with its token mounted: the credentials the
    # reporter finds in a pod are this identity's.
    account = trainer_account_name("tiny")
    pods = items(cluster, "pods", namespace, "llmtrain.dev/job=tiny")
    assert {p["metadata"]["labels"]["llmtrain.dev/role"] for p in pods} == {"head", "worker", "submitter"}
    # The submitter only talks to Ray's job API: it carries no Kubernetes credentials at all.
    (submitter,) = [p for p in pods if p["metadata"]["labels"]["llmtrain.dev/role"] == "submitter"]
    assert submitter["spec"]["automountServiceAccountToken"] is False
    assert not any("projected" in v for v in submitter["spec"].get("volumes", []))
    pods = [p for p in pods if p is not submitter]
    for pod in pods:
        assert pod["spec"]["serviceAccountName"] == account
        sources = [s for v in pod["spec"]["volumes"] for s in v.get("projected", {}).get("sources", [])]
        assert any("serviceAccountToken" in s for s in sources), pod["spec"]["volumes"]

    sink = KubernetesProgressSink(
        target(cluster, trainer_token(cluster, namespace, "tiny")), namespace, "tiny"
    )
    sink.emit(
        MetricsRecord(
            event="step",
            step=120,
            total_steps=1000,
            loss=1.2345,
            learning_rate=2e-5,
            tokens_per_second=5321.5,
            eta_seconds=3600,
            epoch=0,
        )
    )
    checkpoint = f"/mnt/llmtrain/runs/{namespace}/tiny/checkpoint_000001"
    sink.emit(MetricsRecord(event="checkpoint", step=200, total_steps=1000, loss=1.125, path=checkpoint))
    sink.close()
    assert sink.failures == 0 and sink.patches_sent >= 1, (sink.failures, sink.patches_sent)

    status = job_status(cluster, namespace, "tiny")
    progress = status["progress"]
    assert progress["summary"] == "200/1000" and progress["loss"] == 1.125, progress
    assert progress["lastCheckpoint"] == {"path": checkpoint, "step": 200}, progress
    assert progress["tokensPerSecond"] == 5321.5 and progress["etaSeconds"] == 3600, progress
    assert status["phase"] == "Running", status  # the operator's fields are left alone

    [row] = table(cluster.kubectl("get", "llmtj", "tiny", "-n", namespace).stdout)
    assert (row["PHASE"], row["PROGRESS"], row["LOSS"]) == ("Running", "200/1000", "1.125"), row


def test_job_token_is_refused_for_other_jobs_its_spec_and_other_namespaces(
    cluster: Cluster, operator: OperatorProcess, namespace: str, other_namespace: str
) -> None:
    for name, ns in (("mine", namespace), ("other", namespace), ("mine", other_namespace)):
        apply_doc(cluster, cpu_job(name, ns, suspend=True))
    token = trainer_token(cluster, namespace, "mine")
    mine = JOBS.format(namespace=namespace, name="mine")

    assert send(cluster, token, "PATCH", f"{mine}/status", progress_patch("1/10")) == 200
    refused = {
        "another job's status": send(
            cluster,
            token,
            "PATCH",
            JOBS.format(namespace=namespace, name="other") + "/status",
            progress_patch("1/10"),
        ),
        "its own spec": send(cluster, token, "PATCH", mine, {"spec": {"runPolicy": {"suspend": False}}}),
        "its own job, read": send(cluster, token, "GET", mine),
        "the same name in another namespace": send(
            cluster,
            token,
            "PATCH",
            JOBS.format(namespace=other_namespace, name="mine") + "/status",
            progress_patch("1/10"),
        ),
    }
    assert refused == dict.fromkeys(refused, 403), refused

    # The real reporter, pointed at another job, is refused and leaves it untouched.
    sink = KubernetesProgressSink(target(cluster, token), namespace, "other", interval=0.1, max_backoff=0.2)
    sink.emit(MetricsRecord(event="step", step=1, total_steps=10, loss=2.0))
    wait_for(lambda: sink.failures >= 1, timeout=10, what="the reporter's refused patch")
    sink.close(flush_timeout=2)
    assert sink.patches_sent == 0
    assert "progress" not in job_status(cluster, namespace, "other")
    assert "progress" not in job_status(cluster, other_namespace, "mine")
    assert job_status(cluster, namespace, "mine")["progress"] == {"summary": "1/10"}
    live = get(cluster, "llmtj", "mine", namespace)
    assert live is not None and live["spec"]["runPolicy"]["suspend"] is True


def test_token_of_a_deleted_job_does_not_work_for_a_new_job_of_the_same_name(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """The identity is the job's own (deleted with it): a token that leaked from an old run is dead."""
    apply_doc(cluster, cpu_job("rerun", namespace, suspend=True))
    old_token = trainer_token(cluster, namespace, "rerun")
    status = JOBS.format(namespace=namespace, name="rerun") + "/status"
    # RBAC sees the namespace's reporter Role and RoleBinding shortly after the operator made them.
    wait_for(
        lambda: send(cluster, old_token, "PATCH", status, progress_patch("5/10")) == 200,
        what="the job's own token allowed",
    )
    old_account = get(cluster, "serviceaccount", trainer_account_name("rerun"), namespace)
    assert old_account is not None

    cluster.kubectl("delete", "llmtj", "rerun", "-n", namespace, "--wait=true")
    wait_for(
        lambda: get(cluster, "serviceaccount", trainer_account_name("rerun"), namespace) is None,
        what="the old ServiceAccount garbage-collected with its job",
    )
    apply_doc(cluster, cpu_job("rerun", namespace, suspend=True))
    new_token = trainer_token(cluster, namespace, "rerun")
    new_account = get(cluster, "serviceaccount", trainer_account_name("rerun"), namespace)
    assert new_account is not None
    assert new_account["metadata"]["uid"] != old_account["metadata"]["uid"]

    # The API server caches a successful token review for 10 s; after that the old token is dead.
    wait_for(
        lambda: send(cluster, old_token, "PATCH", status, progress_patch("6/10")) == 401,
        timeout=30,
        interval=1,
        what="the old token refused (401)",
    )
    wait_for(
        lambda: send(cluster, new_token, "PATCH", status, progress_patch("0/10")) == 200,
        what="the new job's token allowed",
    )
    assert job_status(cluster, namespace, "rerun")["progress"] == {"summary": "0/10"}
