"""Containment of the operator's ServiceAccount (charts/llmtrain/templates/admission-policy.yaml),
judged by the real API server: requests made as that ServiceAccount (impersonated, so they stay out
of the audit record of the operator's own calls) to write what the operator never renders are
refused with the policy's message, although its RBAC allows every one of them; the children it
does render, for short and hashed names and queued jobs, are admitted; a job runs end to end; and
with the policy switched off (`containment.enabled=false`) the same requests go through.
"""

from __future__ import annotations

import copy
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from llmtrain.api.validation import parse_job
from llmtrain.constants import (
    ALLOWED_SECRETS_ANNOTATION,
    JOB_LABEL,
    KUEUE_GROUP,
    KUEUE_JOB_UID_LABEL,
    KUEUE_WORKLOAD_PLURAL,
    MANAGED_BY_LABEL,
    REPORTER_NAME,
    SUSPENDED_BY_USER_ANNOTATION,
)
from llmtrain.operator.kube import ApiError, Kube, Resource
from llmtrain.render import render
from llmtrain.render.rbac import render_reporter_rbac

from tests.support.cluster.cluster import Cluster
from tests.support.cluster.steps import (
    CHART,
    OPERATOR_USER,
    RELEASE,
    OperatorProcess,
    apply_doc,
    clear_outcome,
    cpu_job,
    end_ray_job,
    get,
    helm,
    wait_for,
    wait_phase,
)

POLICY = f"ValidatingAdmissionPolicy '{RELEASE}-operator'"
CAPABILITIES = "its pods add no capabilities, except IPC_LOCK alone on a worker container"
RBAC_ESCALATION = "is attempting to grant RBAC permissions not currently held"
# `delete` is granted on claims alone (OwnerReferencesPermissionEnforcement, for adopting one).
RBAC_NO_DELETE = 'cannot delete resource "configmaps"'
NAMESPACE = "t-containment"


def as_operator(
    cluster: Cluster, *args: str, doc: dict[str, Any] | None = None
) -> subprocess.CompletedProcess[str]:
    """kubectl as the operator's ServiceAccount: RBAC and admission judge it as that account."""
    text = yaml.safe_dump(doc) if doc is not None else None
    return cluster.kubectl(f"--as={OPERATOR_USER}", *args, input=text, check=False)


def create(
    cluster: Cluster, namespace: str, doc: dict[str, Any], *extra: str
) -> subprocess.CompletedProcess[str]:
    return as_operator(cluster, "create", "-n", namespace, "-f", "-", *extra, doc=doc)


def children(
    name: str, namespace: str, *, suspend: bool = False, queue: str | None = None
) -> dict[str, dict[str, Any]]:
    """What the operator renders for a job, by kind (no owner reference: there is no job), and the
    per-job trainer Role and RoleBinding earlier operators made (still admitted: jobs of those
    versions keep them until they go)."""
    doc = cpu_job(name, namespace, suspend=suspend)
    if queue:
        doc["spec"]["runPolicy"]["queueName"] = queue
    rendered = {obj["kind"]: obj for obj in render(parse_job(doc))}
    return {**rendered, **legacy_trainer_rbac(rendered["ServiceAccount"])}


