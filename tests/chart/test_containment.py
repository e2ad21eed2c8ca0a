"""The containment policy (templates/admission-policy.yaml) against what the operator renders, offline.

Its CEL runs here in the project's CEL engine, as the API server runs it (variables first, then
every validation), on requests made of rendered children: whatever the renderer produces must be
admitted, so a change to the renderer that the policy would refuse fails here, in `make test-fast`,
before the cluster tier (tests/cluster/test_containment.py) meets it. `substring` (a Kubernetes CEL
string extension) is supplied, the rest is standard CEL.
"""

from __future__ import annotations

import copy
from typing import Any

import cel
import pytest
from llmtrain.api.validation import parse_job
from llmtrain.render import render

from tests.chart.helm import NAMESPACE, find, one, render_set
from tests.chart.helm import render as render_chart
from tests.support.jobs import minimal_job

Obj = dict[str, Any]
RESOURCES = {
    "ConfigMap": ("", "configmaps"),
    "PersistentVolumeClaim": ("", "persistentvolumeclaims"),
    "ServiceAccount": ("", "serviceaccounts"),
    "Role": ("rbac.authorization.k8s.io", "roles"),
    "RoleBinding": ("rbac.authorization.k8s.io", "rolebindings"),
    "RayJob": ("ray.io", "rayjobs"),
}


def policy(value_set: str = "default") -> Obj:
    return one(render_set(value_set), "ValidatingAdmissionPolicy")


def _context(bindings: dict[str, Any]) -> cel.Context:
    context = cel.Context(bindings)
    context.add_function("substring", lambda s, start, end: s[start:end])
    return context


def _run(expression: str, bindings: dict[str, Any]) -> Any:
    return cel.compile(expression).execute(_context(bindings))


def operator_user(spec: Obj) -> str:
    (condition,) = spec["matchConditions"]
    prefix = "request.userInfo.username == '"
    expression: str = condition["expression"]
    assert expression.startswith(prefix) and expression.endswith("'"), expression
    return expression[len(prefix) : -1]


def judge(spec: Obj, operation: str, obj: Obj | None, old: Obj | None = None) -> list[str]:
    """The messages of the validations that refuse the request (an evaluation error refuses too:
    the policy's failurePolicy is Fail)."""
    target = obj or old
    assert target is not None
    group, resource = RESOURCES[target["kind"]]
    request = {
        "operation": operation,
        "kind": {"group": group, "version": target["apiVersion"].split("/")[-1], "kind": target["kind"]},
        "resource": {"group": group, "version": target["apiVersion"].split("/")[-1], "resource": resource},
        "namespace": target["metadata"]["namespace"],
        "name": target["metadata"]["name"],
        "userInfo": {"username": operator_user(spec)},
    }
    bindings: dict[str, Any] = {"request": request, "object": obj, "oldObject": old}
    assert all(_run(c["expression"], bindings) is True for c in spec["matchConditions"])
    variables: dict[str, Any] = {}
    for variable in spec["variables"]:
        try:  # the API server evaluates variables lazily: one that fails matters only where used
            variables[variable["name"]] = _run(variable["expression"], {**bindings, "variables": variables})
        except Exception:
            continue
    bindings["variables"] = variables
    refused = []
    for validation in spec["validations"]:
        try:
            allowed = _run(validation["expression"], bindings) is True
        except Exception:
            allowed = False
        if not allowed:
            try:
                refused.append(str(_run(validation["messageExpression"], bindings)))
            except Exception:
                refused.append(validation["expression"])
    return refused


def rendered(name: str, namespace: str = "team-a", **spec: Any) -> list[Obj]:
    job = parse_job(minimal_job(name, namespace, **spec))
    return render(job)


JOBS: dict[str, dict[str, Any]] = {
    "minimal": {},
    "name-hashed-for-every-child": {"name": "a-job-whose-name-is-long-enough-to-hash-its-kid"},
    "queued": {"runPolicy": {"queueName": "team-queue"}},
    "hf-token-and-placement": {
        "model": {"name": "meta-llama/Llama-3.1-8B", "hfTokenSecretRef": {"name": "hf", "key": "token"}},
        "resources": {
            "workers": 2,
            "gpusPerWorker": 8,
            "nodeSelector": {"pool": "gpu"},
            "priorityClassName": "training",
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
        },
    },
    "created-claim": {"storage": {"create": {"size": "1Gi", "storageClassName": "shared-rwx"}}},
    # The fabric profiles' workers request their device; with ipcLock they add IPC_LOCK.
    "infiniband-fabric": {
        "resources": {"gpusPerWorker": 8},
        "network": {"ncclProfile": "infiniband", "fabric": {"ipcLock": True}},
    },
    "efa-fabric-default": {"resources": {"gpusPerWorker": 8}, "network": {"ncclProfile": "efa"}},
    "efa-fabric-named-device": {
        "resources": {"gpusPerWorker": 8, "gpuResourceName": "nvidia.com/mig-3g.40gb"},
        "network": {"ncclProfile": "efa", "fabric": {"resourceName": "example.com/efa", "perWorker": 4}},
    },
    "queued-and-suspended": {"runPolicy": {"queueName": "team-queue", "suspend": True}},
    # Every volume kind spec.podTemplate may add, with pull secrets, labels and annotations.
    "pod-template-overlay": {
        "podTemplate": {
            "labels": {"team": "nlp"},
            "annotations": {"sidecar.istio.io/inject": "false"},
            "serviceAccountAnnotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/t"},
            "imagePullSecrets": [{"name": "registry"}],
            "volumes": [
                {"name": "a", "configMap": {"name": "c"}},
                {"name": "b", "secret": {"secretName": "s"}},
                {"name": "c", "persistentVolumeClaim": {"claimName": "data"}},
                {"name": "d", "emptyDir": {}},
                {"name": "e", "projected": {"sources": []}},
                {"name": "f", "csi": {"driver": "example.csi"}},
                {"name": "g", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                {"name": "h", "downwardAPI": {"items": []}},
            ],
            "volumeMounts": [{"name": "b", "mountPath": "/secrets", "readOnly": True}],
        }
    },
}


@pytest.mark.parametrize("case", JOBS, ids=list(JOBS))
def test_every_child_the_operator_renders_is_admitted(case: str) -> None:
    spec = policy()["spec"]
    overrides = dict(JOBS[case])
    name = overrides.pop("name", "train")
    try:
        children = rendered(name, **overrides)
    except Exception as err:  # a spec the API no longer takes: the case must be updated
        raise AssertionError(f"{case}: {err}") from err
    for child in children:
        assert judge(spec, "CREATE", child) == [], f"{case}: {child['kind']}/{child['metadata']['name']}"
        # Re-sync and adoption: the same object patched back (its labels put back on an orphan).
        assert judge(spec, "UPDATE", child, copy.deepcopy(child)) == [], child["kind"]


def test_a_bound_claim_is_adopted_but_never_rebound() -> None:
    """The binder sets spec.volumeName on a claim; adopting it patches a claim that carries one."""
    spec = policy()["spec"]
    (claim,) = [c for c in rendered("train", **JOBS["created-claim"]) if c["kind"] == "PersistentVolumeClaim"]
    bound = copy.deepcopy(claim)
    bound["spec"]["volumeName"] = "pvc-1234"
    assert judge(spec, "UPDATE", bound, copy.deepcopy(bound)) == []
    assert "never binds a claim" in judge(spec, "UPDATE", bound, claim)[0]
    rebound = copy.deepcopy(bound)
    rebound["spec"]["volumeName"] = "someone-elses"
    assert "never binds a claim" in judge(spec, "UPDATE", rebound, bound)[0]
    assert "never binds a claim" in judge(spec, "CREATE", bound)[0]