def legacy_trainer_rbac(account: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """An earlier operator's Role (patch on its own job's status) and RoleBinding of a job's account."""
    meta, job = account["metadata"], account["metadata"]["labels"][JOB_LABEL]
    rbac = "rbac.authorization.k8s.io"
    return {
        "Role": {
            "apiVersion": f"{rbac}/v1",
            "kind": "Role",
            "metadata": copy.deepcopy(meta),
            "rules": [
                {
                    "apiGroups": ["llmtrain.dev"],
                    "resources": ["llmtrainingjobs/status"],
                    "resourceNames": [job],
                    "verbs": ["patch"],
                }
            ],
        },
        "RoleBinding": {
            "apiVersion": f"{rbac}/v1",
            "kind": "RoleBinding",
            "metadata": copy.deepcopy(meta),
            "roleRef": {"apiGroup": rbac, "kind": "Role", "name": meta["name"]},
            "subjects": [{"kind": "ServiceAccount", "name": meta["name"], "namespace": meta["namespace"]}],
        },
    }


def create_children(
    cluster: Cluster, namespace: str, name: str, *, suspend: bool = False, queue: str | None = None
) -> dict[str, dict[str, Any]]:
    rendered = children(name, namespace, suspend=suspend, queue=queue)
    for obj in rendered.values():
        result = create(cluster, namespace, obj)
        assert result.returncode == 0, f"{obj['kind']}/{obj['metadata']['name']}: {result.stderr}"
    return rendered


# ------------------------------------------------------------------------------ the refused writes


@dataclass(frozen=True)
class Attempt:
    """One write the operator never makes; `refused_by` is the policy's message, or RBAC's own
    escalation check where the API server refuses before admission runs."""

    id: str
    # (cluster, namespace, extra kubectl flags) -> the kubectl result
    run: Callable[..., subprocess.CompletedProcess[str]]
    refused_by: str

    @property
    def policy_only(self) -> bool:
        return self.refused_by not in (RBAC_ESCALATION, RBAC_NO_DELETE)


def _with(doc: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    change(out)
    return out


def _unlabelled(obj: dict[str, Any]) -> None:
    obj["metadata"].pop("labels")


def _head(rayjob: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    return pod


def _worker(rayjob: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    return pod


def _evil(kind: str, namespace: str, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """A child of a job named `evil` (labels and name as rendered), changed by `change`."""
    return _with(children("evil", namespace)[kind], change)


Run = Callable[..., subprocess.CompletedProcess[str]]


def _create(kind: str, change: Callable[[dict[str, Any]], None]) -> Run:
    return lambda cluster, ns, *extra: create(cluster, ns, _evil(kind, ns, change), *extra)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(obj: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        node = obj
        for part in parents:
            node = node[part]
        node[leaf] = value

    return change


def _role_rules(rules: list[dict[str, Any]]) -> Callable[[dict[str, Any]], None]:
    return _set("rules", rules)


def _rayjob(change: Callable[[dict[str, Any]], None]) -> Run:
    return _create("RayJob", change)


def _hostpath(rayjob: dict[str, Any]) -> None:
    _worker(rayjob)["volumes"].append({"name": "node", "hostPath": {"path": "/"}})


def _privileged(rayjob: dict[str, Any]) -> None:
    _head(rayjob)["containers"][0]["securityContext"] = {
        **_head(rayjob)["containers"][0]["securityContext"],
        "privileged": True,
    }


def _capabilities(container: dict[str, Any], *add: str) -> None:
    container["securityContext"] = {
        **container["securityContext"],
        "capabilities": {"drop": ["ALL"], "add": list(add)},
    }


def _fabric_worker(*add: str) -> Callable[[dict[str, Any]], None]:
    """The worker requests a fabric device, as the infiniband and efa profiles render it, and adds
    `add`."""

    def change(rayjob: dict[str, Any]) -> None:
        container = _worker(rayjob)["containers"][0]
        for side in ("requests", "limits"):
            container["resources"][side]["rdma/rdma_shared_device_a"] = "1"
        _capabilities(container, *add)

    return change


def _attach(rayjob: dict[str, Any]) -> None:
    del rayjob["spec"]["rayClusterSpec"]
    rayjob["spec"]["clusterSelector"] = {"ray.io/cluster": "someone-elses"}


def _foreign_account(rayjob: dict[str, Any]) -> None:
    _head(rayjob)["serviceAccountName"] = "default"
    _worker(rayjob)["serviceAccountName"] = "default"


def _secret_volume(name: str) -> Callable[[dict[str, Any]], None]:
    def change(rayjob: dict[str, Any]) -> None:
        _worker(rayjob)["volumes"].append({"name": "loot", "secret": {"secretName": name}})

    return change


def _secret_env(name: str) -> Callable[[dict[str, Any]], None]:
    def change(rayjob: dict[str, Any]) -> None:
        ref = {"secretKeyRef": {"name": name, "key": "token"}}
        _head(rayjob)["containers"][0]["env"].append({"name": "LOOT", "valueFrom": ref})

    return change


def _cluster_role(name: str) -> dict[str, str]:
    return {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name}


def _patch(resource: str, name: str, patch: dict[str, Any]) -> Run:
    """A merge patch of an existing object; "{ns}" in it stands for the namespace."""
    text = json.dumps(patch)
    return lambda cluster, ns, *extra: as_operator(
        cluster, "patch", resource, name, "-n", ns, "--type=merge", "-p", text.replace("{ns}", ns), *extra
    )


def _delete(resource: str, name: str) -> Run:
    return lambda cluster, ns, *extra: as_operator(cluster, "delete", resource, name, "-n", ns, *extra)


OPERATOR_RIGHTS = [{"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": ["create", "patch"]}]
BARE_CONFIGMAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "evil-config"}}
BARE_ROLE = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "Role",
    "metadata": {"name": "copy"},
    "rules": OPERATOR_RIGHTS,
}
LABELS = f"labelled {MANAGED_BY_LABEL}=llmtrain-operator and {JOB_LABEL}"
ATTEMPTS = [
    Attempt(
        "unlabelled-configmap",
        lambda cluster, ns, *extra: create(cluster, ns, BARE_CONFIGMAP, *extra),
        f"refused to write ConfigMap {{ns}}/evil-config: the operator writes only objects {LABELS}",
    ),
    Attempt(
        "labelled-configmap-under-a-name-not-its-jobs",
        _create("ConfigMap", _set("metadata.name", "aws-auth")),
        "refused to write ConfigMap {ns}/aws-auth: a child of job evil is named evil-config",
    ),
    Attempt(
        "patch-a-users-configmap",
        _patch("configmap", "theirs", {"data": {"key": "changed"}}),
        "refused to change ConfigMap {ns}/theirs: it is not the operator's",
    ),
    Attempt(
        "label-a-users-configmap-to-take-it-over",
        _patch("configmap", "theirs", {"metadata": {"labels": {MANAGED_BY_LABEL: "llmtrain-operator"}}}),
        "refused to change ConfigMap {ns}/theirs: it is not the operator's",
    ),
    Attempt("delete-a-users-configmap", _delete("configmap", "theirs"), RBAC_NO_DELETE),
    Attempt("delete-its-own-configmap", _delete("configmap", "mine-config"), RBAC_NO_DELETE),
    # Claims it may delete by RBAC (to adopt one under OwnerReferencesPermissionEnforcement).
    Attempt(
        "delete-its-own-claim",
        _delete("pvc", "pending-storage"),
        "refused to delete PersistentVolumeClaim {ns}/pending-storage: the operator never deletes",
    ),
    Attempt(
        "unlabelled-serviceaccount",
        _create("ServiceAccount", _unlabelled),
        f"refused to write ServiceAccount {{ns}}/evil-trainer: the operator writes only objects {LABELS}",
    ),
    Attempt(
        "pvc-bound-to-an-existing-volume",
        _create("PersistentVolumeClaim", _set("spec.volumeName", "someone-elses-volume")),
        "refused to write PersistentVolumeClaim {ns}/evil-storage: the operator never binds a claim",
    ),
    Attempt(
        "bind-its-own-claim-to-a-volume",
        _patch("pvc", "pending-storage", {"spec": {"volumeName": "someone-elses-volume"}}),
        "refused to write PersistentVolumeClaim {ns}/pending-storage: the operator never binds a claim",
    ),
    # A Role granting `*`, or a binding to cluster-admin, is beyond the operator's own rights: the
    # RBAC escalation check refuses it before admission runs. Granting the operator's own rights
    # (which RBAC allows it to) is the policy's to refuse.
    Attempt(
        "role-granting-everything",
        _create("Role", _role_rules([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}])),
        RBAC_ESCALATION,
    ),
    Attempt(
        "unlabelled-role-granting-the-operators-rights",
        lambda cluster, ns, *extra: create(cluster, ns, BARE_ROLE, *extra),
        f"refused to write Role {{ns}}/copy: the operator writes only objects {LABELS}",
    ),
    Attempt(
        "trainer-role-granting-the-operators-rights",
        _create("Role", _role_rules(OPERATOR_RIGHTS)),
        "refused to write Role {ns}/evil-trainer: the only Role the operator writes grants patch on "
        "llmtrainingjobs/status of job evil, nothing else",
    ),
    Attempt(
        "trainer-role-for-another-jobs-status",
        _create(
            "Role",
            _role_rules(
                [
                    {
                        "apiGroups": ["llmtrain.dev"],
                        "resources": ["llmtrainingjobs/status"],
                        "resourceNames": ["mine"],
                        "verbs": ["patch"],
                    }
                ]
            ),
        ),
        "refused to write Role {ns}/evil-trainer: the only Role the operator writes grants patch",
    ),
    Attempt(
        "widen-its-own-trainer-role",
        _patch("role", "mine-trainer", {"rules": OPERATOR_RIGHTS}),
        "refused to write Role {ns}/mine-trainer: the only Role the operator writes grants patch",
    ),
    # The namespace's reporter Role and RoleBinding: only as rendered.
    Attempt(
        "widen-the-reporter-role",
        _patch("role", REPORTER_NAME, {"rules": OPERATOR_RIGHTS}),
        f"refused to write Role {{ns}}/{REPORTER_NAME}: the reporter Role grants patch on "
        "llmtrainingjobs/status (of any job of the namespace), nothing else",
    ),
    Attempt(
        "bind-the-reporter-role-to-every-serviceaccount",
        _patch(
            "rolebinding",
            REPORTER_NAME,
            {
                "subjects": [
                    {
                        "kind": "Group",
                        "apiGroup": "rbac.authorization.k8s.io",
                        "name": "system:serviceaccounts",
                    }
                ]
            },
        ),
        f"refused to write RoleBinding {{ns}}/{REPORTER_NAME}: the reporter RoleBinding binds the Role "
        f"{REPORTER_NAME} to the group system:serviceaccounts:{{ns}}, nothing else",
    ),
    Attempt(
        "another-namespace-wide-role",
        lambda cluster, ns, *extra: create(
            cluster,
            ns,
            _with(render_reporter_rbac(ns)[0], _set("metadata.name", "llmtrain-reporter-2")),
            *extra,
        ),
        f"refused to write Role {{ns}}/llmtrain-reporter-2: the operator writes only objects {LABELS}",
    ),
    Attempt(
        "rolebinding-to-cluster-admin",
        _create("RoleBinding", _set("roleRef", _cluster_role("cluster-admin"))),
        RBAC_ESCALATION,
    ),
    Attempt(
        "rolebinding-to-the-operators-clusterrole",
        _create(
            "RoleBinding",
            _set("roleRef", _cluster_role(f"{RELEASE}-operator")),
        ),
        "refused to write RoleBinding {ns}/evil-trainer: the only RoleBinding the operator writes binds "
        "the Role evil-trainer to the ServiceAccount evil-trainer of namespace {ns}",
    ),
    Attempt(
        "rebind-its-trainer-role-to-another-account",
        _patch(
            "rolebinding",
            "mine-trainer",
            {"subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "{ns}"}]},
        ),
        "refused to write RoleBinding {ns}/mine-trainer: the only RoleBinding the operator writes binds",
    ),
    Attempt(
        "rayjob-without-labels",
        _rayjob(_unlabelled),
        f"refused to write RayJob {{ns}}/evil: the operator writes only objects {LABELS}",
    ),
    Attempt(
        "rayjob-running-as-another-account",
        _rayjob(_foreign_account),
        "refused to write RayJob {ns}/evil: its pods must run as job evil's trainer ServiceAccount",
    ),
    Attempt(
        "rayjob-mounting-a-host-path",
        _rayjob(_hostpath),
        "refused to write RayJob {ns}/evil: its pods may mount only the volume kinds restricted Pod "
        "Security admits",
    ),
    Attempt(
        "rayjob-with-a-privileged-container",
        _rayjob(_privileged),
        "refused to write RayJob {ns}/evil: its pods must be restricted",
    ),
    Attempt(
        "rayjob-adding-a-capability-beside-ipc-lock-to-a-fabric-worker",
        _rayjob(_fabric_worker("IPC_LOCK", "NET_RAW")),
        f"refused to write RayJob {{ns}}/evil: {CAPABILITIES}",
    ),
    Attempt(
        "rayjob-adding-ipc-lock-to-a-worker-without-a-fabric-device",
        _rayjob(lambda r: _capabilities(_worker(r)["containers"][0], "IPC_LOCK")),
        f"refused to write RayJob {{ns}}/evil: {CAPABILITIES}",
    ),
    Attempt(
        "rayjob-adding-ipc-lock-to-the-head",
        _rayjob(lambda r: _capabilities(_head(r)["containers"][0], "IPC_LOCK")),
        f"refused to write RayJob {{ns}}/evil: {CAPABILITIES}",
    ),
    # The namespace lists no Secret (no llmtrain.dev/allowed-secrets annotation).
    Attempt(
        "rayjob-mounting-a-secret-its-namespace-does-not-list",
        _rayjob(_secret_volume("argocd-cluster-credentials")),
        "refused to write RayJob {ns}/evil: its pods may reference only the Secrets that namespace {ns} "
        f"lists in its annotation {ALLOWED_SECRETS_ANNOTATION} (now: none)",
    ),
    Attempt(
        "rayjob-reading-a-secret-its-namespace-does-not-list-into-env",
        _rayjob(_secret_env("legacy-admin-token")),
        "refused to write RayJob {ns}/evil: its pods may reference only the Secrets",
    ),
    Attempt(
        "rayjob-attaching-to-an-existing-ray-cluster",
        _rayjob(_attach),
        "refused to write RayJob {ns}/evil: a RayJob of the operator brings its own Ray cluster",
    ),
]


def prepare(cluster: Cluster, namespace: str) -> None:
    """The operator's children of a (suspended) job `mine`, created as the operator, a claim of its
    that stays unbound (`pending-storage`: no such StorageClass), and a user's ConfigMap `theirs`."""
    create_children(cluster, namespace, "mine", suspend=True)
    for obj in render_reporter_rbac(namespace):
        result = create(cluster, namespace, obj)
        assert result.returncode == 0, f"{obj['kind']}: {result.stderr}"
    pending = children("pending", namespace)["PersistentVolumeClaim"]
    pending["spec"]["storageClassName"] = "never-provisioned"
    assert create(cluster, namespace, pending).returncode == 0
    cluster.kubectl("create", "configmap", "theirs", "-n", namespace, "--from-literal=key=value")


@pytest.fixture(scope="module")
def contained(cluster: Cluster, platform: str) -> Iterator[str]:
    """A namespace holding what `prepare` makes, with the chart's policy in force."""
    cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}])
    prepare(cluster, NAMESPACE)
    yield NAMESPACE
    cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