def test_the_operator_is_refused_what_it_never_renders() -> None:
    """A few of the cluster tier's refusals, to show this evaluation is not vacuous."""
    spec = policy()["spec"]
    children = {c["kind"]: c for c in rendered("train")}
    unlabelled = copy.deepcopy(children["ConfigMap"])
    del unlabelled["metadata"]["labels"]
    assert "the operator writes only objects labelled" in judge(spec, "CREATE", unlabelled)[0]
    assert "the operator never deletes" in judge(spec, "DELETE", None, children["ConfigMap"])[0]
    assert "it is not the operator's" in judge(spec, "UPDATE", children["ConfigMap"], unlabelled)[0]
    # ... unless a job controls it: the operator puts back the labels someone removed.
    owned = copy.deepcopy(unlabelled)
    owned["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "llmtrain.dev/v1alpha1",
            "kind": "LLMTrainingJob",
            "name": "train",
            "uid": "1",
            "controller": True,
        }
    ]
    assert judge(spec, "UPDATE", children["ConfigMap"], owned) == []
    role = copy.deepcopy(children["Role"])
    role["rules"][0]["verbs"] = ["patch", "update"]
    assert "the only Role the operator writes" in judge(spec, "CREATE", role)[0]
    rayjob = copy.deepcopy(children["RayJob"])
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    head["volumes"].append({"name": "root", "hostPath": {"path": "/"}})
    assert (
        "may mount only the volume kinds restricted Pod Security admits" in judge(spec, "CREATE", rayjob)[0]
    )
    rayjob = copy.deepcopy(children["RayJob"])
    rayjob["spec"]["submitterPodTemplate"]["spec"]["serviceAccountName"] = "admin"
    assert "trainer ServiceAccount" in judge(spec, "CREATE", rayjob)[0]