@pytest.mark.parametrize("attempt", ATTEMPTS, ids=[a.id for a in ATTEMPTS])
def test_the_operator_is_refused_what_it_never_renders(
    cluster: Cluster, contained: str, attempt: Attempt
) -> None:
    result = attempt.run(cluster, contained)
    assert result.returncode != 0, f"{attempt.id} was admitted: {result.stdout}"
    message = attempt.refused_by.replace("{ns}", contained)
    assert message in result.stderr, result.stderr
    if attempt.policy_only:
        assert POLICY in result.stderr and "llmtrain containment: " in result.stderr, result.stderr


# ---------------------------------------------------------------------- what the operator does write


def test_what_the_operator_renders_is_admitted(cluster: Cluster, contained: str) -> None:
    """Its children as rendered (`prepare` made a short-named job's), for a job whose child names
    are hashed and for a queued job; and the writes it makes on existing children: re-syncing a
    RayJob's mutable fields and a Role's rules, putting back a label."""
    hashed = "a-job-whose-name-is-long-enough-to-hash-its-kid"
    assert len(hashed) == 47
    made = create_children(cluster, contained, hashed, suspend=True)
    # The RayJob is named after the job; every other child's name is the hashed form.
    assert all(
        o["metadata"]["name"] == hashed or not o["metadata"]["name"].startswith(hashed) for o in made.values()
    )
    create_children(cluster, contained, "queued", queue="team-queue")
    # A GPU job of the infiniband profile with ipcLock: its workers add IPC_LOCK and request the
    # RDMA device.
    doc = cpu_job("fabric", contained, suspend=True)
    doc["spec"]["resources"].update(gpusPerWorker=8, cpu="4")  # half a core per GPU process
    doc["spec"]["network"] = {"ncclProfile": "infiniband", "fabric": {"ipcLock": True}}
    for obj in render(parse_job(doc)):
        result = create(cluster, contained, obj)
        assert result.returncode == 0, f"{obj['kind']}: {result.stderr}"
    role = children("mine", contained)["Role"]
    writes = [
        _patch("rayjob", "mine", {"spec": {"ttlSecondsAfterFinished": 60, "activeDeadlineSeconds": 3600}}),
        _patch("role", "mine-trainer", {"rules": role["rules"]}),
        _patch("role", REPORTER_NAME, {"rules": render_reporter_rbac(contained)[0]["rules"]}),
        _patch("rolebinding", REPORTER_NAME, {"subjects": render_reporter_rbac(contained)[1]["subjects"]}),
        _patch("configmap", "mine-config", {"metadata": {"labels": {JOB_LABEL: "mine"}}}),
        _patch("serviceaccount", "mine-trainer", {"metadata": {"labels": {JOB_LABEL: "mine"}}}),
    ]
    for write in writes:
        result = write(cluster, contained)
        assert result.returncode == 0, result.stderr