def test_the_policy_matches_the_operators_service_account_only() -> None:
    assert operator_user(policy()["spec"]) == f"system:serviceaccount:{NAMESPACE}:llmtrain-operator"
    assert (
        operator_user(policy("existing-serviceaccount")["spec"])
        == f"system:serviceaccount:{NAMESPACE}:platform-llmtrain-operator"
    )
    objects = render_set("default")
    binding = one(objects, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": policy()["metadata"]["name"], "validationActions": ["Deny"]}
    assert policy()["spec"]["failurePolicy"] == "Fail"


def test_the_policy_can_be_switched_off() -> None:
    objects = render_chart({"containment": {"enabled": False}})
    assert not find(objects, "ValidatingAdmissionPolicy")
    assert not find(objects, "ValidatingAdmissionPolicyBinding")


FABRIC_JOB = JOBS["infiniband-fabric"]
CAPABILITIES = "its pods add no capabilities, except IPC_LOCK alone on a worker container"


def _fabric_rayjob() -> Obj:
    (rayjob,) = [c for c in rendered("train", **FABRIC_JOB) if c["kind"] == "RayJob"]
    return rayjob


def _containers(rayjob: Obj, group: str) -> list[Obj]:
    cluster = rayjob["spec"]["rayClusterSpec"]
    pod = {
        "head": cluster["headGroupSpec"]["template"]["spec"],
        "worker": cluster["workerGroupSpecs"][0]["template"]["spec"],
        "submitter": rayjob["spec"]["submitterPodTemplate"]["spec"],
    }[group]
    containers: list[Obj] = pod["containers"]
    return containers


def _add(container: Obj, *capabilities: str) -> None:
    container["securityContext"] = copy.deepcopy(container["securityContext"])
    container["securityContext"]["capabilities"] = {"drop": ["ALL"], "add": list(capabilities)}


def test_a_fabric_worker_may_add_ipc_lock_and_nothing_else() -> None:
    spec = policy()["spec"]
    rayjob = _fabric_rayjob()
    (worker,) = _containers(rayjob, "worker")
    assert worker["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert judge(spec, "CREATE", rayjob) == []
    refusals: dict[str, Any] = {
        "IPC_LOCK and NET_RAW on the worker": lambda r: _add(
            _containers(r, "worker")[0], "IPC_LOCK", "NET_RAW"
        ),
        "SYS_ADMIN on the worker": lambda r: _add(_containers(r, "worker")[0], "SYS_ADMIN"),
        "IPC_LOCK on the head": lambda r: _add(_containers(r, "head")[0], "IPC_LOCK"),
        "IPC_LOCK on the submitter": lambda r: _add(_containers(r, "submitter")[0], "IPC_LOCK"),
        "IPC_LOCK on a worker without a fabric device": lambda r: _containers(r, "worker")[0]["resources"][
            "limits"
        ].pop("rdma/rdma_shared_device_a"),
        "IPC_LOCK on a worker init container": lambda r: r["spec"]["rayClusterSpec"]["workerGroupSpecs"][0][
            "template"
        ]["spec"].__setitem__("initContainers", [copy.deepcopy(_containers(r, "worker")[0])]),
    }
    for what, change in refusals.items():
        changed = copy.deepcopy(rayjob)
        change(changed)
        refused = judge(spec, "CREATE", changed)
        assert any(CAPABILITIES in m for m in refused), f"{what}: {refused}"


def test_a_restricted_profile_worker_may_not_add_ipc_lock() -> None:
    """Only a worker requesting a fabric device: with just a GPU, IPC_LOCK is refused."""
    spec = policy()["spec"]
    (rayjob,) = [c for c in rendered("train", resources={"gpusPerWorker": 8}) if c["kind"] == "RayJob"]
    assert judge(spec, "CREATE", rayjob) == []
    _add(_containers(rayjob, "worker")[0], "IPC_LOCK")
    assert any(CAPABILITIES in m for m in judge(spec, "CREATE", rayjob))


RESTRICTED = "its pods must be"


def _pod(rayjob: Obj, group: str) -> Obj:
    cluster = rayjob["spec"]["rayClusterSpec"]
    pod: Obj = {
        "head": cluster["headGroupSpec"]["template"]["spec"],
        "worker": cluster["workerGroupSpecs"][0]["template"]["spec"],
        "submitter": rayjob["spec"]["submitterPodTemplate"]["spec"],
    }[group]
    return pod


def _container_context(pod: Obj) -> Obj:
    context: Obj = pod["containers"][0].setdefault("securityContext", {})
    return context


# Each clause of podsAreRestricted, broken once: a compromised operator could otherwise start a pod
# that escapes to its node.
ESCAPES: dict[str, Any] = {
    "hostNetwork": lambda p: p.__setitem__("hostNetwork", True),
    "hostPID": lambda p: p.__setitem__("hostPID", True),
    "hostIPC": lambda p: p.__setitem__("hostIPC", True),
    "hostPort": lambda p: p["containers"][0].__setitem__("ports", [{"containerPort": 80, "hostPort": 80}]),
    "pod runAsUser 0": lambda p: p["securityContext"].__setitem__("runAsUser", 0),
    "pod runAsNonRoot false": lambda p: p["securityContext"].__setitem__("runAsNonRoot", False),
    "pod without runAsNonRoot": lambda p: p["securityContext"].pop("runAsNonRoot"),
    "container runAsUser 0": lambda p: _container_context(p).__setitem__("runAsUser", 0),
    "allowPrivilegeEscalation true": lambda p: _container_context(p).__setitem__(
        "allowPrivilegeEscalation", True
    ),
    "allowPrivilegeEscalation unset": lambda p: _container_context(p).pop("allowPrivilegeEscalation"),
    "privileged": lambda p: _container_context(p).__setitem__("privileged", True),
}


@pytest.mark.parametrize("group", ["head", "worker", "submitter"])
@pytest.mark.parametrize("escape", sorted(ESCAPES))
def test_every_pod_security_clause_refuses_its_escape(escape: str, group: str) -> None:
    spec = policy()["spec"]
    (rayjob,) = [copy.deepcopy(c) for c in rendered("train") if c["kind"] == "RayJob"]
    assert judge(spec, "CREATE", rayjob) == []
    ESCAPES[escape](_pod(rayjob, group))
    refused = judge(spec, "CREATE", rayjob)
    assert any(RESTRICTED in m for m in refused), f"{escape} on the {group}: {refused}"


def test_an_init_container_is_held_to_the_same_clauses() -> None:
    spec = policy()["spec"]
    (rayjob,) = [copy.deepcopy(c) for c in rendered("train") if c["kind"] == "RayJob"]
    worker = _pod(rayjob, "worker")
    init = copy.deepcopy(worker["containers"][0])
    init["name"] = "init"
    init["securityContext"]["privileged"] = True
    worker["initContainers"] = [init]
    assert any(RESTRICTED in m for m in judge(spec, "CREATE", rayjob))