def test_the_secrets_its_namespace_lists_are_admitted_and_no_others(cluster: Cluster, contained: str) -> None:
    """The API server reads the list from the Namespace (namespaceObject): a job whose spec names a
    listed Secret gets its RayJob; an unlisted one is refused; once the list shrinks, a patch that
    leaves the pods alone (the user's suspend) still goes through."""
    listed = f"{contained}-listed"
    annotations = {ALLOWED_SECRETS_ANNOTATION: "wandb, hf-token"}
    cluster.apply(
        [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": listed, "annotations": annotations}}]
    )
    try:
        doc = cpu_job("hf", listed, suspend=True)
        doc["spec"]["model"]["hfTokenSecretRef"] = {"name": "hf-token", "key": "token"}
        rendered = {obj["kind"]: obj for obj in render(parse_job(doc))}
        for obj in rendered.values():
            result = create(cluster, listed, obj)
            assert result.returncode == 0, f"{obj['kind']}: {result.stderr}"
        other = cpu_job("hf2", listed, suspend=True)
        other["spec"]["model"]["hfTokenSecretRef"] = {"name": "hf-token-of-another-team", "key": "token"}
        unlisted = next(o for o in render(parse_job(other)) if o["kind"] == "RayJob")
        result = create(cluster, listed, unlisted)
        assert result.returncode != 0 and POLICY in result.stderr, result.stderr
        assert "(now: wandb, hf-token)" in result.stderr, result.stderr
        cluster.kubectl("annotate", "namespace", listed, f"{ALLOWED_SECRETS_ANNOTATION}-")
        wait_for(
            lambda: (
                create(cluster, listed, rendered["RayJob"], "--dry-run=server").returncode != 0
                and "(now: none)" in create(cluster, listed, rendered["RayJob"], "--dry-run=server").stderr
            ),
            what="the shrunk list in force",
        )
        result = _patch("rayjob", "hf", {"spec": {"ttlSecondsAfterFinished": 60}})(cluster, listed)
        assert result.returncode == 0, result.stderr
        env_from = [
            {
                "op": "add",
                "path": "/spec/submitterPodTemplate/spec/containers/0/envFrom",
                "value": [{"secretRef": {"name": "hf-token"}}],
            }
        ]
        result = as_operator(
            cluster, "patch", "rayjob", "hf", "-n", listed, "--type=json", "-p", json.dumps(env_from)
        )
        assert result.returncode != 0 and "may reference only the Secrets" in result.stderr, result.stderr
    finally:
        cluster.kubectl("delete", "namespace", listed, "--wait=false", check=False)


def _operator_kube(cluster: Cluster) -> Kube:
    """The operator's own client, as its ServiceAccount (impersonated): a bare PATCH, as the
    operator sends it (kubectl would GET first, which its RBAC does not allow on Workloads)."""
    from kubernetes import config as k8s_config

    api = k8s_config.new_client_from_config(str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
    api.set_default_header("Impersonate-User", OPERATOR_USER)
    return Kube(api)


def test_of_a_workload_the_operator_changes_only_spec_active(cluster: Cluster, contained: str) -> None:
    """Kueue's Workload of a queued RayJob: the operator's (de)activation is admitted, the same
    patch with any other change is refused by the policy (its RBAC allows every one of them)."""
    create_children(cluster, contained, "wl", queue="team-queue")
    rayjob = get(cluster, "rayjob", "wl", contained)
    assert rayjob is not None
    selector = f"{KUEUE_JOB_UID_LABEL}={rayjob['metadata']['uid']}"
    workloads = wait_for(
        lambda: json.loads(
            cluster.kubectl("get", "workloads", "-n", contained, "-l", selector, "-o", "json").stdout
        )["items"],
        what="Kueue's Workload of the RayJob",
    )
    name = workloads[0]["metadata"]["name"]
    resource = Resource(KUEUE_GROUP, workloads[0]["apiVersion"].split("/")[1], KUEUE_WORKLOAD_PLURAL)
    kube = _operator_kube(cluster)
    mark = {SUSPENDED_BY_USER_ANNOTATION: "true"}
    refused = {
        "queue": {"metadata": {"annotations": mark}, "spec": {"active": False, "queueName": "other"}},
        "label": {
            "metadata": {"annotations": mark, "labels": {KUEUE_JOB_UID_LABEL: "u2"}},
            "spec": {"active": False},
        },
        "annotation": {
            "metadata": {"annotations": {**mark, "kueue.x-k8s.io/x": "y"}},
            "spec": {"active": False},
        },
    }
    for what, patch in refused.items():
        with pytest.raises(ApiError) as caught:
            kube.merge_patch(resource, contained, name, patch)
        message = str(caught.value)
        assert POLICY in message and "only (de)activates the Workload of a RayJob" in message, (what, message)
    kube.merge_patch(
        resource, contained, name, {"metadata": {"annotations": mark}, "spec": {"active": False}}
    )
    back = {"metadata": {"annotations": {SUSPENDED_BY_USER_ANNOTATION: None}}, "spec": {"active": True}}
    assert kube.merge_patch(resource, contained, name, back)["spec"]["active"] is True


def _policy_refusals(cluster: Cluster) -> list[str]:
    """The operator's own requests (all of this session's, from the audit log) that the policy
    refused: none, or it is in the way of the work it exists for."""
    refused = []
    with cluster.audit_log.open("rb") as log:
        for line in log:
            if not line.endswith(b"\n"):
                break
            event = json.loads(line)
            status = event.get("responseStatus") or {}
            if event["user"]["username"] == OPERATOR_USER and "llmtrain containment" in status.get(
                "message", ""
            ):
                refused.append(status["message"])
    return refused


@pytest.mark.usefixtures("jobs_deleted_first")
def test_a_job_runs_end_to_end_under_the_policy(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """The real operator, policy in force: a job whose children's names are hashed is created,
    runs and succeeds, and no request the operator made in this session was refused by the
    policy (run with test_reconcile.py and test_least_privilege.py, that covers their jobs too)."""
    name = "contained-job-whose-name-is-long-enough-to-hash"
    assert len(name) == 47
    apply_doc(cluster, cpu_job(name, namespace))
    wait_phase(cluster, namespace, name, "Running")
    try:
        end_ray_job(cluster, namespace, name, succeed=True)
        wait_phase(cluster, namespace, name, "Succeeded")
    finally:
        clear_outcome(cluster, namespace)
    assert _policy_refusals(cluster) == []


# ------------------------------------------------------------------------------------ the control


def _set_containment(cluster: Cluster, platform: str, *, enabled: bool) -> None:
    """`helm upgrade` the platform with the policy on or off, then wait until the API server's
    admission plugin has seen the change (a server-side dry run of an unlabelled ConfigMap)."""
    helm(
        cluster,
        "upgrade",
        RELEASE,
        str(CHART),
        "-n",
        platform,
        "--reuse-values",
        f"--set=containment.enabled={str(enabled).lower()}",
    )
    wait_for(
        lambda: (create(cluster, platform, BARE_CONFIGMAP, "--dry-run=server").returncode != 0) == enabled,
        what=f"the containment policy {'in force' if enabled else 'gone'}",
    )


def test_without_the_policy_its_rbac_allows_every_refused_write(
    cluster: Cluster, platform: str, namespace: str
) -> None:
    """The control: with `containment.enabled=false` every write refused above by the policy (not
    by RBAC's escalation check) is admitted, as a server-side dry run (RBAC and admission judge it,
    nothing is stored). The refusals are the policy's, not something else's."""
    started = time.monotonic()
    _set_containment(cluster, platform, enabled=False)
    try:
        prepare(cluster, namespace)
        admitted = {
            attempt.id: attempt.run(cluster, namespace, "--dry-run=server")
            for attempt in ATTEMPTS
            if attempt.policy_only
        }
        refused = {i: r.stderr for i, r in admitted.items() if r.returncode != 0}
        assert refused == {}
    finally:
        _set_containment(cluster, platform, enabled=True)
    print(f"policy off and on again in {time.monotonic() - started:.1f} s")
